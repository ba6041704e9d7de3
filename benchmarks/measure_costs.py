"""Measure the cost model (c and V(k)) of a preset's pair at batch 1 and write it with its provenance.

    python benchmarks/measure_costs.py [--preset qwen2.5-coder] [--threads 2] [--kmax 16] [--repeats 30]
        [--context 0] [--out companion/assets/measured_costs/qwen2.5-coder.json]

Loads the preset's target and drafter with the project's loaders (CPU, the preset's dtype), sets
``--threads`` torch threads, and times, interleaved, ``--repeats`` times: one single-token drafter
forward, one single-token target forward and one target forward over ``k + 1`` tokens for
``k = 1 .. --kmax``, all with a warm KV cache of ``--context`` tokens (0: the median prompt of the
chapter's prompts plus 48, the middle of a 96-token answer) (``companion.speculative.
measure_cost_samples``). Prints c and every V(k) as median [min, max] over repeats of the paired
ratios, and writes every timing with the machine, threads, load averages, library versions and date
to ``--out``: chapter 10 reads that file as its cost model for the preset.
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
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kmax", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--context", type=int, default=0)
    ap.add_argument("--prompts", type=int, default=16, help="prompts whose median length sets the context")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    for name in ("threads", "kmax", "repeats", "prompts"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    import statistics

    import torch
    import transformers

    from companion.harvest.plan import load_planned, plan_harvest
    from companion.speculative.costs import measure_cost_samples

    torch.set_num_threads(args.threads)
    try:
        plan = plan_harvest(args.preset, n_prompts=args.prompts, seed=0)
        target, drafter, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    except (ValueError, FileNotFoundError, OSError) as err:
        print(f"error: cannot load preset {args.preset!r}: {err}", file=sys.stderr)
        return 2
    if drafter is None:
        print(f"error: preset {args.preset!r} has no drafter", file=sys.stderr)
        return 2
    lengths = [len(tok(p.text, add_special_tokens=False).input_ids) for p in prompts]
    context = args.context or int(statistics.median(lengths)) + 48
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    samples = measure_cost_samples(target, drafter, context=context, kmax=args.kmax, repeats=args.repeats)
    took = time.perf_counter() - t0
    load1 = os.getloadavg()
    model = samples.model()
    print(f"{args.preset}: {samples.repeats} repeats, {samples.threads} threads, context {context}, {took:.0f} s, "
          f"load {load0[0]:.2f} -> {load1[0]:.2f}")
    print(f"target one-token forward {model.target_s * 1e3:.1f} ms, drafter {model.drafter_s * 1e3:.1f} ms (medians)")
    lo, med, hi = samples.ratio_spread(None)
    print(f"c = {model.c:.3f} (paired ratios: median {med:.3f} [{lo:.3f}, {hi:.3f}])")
    for k in range(1, samples.kmax + 1):
        lo, med, hi = samples.ratio_spread(k)
        print(f"V({k:2d}) = {model.verify[k]:.3f} (paired: median {med:.3f} [{lo:.3f}, {hi:.3f}])")
    if args.out:
        dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
        record = {
            "preset": args.preset, "dtype": dtype, "batch": 1, "device": "cpu",
            "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
            "load_average_before_after": [round(load0[0], 2), round(load1[0], 2)],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "command": "python benchmarks/measure_costs.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "seconds": round(took, 1), "samples": samples.to_json(),
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
