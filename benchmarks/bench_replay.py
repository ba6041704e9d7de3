"""Chapter 10's replay of the policy grid and record_chains' drafter rows: the reference path and the fast path, side by side.

Run from the repository root (about four minutes on one core: a minute of it recording, most of the rest
the reference paths)::

    python benchmarks/bench_replay.py                       # 32 + 4 recordings of 128 tokens, 18 cost models
    python benchmarks/bench_replay.py --prompts 12 --grid 4 --repeats 1

It records, once, the embedded closed-world pair's greedy answers to ``--prompts`` held-out
standard-library openings (long texts) and ``--calib`` more (the calibrated rules' warm-up), then
times on those same recordings, alternating the two paths ``--repeats`` times and keeping each
one's fastest run:

1. **built-ins**: every policy of :func:`~companion.speculative.replay.grid_builtins` (transformers'
   ``constant``, ``confidence`` and ``heuristic`` schedules) replayed on every evaluated recording:
   ``replay(..., fast=False)``, which drives each policy call by call (the reference, as before),
   against the array replay (``fast=True``, :mod:`companion.speculative.replay_fast`), the
   per-recording arrays built inside the timed run;
2. **oracle**: :func:`~companion.speculative.oracle_result` on every recording for every cost model,
   the reference dynamic programme against the array one;
3. **grid**: :func:`~companion.speculative.replay_grid` over the chapter's cost models (3 shapes of
   ``V(k)`` times the ``c`` values; ``--grid`` takes the first few), ``n_boot`` 2000, in this process,
   ``fast=False`` (every policy driven call by call, the reference) against ``fast=True`` (the
   built-ins' and the oracle's array paths, and the calibrated rules of every cost model replayed
   on every recording at once, a round at a time, by ``companion.speculative.calibrated_replay``,
   with the policy objects' own float64 operations: the same rounds);
4. **_steps**: a drafter row's ``q(1)``, ``q(2)`` and certificate on ``[128, 151936]`` float32 logits
   (a Qwen-sized vocabulary, random logits from flat to confident rows), the float64 softmax over
   the whole row (:func:`~companion.speculative.replay._steps_float64`, the reference) against the
   float64 head and float32 tail of :func:`~companion.speculative.replay._steps`.

For each it prints both times and the ratio reference / fast, and checks that the results agree:
the same rounds for every replay, the same grid rows field for field, the same tokens for
``_steps`` with the largest relative ``q`` difference printed.

5. **grid vs ``--against``** (default ``4c469c7``, the commit before the fast paths): the same
   :func:`~companion.speculative.replay_grid` run by that revision's own code (``git archive`` into a
   temporary folder) and by this working tree's, each in a fresh subprocess on the same recordings
   (passed as plain data), so that the calibrated rules' speed-up is in the ratio too and neither
   side pays for this process's heap of models and results; ``--against ''`` skips it.

Times are CPU seconds of this process (``time.process_time``, one thread), steadier than the wall
clock on a shared machine.

Measured on the 2-core machine of issue 47 with the defaults (36 recordings, 4,532 tokens; best of
2; other sessions' work beside it, load average about 6; no harvest running): built-ins 1.110 s
against 0.128 s (8.7x), oracle 3.286 s against 0.290 s (11.3x), grid 21.679 s against 4.179 s
(5.2x), grid at 4c469c7 24.633 s against this tree's 3.611 s (6.8x), ``_steps`` 0.168 s against
0.040 s (4.1x); every section the same results. With ``--prompts 12 --grid 4`` the grid's ratios are
smaller (2.2x in this process, 3.1x against 4c469c7): the calibrated rules' warm-up, some 460 rounds
replayed in turn, costs about as much for 4 cost models as for 18.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import math
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def held_out_openings(n: int, chars: int = 240, stride: int = 1200) -> list[str]:
    """``n`` plain-ASCII windows of ``chars`` characters from the held-out standard-library files: every
    file's opening first, then the windows ``stride`` characters further on, and so on (the embedded
    pair continues Python source for as long as it is asked: long greedy texts)."""
    from companion.models.tiny_pair import corpus as corpus_mod

    _, held = corpus_mod.split_corpus(corpus_mod.load_corpus(None))
    texts: list[str] = []
    offset = 0
    while len(texts) < n and any(len(f.text) >= offset + chars for f in held):
        texts += [f.text[offset:offset + chars] for f in held
                  if len(f.text) >= offset + chars and f.text[offset:offset + chars].isascii()]
        offset += stride
    if len(texts) < n:
        raise SystemExit(f"error: only {len(texts)} held-out windows of {chars} plain characters; {n} were asked for")
    return texts[:n]


def best_of(repeats: int, runs: dict[str, Callable[[], Any]]) -> tuple[dict[str, float], dict[str, Any]]:
    """Each run's fastest time over ``repeats`` rounds, the runs alternating within a round; and its last result."""
    times = {name: math.inf for name in runs}
    results: dict[str, Any] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            t0 = time.process_time()
            results[name] = run()
            times[name] = min(times[name], time.process_time() - t0)
    return times, results


