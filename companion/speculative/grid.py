"""Every policy replayed under many cost models, against the oracle: the comparison and the grid rows."""
from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from companion.speculative.calibrated_replay import replay_warmed
from companion.speculative.compare import CALIBRATED, PolicyComparison, RatioEstimate, builtin_policies, display_name
from companion.speculative.costs import CostModel
from companion.speculative.decoder import SpeculativeResult
from companion.speculative.oracle import _check_costs, oracle_results
from companion.speculative.policies import Policy, parse_policy
from companion.speculative.policy_replay import replay
from companion.speculative.recording import RecordedChains, _check_chains

ORACLE = "oracle"
"""Row name of the oracle's rounds in a replayed comparison."""

GRID_CONSTANTS: tuple[str, ...] = tuple(f"constant:{k}" for k in range(17))
"""The constant schedules of the cost-model grid: K = 0 .. 16 (long drafts pay where verification is flat)."""


def grid_builtins() -> list[str]:
    """transformers' built-ins replayed on the cost-model grid: :data:`GRID_CONSTANTS`, ``confidence:T`` for
    T = 0.1 .. 0.8 and the heuristic schedules (``constant:0`` first, the reference)."""
    return list(GRID_CONSTANTS) + [s for s in builtin_policies() if not s.startswith("constant:")]


def replay_comparison(
    eval_chains: Sequence[RecordedChains],
    calibration_chains: Sequence[RecordedChains],
    costs: CostModel,
    *,
    builtins: Sequence[str],
    calibrated: Sequence[str] = CALIBRATED,
    cold: bool = True,
    replayed: dict[str, list[SpeculativeResult]] | None = None,
    fast: bool = True,
) -> PolicyComparison:
    """:func:`~companion.speculative.compare_policies` from recordings, priced with ``costs``, plus the oracle.

    The same protocol: ``builtins`` (``constant:0`` first) replayed on every evaluated prompt;
    each calibrated rule given ``costs``' knobs (``c``, ``v1``, ``dv``), warmed on
    ``calibration_chains`` in order, and replayed on every evaluated prompt from a copy of that
    warm state; a ``certificate (cold)`` row from the prior when ``cold``; and the
    :data:`ORACLE` row (:func:`oracle_result`). ``replayed`` may hold built-in runs already
    replayed on ``eval_chains`` (they do not depend on the cost model). The comparison's
    ``fitted`` model is ``costs`` itself (a replay has no timings to fit). ``fast``: the array
    paths (the built-ins and the oracle as :func:`replay`'s and :func:`oracle_plan`'s; the
    calibrated rules replayed on every recording at once, round by round, with the same rounds);
    ``False``: every policy driven call by call, the reference.
    """
    names = _check_comparison(eval_chains, calibration_chains, [costs], builtins)
    runs = _calibrated_runs(eval_chains, calibration_chains, [costs], calibrated, cold, fast)[0]
    with _collector_paused(fast):
        return _comparison(eval_chains, costs, names, replayed, runs, fast)


def _check_comparison(eval_chains: Sequence[RecordedChains], calibration_chains: Sequence[RecordedChains],
                      cost_models: Sequence[CostModel], builtins: Sequence[str]) -> list[str]:
    """The built-ins' names, after refusing what :func:`replay_comparison` cannot replay or price."""
    names = list(builtins)
    if not names or names[0] != "constant:0":
        raise ValueError(f"the built-ins must start with 'constant:0' (the reference decoding), got {names[:1]}")
    if not eval_chains:
        raise ValueError("no recordings to replay")
    for costs in cost_models:
        _check_costs(costs)
    for i, ch in enumerate(eval_chains):
        # an empty text has no token to price: its cost per token is NaN, and a NaN in the totals
        # would make every policy's cost NaN
        if not _check_chains(ch, f"eval_chains[{i}]").tokens:
            raise ValueError(f"eval_chains[{i}] is an empty recording (max_new_tokens = {ch.max_new_tokens}): "
                             "it has no token to price; leave it out")
    for i, ch in enumerate(calibration_chains):
        _check_chains(ch, f"calibration_chains[{i}]")
    return names


