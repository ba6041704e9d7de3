"""Wall clock of speculative decoding on a preset's pair: plain greedy, transformers' assisted generation, ours.

    python benchmarks/bench_wallclock.py [--preset qwen2.5-coder] [--threads 2] [--prompts 3] [--tokens 64]
        [--repeats 2] [--calib-prompts 2] [--costs companion/assets/measured_costs/qwen2.5-coder.json]
        [--out companion/assets/measured_costs/qwen2.5-coder_wallclock.json]

Batch 1, the preset's dtype, on the CPU with ``--threads`` torch threads. Prompts are those of the
book's chapters (``plan_harvest``): the first ``--prompts`` are held out (chapter 10's evaluated
prompts 0, 1, ...) and the ``--calib-prompts`` after the 14 evaluated ones are chapter 10's
calibration prompts.

1. The cost model is the measured one of ``--costs`` (``benchmarks/measure_costs.py``): ``c`` and
   ``V(k)``, medians over its repeats.
2. On the calibration prompts the target's greedy answers are recorded with the drafter's chains
   (``record_many``), every built-in of chapter 10's grid is replayed and priced with that cost
   model, and the cheapest is *the best built-in* (``heldout.choose_builtin``); the certificate rule
   (given the cost model's ``c`` and ``V``) is warmed on the same recordings, and each held-out
   prompt starts from a copy of that warm state.
3. On every held-out prompt, ``--repeats`` times, the modes run one after the other in an order
   rotated per prompt and repeat: ``plain`` (the target's ``generate``, greedy, no assistant),
   ``hf default`` (assisted generation with the drafter, transformers' default schedule
   ``confidence:0.4``), ``hf best`` (assisted generation under the best built-in), ``ours certificate``
   (``companion.speculative.generate`` under the certificate rule) and ``ours best`` (our decoder
   under the best built-in, to compare the two decoders' per-round overheads), all for the same
   ``--tokens`` new tokens (fewer where the greedy answer ends).
4. Prints per mode tokens/s (total tokens over total seconds), and per mode the ratio of its
   tokens/s to another mode's, as the geometric mean over the (prompt, repeat) pairs, each pair
   timed back to back, with the min and max pair and a 95 % bootstrap interval over pairs; beside
   it the modelled speed-up, plain decoding's cost (one target forward per token) over the mode's
   modelled cost per token (``modelled_cost``). Writes everything with its provenance to ``--out``.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

MODES = ("plain", "hf default", "hf best", "ours certificate", "ours best")
HF_DEFAULT = "confidence:0.4"
DEFAULT_COSTS = "companion/assets/measured_costs/qwen2.5-coder.json"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-coder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--calib-prompts", type=int, default=2)
    ap.add_argument("--n-eval", type=int, default=14, help="chapter 10's evaluated prompts; calibration follows them")
    ap.add_argument("--costs", default=DEFAULT_COSTS)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    for name in ("threads", "prompts", "tokens", "repeats", "calib_prompts"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    modes = [m.strip() for m in args.modes.split(",")]
    if "plain" not in modes or any(m not in MODES for m in modes):
        print(f"error: --modes must include plain and name only {', '.join(MODES)}, got {args.modes!r}", file=sys.stderr)
        return 2
    if args.prompts > args.n_eval:
        print(f"error: --prompts ({args.prompts}) must be at most --n-eval ({args.n_eval})", file=sys.stderr)
        return 2
    try:
        measurement = json.loads(Path(args.costs).read_text())
    except (OSError, ValueError) as err:
        print(f"error: cannot read the cost measurement {args.costs!r}: {err}", file=sys.stderr)
        return 2

    import torch
    import transformers

    from companion.harvest.plan import load_planned, plan_harvest
    from companion.speculative import fits, generate, grid_builtins, hf_assisted_generate, modelled_cost
    from companion.speculative import parse_policy, record_many, replay
    from companion.speculative.clock import paired_ratio
    from companion.speculative.costs import CostSamples
    from companion.speculative.heldout import choose_builtin

    try:
        samples = CostSamples.from_json(measurement["samples"])
    except (KeyError, ValueError) as err:
        print(f"error: {args.costs!r} is not a cost measurement of benchmarks/measure_costs.py: {err}", file=sys.stderr)
        return 2
    costs = samples.model()
    torch.set_num_threads(args.threads)
    plan = plan_harvest(args.preset, n_prompts=args.n_eval + args.calib_prompts, seed=0)
    target, drafter, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    if drafter is None:
        print(f"error: preset {args.preset!r} has no drafter", file=sys.stderr)
        return 2
    encode = [tok(p.text, return_tensors="pt", add_special_tokens=False).input_ids for p in prompts]
    held, calib = encode[:args.prompts], encode[args.n_eval:args.n_eval + args.calib_prompts]
    load = [os.getloadavg()[0]]

    t0 = time.perf_counter()
    builtins = grid_builtins()
    calib_chains = record_many(target, drafter, calib, max_new_tokens=args.tokens, max_drafts=24,
                               enough=lambda ch: fits(ch, builtins))
    best, calib_cost = choose_builtin(calib_chains, builtins, costs)
    warm = parse_policy("certificate", **costs.policy_defaults())
    for ch in calib_chains:
        replay(ch, warm)
    print(f"calibration: {len(calib_chains)} prompts recorded and replayed in {time.perf_counter() - t0:.0f} s; "
          f"best built-in {best} ({calib_cost[best]:.3f} target forwards/token modelled; "
          f"{HF_DEFAULT} {calib_cost[HF_DEFAULT]:.3f}); certificate rule {warm}", flush=True)

    def run(mode: str, ids, tokens: int):
        if mode == "plain":
            config = copy.deepcopy(target.generation_config)
            config.do_sample, config.max_new_tokens = False, tokens
            with torch.inference_mode():
                start = time.perf_counter()
                out = target.generate(ids, generation_config=config)
                wall = time.perf_counter() - start
            return {"tokens": int(out.shape[1] - ids.shape[1]), "wall_s": wall, "modelled": 1.0,
                    "ids": out[0, ids.shape[1]:].tolist()}
        if mode.startswith("hf"):
            r = hf_assisted_generate(target, drafter, ids, policy=HF_DEFAULT if mode == "hf default" else best,
                                     max_new_tokens=tokens)
        else:
            r = generate(target, drafter, ids, policy=warm.fresh() if mode == "ours certificate" else best,
                         max_new_tokens=tokens)
        return {"tokens": len(r.tokens), "wall_s": r.timings.wall_s, "modelled": modelled_cost(r, costs),
                "ids": r.tokens.tolist(), "rounds": r.rounds, "mean_accepted": r.mean_accepted,
                "drafter_forwards": r.drafter_forwards,
                "target_s": r.timings.target_s, "drafter_s": r.timings.drafter_s,
                "overhead_s": r.timings.wall_s - r.timings.target_s - r.timings.drafter_s}

    # warm-up: one short run per mode (first calls allocate and compile kernels)
    for mode in modes:
        run(mode, held[0], 4)
    runs = []
    for rep in range(args.repeats):
        for i, ids in enumerate(held):
            shift = (rep + i) % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                la = os.getloadavg()[0]
                r = run(mode, ids, args.tokens)
                r.update(mode=mode, prompt=i, repeat=rep, load=la)
                runs.append(r)
                load.append(la)
                print(f"repeat {rep} prompt {i} {mode:17s} {r['tokens']:3d} tokens {r['wall_s']:6.1f} s "
                      f"{r['tokens'] / r['wall_s']:5.2f} tok/s  modelled {r['modelled']:.3f}/token  load {la:.2f}",
                      flush=True)
    # lossless: every mode's text is the target's greedy text (bfloat16 may part at near ties: counted)
    plain_ids = {(r["prompt"], r["repeat"]): r["ids"] for r in runs if r["mode"] == "plain"}
    differ = sorted({(r["mode"], r["prompt"]) for r in runs if r["ids"] != plain_ids[(r["prompt"], r["repeat"])]})
    speed = {m: sum(r["tokens"] for r in runs if r["mode"] == m) / sum(r["wall_s"] for r in runs if r["mode"] == m)
             for m in modes}
    modelled = {m: sum(r["modelled"] * r["tokens"] for r in runs if r["mode"] == m)
                / sum(r["tokens"] for r in runs if r["mode"] == m) for m in modes}
    key = {(r["mode"], r["prompt"], r["repeat"]): r["tokens"] / r["wall_s"] for r in runs}
    pairs = [(i, rep) for rep in range(args.repeats) for i in range(len(held))]

    def ratio(a: str, b: str) -> dict[str, float]:
        return paired_ratio([key[(a, i, rep)] for i, rep in pairs], [key[(b, i, rep)] for i, rep in pairs])

    ratios = {f"{m} / plain": ratio(m, "plain") for m in modes if m != "plain"}
    for a, b in (("ours certificate", "hf best"), ("ours certificate", "hf default"), ("ours best", "hf best")):
        if a in modes and b in modes:
            ratios[f"{a} / {b}"] = ratio(a, b)
    print(f"\n{args.preset}, batch 1, {str(next(target.parameters()).dtype).removeprefix('torch.')}, "
          f"{torch.get_num_threads()} threads, {len(held)} held-out prompts x {args.tokens} tokens x {args.repeats} "
          f"repeats; load average during runs {min(load):.2f} .. {max(load):.2f}")
    print(f"cost model: c = {costs.c:.3f}, V(1) = {costs.verify[1]:.3f}, V(4) = {costs.verify_cost(4):.3f}, "
          f"V(8) = {costs.verify_cost(8):.3f}, V(16) = {costs.verify_cost(16):.3f}")
    for m in modes:
        line = f"{m:17s} {speed[m]:5.2f} tok/s, modelled {modelled[m]:.3f} target forwards/token"
        if m != "plain":
            q = ratios[f"{m} / plain"]
            line += (f"; x plain: measured {q['geomean']:.3f} [{q['lo']:.3f}, {q['hi']:.3f}] "
                     f"(pairs {q['min']:.3f} .. {q['max']:.3f}), modelled {1 / modelled[m]:.3f}")
        print(line)
    for m in modes[1:]:
        mine = [r for r in runs if r["mode"] == m]
        print(f"{m:17s} outside the models' forwards: {1e3 * sum(r['overhead_s'] for r in mine) / sum(r['rounds'] for r in mine):.1f} "
              f"ms per round ({100 * sum(r['overhead_s'] for r in mine) / sum(r['wall_s'] for r in mine):.1f} % of its time); "
              f"{sum(r['rounds'] for r in mine) / len(mine):.1f} rounds, "
              f"{sum(r['drafter_forwards'] for r in mine) / sum(r['tokens'] for r in mine):.2f} drafter forwards per token")
    for name, q in ratios.items():
        if "plain" not in name:
            print(f"{name}: {q['geomean']:.3f} [{q['lo']:.3f}, {q['hi']:.3f}] (pairs {q['min']:.3f} .. {q['max']:.3f})")
    print(f"runs whose text differs from plain decoding: {differ or 'none'}")
    if args.out:
        record = {
            "preset": args.preset, "dtype": str(next(target.parameters()).dtype).removeprefix("torch."), "batch": 1,
            "device": "cpu", "threads": torch.get_num_threads(),
            "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
            "load_average_min_max": [round(min(load), 2), round(max(load), 2)],
            "torch": torch.__version__, "transformers": transformers.__version__,
            "command": "python benchmarks/bench_wallclock.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "costs_file": args.costs, "cost_model": {"c": costs.c, "verify": list(costs.verify)},
            "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats,
            "calibration_prompts": args.calib_prompts, "best_builtin": best, "hf_default": HF_DEFAULT,
            "calibration_cost": calib_cost, "modes": modes,
            "tokens_per_s": speed, "modelled_cost": modelled, "ratios": ratios,
            "differ_from_plain": [list(d) for d in differ],
            "runs": [{k: v for k, v in r.items() if k != "ids"} for r in runs],
        }
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