def rounds(r) -> tuple:
    return (r.tokens.tolist(), r.accepted, r.submitted, r.drafted, r.draft_tokens, r.target_forwards,
            r.drafter_forwards, r.ended_by_eos, r.policy)


def row_key(r) -> dict:
    """A grid row as plain data (nan as "nan", so that equal rows compare equal)."""
    d = dataclasses.asdict(r)
    return {**d, "gap_closed": {p: ("nan" if math.isnan(x) else x) for p, x in d["gap_closed"].items()}}


_AT_REVISION = """
import math, pickle, sys, time, dataclasses
import torch
torch.set_num_threads(1)
from companion.speculative import CostModel, DraftStep, RecordedChains, replay_grid
job = pickle.load(open(sys.argv[1], "rb"))
def rec(d):
    chains = tuple(tuple(DraftStep(*step) for step in chain) for chain in d["chains"])
    return RecordedChains(tuple(d["tokens"]), chains, tuple(d["kl"]), d["max_new_tokens"], d["max_drafts"],
                          frozenset(d["eos"]), d["ended"], tuple(d["disagreements"]))
evals, calib = [rec(d) for d in job["evals"]], [rec(d) for d in job["calib"]]
grid = [(shape, CostModel(c=c, verify=tuple(v))) for shape, c, v in job["grid"]]
best, rows = math.inf, None
for _ in range(job["repeats"]):
    t0 = time.process_time()
    rows = replay_grid(evals, calib, grid, n_boot=2000)
    best = min(best, time.process_time() - t0)
plain = [dataclasses.asdict(r) for r in rows]
for d in plain:
    d["gap_closed"] = {p: ("nan" if math.isnan(x) else x) for p, x in d["gap_closed"].items()}
import companion
pickle.dump({"seconds": best, "rows": plain, "code": companion.__file__}, open(sys.argv[2], "wb"))
"""


def plain_recording(ch) -> dict:
    """A recording as plain data, which any revision's RecordedChains can be made from."""
    return {"tokens": list(ch.tokens), "kl": list(ch.kl), "max_new_tokens": ch.max_new_tokens,
            "max_drafts": ch.max_drafts, "eos": sorted(ch.eos_token_ids), "ended": ch.ended_by_eos,
            "disagreements": list(ch.disagreements),
            "chains": [[(d.token, d.q1, d.q2, d.rho) for d in chain] for chain in ch.chains]}