def _calibrated_runs(eval_chains: Sequence[RecordedChains], calibration_chains: Sequence[RecordedChains],
                     cost_models: Sequence[CostModel], calibrated: Sequence[str], cold: bool, fast: bool
                     ) -> list[dict[str, list[SpeculativeResult]]]:
    """Per cost model, the calibrated rows of :func:`replay_comparison`: ``{display name: runs}``, and
    ``certificate (cold)`` when ``cold``. ``fast``: every rule under every cost model replayed at once
    (``companion.speculative.calibrated_replay``), unless one of them is not a plain calibrated spec."""
    rows: list[tuple[int, str, Policy, bool]] = []    # (cost model, row name, policy, warmed first)
    for m, costs in enumerate(cost_models):
        knobs = costs.policy_defaults()
        rows += [(m, display_name(spec), parse_policy(spec, **knobs), True) for spec in calibrated]
        if cold:
            rows.append((m, "certificate (cold)", parse_policy("certificate", **knobs), False))
    runs = replay_warmed([pol for _, _, pol, _ in rows],
                         [calibration_chains if warmed else () for _, _, _, warmed in rows],
                         eval_chains) if fast and rows else None
    if runs is None:                    # call by call: the reference (and where a replay raises, its error)
        runs = []
        for _, _, pol, warmed in rows:
            if warmed:
                for ch in calibration_chains:
                    replay(ch, pol)
            runs.append([replay(ch, pol.fresh()) for ch in eval_chains])
    out: list[dict[str, list[SpeculativeResult]]] = [{} for _ in cost_models]
    for (m, name, _, _), r in zip(rows, runs):
        out[m][name] = r
    return out


def _comparison(eval_chains: Sequence[RecordedChains], costs: CostModel, names: list[str],
                replayed: dict[str, list[SpeculativeResult]] | None, calibrated: dict[str, list[SpeculativeResult]],
                fast: bool) -> PolicyComparison:
    """The comparison of :func:`replay_comparison` from its calibrated rows: the built-ins first, then
    those rows, then the oracle; with ``fast``, every row's prompt costs worked out for all its runs together."""
    results: dict[str, list[SpeculativeResult]] = {}
    for spec in names:
        runs = (replayed or {}).get(spec)
        results[spec] = list(runs) if runs is not None else [replay(ch, spec, fast=fast) for ch in eval_chains]
    results.update(calibrated)
    results[ORACLE] = oracle_results(list(eval_chains), costs, fast=fast)
    reference = [r.tokens for r in results["constant:0"]]
    failures = [f"{name} on prompt {i}" for name, runs in results.items() for i, r in enumerate(runs)
                if not torch.equal(r.tokens, reference[i])]
    comparison = PolicyComparison(results, names, costs, costs, failures)
    if fast:
        for name, runs in results.items():
            # what PolicyComparison.prompt_costs keeps per row, made here for all runs at once
            comparison._priced[name] = (runs, len(runs), costs, prompt_costs(runs, costs))
    return comparison


def prompt_costs(runs: Sequence[SpeculativeResult], costs: CostModel) -> np.ndarray:
    """``[modelled_cost(r, costs) * len(r.tokens) for r in runs]`` as an array, bit for bit.

    ``modelled_cost`` sums ``V(k)`` over a run's rounds left to right, adds ``c`` times its drafter
    calls and divides by its tokens; here every run's sum is one row of a cumulative sum (also left
    to right; the rows' padding adds zeros), and the rest the same float64 operations.
    """
    tokens = np.array([len(r.tokens) for r in runs], dtype=float)
    rounds = np.array([len(r.submitted) for r in runs], dtype=np.intp)
    width = int(rounds.max(initial=0))
    flat = np.fromiter((k for r in runs for k in r.submitted), dtype=np.intp, count=int(rounds.sum()))
    table = np.array([costs.verify_cost(k) for k in range(int(flat.max(initial=0)) + 1)])
    padded = np.zeros((len(runs), max(width, 1)))
    row = np.repeat(np.arange(len(runs)), rounds)
    padded[row, np.arange(flat.size) - np.repeat(np.cumsum(rounds) - rounds, rounds)] = table[flat]
    total = np.cumsum(padded, axis=1)[:, -1] + costs.c * np.array([r.drafter_forwards for r in runs], dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, total / tokens * tokens, np.nan)


