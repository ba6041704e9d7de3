"""Measure where a preset's target can change its greedy token between kernel paths, and write the record.

    python benchmarks/measure_kernel_paths.py [--preset qwen2.5-coder] [--prompts 24] [--steps 128] [--k 4]
        [--batch 16] [--threads 2] [--out companion/assets/kernel_paths/qwen2.5-coder.json]

Loads the preset's target with the project's loaders (CPU, the preset's dtype), greedy-decodes
``--steps`` tokens from each of the first ``--prompts`` prompts of the preset's selection at batch 1,
and reads the same answers along three more paths (verification forwards of ``--k + 1`` tokens, one
forward over the whole text, the prompts left-padded in batches of ``--batch``):
:func:`companion.harvest.kernel_paths.measure_kernel_paths`. Prints every flip (two paths choosing
different greedy tokens) with both top-2 gaps in ulps, and writes every path's rows with the
machine, threads, library versions and date to ``--out``; the book reads that file to justify the
certificates' tie band (:data:`companion.certify.precision.TIE_ULPS`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-coder")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="drafts per verification forward (it reads k + 1 tokens)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    for name in ("prompts", "steps", "k", "batch", "threads"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    import torch
    import transformers
    from tqdm.auto import tqdm

    from companion.atomic import write_text
    from companion.harvest.core import resolve_eos
    from companion.harvest.kernel_paths import band_check, compare, measure_kernel_paths
    from companion.harvest.plan import load_planned, plan_harvest

    torch.set_num_threads(args.threads)
    try:
        plan = plan_harvest(args.preset, n_prompts=args.prompts, seed=0, no_drafter=True)
        target, _, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"error: cannot load preset {args.preset!r}: {err}", file=sys.stderr)
        return 2
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    eos = resolve_eos(target, tok, None)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    t0 = time.perf_counter()
    with tqdm(total=len(ids) + -(-len(ids) // args.batch), desc="kernel paths", unit="pass") as bar:
        got = measure_kernel_paths(target, ids, args.steps, k=args.k, batch_size=args.batch, pad_id=pad,
                                   eos_ids=eos, on_prompt=lambda _: bar.update(1))
    took = time.perf_counter() - t0
    flips, moves = compare(got["paths"], dtype)
    check = band_check(got["paths"], dtype)
    print(f"{args.preset} ({dtype}): {check.steps} steps of {len(ids)} answers in {took:.0f} s; "
          f"{check.flips} flips, widest top-2 gap at a flip {check.widest_flip_ulps:g} ulps, "
          f"band {check.band_ulps:g} ulps covers {'all' if check.covers else f'all but {check.outside}'}")
    for f in flips:
        print(f"  flip {f.a}/{f.b} at step {f.step}: gaps {f.gap_ulps_a:g} and {f.gap_ulps_b:g} ulps")
    for pair, m in moves.items():
        print(f"  {pair}: top logit moved at most {m['top1_max']:g} ulps (p99 {m['top1_p99']:g}), "
              f"top-2 gap at most {m['gap_max']:g} ulps")
    if args.out:
        record = {
            "preset": args.preset, "dtype": dtype, "device": "cpu", "threads": args.threads,
            "prompt_ids": [p.prompt_id for p in prompts], "steps": args.steps, "k": args.k, "batch": args.batch,
            "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "command": "python benchmarks/measure_kernel_paths.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seconds": round(took, 1), "lengths": got["lengths"],
            "paths": {name: rows.to_json() for name, rows in got["paths"].items()},
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        write_text(Path(args.out), json.dumps(record) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
