"""The calibrated rule's refresh for many policy states at once: bin tables, survival laws, the rate, the value tables.

``companion.speculative.policies.Calibrated`` recomputes, every 8 newly verified steps, its
calibration table (``_bin_table``), the laws of the next step's survival (``_survival_laws``),
their expectation operators (``_expectation``), the optimal rate ``lam*`` (``optimal_rate``, by
bisection) and the value tables ``W_0 .. W_kmax`` at that rate. Here each is computed for a batch
of policy states (rows) in a few array operations, with the float64 operations of the policy's
own code in the same order (the sums and quantiles through
``companion.speculative.batched_numpy``), so that every number a decision reads has the same bits.

The rate is the one exception in method, not in result. The policy bisects
``excess(lam) = 1 - lam + W_0(1; lam)`` on ``[1, kmax + 1]`` (first on ``guess +- 0.05``) down to a
bracket narrower than ``tol`` and returns its lower end: about ten evaluations of the value
recursion. :func:`optimal_rates` returns the same lower end from a few: it predicts the root,
evaluates ``excess`` exactly (the policy's own float64 recursion) at the bisection points around the
prediction, and settles every other point of the bisection's path by monotonicity. In exact
arithmetic ``excess`` decreases with slope at most ``-sigma``, ``sigma = min(1, 1 + step_0)``
(``W_i`` for ``i >= 1`` does not increase with ``lam``, as every later step costs ``c + dv >= 0``;
``W_0`` grows at most at rate ``-step_0`` when the first draft's step ``c + V(1) - 1`` is negative);
its float64 evaluation is within ``eps`` of the exact value (``eps`` below: far above the rounding
of at most ``kmax`` levels of 65-term sums of numbers below ``kmax + 1``). So a point ``x`` with an
exactly evaluated ``y >= x + 2 eps / sigma`` where ``excess(y) > 0`` has ``excess(x) > 0`` in float64
as well, and symmetrically below zero: the bisection takes the same branch at every point, whether
evaluated or settled, and ends at the same lower end, whose value tables are then computed exactly.
"""
from __future__ import annotations

import numpy as np

from companion.speculative.batched_numpy import GRID_POINTS, row_sums, sorted_quantiles
from companion.speculative.policies import SURVIVAL_GRID

G = GRID_POINTS

# The interpolation operator of a survival value k / 64 (the laws' support is on that grid), worked out
# once with the arithmetic of policies._expectation: s_next = S_r * v, pos = 64 s_next, left = floor(pos)
# (at most 63), frac = pos - left; the operator adds (1 - frac) w at column left and frac w at left + 1.
_VALS = np.arange(G) / (G - 1)
_S_NEXT_RK = SURVIVAL_GRID[:, None] * _VALS[None, :]            # [grid row r, support value k]
_POS = _S_NEXT_RK * (G - 1)
_LEFT_RK = np.clip(np.floor(_POS).astype(int), 0, G - 2)
_FRAC_RK = _POS - _LEFT_RK
_COEF_LEFT_RK = 1 - _FRAC_RK
_ROW_BASE = np.arange(G) * G
# per side (the (1 - frac) term at left, the frac term at left + 1), support value k and grid row r: the
# flat index of the entry in its law's 65 x 65 operator, and the coefficient its weight multiplies
_INDEX_SKR = np.stack([_ROW_BASE[:, None] + _LEFT_RK, _ROW_BASE[:, None] + _LEFT_RK + 1]).transpose(0, 2, 1).copy()
_COEF_SKR = np.stack([_COEF_LEFT_RK, _FRAC_RK]).transpose(0, 2, 1).copy()

_LEVELS: dict[int, np.ndarray] = {}


def _levels(nb: np.ndarray, width: int) -> np.ndarray:
    """Per row, ``np.linspace(0, 1, nb + 1)[1:-1]`` (the inner quantile levels of ``nb`` bins), padded to ``width``."""
    out = np.full((len(nb), width), 0.5)
    for b in np.unique(nb):
        if b not in _LEVELS:
            _LEVELS[int(b)] = np.linspace(0, 1, int(b) + 1)[1:-1]
        out[nb == b, :int(b) - 1] = _LEVELS[int(b)]
    return out


