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
from dataclasses import dataclass

import numpy as np
import torch

from companion.models import load_pair
from companion.prompts import load_prompts
from companion.speculative import (
    CostModel,
    Policy,
    SpeculativeResult,
    costs_from_results,
    generate,
    hf_assisted_generate,
    measure_costs,
    modelled_cost,
    parse_policy,
)

CONFIDENCE_GRID = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
DEFAULTS = ("confidence:0.4", "heuristic:20,0.4")  # transformers 4.57 out of the box; its heuristic with 0.4 kept


@dataclass
class Row:
    tokens: int
    target_forwards: int
    drafter_forwards: int
    accepted: int
    rounds: int
    cost: float
    wall: float


def builtin_policies(quick: bool) -> list[str]:
    ks = (0, 2, 3, 4, 5) if quick else tuple(range(9))
    grid = (0.2, 0.4, 0.6) if quick else CONFIDENCE_GRID
    return ([f"constant:{k}" for k in ks] + [f"confidence:{t}" for t in grid]
            + ["heuristic", "heuristic:5", "heuristic:20,0.4"])


def calibrated_policies() -> list[str]:
    return ["certificate", "top1", "margin", "certificate:cal=kl"]


def bootstrap_ratio(costs: dict[str, np.ndarray], tokens: np.ndarray, num: str, den: list[str],
                    n_boot: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """Point estimate and 95% percentile interval of ``rate(num) / min_b rate(b)``, resampling prompts."""
    def ratio(idx: np.ndarray) -> float:
        t = tokens[idx].sum()
        best = min(costs[b][idx].sum() / t for b in den)
        return costs[num][idx].sum() / t / best
    n = len(tokens)
    point = ratio(np.arange(n))
    boots = np.array([ratio(rng.integers(0, n, n)) for _ in range(n_boot)])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return point, float(lo), float(hi)


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
    calibrated = calibrated_policies()
    results: dict[str, list[SpeculativeResult]] = {}
    reference: list[torch.Tensor] = []
    lossless_failures: list[str] = []

    def record(name: str, i: int, r: SpeculativeResult) -> None:
        results.setdefault(name, []).append(r)
        if name == "constant:0":
            reference.append(r.tokens)
        elif not torch.equal(r.tokens, reference[i]):
            lossless_failures.append(f"{name} on prompt {i}")

    t0 = time.perf_counter()
    for i, ids in enumerate(evals):  # phase 1: the built-ins (constant:0 first: the reference)
        for spec in builtins:
            record(spec, i, generate(target, drafter, ids, policy=spec, max_new_tokens=args.tokens))
    fitted = costs_from_results([r for spec in builtins for r in results[spec]])
    knobs = fitted.policy_defaults()
    print(f"cost model fitted on the built-ins' own rounds{'' if pinned else ' (used below)'}: target forward "
          f"{fitted.target_s * 1e3:.2f} ms, drafter {fitted.drafter_s * 1e3:.2f} ms, c = {fitted.c:.3f}; "
          f"V(0..{len(fitted.verify) - 1}) = " + " ".join(f"{v:.2f}" for v in fitted.verify)
          + f"; affine fit V(k) = {knobs['v1']:.3f} + {knobs['dv']:.4f} (k - 1)")
    costs = fitted
    if pinned is not None:
        costs = pinned
        knobs = {"c": c_pin, "v1": v1_pin, "dv": dv_pin}
        print(f"pinned cost model (used below): c = {c_pin:g}, V(k) = {v1_pin:g} + {dv_pin:g} (k - 1), "
              f"V(5) = {pinned.verify[5]:.3f}")

    warmed: dict[str, Policy] = {}
    for spec in calibrated:  # phase 2: the calibrated rule, given the fitted costs
        pol = parse_policy(spec, **knobs)
        for ids in calib:
            generate(target, drafter, ids, policy=pol, max_new_tokens=args.tokens)
        warmed[spec] = pol
    for i, ids in enumerate(evals):
        for spec in calibrated:
            record(spec.replace(":cal=kl", " (kl)"), i,
                   generate(target, drafter, ids, policy=warmed[spec].fresh(), max_new_tokens=args.tokens))
        record("certificate (cold)", i,
               generate(target, drafter, ids, policy=parse_policy("certificate", **knobs), max_new_tokens=args.tokens))
    names = list(results)
    print(f"decoded {len(evals)} prompts x {len(names)} policies in {time.perf_counter() - t0:.0f} s "
          f"({args.calib_prompts} calibration prompts warm the calibrated policies; '(cold)' starts from the prior "
          "on every prompt)")
    rows = {name: [Row(len(r.tokens), r.target_forwards, r.drafter_forwards, sum(r.accepted), r.rounds,
                       modelled_cost(r, costs) * len(r.tokens), r.timings.wall_s) for r in rs]
            for name, rs in results.items()}

    print(f"\n{'policy':<22} {'target/tok':>10} {'drafter/tok':>11} {'mean acc':>9} {'cost/tok':>9} {'tok/s':>7}")
    for name in names:
        rs = rows[name]
        n_tok = sum(r.tokens for r in rs)
        print(f"{name:<22} {sum(r.target_forwards for r in rs) / n_tok:>10.3f} "
              f"{sum(r.drafter_forwards for r in rs) / n_tok:>11.3f} "
              f"{sum(r.accepted for r in rs) / sum(r.rounds for r in rs):>9.3f} "
              f"{sum(r.cost for r in rs) / n_tok:>9.4f} {n_tok / sum(r.wall for r in rs):>7.1f}")
    print("lossless: every policy reproduced the target's greedy decoding" if not lossless_failures
          else f"NOT lossless: {', '.join(lossless_failures)}")

    tokens = np.array([r.tokens for r in rows["constant:0"]], dtype=float)
    cost_arr = {name: np.array([r.cost for r in rows[name]]) for name in names}
    best = min(builtins, key=lambda b: cost_arr[b].sum())
    rng = np.random.default_rng(args.seed)
    print(f"\nbest built-in on these prompts: {best}; paired bootstrap over {len(evals)} prompts, {args.boot} resamples, "
          "95% interval of the cost-per-token ratio")
    for name in names[len(builtins):]:
        parts = []
        for label, den in (("best built-in", builtins), *((d, [d]) for d in DEFAULTS if d in builtins)):
            point, lo, hi = bootstrap_ratio(cost_arr, tokens, name, den, args.boot, rng)
            parts.append(f"vs {label}: {point:.3f} [{lo:.3f}, {hi:.3f}]")
        print(f"{name:<22} " + "; ".join(parts))
    for other in ("top1", "margin"):
        if other in cost_arr:
            point, lo, hi = bootstrap_ratio(cost_arr, tokens, "certificate", [other], args.boot, rng)
            print(f"certificate vs {other}: {point:.3f} [{lo:.3f}, {hi:.3f}]")

    if args.hf:
        matched, total, hf_wall, hf_tok = 0, 0, 0.0, 0
        for ids in evals:
            for spec in builtins:
                ours = generate(target, drafter, ids, policy=spec, max_new_tokens=args.tokens)
                theirs = hf_assisted_generate(target, drafter, ids, policy=spec, max_new_tokens=args.tokens)
                total += 1
                hf_wall += theirs.timings.wall_s
                hf_tok += len(theirs.tokens)
                matched += (ours.accepted == theirs.accepted and ours.submitted == theirs.submitted
                            and torch.equal(ours.tokens, theirs.tokens))
        print(f"\ntransformers' assisted generation: {matched}/{total} (prompt, policy) runs identical round for round; "
              f"its wall clock {hf_tok / hf_wall:.1f} tok/s over the built-ins")
    return 0 if not lossless_failures else 1


if __name__ == "__main__":
    sys.exit(main())
