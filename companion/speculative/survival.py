"""The survival plan of the calibrated cost rule: value functions ``W_i(S)`` on a grid of survival
probabilities and the optimal rate ``lam*`` (the rule itself: :mod:`companion.speculative.calibrated`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def pava(values: list[float], weights: list[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for m, _, n in blocks:
        out.extend([m] * int(n))
    return out


SURVIVAL_GRID = np.linspace(0.0, 1.0, 65)
"""Where the value functions ``W_i(S)`` are tabulated (linear interpolation in between)."""

Law = tuple[np.ndarray, np.ndarray]


def _expectation(law: Law) -> tuple[np.ndarray, np.ndarray]:
    """``(a, M)`` with ``E_s[S s + W(S s)] = a + M @ W`` at every grid point ``S``, for ``W`` tabulated on
    :data:`SURVIVAL_GRID` and read by linear interpolation (what ``np.interp`` does on that grid).

    The law is fixed while the rate is searched, so the interpolation weights are worked out once
    and each Bellman step is one small matrix-vector product.
    """
    vals, w = law
    g = SURVIVAL_GRID.size
    s_next = SURVIVAL_GRID[:, None] * np.asarray(vals, dtype=float)[None, :]  # in [0, 1]
    pos = s_next * (g - 1)
    left = np.clip(np.floor(pos).astype(int), 0, g - 2)
    frac = pos - left
    rows = np.arange(g)[:, None] * g
    # m[r, left] += (1 - frac) w, then m[r, left + 1] += frac w, each in the row-major order of the
    # pairs: one bincount over the flat indices adds the same terms in the same order (bit for bit
    # the two np.add.at calls it replaces, at a fraction of their time)
    flat = np.concatenate([(rows + left).reshape(-1), (rows + left + 1).reshape(-1)])
    weights = np.concatenate([((1 - frac) * w[None, :]).reshape(-1), (frac * w[None, :]).reshape(-1)])
    m = np.bincount(flat, weights=weights, minlength=g * g).reshape(g, g)
    return (s_next * w[None, :]).sum(1), m


def bellman(lam: float, laws: Sequence[Law], c: float, verify_cost: Callable[[int], float], kmax: int,
            _ops: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> list[np.ndarray]:
    """Value functions ``W_0 .. W_kmax`` on :data:`SURVIVAL_GRID`.

    ``W_kmax = 0`` and ``W_i(S) = max(0, E_s[S s + W_{i+1}(S s)] - lam (c + V(i+1) - V(i)))``, with
    ``s`` drawn from ``laws[0]`` (values, weights summing to 1) for the first draft of a round and
    from ``laws[1]`` for later ones. ``_ops``: the laws' :func:`_expectation` operators, when the
    caller evaluates many rates for the same laws.
    """
    ops = _ops if _ops is not None else [_expectation(laws[0]), _expectation(laws[1])]
    return _bellman(lam, ops, _step_costs(c, verify_cost, kmax))


def _step_costs(c: float, verify_cost: Callable[[int], float], kmax: int) -> list[float]:
    """``c + V(i+1) - V(i)`` for ``i = 0 .. kmax - 1``: the cost of one more drafter call after ``i``."""
    return [c + verify_cost(i + 1) - verify_cost(i) for i in range(kmax)]


def _bellman(lam: float, ops: Sequence[tuple[np.ndarray, np.ndarray]], steps: Sequence[float]) -> list[np.ndarray]:
    """:func:`bellman` with the expectation operators and the step costs worked out: the same
    float64 operations in the same order (``(a + M @ W) - lam * step``, then ``max(., 0)``), in
    buffers of its own. ``M @ 0`` is exactly 0 (``M >= 0``), so the first step skips the product."""
    kmax = len(steps)
    w_next = np.zeros_like(SURVIVAL_GRID)
    tables = [w_next]
    for i in range(kmax - 1, -1, -1):
        a, m = ops[0] if i == 0 else ops[1]
        if i == kmax - 1:
            w = a + 0.0
        else:
            w = m @ w_next
            w += a
        w -= lam * steps[i]
        np.maximum(w, 0.0, out=w)
        w_next = w
        tables.append(w_next)
    return tables[::-1]


def optimal_rate(laws: Sequence[Law], c: float, verify_cost: Callable[[int], float], kmax: int,
                 tol: float = 1e-4, guess: float | None = None) -> tuple[float, list[np.ndarray]]:
    """``(lam*, W tables at lam*)``: the root of ``1 - lam + W_0(1; lam) = 0`` by bisection on ``[1, kmax + 1]``.

    ``1 - lam + W_0(1; lam)`` is the best ``E[N] - lam E[C]`` of a round (one target token at cost
    ``V(0) = 1`` plus the value of drafting); it decreases in ``lam``, and its root is the best
    tokens-per-cost rate the model allows (Dinkelbach). 1 when drafting never pays. ``guess``
    (e.g. the previous root) narrows the first bracket to ``guess +- 0.05`` when it holds the root.
    """
    ops = [_expectation(laws[0]), _expectation(laws[1])]
    steps = _step_costs(c, verify_cost, kmax)
    seen: dict[float, list[np.ndarray]] = {}   # the tables at every rate tried (the answer is one of them)

    def tables(lam: float) -> list[np.ndarray]:
        if lam not in seen:
            seen[lam] = _bellman(lam, ops, steps)
        return seen[lam]

    def excess(lam: float) -> float:
        return 1.0 - lam + tables(lam)[0][-1]

    lo, hi = 1.0, float(kmax + 1)
    if excess(lo) <= 0.0:
        return 1.0, tables(1.0)
    if guess is not None:
        g_lo, g_hi = max(lo, guess - 0.05), min(hi, guess + 0.05)
        if excess(g_lo) > 0.0 and excess(g_hi) <= 0.0:
            lo, hi = g_lo, g_hi
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if excess(mid) > 0.0:
            lo = mid
        else:
            hi = mid
    return lo, tables(lo)
