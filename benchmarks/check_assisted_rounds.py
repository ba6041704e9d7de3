"""transformers' assisted generation against the rounds a harvest predicts, on real models.

Run from the repository root (the Qwen pair in float32 takes about 9.5 GB and 5 minutes on two cores)::

    python benchmarks/check_assisted_rounds.py                                  # Qwen pair, float32, 8 x 64
    python benchmarks/check_assisted_rounds.py --dtype bfloat16 --prompts 4 --tokens 32

It harvests the first ``--prompts`` chat requests (in the target's own chat template) for
``--tokens`` greedy steps with the preset's drafter, runs ``transformers``' assisted generation
(constant schedule, ``num_assistant_tokens`` = 4) on each, and compares them round for round
(:func:`companion.speculative.harvest_rounds.compare_runs`). It prints the comparison and exits 1
if, in float32, any prompt differs, or, in another dtype, any parting lies at no near tie of
:mod:`companion.harvest.ties`.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-coder")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.prompts < 1 or args.tokens < 2:
        parser.error("--prompts must be >= 1 and --tokens >= 2")

    import torch

    from companion.prompts.families import retemplated
    from companion.harvest import load_traces
    from companion.harvest.core import harvest
    from companion.models.loading import load_pair
    from companion.prompts.sets import load_prompts
    from companion.speculative.harvest_rounds import compare_runs, harvest_rows_by_prompt
    from companion.speculative.hf import hf_assisted_generate

    torch.set_num_threads(args.threads)
    target, drafter, tok = load_pair(args.preset, device="cpu", dtype=args.dtype)
    if drafter is None:
        parser.error(f"preset {args.preset!r} has no drafter")
    prompts = [p.text for p in retemplated(load_prompts("chat-requests")[: args.prompts], tok)]
    work = Path(tempfile.mkdtemp(prefix="check-rounds-"))
    try:
        t0 = time.perf_counter()
        harvest(target, drafter, tok, prompts, work / "h", n_steps=args.tokens, batch_size=args.prompts,
                progress=False, order="given", log=lambda m: None)
        harvest_s = time.perf_counter() - t0
        rows = harvest_rows_by_prompt(load_traces(work / "h"), range(len(prompts)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    t0 = time.perf_counter()
    runs = []
    for text in prompts:
        ids = tok(text, add_special_tokens=False).input_ids
        r = hf_assisted_generate(target, drafter, ids, policy="constant:4", max_new_tokens=args.tokens)
        runs.append((r.tokens.tolist(), r.accepted))
    assisted_s = time.perf_counter() - t0
    res = compare_runs(rows, runs, k=4, n=args.tokens, dtype=args.dtype)
    print(f"preset {args.preset}, {args.dtype}, {args.prompts} prompts x {args.tokens} tokens: harvest {harvest_s:.0f} s, "
          f"assisted generation {assisted_s:.0f} s; {res.identical} of {res.prompts} identical round for round "
          f"({res.rounds} rounds, {res.tokens} tokens); {len(res.divergences)} part, {res.unexplained} at no near tie")
    for line in res.details:
        print("  " + line)
    ok = res.identical == res.prompts if args.dtype == "float32" else res.unexplained == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
