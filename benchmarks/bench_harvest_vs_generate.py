"""Harvest throughput against transformers' own greedy ``generate``, on a real target.

Run from the repository root::

    python benchmarks/bench_harvest_vs_generate.py                        # Qwen2.5-Coder-1.5B, bf16, batch 16, 32 steps
    python benchmarks/bench_harvest_vs_generate.py --preset smollm2 --steps 64   # SmolLM2-135M, fp32
    python benchmarks/bench_harvest_vs_generate.py --threads 2

Both decode the same held-out chat requests greedily, for the same number of steps (no stop
at the end token), at the same batch size, dtype (the preset's: bfloat16 for the Qwen pair) and
number of torch threads (``--threads``, default 1), in one process, alternately:

* ``generate``: ``model.generate(..., do_sample=False, output_logits=True,
  return_dict_in_generate=True)``, which returns every step's logits and nothing else;
* ``harvest``: :func:`companion.harvest.harvest` without a drafter, which also reduces every
  step to its statistics and certificates (the paper's criteria, trees m = 1, 2, 4, 8) and
  writes them to Parquet.

Reported: steps per second of each (CPU time of this process, which one thread makes immune
to other jobs on the machine; wall time beside it), and their ratio (goal: harvest >= 0.9x
generate).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--preset", default="qwen2.5-coder", help="a model preset (default qwen2.5-coder)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()

    import torch

    from companion.harvest import harvest
    from companion.models.loading import load_pair
    from companion.prompts.sets import load_prompts

    torch.set_num_threads(args.threads)
    target, _, tok = load_pair(args.preset, False, device="cpu")
    dtype = str(target.dtype).removeprefix("torch.")
    prompts = load_prompts("chat-requests")[: args.batch]
    tok.padding_side = "left"  # generate needs the padding before the prompts (the harvest pads its own way)
    enc = tok([p.text for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    work = Path(tempfile.mkdtemp(prefix="bench-harvest-"))

    def run_generate() -> None:
        with torch.no_grad():
            target.generate(**enc, max_new_tokens=args.steps, do_sample=False, output_logits=True,
                            return_dict_in_generate=True, eos_token_id=None, pad_token_id=tok.pad_token_id)

    def run_harvest(i: int) -> None:
        harvest(target, None, tok, prompts, work / f"h{i}", n_steps=args.steps, batch_size=args.batch,
                stop_at_eos=False, progress=False, log=lambda m: None)

    times: dict[str, list[tuple[float, float]]] = {"generate": [], "harvest": []}
    for i in range(args.repeats):
        for name, fn in (("generate", run_generate), ("harvest", lambda: run_harvest(i))):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[name].append((time.process_time() - c0, time.perf_counter() - t0))
    shutil.rmtree(work, ignore_errors=True)
    steps = args.batch * args.steps
    cpu = {k: statistics.median(c for c, _ in v) for k, v in times.items()}
    wall = {k: statistics.median(w for _, w in v) for k, v in times.items()}
    print(f"preset {args.preset} (target alone), {dtype}, {args.threads} thread(s), batch {args.batch}, {args.steps} steps, "
          f"{args.repeats} repeats")
    for k in times:
        print(f"  {k:9s} {steps / cpu[k]:7.1f} steps/s (CPU time)   {steps / wall[k]:7.1f} steps/s (wall)")
    ratio = cpu["generate"] / cpu["harvest"]
    print(f"harvest / generate throughput: {ratio:.2f}x (CPU time; wall {wall['generate'] / wall['harvest']:.2f}x); "
          f"goal >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
