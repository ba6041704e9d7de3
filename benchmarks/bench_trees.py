"""Draft trees on the clock: V(N) and the drafter's cost for tree forwards, then plain, chain and tree decoding timed.

    python benchmarks/bench_trees.py [--preset qwen2.5-coder] [--threads 2] [--prompts 8] [--tokens 128]
        [--repeats 2] [--calib-prompts 3] [--trees "spine:3,3,3;static:2,2,2;dynamic:16,6,4;certified;..."]
        [--sizes 1,2,4,8,16,32] [--widths 1,2,4,8,16] [--cost-repeats 10] [--costs-only] [--out FILE]

Batch 1, the preset's dtype, on the CPU with ``--threads`` torch threads; prompts as in
``benchmarks/bench_wallclock.py`` (the first ``--prompts`` of the book's plan are held out, the
``--calib-prompts`` after the ``--n-eval`` evaluated ones calibrate).

1. *Costs* (:func:`companion.speculative.tree.costs.measure_tree_costs`): ``V(N)``, a target forward over the
   root and ``N`` tree nodes with the 4D tree mask, and ``D(w)``, a drafter forward over ``w`` tree nodes, both in
   one-token target forwards, interleaved over ``--cost-repeats`` repeats at ``--context`` cached tokens; medians
   with the min and max of the paired ratios. The chain cost model is the same table (a chain of ``k`` drafts is a
   forward over ``k + 1`` tokens) with ``c = D(1)``.
2. *Calibration*: on the calibration prompts, the best of transformers' built-ins (chapter 10's grid, replayed from
   recorded chains and priced by that cost model) and the chain certificate rule warmed on them; every tree policy
   replayed from recorded ranks (:mod:`companion.speculative.tree.replay`; the certified tree warmed through its
   replays) and priced by the tree cost model; the best tree policy is the one of highest modelled speed-up, and
   the best static tree of each node budget knowing the calibration ranks (:func:`~companion.speculative.tree.model.best_tree`)
   is printed as the bound on fixed shapes. (``--costs-only`` stops after step 1 and writes the cost model alone.) ``--trees`` are candidates: only the best of each family (static, spine,
   dynamic, certified) by modelled speed-up on the calibration prompts goes on the clock.
3. *Clock*: on every held-out prompt, ``--repeats`` times, in an order rotated per prompt and repeat: ``plain``
   (``target.generate``), ``hf default`` and ``hf best`` (assisted generation), ``chain certificate`` (our chain
   decoder, warmed rule), and each tree policy (our tree decoder), all for ``--tokens`` new tokens.
4. Prints tokens/s per mode, the ratio of each to plain decoding and of the trees to ``hf best`` as geometric means
   over (prompt, repeat) pairs timed back to back with 95 % bootstrap intervals
   (:func:`companion.speculative.clock.paired_ratio`), the modelled speed-up beside each, the accepted length per
   round, and whether every text is the target's greedy text. ``--out`` writes it all with its provenance.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

HF_DEFAULT = "confidence:0.4"
DEFAULT_TREES = ("static:2,2,2;static:2,2,1;static:3,2,1;static:2,2,2,1;"
                 "spine:3,3,3;spine:2,2,2,2;spine:4,3,2,2;spine:3,2,2,2,1;"
                 "dynamic:8,5,3;dynamic:12,5,3;dynamic:16,6,4;dynamic:24,6,4;"
                 "certified;certified:nmax=24")


def family(spec: str) -> str:
    """A tree spec's family: ``static``, ``spine``, ``dynamic`` or ``certified``."""
    return spec.partition(":")[0]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen2.5-coder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--calib-prompts", type=int, default=3)
    ap.add_argument("--n-eval", type=int, default=14, help="chapter 10's evaluated prompts; calibration follows them")
    ap.add_argument("--trees", default=DEFAULT_TREES,
                    help="candidate tree policy specs separated by ';' (the best of each family is clocked)")
    ap.add_argument("--sizes", default="1,2,4,8,16,32")
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--cost-repeats", type=int, default=10)
    ap.add_argument("--no-hf", action="store_true", help="leave out transformers' assisted generation")
    ap.add_argument("--costs-only", action="store_true",
                    help="measure the tree cost model (step 1) and write it alone, without calibration or clock")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    for name in ("threads", "prompts", "tokens", "repeats", "calib_prompts", "context", "cost_repeats"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.prompts > args.n_eval:
        print(f"error: --prompts ({args.prompts}) must be at most --n-eval ({args.n_eval})", file=sys.stderr)
        return 2
    try:
        sizes, widths = _ints(args.sizes), _ints(args.widths)
    except ValueError:
        print("error: --sizes and --widths must be comma-separated integers", file=sys.stderr)
        return 2

    import torch
    import transformers

    from companion.harvest.plan import load_planned, plan_harvest
    from companion.speculative import CostModel, fits, generate, grid_builtins, hf_assisted_generate
    from companion.speculative import parse_policy, record_many, replay
    from companion.speculative.clock import paired_ratio
    from companion.speculative.heldout import choose_builtin
    from companion.speculative.tree import bf16_parting, generate_tree, parse_tree_policy
    from companion.speculative.tree.costs import measure_tree_costs
    from companion.speculative.tree.model import best_tree, empirical_prefix_law, expanded_widths
    from companion.speculative.tree.policies import Certified, Dynamic
    from companion.speculative.tree.replay import record_tree_text, replay_tree

    try:
        trees = [parse_tree_policy(s.strip()) for s in args.trees.split(";") if s.strip()]
    except ValueError as err:
        print(f"error: --trees: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    plan = plan_harvest(args.preset, n_prompts=args.n_eval + args.calib_prompts, seed=0)
    target, drafter, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    if drafter is None:
        print(f"error: preset {args.preset!r} has no drafter", file=sys.stderr)
        return 2
    encode = [tok(p.text, return_tensors="pt", add_special_tokens=False).input_ids for p in prompts]
    held, calib = encode[:args.prompts], encode[args.n_eval:args.n_eval + args.calib_prompts]
    load = [os.getloadavg()[0]]

    # 1. costs
    t0 = time.perf_counter()
    samples = measure_tree_costs(target, drafter, context=args.context, sizes=sizes, widths=widths,
                                 repeats=args.cost_repeats)
    tcosts = samples.model()
    chain_costs = CostModel(c=tcosts.c, verify=tcosts.verify)
    print(f"costs ({time.perf_counter() - t0:.0f} s, {args.cost_repeats} repeats, context {args.context}, "
          f"{torch.get_num_threads()} threads):", flush=True)
    for n in sizes:
        lo, med, hi = samples.spread("verify", n)
        print(f"  V({n:2d}) = {tcosts.verify_cost(n):.3f}   paired {lo:.3f} .. {hi:.3f}")
    for w in widths:
        lo, med, hi = samples.spread("draft", w)
        print(f"  D({w:2d}) = {tcosts.draft_cost(w):.3f}   paired {lo:.3f} .. {hi:.3f}", flush=True)

    if args.costs_only:
        if args.out:
            _write(args, argv, torch, transformers, target, load, {
                "tree_costs": samples.to_json(),
                "tree_cost_model": {"verify": list(tcosts.verify), "draft": list(tcosts.draft)}})
        return 0

    # 2. calibration
    t0 = time.perf_counter()
    builtins = grid_builtins()
    calib_chains = record_many(target, drafter, calib, max_new_tokens=args.tokens, max_drafts=24,
                               enough=lambda ch: fits(ch, builtins))
    best, calib_cost = choose_builtin(calib_chains, builtins, chain_costs)
    warm = parse_policy("certificate", **chain_costs.policy_defaults())
    for ch in calib_chains:
        replay(ch, warm)
    width = max(t.max_width for t in trees)
    depth = max([len(t.widths) for t in trees if hasattr(t, "widths")] + [t.dmax for t in trees if isinstance(t, Certified)]
                + [1])
    dyn = [str(t) for t in trees if isinstance(t, Dynamic)]
    recs = [record_tree_text(target, drafter, x, max_new_tokens=args.tokens, width=width, depth=depth, trees=dyn)
            for x in calib]
    # the certified trees priced by the measured costs (knobs written in their specs win)
    trees = [parse_tree_policy(str(t), c=tcosts.c, verify=tcosts.verify) if isinstance(t, Certified) else t
             for t in trees]
    modelled_calib = {}
    for t in trees:
        reps = [replay_tree(r, t) for r in recs]
        acc = [a for r in reps for a in r.accepted]
        nodes = [n for r in reps for n in r.nodes]
        ws = [w for r in reps for w in r.widths]
        modelled_calib[str(t)] = tcosts.speedup(acc, nodes, ws)
    best_tree_spec = max(modelled_calib, key=modelled_calib.get)
    clocked = {}
    for spec, x in modelled_calib.items():
        f = family(spec)
        if f not in clocked or x > modelled_calib[clocked[f]]:
            clocked[f] = spec
    trees = [t for t in trees if str(t) in clocked.values()]
    law = empirical_prefix_law([r.ranks[s:s + 8] for r in recs for s in range(len(r.ranks))])
    print(f"calibration ({time.perf_counter() - t0:.0f} s, {len(calib)} prompts): best built-in {best} "
          f"({1 / calib_cost[best]:.3f}x plain modelled); chain certificate rule {warm}")
    for spec, x in modelled_calib.items():
        print(f"  tree {spec:28s} modelled {x:.3f}x plain{'  (clocked)' if spec in clocked.values() else ''}")
    for n in (4, 8, 16, 32):
        paths, ea = best_tree(law, n, max_depth=8)
        fwd = tcosts.c + sum(tcosts.draft_cost(w) for w in expanded_widths(paths))
        print(f"  best static tree of {n:2d} nodes knowing the ranks: E[A] = {ea:.3f}, "
              f"modelled {(ea + 1) / (tcosts.verify_cost(n) + fwd):.3f}x plain", flush=True)

    # 3. clock
    modes = ["plain"] + ([] if args.no_hf else ["hf default", "hf best"]) + ["chain certificate"] + [str(t) for t in trees]
    by_name = {str(t): t for t in trees}

    def run(mode: str, ids, tokens: int):
        if mode == "plain":
            config = copy.deepcopy(target.generation_config)
            config.do_sample, config.max_new_tokens = False, tokens
            with torch.inference_mode():
                start = time.perf_counter()
                out = target.generate(ids, generation_config=config)
                wall = time.perf_counter() - start
            return {"tokens": int(out.shape[1] - ids.shape[1]), "wall_s": wall, "modelled": 1.0,
                    "ids": out[0, ids.shape[1]:].tolist(), "mean_accepted": 0.0}
        if mode.startswith("hf"):
            r = hf_assisted_generate(target, drafter, ids, policy=HF_DEFAULT if mode == "hf default" else best,
                                     max_new_tokens=tokens)
            widths_r = [[1] * d for d in r.drafted]
        elif mode == "chain certificate":
            r = generate(target, drafter, ids, policy=warm.fresh(), max_new_tokens=tokens)
            widths_r = [[1] * d for d in r.drafted]
        else:
            pol = copy.deepcopy(by_name[mode])
            r = generate_tree(target, drafter, ids, policy=pol, max_new_tokens=tokens)
            widths_r = [[1] + list(w[1:]) if w else [] for w in r.widths]
        modelled = tcosts.speedup(r.accepted, r.submitted, widths_r)
        return {"tokens": len(r.tokens), "wall_s": r.timings.wall_s, "modelled": modelled, "ids": r.tokens.tolist(),
                "rounds": r.rounds, "mean_accepted": r.mean_accepted, "drafter_forwards": r.drafter_forwards,
                "target_s": r.timings.target_s, "drafter_s": r.timings.drafter_s,
                "nodes_per_round": sum(r.submitted) / max(r.rounds, 1)}

    for mode in modes:   # warm-up
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
                print(f"repeat {rep} prompt {i} {mode:28s} {r['tokens']:3d} tokens {r['wall_s']:6.2f} s "
                      f"{r['tokens'] / r['wall_s']:6.2f} tok/s  A/round {r['mean_accepted']:.2f}  load {la:.2f}",
                      flush=True)
    plain_ids = {(r["prompt"], r["repeat"]): r["ids"] for r in runs if r["mode"] == "plain"}
    differ = sorted({(r["mode"], r["prompt"]) for r in runs if r["ids"] != plain_ids[(r["prompt"], r["repeat"])]})
    speed = {m: sum(r["tokens"] for r in runs if r["mode"] == m) / sum(r["wall_s"] for r in runs if r["mode"] == m)
             for m in modes}
    modelled = {m: sum(r["tokens"] for r in runs if r["mode"] == m)
                / sum(r["tokens"] / r["modelled"] for r in runs if r["mode"] == m) for m in modes}
    key = {(r["mode"], r["prompt"], r["repeat"]): r["tokens"] / r["wall_s"] for r in runs}
    pairs = [(i, rep) for rep in range(args.repeats) for i in range(len(held))]

    def ratio(a: str, b: str) -> dict[str, float]:
        return paired_ratio([key[(a, i, rep)] for i, rep in pairs], [key[(b, i, rep)] for i, rep in pairs])

    ratios = {f"{m} / plain": ratio(m, "plain") for m in modes if m != "plain"}
    base = "chain certificate" if args.no_hf else "hf best"
    for t in trees:
        ratios[f"{t} / {base}"] = ratio(str(t), base)
    certified = [str(t) for t in trees if isinstance(t, Certified)]
    for c in certified:
        for t in trees:
            if str(t) != c:
                ratios[f"{c} / {t}"] = ratio(c, str(t))
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    print(f"\n{args.preset}, batch 1, {dtype}, {torch.get_num_threads()} threads, {len(held)} held-out prompts x "
          f"{args.tokens} tokens x {args.repeats} repeats; load average during runs {min(load):.2f} .. {max(load):.2f}")
    for m in modes:
        line = f"{m:28s} {speed[m]:6.2f} tok/s"
        if m != "plain":
            q = ratios[f"{m} / plain"]
            line += (f"; x plain: measured {q['geomean']:.3f} [{q['lo']:.3f}, {q['hi']:.3f}], "
                     f"modelled {modelled[m]:.3f}")
        print(line)
    for name, q in ratios.items():
        if "/ plain" not in name:
            print(f"{name}: {q['geomean']:.3f} [{q['lo']:.3f}, {q['hi']:.3f}] (pairs {q['min']:.3f} .. {q['max']:.3f})")
    print(f"best tree policy on calibration: {best_tree_spec}")
    print(f"runs whose text differs from plain decoding: {differ or 'none'}")
    partings = []
    for r in runs:
        if (r["mode"], r["prompt"]) in differ and r["mode"] != "plain":
            where = bf16_parting(r["ids"], plain_ids[(r["prompt"], r["repeat"])], target, held[r["prompt"]][0].tolist(),
                                 dtype)
            if where is not None:
                partings.append({"mode": r["mode"], "prompt": r["prompt"], "repeat": r["repeat"], "position": where[0],
                                 "gap_ulps": where[1]})
                print(f"  {r['mode']} prompt {r['prompt']} repeat {r['repeat']}: parts at answer token {where[0]}, "
                      f"the target's top-2 logits {where[1]:.1f} ulps apart in {dtype}")
    if args.out:
        _write(args, argv, torch, transformers, target, load, {
            "tree_costs": samples.to_json(), "tree_cost_model": {"verify": list(tcosts.verify), "draft": list(tcosts.draft)},
            "prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats,
            "calibration_prompts": args.calib_prompts, "best_builtin": best, "hf_default": HF_DEFAULT,
            "calibration_modelled_tree": modelled_calib, "best_tree": best_tree_spec,
            "clocked_trees": [str(t) for t in trees], "modes": modes,
            "tokens_per_s": speed, "modelled_speedup": modelled, "ratios": ratios,
            "differ_from_plain": [list(d) for d in differ], "partings": partings,
            "runs": [{k: v for k, v in r.items() if k != "ids"} for r in runs]})
    return 0


def _write(args: argparse.Namespace, argv: list[str] | None, torch: Any, transformers: Any, target: Any,
           load: list[float], fields: dict[str, Any]) -> None:
    """The record with its provenance, written whole (a temporary file renamed)."""
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
    record = {
        "preset": args.preset, "dtype": dtype, "batch": 1, "device": "cpu", "threads": torch.get_num_threads(),
        "measured_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs",
        "load_average_min_max": [round(min(load), 2), round(max(load), 2)],
        "torch": torch.__version__, "transformers": transformers.__version__,
        "command": "python benchmarks/bench_trees.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        **fields}
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.exit(main())
