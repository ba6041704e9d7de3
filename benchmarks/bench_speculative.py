"""Drafting policies compared on the embedded pair: forwards, acceptance, modelled cost and wall clock.

    python benchmarks/bench_speculative.py [--prompts 16] [--tokens 64] [--calib-prompts 8]
        [--threads 1] [--boot 2000] [--hf] [--quick] [--costs C,V1,DV]

1. Measures the cost model (``c`` = drafter/target single-token forward time, ``V(k)`` = cost of
   verifying ``k`` drafts) with the microbenchmark :func:`companion.speculative.measure_costs`,
   for reference.
2. Decodes each of the first ``--prompts`` prompts of the default set for ``--tokens`` tokens
   under transformers' built-ins (``constant:K`` for K in 0..8, the confidence threshold on a
   grid, the heuristic schedule), then fits the cost model on those runs' own rounds
   (:func:`companion.speculative.costs_from_results`: a round's wall time minus its drafter
   forwards is its target-side cost, the decoder's bookkeeping included): on a shared machine
   this is steadier than the microbenchmark and it predicts wall-clock time; it is the model
   every modelled cost below uses, unless ``--costs``
   pins one (the measured ratios move by tens of percent with the load of a shared machine).
3. Decodes the same prompts under the calibrated rule driven by the drafter-side certificate,
   by ``q(1)`` only and by ``q(1) - q(2)``, given the fitted ``c, v1, dv``. They start from a
   calibration warmed on ``--calib-prompts`` other prompts (the same snapshot for every
   evaluated prompt, so prompts stay independent) and keep calibrating online; the ``(cold)``
   row starts from the prior on every prompt.
4. Checks that every policy reproduced the target's greedy decoding token for token.
5. Prints per policy: target forwards / token, drafter forwards / token, mean accepted length
   per round, modelled cost / token, wall-clock tokens / s.
6. Paired bootstrap over prompts of the ratio of modelled cost per token, certificate over the
   best built-in policy (re-selected within every resample, so the baseline is tuned on the same
   prompts), and over transformers' defaults.
With ``--hf`` it also runs transformers' assisted generation for the built-ins and counts the
prompts on which it matched our decoder round for round.
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from companion.models.loading import load_pair
from companion.prompts.sets import load_prompts
from companion.speculative import (
    DEFAULTS,
    CostModel,
    builtin_policies,
    compare_policies,
    hf_agreement,
    measure_costs,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--calib-prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hf", action="store_true", help="also run transformers' assisted generation for the built-ins")
    ap.add_argument("--quick", action="store_true", help="a smaller grid of built-in policies")
    ap.add_argument("--costs", metavar="C,V1,DV", default=None,
                    help="pin the cost model instead of fitting it: c and V(k) = V1 + DV (k - 1) for k >= 1, "
                         "e.g. 0.28,1.4,0.025 (c = 0.28, V(5) = 1.5)")
    args = ap.parse_args(argv)
    for name in ("prompts", "tokens", "threads", "boot"):
        if getattr(args, name) < 1:
            print(f"error: --{name} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.calib_prompts < 0:
        print(f"error: --calib-prompts must be >= 0, got {args.calib_prompts}", file=sys.stderr)
        return 2
    pinned = None
    if args.costs is not None:
        try:
            c_pin, v1_pin, dv_pin = (float(x) for x in args.costs.split(","))
            pinned = CostModel(c=c_pin, verify=(1.0,) + tuple(v1_pin + dv_pin * (k - 1) for k in range(1, 41)))
        except ValueError as err:
            print(f"error: --costs must be three numbers C,V1,DV with C >= 0, got {args.costs!r} ({err})", file=sys.stderr)
            return 2
    torch.set_num_threads(args.threads)
    target, drafter, tok = load_pair("default")
    prompts = load_prompts("default")
    if args.prompts + args.calib_prompts > len(prompts):
        print(f"error: {args.prompts} + {args.calib_prompts} prompts asked, the default set has {len(prompts)}",
              file=sys.stderr)
        return 2
    encode = [tok(p.text, return_tensors="pt").input_ids for p in prompts[: args.prompts + args.calib_prompts]]
    evals, calib = encode[: args.prompts], encode[args.prompts:]
    context = int(np.mean([x.shape[1] for x in evals])) + args.tokens // 2

    t0 = time.perf_counter()
    micro = measure_costs(target, drafter, context=context, kmax=20, repeats=30)
    print(f"microbenchmark at {context} cached tokens: target forward {micro.target_s * 1e3:.2f} ms, drafter "
          f"{micro.drafter_s * 1e3:.2f} ms, c = {micro.c:.3f}; V(0..20) = "
          + " ".join(f"{v:.2f}" for v in micro.verify) + f"  [{time.perf_counter() - t0:.0f} s]")

    builtins = builtin_policies(args.quick)
    t0 = time.perf_counter()
    cmp = compare_policies(target, drafter, evals, calib, max_new_tokens=args.tokens, builtins=builtins, costs=pinned)
    fitted = cmp.fitted
    v1, dv = fitted.affine()
    print(f"cost model fitted on the built-ins' own rounds{'' if pinned else ' (used below)'}: target forward "
          f"{fitted.target_s * 1e3:.2f} ms, drafter {fitted.drafter_s * 1e3:.2f} ms, c = {fitted.c:.3f}; "
          f"V(0..{len(fitted.verify) - 1}) = " + " ".join(f"{v:.2f}" for v in fitted.verify)
          + f"; affine fit V(k) = {v1:.3f} + {dv:.4f} (k - 1)")
    if pinned is not None:
        print(f"pinned cost model (used below): c = {c_pin:g}, V(k) = {v1_pin:g} + {dv_pin:g} (k - 1), "
              f"V(5) = {pinned.verify[5]:.3f}")
    print(f"decoded {len(evals)} prompts x {len(cmp.policies)} policies in {time.perf_counter() - t0:.0f} s "
          f"({args.calib_prompts} calibration prompts warm the calibrated policies; '(cold)' starts from the prior "
          "on every prompt)")

    print(f"\n{'policy':<22} {'target/tok':>10} {'drafter/tok':>11} {'mean acc':>9} {'cost/tok':>9} {'tok/s':>7}")
    for r in cmp.summaries():
        print(f"{r.policy:<22} {r.target_per_token:>10.3f} {r.drafter_per_token:>11.3f} {r.mean_accepted:>9.3f} "
              f"{r.cost_per_token:>9.4f} {r.tokens_per_s:>7.1f}")
    print("lossless: every policy reproduced the target's greedy decoding" if cmp.lossless
          else f"NOT lossless: {', '.join(cmp.lossless_failures)}")

    print(f"\nbest built-in on these prompts: {cmp.best_builtin()}; paired bootstrap over {len(evals)} prompts, "
          f"{args.boot} resamples, 95% interval of the cost-per-token ratio")
    for name in cmp.policies[len(builtins):]:
        parts = []
        for label, den in (("best built-in", builtins), *((d, [d]) for d in DEFAULTS if d in builtins)):
            e = cmp.ratio(name, den, n_boot=args.boot, seed=args.seed)
            parts.append(f"vs {label}: {e.point:.3f} [{e.lo:.3f}, {e.hi:.3f}]")
        print(f"{name:<22} " + "; ".join(parts))
    for other in ("top1", "margin"):
        if other in cmp.results:
            e = cmp.ratio("certificate", [other], n_boot=args.boot, seed=args.seed)
            print(f"certificate vs {other}: {e.point:.3f} [{e.lo:.3f}, {e.hi:.3f}]")

    if args.hf:
        hf = hf_agreement(target, drafter, evals, builtins, max_new_tokens=args.tokens)
        print(f"\ntransformers' assisted generation: {hf.matched}/{hf.total} (prompt, policy) runs identical round for "
              f"round; its wall clock {hf.tokens_per_s:.1f} tok/s over the built-ins")
    return 0 if cmp.lossless else 1


if __name__ == "__main__":
    sys.exit(main())
