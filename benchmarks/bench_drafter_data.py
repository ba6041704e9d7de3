"""How SmolLM2's drafter's greedy agreement grows with its training answers and its training steps.

Run from the repository root, on the answers of a ``companion build-drafter`` run (its
``<checkpoint-dir>/answers``; about 2 s a training step on one core, ``--jobs`` runs at once)::

    python benchmarks/bench_drafter_data.py --answers DRAFTER.checkpoints/answers --jobs 2
    python benchmarks/bench_drafter_data.py --answers DIR --sizes 297 --steps 228,456,912

Every pair of a size ``n`` (``--sizes``) and a step count ``s`` (``--steps``; default: the
recipe's own number of steps on all the training answers) trains the default recipe
(:class:`companion.models.distill.config.DrafterConfig`) from scratch on the first ``n`` training
answers, for as many epochs as come nearest to ``s`` steps, and measures, on the validation
answers the build holds out (the last tenth of the training split):

- greedy agreement: the share of steps at which the drafter's argmax is the target's greedy token;
- the same on (up to 74 of) the answers it was trained on: how closely a model of this shape
  fits its own data after that many steps.

Where one axis has two or more values at the largest value of the other, it fits
``agreement = a + b log2(x)`` by least squares along it and says where that line would reach
``--goal``: an extrapolation past the measured range, printed as one, with what it would cost
on this machine at the rates measured here (training) and in the answers' harvest (answers).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: How many training answers the fit-sample agreement reads at most (the build reads a quarter of 297).
FIT_SAMPLE = 74


def run_one(answers: str, n: int, steps: int) -> dict:
    """Train the default recipe on the first ``n`` training answers for about ``steps`` steps; its agreements."""
    import dataclasses

    import torch

    from companion.models.distill.build import split_validation
    from companion.models.distill.config import DrafterConfig
    from companion.models.distill.data import load_examples
    from companion.models.distill.train import agreement, make_drafter, train
    from companion.models.loading import load_pair
    from companion.prompts.sets import load_prompts

    torch.set_num_threads(1)
    prompts = load_prompts("chat-requests-train")
    target, _, tok = load_pair("smollm2", False, device="cpu", dtype="float32")
    fit, val = split_validation(load_examples(Path(answers), tok, prompts))
    fit = fit[:n]
    base = DrafterConfig()
    per_epoch = math.ceil(n / base.batch_size)
    cfg = dataclasses.replace(base, epochs=max(1, round(steps / per_epoch)))
    model = make_drafter(cfg, target)
    pad = int(tok.pad_token_id)
    t0 = time.perf_counter()
    log = train(model, fit, cfg, checkpoint=None, pad_id=pad, progress=False, log=lambda _: None)
    saved = model.to(getattr(torch, cfg.save_dtype)).float()  # as the build saves and loads it
    return {"n": n, "requested_steps": steps, "epochs": cfg.epochs, "steps": log["steps"],
            "answer_steps": sum(e.n_answer for e in fit), "seconds": round(time.perf_counter() - t0, 1),
            "validation": agreement(saved, val, pad), "fit": agreement(saved, fit[:FIT_SAMPLE], pad)}


def _numbers(text: str, name: str, low: int, high: int) -> list[int]:
    """A comma-separated list of whole numbers in [low, high], sorted and distinct; one ValueError line otherwise."""
    try:
        values = sorted({int(v) for v in text.split(",")})
    except ValueError:
        raise ValueError(f"--{name} {text}: expected whole numbers separated by commas") from None
    if not values or values[0] < low or values[-1] > high:
        raise ValueError(f"--{name} {text}: each value must be between {low} and {high}")
    return values


def _trend(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b log2(x)``."""
    lx = [math.log2(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(lx, ys)) / sum((x - mx) ** 2 for x in lx)
    return my - b * mx, b


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", required=True, help="the answers folder of a companion build-drafter run")
    parser.add_argument("--sizes", default="37,74,148,297", help="numbers of training answers, comma-separated")
    parser.add_argument("--steps", default="0",
                        help="training step counts, comma-separated (0: the recipe's own on all the training answers)")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, one thread each")
    parser.add_argument("--goal", type=float, default=0.55, help="the greedy agreement to extrapolate to")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()

    from companion.models.distill.build import split_validation
    from companion.models.distill.config import DrafterConfig
    from companion.prompts.sets import load_prompts

    answers = Path(args.answers)
    manifest_path = answers / "manifest.json"
    if not manifest_path.is_file():
        print(f"--answers {answers}: no harvest manifest there (expected a build-drafter run's answers folder)",
              file=sys.stderr)
        return 2
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("status") != "complete":
        print(f"--answers {answers}: the harvest is not complete (status {manifest.get('status')!r})", file=sys.stderr)
        return 2
    fit_prompts, val_prompts = split_validation(load_prompts("chat-requests-train"))
    n_fit = len(fit_prompts)
    cfg = DrafterConfig()
    own_steps = cfg.epochs * math.ceil(n_fit / cfg.batch_size)
    try:
        sizes = _numbers(args.sizes, "sizes", 1, n_fit)
        steps = sorted({s or own_steps for s in _numbers(args.steps, "steps", 0, 10**6)})
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    if args.jobs < 1 or not 0 < args.goal < 1:
        print(f"--jobs must be at least 1 (got {args.jobs}) and --goal a share in (0, 1) (got {args.goal})",
              file=sys.stderr)
        return 2
    grid = [(n, s) for s in steps for n in sizes]
    print(f"default recipe; sizes {sizes}, steps {steps}; validation: the last {len(val_prompts)} training requests; "
          f"{len(grid)} runs, {args.jobs} at once", flush=True)
    # One line per finished run (each takes minutes), then the table in the grid's order.
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_one, str(answers), n, s): (n, s) for n, s in grid}
        done: dict[tuple[int, int], dict] = {}
        for future in as_completed(futures):
            done[futures[future]] = r = future.result()
            print(f"  done {len(done)}/{len(grid)}: {r['n']} answers, {r['steps']} steps, validation agreement "
                  f"{r['validation']['greedy_agreement']:.1%} ({r['seconds']:.0f} s)", flush=True)
    rows = [done[key] for key in grid]
    print(f"\n{'answers':>8} {'tokens':>7} {'epochs':>6} {'steps':>5} {'validation':>10} {'fit':>6} {'val KL':>7} "
          f"{'seconds':>7}")
    for r in rows:
        print(f"{r['n']:>8} {r['answer_steps']:>7} {r['epochs']:>6} {r['steps']:>5} "
              f"{r['validation']['greedy_agreement']:>10.1%} {r['fit']['greedy_agreement']:>6.1%} "
              f"{r['validation']['coarse_kl']:>7.3f} {r['seconds']:>7.0f}")
    out: dict = {"grid": rows, "trends": {}}
    sec_per_step = sum(r["seconds"] for r in rows) / sum(r["steps"] for r in rows)
    sec_per_answer = manifest.get("totals", {}).get("wall_s", 0) / max(1, manifest.get("totals", {}).get("prompts", 0))
    for axis, fixed, key, cost in (("answers", steps[-1], "n", sec_per_answer), ("steps", sizes[-1], "steps", sec_per_step)):
        line = [r for r in rows if (r["requested_steps"] if axis == "answers" else r["n"]) == fixed]
        if len({r[key] for r in line}) < 2:
            continue
        a, b = _trend([r[key] for r in line], [r["validation"]["greedy_agreement"] for r in line])
        other = f"about {fixed} steps" if axis == "answers" else f"{fixed} answers"
        print(f"\nalong {axis} (at {other}): agreement = {a:.3f} + {b:.4f} log2({axis}), {100 * b:+.1f} points a doubling")
        trend = {"a": a, "b_per_doubling": b}
        best = max(line, key=lambda r: r["validation"]["greedy_agreement"])
        if best["validation"]["greedy_agreement"] >= args.goal:
            print(f"  {args.goal:.0%} is reached within the measured range ({best['n']} answers, {best['steps']} steps)")
        elif b <= 0:
            print(f"  the agreement does not grow along {axis} over the measured range: no extrapolation")
        elif (args.goal - a) / b > 200:
            print(f"  extrapolated past the measured range: {args.goal:.0%} beyond 2**200 {axis}")
        else:
            need = 2 ** ((args.goal - a) / b)
            trend["goal_at"] = need
            print(f"  extrapolated past the measured range: {args.goal:.0%} at about {need:.3g} {axis}, "
                  f"{need / max(r[key] for r in line):.3g} times the most measured"
                  + (f"; about {need * cost / 3600:.3g} hours on one core at {cost:.1f} s "
                     f"{'an answer (the harvest)' if axis == 'answers' else 'a step (these runs)'}" if cost > 0 else ""))
        out["trends"][axis] = trend
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