@dataclass(frozen=True)
class GridRow:
    """One cost model of the grid: every policy's cost against the oracle's and the certificate rule's ratios.

    ``to_oracle[p]``: policy ``p``'s cost per token over the oracle's (total cost over total tokens
    of the evaluated prompts). ``best_constant``: the cheapest of :data:`GRID_CONSTANTS`;
    ``best_policy``: the cheapest of every policy replayed. Ratios with their 95 % paired
    bootstrap intervals over prompts: ``cert_vs_constant`` (the certificate rule over the best
    constant schedule, re-selected in every resample), ``cert_vs_default`` (over ``default``),
    ``cert_vs_oracle`` and ``best_vs_oracle``. ``gap_closed[p]``: the share of the gap from the
    best constant schedule down to the oracle that ``p`` closes, ``(C_const - C_p) / (C_const -
    C_oracle)`` (negative when ``p`` costs more than the best constant schedule; ``nan`` when there
    is no gap).
    """

    shape: str
    c: float
    oracle_cost: float
    costs: dict[str, float]
    to_oracle: dict[str, float]
    best_constant: str
    best_policy: str
    default: str
    cert_vs_constant: RatioEstimate
    cert_vs_default: RatioEstimate
    cert_vs_oracle: RatioEstimate
    best_vs_oracle: RatioEstimate
    gap_closed: dict[str, float]


def grid_row(comparison: PolicyComparison, shape: str, *, default: str = "confidence:0.4",
             certificate: str = "certificate", n_boot: int = 2000, seed: int = 0) -> GridRow:
    """The :class:`GridRow` of one replayed comparison (see :func:`replay_comparison`)."""
    policies = [p for p in comparison.policies if p != ORACLE]
    constants = [p for p in comparison.builtins if p in GRID_CONSTANTS]
    for name in (default, certificate):
        if name not in policies:
            raise ValueError(f"{name!r} was not replayed; policies: {policies}")
    if not constants:
        raise ValueError(f"no constant schedule among the built-ins {comparison.builtins}")
    per_token = {p: comparison.summary(p).cost_per_token for p in comparison.policies}
    oracle = per_token[ORACLE]
    best_constant = min(constants, key=lambda p: (per_token[p], p))
    best_policy = min(policies, key=lambda p: (per_token[p], p))
    gap = per_token[best_constant] - oracle
    closed = {p: (per_token[best_constant] - per_token[p]) / gap if gap > 0 else math.nan for p in policies}
    return GridRow(
        shape=shape, c=comparison.costs.c, oracle_cost=oracle,
        costs={p: per_token[p] for p in policies},
        to_oracle={p: per_token[p] / oracle for p in policies},
        best_constant=best_constant, best_policy=best_policy, default=default,
        cert_vs_constant=comparison.ratio(certificate, constants, n_boot=n_boot, seed=seed),
        cert_vs_default=comparison.ratio(certificate, [default], n_boot=n_boot, seed=seed),
        cert_vs_oracle=comparison.ratio(certificate, [ORACLE], n_boot=n_boot, seed=seed),
        best_vs_oracle=comparison.ratio(best_policy, [ORACLE], n_boot=n_boot, seed=seed),
        gap_closed=closed,
    )


