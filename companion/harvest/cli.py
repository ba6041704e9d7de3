"""``companion harvest``: per-step traces of a target (and drafter) along greedy decoding.

Examples::

    companion harvest --out traces/closed-world                   # embedded pair, CPU
    companion harvest --preset paper-qwen3-4b --out traces/qwen3-4b   # CUDA, bf16
    accelerate launch --num_processes 4 -m companion harvest --preset paper-qwen3-4b --out traces/qwen3-4b

Rerunning the same command resumes an interrupted harvest; a different configuration into the
same ``--out`` is refused. One process writes a folder at a time: a second harvest of the same
``--out`` (or a chapter harvesting it through ``chapter_traces``) says in one line that it waits,
waits for the lock ``<out>.lock`` beside the folder, then resumes what the first one wrote
(``companion.harvest.lock.exclusive``).

Every mistake that can be found without the models (options, folders, the prompt file, the
output folder, the device) is found before they load, and ends the command with one line on
standard error and exit status 2, having written nothing. Ctrl-C ends it with status 130 and
a line that says how far it got; rerunning the same command resumes.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from companion.models.presets import PRESETS

MODEL_DTYPES = ("bfloat16", "float16", "float32")
EXIT_REFUSED = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


class Refusal(Exception):
    """A mistake found before anything is written: one line for the user, exit status 2."""


# -------------------------------------------------------------------------------------------------
# Option types: checked while parsing, so a bad value never reaches the models


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _csv_ints(text: str) -> list[int]:
    """Tree widths: comma-separated positive integers, each once."""
    items = [x.strip() for x in text.split(",")]
    try:
        widths = [int(x) for x in items]
    except ValueError:
        widths = []
    if not widths or any(m < 1 for m in widths):
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers such as 1,2,4,8, got {text!r}")
    if len(set(widths)) != len(widths):
        raise argparse.ArgumentTypeError(f"each tree width once, got {text!r}")
    return widths


def _criteria_specs(text: str) -> list[str]:
    """Criterion specs, ';'-separated, each parsed now (the engine's own message names a bad one)."""
    from companion.certify.criteria import parse_criterion

    specs = [s.strip() for s in text.split(";") if s.strip()]
    if not specs:
        raise argparse.ArgumentTypeError(f"expected criterion specs separated by ';' such as greedy;additive:0.3, "
                                         f"got {text!r}")
    for spec in specs:
        try:
            parse_criterion(spec)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return specs


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``harvest`` subcommand."""
    p = subparsers.add_parser(
        "harvest",
        help="greedy-decode prompts and record every step's certificates, KL, acceptance (Parquet + manifest)",
        description="Greedy-decode every prompt with the target, run the drafter teacher-forced on the same "
                    "prefixes, and write one row per step (top-k, margin, entropy, certificates of every criterion "
                    "and tree width, KL both ways, TV, acceptance and certification of the drafter's token) to "
                    "Parquet shards with a JSON manifest. Rerun the same command to resume. Under `accelerate "
                    "launch` or `torchrun` the prompts are split across processes. Exit status: 0 complete, 1 "
                    "incomplete or failed while writing, 2 refused (nothing written), 130 interrupted.",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory (created; resumed if it holds this harvest)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="closed-world",
                   help="models, prompts and settings (default: closed-world, the embedded CPU pair; "
                        "'default' is its former name)")
    p.add_argument("--target", help="target model: hub id or local folder (overrides the preset)")
    p.add_argument("--drafter", help="drafter model: hub id or local folder (overrides the preset)")
    p.add_argument("--no-drafter", action="store_true", help="target-side statistics only (the paper's setting)")
    p.add_argument("--tokenizer", help="tokenizer (default: the preset's, else the target's)")
    p.add_argument("--prompts", help="prompt set: a name (default), a JSONL file (one object a line with 'text', "
                                     "optionally 'prompt_id', 'n_tokens', 'source', 'line') or a text file "
                                     "(one prompt a line)")
    p.add_argument("--ultrachat", type=Path,
                   help="UltraChat-200k train_sft as local Parquet file(s) or JSONL, instead of the `datasets` library")
    p.add_argument("--n-prompts", type=_positive_int,
                   help="number of prompts (default: the preset's; for a prompt set: its first N)")
    p.add_argument("--min-prompt-tokens", type=_nonnegative_int,
                   help="UltraChat selection: minimum templated prompt length")
    p.add_argument("--enable-thinking", action="store_true", help="UltraChat: Qwen3 thinking mode on (default off)")
    p.add_argument("--write-prompts", type=Path,
                   help="also save the prompt set used as JSONL (to reuse with --prompts), once the harvest ends")
    p.add_argument("--steps", type=_positive_int, help="greedy steps per prompt (default: the preset's, 128)")
    p.add_argument("--criteria", type=_criteria_specs, action="append", metavar="SPECS",
                   help="criterion specs, ';'-separated or repeated (default: the paper's: "
                        "greedy;additive:0.3;multiplicative:0.1;typical:0.09,0.3;topk-delta:10,0.6;topm:4)")
    p.add_argument("--tree-widths", type=_csv_ints, help="tree widths m, comma-separated (default 1,2,4,8)")
    p.add_argument("--top-k", type=_positive_int, default=64, help="target probabilities kept per step (default 64)")
    p.add_argument("--batch-size", type=_positive_int, help="prompts per batch (default 32 on CUDA, 8 on the CPU)")
    p.add_argument("--prompts-per-shard", type=_positive_int,
                   help="prompts per Parquet shard (default: the batch size)")
    p.add_argument("--chunk-steps", type=_positive_int,
                   help="steps reduced to statistics at a time (default: ~256 rows on CUDA, 1 on CPU)")
    p.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: CUDA when present; one GPU per process "
                                    "when launched)")
    p.add_argument("--dtype", choices=MODEL_DTYPES,
                   help="model dtype (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--threads", type=_positive_int,
                   help="torch CPU threads (default: torch's; part of the configuration: it changes the last bits)")
    p.add_argument("--seed", type=int, help="seed of the prompt sample (default: the preset's, 0)")
    p.add_argument("--no-stop-at-eos", action="store_true", help="decode all steps even past an EOS token")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_harvest)
    _register_prefetch(subparsers)
    _register_status(subparsers)


# -------------------------------------------------------------------------------------------------
# The command


def main(argv: list[str] | None = None) -> int:
    """Run ``companion harvest ARGV`` from code (the full profile, the rehearsal) as ``companion`` runs it;
    return its exit status."""
    from companion.parsing import OneLineParser, run_parsed

    parser = OneLineParser(prog="companion")
    register(parser.add_subparsers(dest="command", metavar="COMMAND"))
    return run_parsed(parser, ["harvest", *(sys.argv[1:] if argv is None else argv)])


def _say(message: str) -> None:
    """One line on standard error, from the main process only (every process finds the same mistakes)."""
    if os.environ.get("RANK", "0") == "0":
        print(f"companion harvest: {message}", file=sys.stderr)


def cmd_harvest(args: argparse.Namespace) -> int:
    """Check everything that can be checked, load the models, harvest; see the module docstring for exit codes."""
    stage = {"harvest_started": False, "stop_requested": False}
    try:
        with _deferred_interrupts(stage):
            return _harvest(args, stage)
    except Refusal as err:
        _say(str(err))
        return EXIT_REFUSED
    except KeyboardInterrupt:
        _say(_interrupted_message(args.out, stage["harvest_started"]))
        return EXIT_INTERRUPTED


@contextlib.contextmanager
def _deferred_interrupts(stage: dict[str, bool]):
    """While decoding, the first Ctrl-C only asks the harvest to stop after the current block.

    Python raises ``KeyboardInterrupt`` wherever the interpreter happens to be, and one raised
    inside a finaliser (``__del__``) is printed and dropped: the harvest would then run to the
    end. Before decoding starts (options, model loading) and on a second Ctrl-C it raises at once.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stage["harvest_started"] and not stage["stop_requested"]:
            stage["stop_requested"] = True
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_message(out: Path, harvest_started: bool) -> str:
    from companion.harvest.store import read_manifest

    if harvest_started:
        try:
            manifest = read_manifest(out)
        except (OSError, ValueError):
            manifest = None
        if manifest is not None and manifest.get("status") in ("interrupted", "complete"):
            done = manifest["totals"]["shards"]
            total = done + len(manifest.get("missing_shards", []))
            return (f"interrupted: {done} of {total} shards are complete in {out}; "
                    "rerun the same command to resume")
    return f"interrupted before the harvest wrote anything to {out}; rerun the same command to start it"


def _harvest(args: argparse.Namespace, stage: dict[str, bool]) -> int:
    import torch

    from companion.models import presets as pr
    from companion.prompts import ultrachat

    plan = _plan(args)
    _check_out(args.out)
    if args.write_prompts is not None:
        _check_new_file(args.write_prompts, "--write-prompts")
    _check_device(args.device)

    # Nothing can be found wrong without the models from here on.
    from companion.models.devices import resolve_device
    from companion.harvest.core import distributed_context, harvest
    from companion.harvest.plan import load_planned
    from companion.harvest.store import HarvestConfigError
    from companion.models.loading import WeightsUnavailableError
    from companion.prompts.sets import dumps_prompts, with_token_counts

    if args.threads:
        torch.set_num_threads(args.threads)
    dist = distributed_context()
    device = resolve_device(args.device, local_rank=dist.local_rank, world=dist.world)
    try:
        target, draft_model, tokenizer, prompts = load_planned(plan, device=device, dtype=args.dtype)
    except (WeightsUnavailableError, ultrachat.PromptsUnavailableError, ValueError, OSError) as err:
        # missing weights offline, mismatched tokenizers, unreadable folders: a line, not a traceback
        raise Refusal(_one_line(err)) from None

    from companion.harvest.lock import exclusive

    def waiting(lock: Path) -> None:
        _say(f"--out {args.out}: another process is harvesting into it (it holds {lock}); waiting for it to "
             "finish, then this harvest resumes from what it wrote")

    # One writer per folder (the lock chapter_traces takes too): two harvests writing the same shards would
    # leave a manifest whose checksums do not match them.
    with exclusive(args.out, rank=dist.rank, on_wait=waiting):
        manifest_path = args.out / "manifest.json"
        before = manifest_path.read_bytes() if manifest_path.is_file() else None
        stage["harvest_started"] = True
        try:
            manifest = harvest(
                target, draft_model, tokenizer, prompts, args.out,
                criteria=plan.criteria,
                tree_widths=plan.tree_widths,
                n_steps=plan.n_steps,
                batch_size=args.batch_size,
                prompts_per_shard=args.prompts_per_shard,
                chunk_steps=args.chunk_steps,
                top_k=args.top_k,
                stop_at_eos=not args.no_stop_at_eos,
                seed=plan.seed,
                prompt_set_name=plan.prompt_set_name,
                extra={"preset": plan.preset, "enable_thinking": plan.enable_thinking},
                progress=not args.no_progress,
                stop=lambda: stage["stop_requested"],
            )
        except (HarvestConfigError, ValueError, OSError) as err:
            after = manifest_path.read_bytes() if manifest_path.is_file() else None
            if after == before and not isinstance(err, OSError):  # found before anything was written
                raise Refusal(_one_line(err)) from None
            _say(f"the harvest in {args.out} failed: {_one_line(err)}")
            return 1
    if dist.is_main:
        if args.write_prompts is not None:  # with the token counts the harvest measured
            counted = with_token_counts(prompts, lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"]))
            args.write_prompts.write_text(dumps_prompts(counted), encoding="utf-8")
        totals = manifest["totals"]
        print(json.dumps({"out": str(args.out), "status": manifest["status"], **totals}))
    return 0 if manifest["status"] == "complete" else 1


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _plan(args: argparse.Namespace) -> Any:
    """The harvest plan of the options (:func:`companion.harvest.plan.plan_harvest`); its mistakes are refusals."""
    from companion.harvest.plan import PlanError, plan_harvest

    try:
        return plan_harvest(
            args.preset, target=args.target, drafter=args.drafter, no_drafter=args.no_drafter,
            tokenizer=args.tokenizer, prompts=args.prompts, n_prompts=args.n_prompts, ultrachat=args.ultrachat,
            min_prompt_tokens=args.min_prompt_tokens, enable_thinking=args.enable_thinking, n_steps=args.steps,
            criteria=[s for group in args.criteria for s in group] if args.criteria else None,
            tree_widths=args.tree_widths or None, seed=args.seed)
    except PlanError as err:
        raise Refusal(str(err)) from None


def _check_out(out: Path) -> None:
    """``--out`` must be a folder this process can write, or creatable; an existing harvest's manifest readable."""
    from companion.harvest import store

    _refuse_inside_weights_cache(out)
    if out.exists():
        if not out.is_dir():
            raise Refusal(f"--out {out} is a file; pass a folder (it is created if missing)")
        if not os.access(out, os.W_OK | os.X_OK):
            raise Refusal(f"--out {out} is not writable; pass a folder you can write to")
        if (out / store.MANIFEST).exists():
            try:
                store.read_manifest(out)
            except (OSError, ValueError) as err:
                raise Refusal(_one_line(err)) from None
        elif any(not e.name.startswith(".") for e in out.iterdir()):
            raise Refusal(f"--out {out} is not empty and holds no {store.MANIFEST}: refusing to write into it; "
                          "pass a new or empty folder")
        return
    _check_creatable(out, "--out")


def _refuse_inside_weights_cache(out: Path) -> None:
    """``--out`` may not lie inside the weights cache: the companion replaces a model's folder when it converts the
    model again (after damage) and deletes old conversions when pruned, taking whatever else is in it along."""
    from companion.models.weights.convert import cache_root

    root = cache_root().resolve()
    where = out.resolve()
    if where == root or root in where.parents:
        raise Refusal(f"--out {out} is inside the weights cache {root}, whose folders the companion replaces or "
                      "deletes when it converts a model again or prunes: pass a folder outside it")


def _check_creatable(path: Path, option: str) -> None:
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise Refusal(f"{option} {path}: cannot create it, {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise Refusal(f"{option} {path}: cannot create it, {parent} is not writable")


def _check_new_file(path: Path, option: str) -> None:
    if path.is_dir():
        raise Refusal(f"{option} {path} is a folder; pass a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise Refusal(f"{option} {path} is not writable")
        return
    _check_creatable(path, option)


def _check_device(requested: str | None) -> None:
    """A device torch knows and this machine has."""
    from companion.models.devices import DeviceUnavailableError, check_device

    try:
        check_device(requested)
    except DeviceUnavailableError as err:
        raise Refusal(f"--device {requested}: {err}") from None


# -------------------------------------------------------------------------------------------------
# `companion prefetch` and `companion harvest-status`: before and after a harvest on many processes


def _register_prefetch(subparsers: argparse._SubParsersAction) -> None:
    """Add ``prefetch``: fetch a harvest's models and prompts once, so that N ranks can then read them offline."""
    p = subparsers.add_parser(
        "prefetch",
        help="download a harvest's tokenizer, models and prompts once into the local caches, then exit",
        description="Plan the harvest that `companion harvest` would run with the same options, load its "
                    "tokenizer, target, drafter (on the CPU, in bfloat16) and prompt set once, which downloads "
                    "whatever is missing into the Hugging Face caches, and exit. Run it once (per cache: once "
                    "per node unless HF_HOME is on a shared filesystem) before launching the ranks with "
                    "HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1, so that N processes do not query the hub together. "
                    "Prints one JSON line. Exit status: 0 fetched, 2 refused or unavailable.",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="closed-world", help="as for `companion harvest`")
    p.add_argument("--target", help="as for `companion harvest`")
    p.add_argument("--drafter", help="as for `companion harvest`")
    p.add_argument("--no-drafter", action="store_true", help="as for `companion harvest`")
    p.add_argument("--tokenizer", help="as for `companion harvest`")
    p.add_argument("--prompts", help="as for `companion harvest`")
    p.add_argument("--ultrachat", type=Path, help="as for `companion harvest`")
    p.add_argument("--n-prompts", type=_positive_int, help="as for `companion harvest`")
    p.add_argument("--min-prompt-tokens", type=_nonnegative_int, help="as for `companion harvest`")
    p.add_argument("--enable-thinking", action="store_true", help="as for `companion harvest`")
    p.add_argument("--seed", type=int, help="as for `companion harvest`")
    p.set_defaults(func=cmd_prefetch, steps=None, criteria=None, tree_widths=None)


def cmd_prefetch(args: argparse.Namespace) -> int:
    """Load the planned harvest's tokenizer, models and prompts once on the CPU; print what was fetched."""
    from companion.harvest.plan import load_planned
    from companion.models.loading import WeightsUnavailableError
    from companion.prompts import ultrachat

    try:
        plan = _plan(args)
        target, drafter, tokenizer, prompts = load_planned(plan, device="cpu", dtype="bfloat16")
    except Refusal as err:
        print(f"companion prefetch: {err}", file=sys.stderr)
        return EXIT_REFUSED
    except (WeightsUnavailableError, ultrachat.PromptsUnavailableError, ValueError, OSError) as err:
        print(f"companion prefetch: {_one_line(err)}", file=sys.stderr)
        return EXIT_REFUSED
    from huggingface_hub import constants

    # the longest prompt sets the KV cache a batch needs (the page's memory arithmetic)
    longest = max((len(tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in prompts), default=0)
    print(json.dumps({"preset": plan.preset, "target": plan.target, "drafter": plan.drafter,
                      "tokenizer": plan.tokenizer or plan.target, "prompt_set": plan.prompt_set_name,
                      "prompts": len(prompts), "max_prompt_tokens": longest,
                      "target_parameters": sum(p.numel() for p in target.parameters()),
                      "drafter_parameters": (sum(p.numel() for p in drafter.parameters())
                                             if drafter is not None else 0),
                      "hub_cache": str(constants.HF_HUB_CACHE),
                      "offline": bool(constants.HF_HUB_OFFLINE)}))
    return 0


def _register_status(subparsers: argparse._SubParsersAction) -> None:
    """Add ``harvest-status``: a harvest folder's manifest status, rows and shards, and its locks."""
    p = subparsers.add_parser(
        "harvest-status",
        help="print a harvest folder's status (complete or not), rows, prompts, shards and lock holders",
        description="Read DIR/manifest.json and print its status, rows, prompts, shards done out of the total, "
                    "the missing shards, the runs that wrote it and the lock files beside it with their holders. "
                    "Exit status: 0 complete, 1 not complete (rerun the harvest command to finish it), 2 no "
                    "readable manifest.",
    )
    p.add_argument("out", type=Path, metavar="DIR", help="the harvest's --out folder")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the summary lines")
    p.set_defaults(func=cmd_harvest_status)


def cmd_harvest_status(args: argparse.Namespace) -> int:
    """Print :func:`companion.harvest.status.harvest_status` of ``args.out``; 0 when complete."""
    from companion.harvest.status import harvest_status

    try:
        info = harvest_status(args.out)
    except FileNotFoundError:
        print(f"companion harvest-status: {args.out} holds no manifest.json: not a harvest folder, or the "
              "harvest has not started", file=sys.stderr)
        return EXIT_REFUSED
    except (OSError, ValueError) as err:
        print(f"companion harvest-status: {_one_line(err)}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(info))
    else:
        print(f"{info['out']}: {info['status']}, {info['rows']:,} rows, {info['prompts']:,} prompts, "
              f"{info['shards']} of {info['shards_total']} shards")
        if info["missing_shards"]:
            print(f"missing shards: {', '.join(map(str, info['missing_shards']))}")
        for run in info["runs"]:
            print(f"run finished {run['finished']}: {run['world_size']} process(es), {run['rows']:,} rows")
        for held in info["locks"]:
            print(f"lock {held['file']}: held by pid {held['pid']} on {held['host']} since {held['since']}, "
                  f"last heartbeat {held['untouched_s']} s ago")
    return 0 if info["status"] == "complete" else 1
