"""``companion harvest``: per-step traces of a target (and drafter) along greedy decoding.

Examples::

    companion harvest --out traces/default                        # embedded pair, CPU
    companion harvest --preset paper-qwen3-4b --out traces/qwen3-4b   # CUDA, bf16
    accelerate launch --num_processes 4 -m companion harvest --preset paper-qwen3-4b --out traces/qwen3-4b

Rerunning the same command resumes an interrupted harvest; a different configuration into the
same ``--out`` is refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from companion.harvest.presets import PRESETS


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``harvest`` subcommand."""
    p = subparsers.add_parser(
        "harvest",
        help="greedy-decode prompts and record every step's certificates, KL, acceptance (Parquet + manifest)",
        description="Greedy-decode every prompt with the target, run the drafter teacher-forced on the same "
                    "prefixes, and write one row per step (top-k, margin, entropy, certificates of every criterion "
                    "and tree width, KL both ways, TV, acceptance and certification of the drafter's token) to "
                    "Parquet shards with a JSON manifest. Rerun the same command to resume. Under `accelerate "
                    "launch` or `torchrun` the prompts are split across processes.",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory (created; resumed if it holds this harvest)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="default",
                   help="models, prompts and settings (default: default, the embedded CPU pair)")
    p.add_argument("--target", help="target model: hub id or local folder (overrides the preset)")
    p.add_argument("--drafter", help="drafter model: hub id or local folder (overrides the preset)")
    p.add_argument("--no-drafter", action="store_true", help="target-side statistics only (the paper's setting)")
    p.add_argument("--tokenizer", help="tokenizer (default: the preset's, else the target's)")
    p.add_argument("--prompts", help="prompt set: a name (default) or a JSONL file in companion.prompts format, used verbatim")
    p.add_argument("--ultrachat", type=Path,
                   help="UltraChat-200k train_sft as local Parquet file(s) or JSONL, instead of the `datasets` library")
    p.add_argument("--n-prompts", type=int, help="number of prompts (default: the preset's; for a prompt set: its first N)")
    p.add_argument("--min-prompt-tokens", type=int, help="UltraChat selection: minimum templated prompt length")
    p.add_argument("--enable-thinking", action="store_true", help="UltraChat: Qwen3 thinking mode on (default off)")
    p.add_argument("--write-prompts", type=Path, help="also save the prompt set used as JSONL (to reuse with --prompts)")
    p.add_argument("--steps", type=int, help="greedy steps per prompt (default: the preset's, 128)")
    p.add_argument("--criteria", action="append", metavar="SPECS",
                   help="criterion specs, ';'-separated or repeated (default: the paper's: "
                        "greedy;additive:0.3;multiplicative:0.1;typical:0.09,0.3;topk-delta:10,0.6;topm:4)")
    p.add_argument("--tree-widths", type=_csv_ints, help="tree widths m, comma-separated (default 1,2,4,8)")
    p.add_argument("--top-k", type=int, default=64, help="target probabilities kept per step (default 64)")
    p.add_argument("--batch-size", type=int, help="prompts per batch (default 32 on CUDA, 8 on the CPU)")
    p.add_argument("--prompts-per-shard", type=int, help="prompts per Parquet shard (default: the batch size)")
    p.add_argument("--chunk-steps", type=int, help="steps reduced to statistics at a time (default: ~256 rows on CUDA, 1 on CPU)")
    p.add_argument("--device", help="cuda, cuda:1, cpu (default: CUDA when present; one GPU per process when launched)")
    p.add_argument("--dtype", help="bfloat16, float16, float32 (default: bfloat16 on CUDA, float32 on the CPU)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, help="seed of the prompt sample (default: the preset's, 0)")
    p.add_argument("--no-stop-at-eos", action="store_true", help="decode all steps even past an EOS token")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_harvest)


def cmd_harvest(args: argparse.Namespace) -> int:
    import torch

    from companion.harvest import presets as pr
    from companion.harvest.core import distributed_context, harvest
    from companion.harvest.store import HarvestConfigError
    from companion.models import WeightsUnavailableError, load_pair, resolve_dtype
    from companion.prompts import dumps_prompts, load_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    preset = pr.get_preset(args.preset)
    dist = distributed_context()
    device = _device(args.device, dist.local_rank, dist.world)
    dtype = resolve_dtype(args.dtype, device)
    seed = preset.seed if args.seed is None else args.seed

    needed = []
    if preset.target == "default" and not args.target:
        needed.append("target")
    if preset.drafter == "default" and not (args.drafter or args.no_drafter or args.target):
        needed.append("drafter")
    if preset.prompts == "default" and not args.prompts:
        needed.append("prompts")
    try:
        pr.check_default_assets(needed)
    except FileNotFoundError as err:
        print(f"companion harvest: {err}", file=sys.stderr)
        return 2
    drafter = None if args.no_drafter else (args.drafter or preset.drafter)
    target_name = args.target or preset.target
    tokenizer_name = args.tokenizer or preset.tokenizer
    try:
        if target_name == "default" and drafter == "default":
            drafter = None  # load_pair("default") brings the embedded drafter
            target, draft_model, tokenizer = load_pair("default", tokenizer=tokenizer_name, device=device, dtype=dtype)
            if args.no_drafter:
                draft_model = None
        else:
            if drafter == "default":
                drafter = None
            target, draft_model, tokenizer = load_pair(target_name, drafter, tokenizer_name, device=device, dtype=dtype)
    except (WeightsUnavailableError, ValueError, FileNotFoundError) as err:
        # missing weights offline, mismatched tokenizers, bad paths: a message, not a traceback
        print(f"companion harvest: {err}", file=sys.stderr)
        return 2

    # Prompts.
    if args.prompts:
        prompts = load_prompts(args.prompts)
        name = args.prompts
    elif preset.prompts == "ultrachat":
        try:
            rows = pr.ultrachat_rows(args.ultrachat)
            prompts = pr.select_ultrachat_prompts(
                rows, tokenizer, n=args.n_prompts or preset.n_prompts or 500,
                min_tokens=preset.min_prompt_tokens if args.min_prompt_tokens is None else args.min_prompt_tokens,
                seed=seed, enable_thinking=args.enable_thinking or preset.enable_thinking)
        except pr.PromptsUnavailableError as err:
            print(f"companion harvest: {err}", file=sys.stderr)
            return 2
        name = f"{pr.ULTRACHAT}:{pr.ULTRACHAT_SPLIT}"
    else:
        prompts = load_prompts(preset.prompts)
        name = preset.prompts
    if args.n_prompts and (args.prompts or preset.prompts != "ultrachat"):
        prompts = prompts[: args.n_prompts]
        name = f"{name}[:{args.n_prompts}]"
    if args.write_prompts and dist.is_main:
        args.write_prompts.write_text(dumps_prompts(prompts), encoding="utf-8")

    criteria = _criteria(args.criteria) or list(preset.criteria)
    try:
        manifest = _run(harvest, target, draft_model, tokenizer, prompts, args, criteria, preset, seed, name)
    except (HarvestConfigError, ValueError) as err:
        print(f"companion harvest: {err}", file=sys.stderr)
        return 2
    if dist.is_main:
        totals = manifest["totals"]
        print(json.dumps({"out": str(args.out), "status": manifest["status"], **totals}))
    return 0 if manifest["status"] == "complete" else 1


def _run(harvest, target, draft_model, tokenizer, prompts, args, criteria, preset, seed, name):
    return harvest(
        target, draft_model, tokenizer, prompts, args.out,
        criteria=criteria,
        tree_widths=args.tree_widths or list(preset.tree_widths),
        n_steps=args.steps or preset.n_steps,
        batch_size=args.batch_size,
        prompts_per_shard=args.prompts_per_shard,
        chunk_steps=args.chunk_steps,
        top_k=args.top_k,
        stop_at_eos=not args.no_stop_at_eos,
        seed=seed,
        prompt_set_name=name,
        extra={"preset": preset.name, "enable_thinking": args.enable_thinking or preset.enable_thinking},
        progress=not args.no_progress,
    )


def _criteria(values: list[str] | None) -> list[str]:
    if not values:
        return []
    return [s.strip() for v in values for s in v.split(";") if s.strip()]


def _device(requested: str | None, local_rank: int, world: int):
    """The device of this process: as requested, else CUDA (one GPU per local rank) when present, else CPU."""
    import torch

    if requested is None:
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
    dev = torch.device(requested)
    if dev.type == "cuda" and dev.index is None and world > 1:
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return dev
