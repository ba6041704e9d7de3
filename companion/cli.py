"""Command-line entry point: ``companion <command> ...``.

Each command lives in the module that owns its concept and exposes ``register(subparsers)``;
this file only dispatches, so adding a command never touches another module's code.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# (module, description) in the order shown by ``companion --help``.
COMMAND_MODULES: tuple[str, ...] = (
    "companion.tiny_pair.cli",   # retrain / pair-report: the embedded default model pair
    "companion.harvest.cli",     # harvest: per-step traces from a target and drafter
    "companion.reproduce",       # reproduce / build-book: run every notebook, build the HTML book
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="companion",
        description="Acceptance certificates for speculative decoding: reproduction tools.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            # Only tolerate the command module itself being absent (e.g. a trimmed install);
            # a missing dependency inside it is a real error and must surface.
            if err.name and (name == err.name or name.startswith(err.name + ".")):
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