def grid_in_fresh_process(rev: str | None, evals, calib, grid, repeats: int) -> tuple[float, list[dict]] | str:
    """``(CPU seconds, rows)`` of ``replay_grid`` run in a fresh Python process by revision ``rev``'s code
    (``None``: this working tree's), or why it could not run. A fresh process on both sides: the one this
    benchmark runs in holds the models and every earlier result, which slows its garbage collection."""
    with tempfile.TemporaryDirectory() as tmp:
        code = str(ROOT)
        if rev is not None:
            try:
                archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "companion"],
                                         capture_output=True, check=True).stdout
            except (OSError, subprocess.CalledProcessError) as err:
                return f"git archive {rev} failed ({getattr(err, 'stderr', b'').decode(errors='replace').strip() or err})"
            code = os.path.join(tmp, "code")
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(code, filter="data")
        job, out = os.path.join(tmp, "job.pkl"), os.path.join(tmp, "out.pkl")
        with open(job, "wb") as f:
            pickle.dump({"evals": [plain_recording(c) for c in evals], "calib": [plain_recording(c) for c in calib],
                         "grid": [(shape, costs.c, list(costs.verify)) for shape, costs in grid],
                         "repeats": repeats}, f)
        env = {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1"}
        # run from the temporary folder: `python -c` puts the working directory first on sys.path
        done = subprocess.run([sys.executable, "-c", _AT_REVISION, job, out], env=env, capture_output=True, text=True,
                              cwd=tmp)
        if done.returncode != 0:
            return f"revision {rev or 'working tree'} failed: {done.stderr.strip().splitlines()[-1:]}"
        with open(out, "rb") as f:
            result = pickle.load(f)
        if not Path(result["code"]).resolve().is_relative_to(Path(code).resolve()):
            return f"the subprocess imported companion from {result['code']}, not from {code}"
    return result["seconds"], result["rows"]


def line(what: str, times: dict[str, float], same: bool, extra: str = "") -> None:
    ref, fast = times["reference"], times["fast"]
    print(f"{what:<13} reference {ref:8.3f} s   fast {fast:8.3f} s   ratio {ref / fast:5.1f}x   "
          f"{'same results' if same else 'RESULTS DIFFER'}{extra}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=32, help="evaluated recordings (chapter 10: 32)")
    ap.add_argument("--calib", type=int, default=4, help="calibration recordings (chapter 10: 4)")
    ap.add_argument("--tokens", type=int, default=128, help="greedy answer length (chapter 10: 128)")
    ap.add_argument("--grid", type=int, default=18, help="cost models of the grid replayed (at most 18)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs of each path (the fastest is kept)")
    ap.add_argument("--steps-rows", type=int, default=128, help="rows of the [rows, 151936] logits for _steps")
    ap.add_argument("--against", default="4c469c7", help="a git revision whose own replay_grid is timed too ('': none)")
    args = ap.parse_args(argv)
    for name in ("prompts", "tokens", "grid", "repeats", "steps_rows"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}", file=sys.stderr)
            return 2
    if args.calib < 0:
        print(f"error: --calib must be >= 0, got {args.calib}", file=sys.stderr)
        return 2

    import torch

    from companion.models.loading import load_pair
    from companion.speculative import CostModel, oracle_result, record_many, replay, replay_grid
    from companion.speculative.replay import _steps, _steps_float64, grid_builtins

    torch.set_num_threads(1)
    target, drafter, tok = load_pair("closed-world")
    texts = held_out_openings(args.prompts + args.calib)
    ids = [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]
    t0 = time.perf_counter()
    chains = record_many(target, drafter, ids, max_new_tokens=args.tokens)
    evals, calib = chains[:args.prompts], chains[args.prompts:]
    print(f"recorded {len(chains)} answers ({sum(len(c.tokens) for c in chains)} tokens) in "
          f"{time.perf_counter() - t0:.1f} s; timing the best of {args.repeats} runs per path, one thread", flush=True)

    def forget_arrays() -> None:
        for ch in chains:
            object.__setattr__(ch, "_arrays", None)   # the fast path builds them inside its timed run

    # 1. built-ins
    names = grid_builtins()

    def builtins(fast: bool) -> list:
        if fast:
            forget_arrays()
        return [[rounds(replay(ch, spec, fast=fast)) for ch in evals] for spec in names]

    times, res = best_of(args.repeats, {"reference": lambda: builtins(False), "fast": lambda: builtins(True)})
    line("built-ins", times, res["reference"] == res["fast"], f"   ({len(names)} policies x {len(evals)} answers)")

    # 2. oracle, 3. grid over the chapter's cost models
    shapes = {"flat": (1.0,), "gentle": (1.0,) + tuple(1.0 + 0.02 * k for k in range(1, 41)),
              "cpu": (1.0, 1.4, 1.45)}   # chapter 10's shapes; its "cpu" is measured there, this one is a typical CPU V(k)
    grid = [(shape, CostModel(c=c, verify=v)) for shape, v in shapes.items()
            for c in (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)][:args.grid]

    def oracle(fast: bool) -> list:
        if fast:
            forget_arrays()
        return [[rounds(oracle_result(ch, costs, fast=fast)) for ch in evals] for _, costs in grid]

    times, res = best_of(args.repeats, {"reference": lambda: oracle(False), "fast": lambda: oracle(True)})
    line("oracle", times, res["reference"] == res["fast"], f"   ({len(grid)} cost models x {len(evals)} answers)")

    def whole(fast: bool) -> list:
        if fast:
            forget_arrays()
        return [row_key(r) for r in replay_grid(evals, calib, grid, n_boot=2000, fast=fast)]

    times, res = best_of(args.repeats, {"reference": lambda: whole(False), "fast": lambda: whole(True)})
    line("grid", times, res["reference"] == res["fast"], f"   ({len(grid)} cost models, {len(names)} built-ins + "
                                                         f"4 calibrated rules + oracle each)")
    if args.against:
        then = grid_in_fresh_process(args.against, evals, calib, grid, args.repeats)
        now = grid_in_fresh_process(None, evals, calib, grid, args.repeats)
        if isinstance(then, str) or isinstance(now, str):
            print(f"grid at {args.against}: not timed, {then if isinstance(then, str) else now}", flush=True)
        else:
            line(f"grid@{args.against}"[:13], {"reference": then[0], "fast": now[0]},
                 then[1] == now[1] == res["fast"], f"   (revision {args.against}'s replay_grid against this tree's, "
                                                   "each in a fresh process: the calibrated rules' speed-up included)")

    # 4. _steps
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(args.steps_rows, 151936, generator=gen) * 3.0
    logits[:, 7] += torch.linspace(0.0, 25.0, args.steps_rows)   # from flat rows to confident ones
    times, res = best_of(args.repeats, {"reference": lambda: _steps_float64(logits), "fast": lambda: _steps(logits)})
    (ref_steps, ref_tokens), (new_steps, new_tokens) = res["reference"], res["fast"]
    worst = max(max(abs(a.q1 - b.q1) / b.q1, abs(a.q2 - b.q2) / b.q2) for a, b in zip(new_steps, ref_steps))
    line("_steps", times, torch.equal(ref_tokens, new_tokens),
         f" tokens   ([{args.steps_rows}, 151936] float32; largest relative q difference {worst:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