def replay_grid(
    eval_chains: Sequence[RecordedChains],
    calibration_chains: Sequence[RecordedChains],
    grid: Sequence[tuple[str, CostModel]],
    *,
    builtins: Sequence[str] | None = None,
    calibrated: Sequence[str] = CALIBRATED,
    default: str = "confidence:0.4",
    n_boot: int = 2000,
    seed: int = 0,
    processes: int = 0,
    fast: bool = True,
) -> list[GridRow]:
    """A :class:`GridRow` per ``(shape name, cost model)`` of ``grid``: the built-ins (default
    :func:`grid_builtins`) replayed once, the calibrated rules recalibrated for each cost model.

    ``processes``: 0 computes every row here; ``N >= 1`` hands the cost models to ``N`` worker
    processes (started fresh, one thread each; at most one per cost model), each a run of
    consecutive cost models. Each row is a function of its cost model alone (its bootstrap is
    seeded with ``seed``), so the rows are the same either way. Workers that cannot start or that
    die are reported in one line, and the rows are then computed here. ``fast``: as
    :func:`replay_comparison`'s; the calibrated rules of all the cost models a process computes are
    replayed together, every rule on every recording at once.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"processes must be an integer >= 0, got {processes!r}")
    names = list(builtins) if builtins is not None else grid_builtins()
    replayed = {spec: [replay(ch, spec, fast=fast) for ch in eval_chains] for spec in names}
    job = (list(eval_chains), list(calibration_chains), names, list(calibrated), default, n_boot, seed, replayed, fast)
    points = list(grid)
    if processes and len(points) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        # each worker replays a run of consecutive cost models together (the calibrated rules of all of
        # them at once), so the rows come back in the grid's order
        parts = np.array_split(np.arange(len(points)), min(processes, len(points)))
        chunks = [[points[i] for i in part] for part in parts]
        try:
            with ProcessPoolExecutor(max_workers=len(chunks), mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_grid_worker_start, initargs=(job,)) as pool:
                return [row for rows in pool.map(_grid_worker_rows, chunks) for row in rows]
        except (BrokenProcessPool, OSError) as err:
            print(f"replay_grid: the worker processes failed ({type(err).__name__}: {err}); replaying here instead")
    return _grid_rows(job, points)


def submit_replay_grid(eval_chains: Sequence[RecordedChains], calibration_chains: Sequence[RecordedChains],
                       grid: Sequence[tuple[str, CostModel]], **kwargs: Any) -> Future[tuple[list[GridRow], float]]:
    """:func:`replay_grid` started in the background: a future of ``(rows, seconds it took)``.

    With ``processes >= 1`` the work happens in the worker processes, and the calling thread stays
    free, e.g. to decode live on the other cores meanwhile (a thread of this process replays the
    built-ins, under a second, then only waits on the workers); with ``processes = 0`` that thread
    does all of it, sharing the interpreter with the caller. Arguments as :func:`replay_grid`'s:
    ``processes`` is checked here, the others when the replay starts (the future raises their error).
    """
    processes = kwargs.get("processes", 0)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"processes must be an integer >= 0, got {processes!r}")
    from concurrent.futures import ThreadPoolExecutor

    def timed() -> tuple[list[GridRow], float]:
        t0 = time.perf_counter()
        rows = replay_grid(eval_chains, calibration_chains, grid, **kwargs)
        return rows, time.perf_counter() - t0

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-grid")
    try:
        return pool.submit(timed)
    finally:
        pool.shutdown(wait=False)


_GRID_JOB: tuple | None = None   # a grid worker process's shared inputs (set once by its initializer)


def _grid_worker_start(job: tuple) -> None:
    global _GRID_JOB
    torch.set_num_threads(1)
    _GRID_JOB = job


def _grid_worker_rows(points: list[tuple[str, CostModel]]) -> list[GridRow]:
    assert _GRID_JOB is not None, "the worker's initializer sets the job"
    return _grid_rows(_GRID_JOB, points)


def _grid_worker_row(point: tuple[str, CostModel]) -> GridRow:
    assert _GRID_JOB is not None, "the worker's initializer sets the job"
    return _grid_point(_GRID_JOB, *point)


def _grid_point(job: tuple, shape: str, costs: CostModel) -> GridRow:
    return _grid_rows(job, [(shape, costs)])[0]


def _grid_rows(job: tuple, points: Sequence[tuple[str, CostModel]]) -> list[GridRow]:
    """The :class:`GridRow` of every ``(shape, cost model)`` of ``points``: each its own comparison (no cold
    row), the calibrated rules of all of them replayed together."""
    eval_chains, calibration_chains, names, calibrated, default, n_boot, seed, replayed, fast = job
    if not points:
        return []
    cost_models = [costs for _, costs in points]
    _check_comparison(eval_chains, calibration_chains, cost_models, names)
    runs = _calibrated_runs(eval_chains, calibration_chains, cost_models, calibrated, False, fast)
    with _collector_paused(fast):
        return [grid_row(_comparison(eval_chains, costs, names, replayed, rows, fast), shape, default=default,
                         n_boot=n_boot, seed=seed)
                for (shape, costs), rows in zip(points, runs)]


@contextmanager
def _collector_paused(pause: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off (when ``pause``) while the comparisons' results are made: some
    10^4 small lists per cost model and no cycle, for which the collector would rescan the whole heap."""
    collecting = pause and gc.isenabled()
    if collecting:
        gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def ratio_outcome(est: RatioEstimate) -> str:
    """``"cheaper"`` when the whole 95 % interval is below 1, ``"dearer"`` when above, else ``"no difference"``."""
    if est.hi < 1.0:
        return "cheaper"
    if est.lo > 1.0:
        return "dearer"
    return "no difference"
