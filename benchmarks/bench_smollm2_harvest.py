"""Harvest throughput on SmolLM2-135M-Instruct against transformers' own greedy ``generate``.

Run from the repository root (about 5 minutes on one core of a shared machine)::

    python benchmarks/bench_smollm2_harvest.py                 # batch 16, 64 steps, 2 repeats each
    python benchmarks/bench_smollm2_harvest.py --batch 32 --steps 128

Both decode the same held-out chat requests greedily, for the same number of steps (no stop
at ``<|im_end|>``), at the same batch size, on one torch thread, in one process, alternately:

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
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    from companion.harvest import harvest
    from companion.models import load_pair
    from companion.prompts import load_prompts

    torch.set_num_threads(1)
    target, _, tok = load_pair("smollm2", False, device="cpu", dtype="float32")
    prompts = load_prompts("chat-requests")[: args.batch]
    enc = tok([p.text for p in prompts], return_tensors="pt", padding=True, add_special_tokens=False)
    work = Path(tempfile.mkdtemp(prefix="bench-smollm2-"))

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
    print(f"SmolLM2-135M-Instruct, fp32, 1 thread, batch {args.batch}, {args.steps} steps, {args.repeats} repeats")
    for k in times:
        print(f"  {k:9s} {steps / cpu[k]:7.1f} steps/s (CPU time)   {steps / wall[k]:7.1f} steps/s (wall)")
    ratio = cpu["generate"] / cpu["harvest"]
    print(f"harvest / generate throughput: {ratio:.2f}x (CPU time; wall {wall['generate'] / wall['harvest']:.2f}x); "
          f"goal >= 0.9x: {'met' if ratio >= 0.9 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