def bin_tables(scores: np.ndarray, accepted: np.ndarray, first: np.ndarray, nd: np.ndarray, bins: np.ndarray,
               n0: np.ndarray, n0p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Calibrated._bin_table`` per row: ``(edges, rates, counts)``.

    Row ``r`` reads its first ``nd[r]`` verified steps (``scores``, ``accepted`` 1.0 / 0.0, ``first``:
    a round's first draft), with ``bins``, ``n0`` and ``n0p = n0 * prior`` its knobs. ``edges``
    ``[rows, E]``: the row's inner quantile edges (``np.unique(np.quantile(u, levels))``), then
    ``+inf``; ``rates`` ``[rows, E + 1]``: the rate of each bin; ``counts`` ``[rows, 2, E + 1]``: the
    steps in each bin that were a round's first draft, and the others (what the survival laws
    count). Past a row's own bins no step counts and the rates are ``n0 prior / n0``. Bin ``b`` holds the
    scores ``u`` with ``edges[b - 1] <= u < edges[b]`` (``searchsorted(edges, u, side="right")``),
    counted from the sorted scores; the counts are the policy's bincounts (whole numbers).
    """
    rows, width = scores.shape
    valid = np.arange(width)[None, :] < nd[:, None]
    nb = np.maximum(1, np.minimum(bins, nd // 8))
    e = max(int(nb.max(initial=1)) - 1, 1)
    srt = np.sort(np.where(valid, scores, np.inf), axis=1)
    edges = np.full((rows, e), np.inf)
    split = np.flatnonzero(nb > 1)
    if split.size:
        qs = sorted_quantiles(srt[split], nd[split], _levels(nb[split], e))
        qs[np.arange(e)[None, :] >= (nb[split] - 1)[:, None]] = np.inf
        qs.sort(axis=1)
        # np.unique: the sorted values without repeats (a repeat becomes +inf and sorts past the rest)
        qs[:, 1:][qs[:, 1:] == qs[:, :-1]] = np.inf
        qs.sort(axis=1)
        edges[split] = qs

    def per_bin(subset: np.ndarray) -> np.ndarray:
        """The steps of ``subset`` in each bin: differences of the counts below each edge."""
        ordered = srt if subset is valid else np.sort(np.where(subset, scores, np.inf), axis=1)
        below = count_below(ordered, edges)
        return np.diff(below, prepend=0, append=subset.sum(1)[:, None], axis=1)

    n = per_bin(valid).astype(float)
    acc = per_bin(valid & (accepted > 0)).astype(float)
    ones = per_bin(valid & first)
    counts = np.stack([ones, n.astype(np.intp) - ones], axis=1)
    rates = (acc + n0p[:, None]) / (n + n0[:, None])
    # pool adjacent violators where a row's own rates decrease somewhere (a non-decreasing row is its own fit)
    own = np.arange(e + 1)[None, :] <= np.isfinite(edges).sum(1)[:, None]
    falls = ((rates[:, 1:] < rates[:, :-1]) & own[:, 1:]).any(1)
    for r in np.flatnonzero(falls):
        k = int(own[r].sum())
        rates[r, :k] = _pava(rates[r, :k].tolist(), (n[r, :k] + n0[r]).tolist())
    return edges, rates, counts


def _pava(values: list[float], weights: list[float]) -> list[float]:
    """``policies.pava``, the same pools and the same float operations, on parallel lists (fewer objects)."""
    means: list[float] = []
    pooled: list[float] = []
    sizes: list[int] = []
    for v, w in zip(values, weights):
        means.append(v)
        pooled.append(w)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:
            m2, w2, n2 = means.pop(), pooled.pop(), sizes.pop()
            m1, w1 = means[-1], pooled[-1]
            means[-1] = (m1 * w1 + m2 * w2) / (w1 + w2)
            pooled[-1] = w1 + w2
            sizes[-1] += n2
    out: list[float] = []
    for m, n in zip(means, sizes):
        out.extend([m] * n)
    return out


def lookup_bins(edges: np.ndarray, rates: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``rates[searchsorted(edges, x, side="right")]`` per row (``x`` ``[rows, m]``): ``Calibrated._lookup`` of ``cal=bins``."""
    b = (x[:, :, None] >= edges[:, None, :]).sum(-1)
    return np.take_along_axis(rates, b, axis=1)


def count_below(sorted_rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``np.searchsorted(sorted_rows[r], x[r], side="left")`` for every row, in one search.

    Rows are kept apart by a complex key ``row + 1j * value`` (numpy orders complex numbers by real
    part, then imaginary part); ``+inf`` padding counts as no value below any finite ``x``.
    """
    rows, width = sorted_rows.shape
    keys = np.empty(sorted_rows.shape, dtype=complex)
    keys.real = np.arange(rows)[:, None]
    keys.imag = sorted_rows
    query = np.empty(x.shape, dtype=complex)
    query.real = np.arange(rows)[:, None]
    query.imag = x
    return np.searchsorted(keys.reshape(-1), query, side="left") - (np.arange(rows) * width)[:, None]


def survival_laws(looked: np.ndarray, first: np.ndarray, nd: np.ndarray, prior: np.ndarray, n0: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``Calibrated._survival_laws`` per row, for a round's first draft (class 0) and the others (class 1).

    ``looked``: each verified step's predicted survival, ``first``: whether it was a round's first
    draft, the first ``nd[r]`` of row ``r`` valid. Returns ``(kk, w, J)``: the law of class ``c`` of row
    ``r`` puts weight ``w[r, c, j]`` on ``kk[r, c, j] / 64`` for ``j < J[r, c]`` (in increasing order,
    the rest zero), with ``n0`` pseudo-steps at ``prior``, the weights summed and divided as ``_law``
    does.
    """
    rows, width = looked.shape
    valid = np.arange(width)[None, :] < nd[:, None]
    k = np.round(np.where(valid, looked, 0.0) * (G - 1)).astype(np.intp)
    cls = np.where(first, 0, 1)
    flat = ((np.arange(rows)[:, None] * 2 + cls) * G + k)[valid]
    counts = np.bincount(flat, minlength=rows * 2 * G).reshape(rows, 2, G)
    return _laws(counts, prior, n0)


def bin_laws(rates: np.ndarray, counts: np.ndarray, prior: np.ndarray, n0: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`survival_laws` of ``cal=bins`` rows from their tables: every step of bin ``b`` looks up
    ``rates[b]``, so a law counts ``counts[r, c, b]`` steps at ``round(64 rates[r, b]) / 64``."""
    rows, _, width = counts.shape
    k = np.round(rates[:, :width] * (G - 1)).astype(np.intp)
    flat = (np.arange(rows * 2).reshape(rows, 2, 1) * G + k[:, None, :]).reshape(-1)
    total = np.bincount(flat, weights=counts.reshape(-1), minlength=rows * 2 * G).reshape(rows, 2, G)
    return _laws(total.astype(np.intp), prior, n0)


def _laws(counts: np.ndarray, prior: np.ndarray, n0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The laws of :func:`survival_laws` from the steps counted at each grid value ``counts`` ``[rows, 2, 65]``."""
    rows = counts.shape[0]
    kp = np.round(prior * (G - 1)).astype(np.intp)
    w = counts.astype(float)
    r = np.arange(rows)
    w[r, :, kp] += n0[:, None]          # the pseudo-steps come last: count + n0, one rounding
    present = counts > 0
    present[r, :, kp] = True
    n = present.sum(-1)
    width_j = int(n.max())
    slot = np.cumsum(present, axis=-1) - 1
    at = np.nonzero(present)
    kk = np.zeros((rows, 2, width_j), dtype=np.intp)
    wc = np.zeros((rows, 2, width_j))
    kk[at[0], at[1], slot[at]] = at[2]
    wc[at[0], at[1], slot[at]] = w[at]
    total = row_sums(wc.reshape(rows * 2, width_j), n.reshape(-1)).reshape(rows, 2)
    return kk, wc / total[:, :, None], n


def expectation_ops(kk: np.ndarray, w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``policies._expectation`` of the laws of :func:`survival_laws`: ``(a [rows, 2, 65], M [rows, 2, 65, 65])``.

    ``a[r] = sum_j S_r v_j w_j`` (numpy's sum over the support) and ``M`` the interpolation
    operator, built by a bincount that adds each entry's terms in the order ``_expectation``'s does
    (for each grid row, the ``(1 - frac) w`` terms by support point, then the ``frac w`` ones; the
    padding adds zeros). Class 0 (a round's first draft) only at ``S = 1``, its last grid row: it
    makes ``W_0``, and the rule reads ``W_0`` only there (``excess`` reads ``W_0(1)``, the
    continuation ``W_1 .. W_kmax``); its other rows are left zero. Class 1 in full, the rows taken
    in groups of similar support sizes, so that little is padded.
    """
    rows = kk.shape[0]
    a = np.zeros((rows, 2, G))
    m = np.zeros((rows, 2, G, G))
    width0 = int(n[:, 0].max())
    a[:, 0, -1], m[:, 0, -1] = _last_row(kk[:, 0, :width0], w[:, 0, :width0], n[:, 0])
    for lo, hi in ((0, 8), (8, 16), (16, 32), (32, G + 1)):
        pick = np.flatnonzero((n[:, 1] > lo) & (n[:, 1] <= hi))
        if pick.size:
            width = min(hi, kk.shape[2])
            a[pick, 1], m[pick, 1] = _operator(kk[pick, 1, :width], w[pick, 1, :width], n[pick, 1])
    return a, m


def _last_row(kk: np.ndarray, w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a[64]`` and ``M[64, :]`` of each row's law (support ``kk``, weights ``w``)."""
    rows = kk.shape[0]
    a = row_sums(_S_NEXT_RK[G - 1, kk] * w, n)
    left = _LEFT_RK[G - 1, kk] + (np.arange(rows) * G)[:, None]
    index = np.stack([left, left + 1], axis=1)                         # [rows, side, J]
    weights = np.stack([_COEF_LEFT_RK[G - 1, kk] * w, _FRAC_RK[G - 1, kk] * w], axis=1)
    return a, np.bincount(index.reshape(-1), weights=weights.reshape(-1), minlength=rows * G).reshape(rows, G)


def _operator(kk: np.ndarray, w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a`` ``[rows, 65]`` and ``M`` ``[rows, 65, 65]`` of each row's law, every grid row."""
    rows, width = kk.shape
    # grid row first, support point last: [65, rows, J], each gathered from the [r, k] tables
    a = row_sums((_S_NEXT_RK[:, kk] * w).reshape(-1, width), np.broadcast_to(n, (G, rows)).reshape(-1))
    # [side, rows, J, 65]: for a fixed entry (row, grid row, column) its terms come side by side, then by
    # support point, as _expectation's flat arrays give them to its bincount
    index = _INDEX_SKR[:, kk] + (np.arange(rows) * (G * G))[None, :, None, None]
    weights = _COEF_SKR[:, kk] * w[None, :, :, None]
    m = np.bincount(index.reshape(-1), weights=weights.reshape(-1), minlength=rows * G * G)
    return a.reshape(G, rows).T, m.reshape(rows, G, G)


def value_tables(lam: np.ndarray, a: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``policies._bellman`` per row and rate: ``W_0 .. W_kmax`` ``[kmax + 1, points, rows, 65]`` at rate
    ``lam[p, r]`` (``W_0`` at ``S = 1`` only, ``nan`` elsewhere: see :func:`expectation_ops`).

    ``a`` ``[rows, 2, 65]``, ``m`` ``[rows, 2, 65, 65]`` (class 0 for ``W_0``, class 1 above), ``steps``
    ``[rows, kmax]`` the costs ``c + V(i + 1) - V(i)``. The same operations in the same order: per
    level ``(M @ W_{i+1}) + a``, minus ``lam * step_i``, floored at 0; the batched matrix-vector
    products are the single ones, row by row (numpy hands each to BLAS's gemv). Level first, so that
    each level is one contiguous block.
    """
    points, rows = lam.shape
    kmax = steps.shape[1]
    tables = np.empty((kmax + 1, points, rows, G))
    tables[kmax] = 0.0
    cost = lam[:, :, None] * steps[None]                # lam * step_i, one product each
    for i in range(kmax - 1, -1, -1):
        c = 0 if i == 0 else 1
        w = tables[i]
        if i == kmax - 1:
            np.add(a[None, :, c], 0.0, out=w)
        else:
            for p in range(points):
                np.matmul(m[:, c], tables[i + 1, p, :, :, None], out=w[p, :, :, None])
            w += a[None, :, c]
        w -= cost[:, :, i, None]
        np.maximum(w, 0.0, out=w)
    tables[0, :, :, :-1] = np.nan       # W_0 is made at S = 1 only (see expectation_ops)
    return tables


def excess(lam: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """``1 - lam + W_0(1; lam)``: the best round's ``E[N] - lam E[C]`` (``optimal_rate``'s ``excess``), from
    :func:`value_tables`' tables."""
    return 1.0 - lam + tables[0, ..., -1]


def optimal_rates(a: np.ndarray, m: np.ndarray, steps: np.ndarray, guess: np.ndarray, slope: np.ndarray,
                  tol: float = 1e-3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``policies.optimal_rate`` per row (``guess`` ``nan`` for none): ``(lam, tables at lam, slope)``.

    The lower end of the policy's bisection, bit for bit, from a few exact evaluations (see the
    module docstring): each sweep walks a row's bisection on what is known, evaluates exactly the
    points its walk could only estimate (the largest one estimated to lie below the root and the
    smallest above it), and is done once those confirm the walk. ``slope`` is a row's estimate of
    ``-d excess / d lam`` (``nan``: none), from the last call; the returned one is for the next.
    """
    rows, kmax = steps.shape
    top = float(kmax + 1)
    step_size = np.abs(steps).max(1)
    sigma = np.minimum(1.0, 1.0 + steps[:, 0]) * (1 - 1e-9)
    eps = 1e-11 * kmax * (80.0 + top * step_size)
    # monotonicity needs every later step to cost >= 0 (c, dv >= 0); a row without it settles nothing by it
    sure = (sigma > 0) & (steps[:, 1:] >= 0).all(1)
    margin = np.where(sure, 2 * eps / np.maximum(sigma, 1e-300), np.inf)
    has_guess = ~np.isnan(guess)
    known_x = np.full((rows, 0), np.nan)
    known_e = np.full((rows, 0), np.nan)
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (rows, x, tables) of every evaluation
    estimate = np.where(has_guess, guess, 0.5 * (1.0 + top))
    lam = np.ones(rows)
    active = np.arange(rows)
    for sweep in range(64):
        if active.size == 0:
            break
        r = active
        lo, need, first_open, y2, z2 = _walk(known_x[r], known_e[r], estimate[r], has_guess[r], guess[r], top, tol,
                                              margin[r])
        y, z = need[:, 0].copy(), need[:, 1].copy()
        if sweep == 0:
            # first, one point near the guess: with the slope carried from the last refresh it predicts
            # the root well enough that the next sweep's two points usually settle the whole path
            one = has_guess[r] & ~np.isnan(slope[r])
            need[one, 1] = np.nan
        if sweep >= 3:                  # a slow row: also settle its path's first unsettled point
            need = np.concatenate([need, first_open[:, None]], axis=1)
        settled = np.isnan(y) & np.isnan(z)
        # the lower end's own tables, once its branch is settled
        need = np.concatenate([need, np.where(settled & ~(known_x[r] == lo[:, None]).any(1), lo, np.nan)[:, None]],
                              axis=1)
        # evaluate every needed point not yet known, all of this sweep's at once
        need[(known_x[r][:, :, None] == need[:, None, :]).any(1)] = np.nan
        need = need[:, ~np.isnan(need).all(0)]
        pick = np.flatnonzero(~np.isnan(need).all(1))
        if pick.size:
            which = r[pick]
            x = need[pick].T
            if which.size == rows:
                t = value_tables(np.where(np.isnan(x), 1.0, x), a, m, steps)
            else:
                t = value_tables(np.where(np.isnan(x), 1.0, x), a[which], m[which], steps[which])
            e = excess(x, t)
            for p in range(x.shape[0]):
                got = ~np.isnan(x[p])
                found.append((which[got], x[p, got], t[:, p, got]))
            column = np.full((2, rows, x.shape[0]), np.nan)
            column[0, which] = x.T
            column[1, which] = e.T
            known_x = np.concatenate([known_x, column[0]], axis=1)
            known_e = np.concatenate([known_e, column[1]], axis=1)
        # done: the walk needed nothing, or its estimated extremes came out as estimated, the next ones
        # are settled from them, and the lower end is evaluated
        kx, ke = known_x[r], known_e[r]
        e_y = np.where(kx == y[:, None], ke, -np.inf).max(1, initial=-np.inf)     # -inf / +inf: not evaluated
        e_z = np.where(kx == z[:, None], ke, np.inf).min(1, initial=np.inf)
        done = ((np.isnan(y) | (e_y > 0)) & (np.isnan(z) | ~(e_z > 0))
                & (np.isnan(y2) | (y2 <= y - margin[r])) & (np.isnan(z2) | (z2 >= z + margin[r]))
                & (kx == lo[:, None]).any(1) & (sweep < 3))
        done |= settled & (kx == lo[:, None]).any(1)
        lam[r[done]] = lo[done]
        active = r[~done]
        if active.size:
            estimate[active] = _estimate(known_x[active], known_e[active], estimate[active], slope[active])
    else:
        raise RuntimeError("optimal_rates: the bisection's path did not settle")
    tables = np.zeros((rows, kmax + 1, G))
    for which, x, t in found:
        hit = x == lam[which]
        tables[which[hit]] = np.moveaxis(t[:, hit], 0, 1)
    return lam, tables, _slope(known_x, known_e, slope)


def _walk(known_x: np.ndarray, known_e: np.ndarray, estimate: np.ndarray, has_guess: np.ndarray, guess: np.ndarray,
          top: float, tol: float, margin: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The bisection of ``optimal_rate`` per row, each branch taken from an exact evaluation, a
    settled sign (monotonicity from one, ``margin`` away) or, failing both, the ``estimate`` of the root.

    Returns the lower end it reaches; the points to evaluate next (per row: the largest and the
    smallest estimated point with a positive / non-positive branch, ``nan`` for none); the first
    estimated point of each row's path; and the second largest and second smallest estimated points
    (``nan`` for none).
    """
    rows = len(estimate)
    any_known = known_x.shape[1] > 0
    pos_known = known_e > 0                         # nan (no point) compares False
    sure_below = np.where(pos_known, known_x, -np.inf).max(1, initial=-np.inf) - margin
    sure_above = np.where(~np.isnan(known_x) & ~pos_known, known_x, np.inf).min(1, initial=np.inf) + margin
    seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []     # (point, positive, estimated) per decision

    def decide(x: np.ndarray, live: np.ndarray) -> np.ndarray:
        guessed = x < estimate
        if not any_known:
            seen.append((x, guessed, live))
            return guessed
        same = known_x == x[:, None]
        exact = same.any(1)
        sure_pos = x <= sure_below
        sure_neg = x >= sure_above
        positive = np.where(exact, (same & pos_known).any(1), sure_pos | (~sure_neg & guessed))
        seen.append((x, positive, live & ~(exact | sure_pos | sure_neg)))
        return positive

    lo = np.ones(rows)
    hi = np.full(rows, top)
    live = decide(lo, np.ones(rows, dtype=bool))       # excess(1) <= 0: the rate is 1
    g_lo = np.maximum(1.0, guess - 0.05)
    g_hi = np.minimum(top, guess + 0.05)
    probe = live & has_guess
    first = decide(np.where(probe, g_lo, 1.0), probe)
    second = decide(np.where(probe & first, g_hi, 1.0), probe & first)
    take = probe & first & ~second
    lo = np.where(take, g_lo, lo)
    hi = np.where(take, g_hi, hi)
    going = live & (hi - lo > tol)
    while going.any():
        mid = 0.5 * (lo + hi)
        up = decide(mid, going)
        lo = np.where(up & going, mid, lo)
        hi = np.where(~up & going, mid, hi)
        going &= hi - lo > tol
    x, positive, estimated = (np.stack(v) for v in zip(*seen))      # [decisions, rows]
    below = np.where(estimated & positive, x, -np.inf)
    above = np.where(estimated & ~positive, x, np.inf)
    below.sort(axis=0)
    above.sort(axis=0)
    first_open = np.where(estimated.any(0), x[np.argmax(estimated, axis=0), np.arange(rows)], np.nan)

    def finite(v: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(v), v, np.nan)

    return (lo, np.stack([finite(below[-1]), finite(above[0])], axis=1), first_open,
            finite(below[-2]) if len(seen) > 1 else np.full(rows, np.nan),
            finite(above[1]) if len(seen) > 1 else np.full(rows, np.nan))


def _estimate(known_x: np.ndarray, known_e: np.ndarray, previous: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """The root of ``excess`` predicted from the exact evaluations so far: the secant through the closest
    points on either side; with one side only, a step from its nearest point along the secant of its
    two nearest, or along the row's ``slope`` estimate (1 when it has none)."""
    valid = ~np.isnan(known_x)
    pos = valid & (known_e > 0)
    neg = valid & ~(known_e > 0)
    xp = np.where(pos, known_x, -np.inf)
    xn = np.where(neg, known_x, np.inf)
    order_p = np.argsort(-xp, axis=1)               # nearest positive points first
    order_n = np.argsort(xn, axis=1)
    y1, y2 = (np.take_along_axis(xp, order_p[:, i:i + 1], 1)[:, 0] if order_p.shape[1] > i else
              np.full(len(xp), -np.inf) for i in (0, 1))
    z1, z2 = (np.take_along_axis(xn, order_n[:, i:i + 1], 1)[:, 0] if order_n.shape[1] > i else
              np.full(len(xn), np.inf) for i in (0, 1))
    ey1, ey2 = (np.take_along_axis(np.where(pos, known_e, 0.0), order_p[:, i:i + 1], 1)[:, 0]
                if order_p.shape[1] > i else np.zeros(len(xp)) for i in (0, 1))
    ez1, ez2 = (np.take_along_axis(np.where(neg, known_e, 0.0), order_n[:, i:i + 1], 1)[:, 0]
                if order_n.shape[1] > i else np.zeros(len(xn)) for i in (0, 1))
    fallback = np.where(np.isnan(slope) | ~(slope > 0), 1.0, slope)
    with np.errstate(divide="ignore", invalid="ignore"):
        both = np.isfinite(y1) & np.isfinite(z1)
        secant = y1 + ey1 * (z1 - y1) / (ey1 - ez1)
        s_pos = np.where(np.isfinite(y2) & (ey2 > ey1), (ey2 - ey1) / (y1 - y2), fallback)
        s_neg = np.where(np.isfinite(z2) & (ez1 > ez2), (ez1 - ez2) / (z2 - z1), fallback)
        from_pos = y1 + ey1 / s_pos
        from_neg = z1 + ez1 / s_neg
    out = np.where(both, secant, np.where(np.isfinite(y1), from_pos, np.where(np.isfinite(z1), from_neg, previous)))
    return np.where(np.isfinite(out), out, previous)


def _slope(known_x: np.ndarray, known_e: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """``-d excess / d lam`` between the closest exactly evaluated points on either side of the root
    (the previous estimate where a row has no such pair)."""
    valid = ~np.isnan(known_x)
    pos = valid & (known_e > 0)
    neg = valid & ~(known_e > 0)
    y = np.where(pos, known_x, -np.inf).max(1, initial=-np.inf)
    z = np.where(neg, known_x, np.inf).min(1, initial=np.inf)
    ey = np.where(pos & (known_x == y[:, None]), known_e, -np.inf).max(1, initial=-np.inf)
    ez = np.where(neg & (known_x == z[:, None]), known_e, np.inf).min(1, initial=np.inf)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (ey - ez) / (z - y)
    return np.where(np.isfinite(s) & (s > 0), s, previous)
