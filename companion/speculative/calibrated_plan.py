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
from companion.speculative.policies import SURVIVAL_GRID, pava

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

_LEVELS: dict[int, np.ndarray] = {}


def _levels(nb: np.ndarray, width: int) -> np.ndarray:
    """Per row, ``np.linspace(0, 1, nb + 1)[1:-1]`` (the inner quantile levels of ``nb`` bins), padded to ``width``."""
    out = np.full((len(nb), width), 0.5)
    for b in np.unique(nb):
        if b not in _LEVELS:
            _LEVELS[int(b)] = np.linspace(0, 1, int(b) + 1)[1:-1]
        out[nb == b, :int(b) - 1] = _LEVELS[int(b)]
    return out


def bin_tables(scores: np.ndarray, accepted: np.ndarray, nd: np.ndarray, bins: np.ndarray, n0: np.ndarray,
               n0p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Calibrated._bin_table`` per row: ``(edges, rates)``.

    Row ``r`` reads its first ``nd[r]`` verified steps (``scores``, ``accepted`` 1.0 / 0.0), with
    ``bins``, ``n0`` and ``n0p = n0 * prior`` its knobs. ``edges`` ``[rows, E]``: the row's inner
    quantile edges (``np.unique(np.quantile(u, levels))``), then ``+inf``; ``rates`` ``[rows, E + 1]``:
    the rate of each bin (past the row's own bins, entries that no score reaches).
    """
    rows, width = scores.shape
    valid = np.arange(width)[None, :] < nd[:, None]
    nb = np.maximum(1, np.minimum(bins, nd // 8))
    e = max(int(nb.max(initial=1)) - 1, 1)
    edges = np.full((rows, e), np.inf)
    split = np.flatnonzero(nb > 1)
    if split.size:
        srt = np.sort(np.where(valid[split], scores[split], np.inf), axis=1)
        qs = sorted_quantiles(srt, nd[split], _levels(nb[split], e))
        qs[np.arange(e)[None, :] >= (nb[split] - 1)[:, None]] = np.inf
        qs.sort(axis=1)
        # np.unique: the sorted values without repeats (a repeat becomes +inf and sorts past the rest)
        qs[:, 1:][qs[:, 1:] == qs[:, :-1]] = np.inf
        qs.sort(axis=1)
        edges[split] = qs
    # searchsorted(edges, u, side="right"): the number of edges <= u
    b = (scores[:, :, None] >= edges[:, None, :]).sum(-1)
    flat = (np.arange(rows)[:, None] * (e + 1) + b)[valid]
    n = np.bincount(flat, minlength=rows * (e + 1)).reshape(rows, e + 1).astype(float)
    acc = np.bincount(flat, weights=accepted[valid], minlength=rows * (e + 1)).reshape(rows, e + 1)
    rates = (acc + n0p[:, None]) / (n + n0[:, None])
    # pool adjacent violators where a row's own rates decrease somewhere (a non-decreasing row is its own fit)
    own = np.arange(e + 1)[None, :] <= np.isfinite(edges).sum(1)[:, None]
    falls = ((rates[:, 1:] < rates[:, :-1]) & own[:, 1:]).any(1)
    for r in np.flatnonzero(falls):
        k = int(own[r].sum())
        rates[r, :k] = pava(rates[r, :k].tolist(), (n[r, :k] + n0[r]).tolist())
    return edges, rates


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
    k = np.round(looked * (G - 1)).astype(np.intp)
    cls = np.where(first, 0, 1)
    flat = ((np.arange(rows)[:, None] * 2 + cls) * G + k)[valid]
    counts = np.bincount(flat, minlength=rows * 2 * G).reshape(rows, 2, G)
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
    """``policies._expectation`` of every law of :func:`survival_laws`: ``(a [rows, 2, 65], M [rows, 2, 65, 65])``.

    ``a[r] = sum_j S_r v_j w_j`` (numpy's sum over the support) and ``M`` the interpolation
    operator, built by one bincount that adds each entry's terms in the order ``_expectation``'s
    does (for each grid row, the ``(1 - frac) w`` terms by support point, then the ``frac w`` ones;
    the padding adds zeros). Rows are taken in groups of similar support sizes, so that little is padded.
    """
    rows = kk.shape[0]
    a = np.zeros((rows, 2, G))
    m = np.zeros((rows, 2, G, G))
    size = n.max(1)
    for lo, hi in ((0, 8), (8, 16), (16, 32), (32, G + 1)):
        pick = np.flatnonzero((size > lo) & (size <= hi))
        if pick.size:
            a[pick], m[pick] = _expectation_group(kk[pick, :, :hi], w[pick, :, :hi], n[pick])
    return a, m


def _expectation_group(kk: np.ndarray, w: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    rows, _, width = kk.shape
    # grid row first, support point last: [65, rows, 2, J], each gathered from the [r, k] tables
    terms = _S_NEXT_RK[:, kk] * w
    a = row_sums(terms.reshape(-1, width), np.broadcast_to(n, (G, rows, 2)).reshape(-1))
    a = a.reshape(G, rows, 2).transpose(1, 2, 0)
    # one bin per (row, class, grid row, column); for a fixed bin its terms come side by side, then by
    # support point, as _expectation's flat arrays give them
    left = _LEFT_RK[:, kk] + (np.arange(rows * 2) * (G * G)).reshape(1, rows, 2, 1) + _ROW_BASE.reshape(G, 1, 1, 1)
    index = np.stack([left, left + 1], axis=3)                                   # [65, rows, 2, side, J]
    weights = np.stack([_COEF_LEFT_RK[:, kk] * w, _FRAC_RK[:, kk] * w], axis=3)
    m = np.bincount(index.reshape(-1), weights=weights.reshape(-1), minlength=rows * 2 * G * G)
    return a, m.reshape(rows, 2, G, G)


def value_tables(lam: np.ndarray, a: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """``policies._bellman`` per row: ``W_0 .. W_kmax`` ``[rows, kmax + 1, 65]`` at rate ``lam[r]``.

    ``a`` ``[rows, 2, 65]``, ``m`` ``[rows, 2, 65, 65]`` (class 0 for ``W_0``, class 1 above), ``steps``
    ``[rows, kmax]`` the costs ``c + V(i + 1) - V(i)``. The same operations in the same order; the
    batched matrix-vector products are the single ones, row by row (numpy hands each to BLAS's gemv).
    """
    rows, kmax = steps.shape
    tables = np.zeros((rows, kmax + 1, G))
    w_next = tables[:, kmax].copy()
    for i in range(kmax - 1, -1, -1):
        c = 0 if i == 0 else 1
        if i == kmax - 1:
            w = a[:, c] + 0.0
        else:
            w = np.matmul(m[:, c], w_next[:, :, None])[:, :, 0]
            w += a[:, c]
        w -= (lam * steps[:, i])[:, None]
        np.maximum(w, 0.0, out=w)
        tables[:, i] = w
        w_next = w
    return tables


def excess(lam: np.ndarray, tables: np.ndarray) -> np.ndarray:
    """``1 - lam + W_0(1; lam)``: the best round's ``E[N] - lam E[C]`` (``optimal_rate``'s ``excess``)."""
    return 1.0 - lam + tables[:, 0, -1]


def optimal_rates(a: np.ndarray, m: np.ndarray, steps: np.ndarray, guess: np.ndarray, slope: np.ndarray,
                  tol: float = 1e-3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``policies.optimal_rate`` per row (``guess`` ``nan`` for none): ``(lam, tables at lam, slope)``.

    The lower end of the policy's bisection, bit for bit, from a few exact evaluations (see the
    module docstring). ``slope`` is a row's estimate of ``-d excess / d lam`` (``nan``: none), from
    the last call; the returned one is for the next.
    """
    rows, kmax = steps.shape
    top = float(kmax + 1)
    step_size = np.abs(steps).max(1)
    sigma = np.minimum(1.0, 1.0 + steps[:, 0]) * (1 - 1e-9)
    eps = 1e-11 * kmax * (80.0 + top * step_size)
    margin = np.where(sigma > 0, 2 * eps / np.maximum(sigma, 1e-300), np.inf)
    has_guess = ~np.isnan(guess)
    known_x = np.zeros((rows, 0))
    known_e = np.zeros((rows, 0))
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []   # (rows, x, tables) of every evaluation
    estimate = np.where(has_guess, guess, 0.5 * (1.0 + top))
    lo = np.ones(rows)
    for sweep in range(64):
        lo, need, uncertain_first = _walk(known_x, known_e, estimate, has_guess, guess, top, tol, margin)
        if sweep >= 3:                  # a slow row: also settle its path's first unsettled point
            need = np.concatenate([need, uncertain_first[:, None]], axis=1)
        # the lower end's own tables, once its branch is settled
        settled = np.isnan(need).all(1)
        at_lo = (known_x == lo[:, None]).any(1)
        need = np.concatenate([need, np.where(settled & ~at_lo, lo, np.nan)[:, None]], axis=1)
        if np.isnan(need).all():
            break
        for col in range(need.shape[1]):
            x = need[:, col]
            which = np.flatnonzero(~np.isnan(x) & ~(known_x == x[:, None]).any(1))
            if which.size == 0:
                continue
            if which.size == rows:
                t = value_tables(x, a, m, steps)
            else:
                t = value_tables(x[which], a[which], m[which], steps[which])
            ex = np.full(rows, np.nan)
            ex[which] = excess(x[which], t)
            found.append((which, x[which], t))
            xs = np.full(rows, np.nan)
            xs[which] = x[which]
            known_x = np.concatenate([known_x, xs[:, None]], axis=1)
            known_e = np.concatenate([known_e, ex[:, None]], axis=1)
        estimate = _estimate(known_x, known_e, estimate, slope)
    else:
        raise RuntimeError("optimal_rates: the bisection's path did not settle")
    tables = np.zeros((rows, kmax + 1, G))
    for which, x, t in found:
        hit = x == lo[which]
        tables[which[hit]] = t[hit]
    return lo, tables, _slope(known_x, known_e, slope)


def _walk(known_x: np.ndarray, known_e: np.ndarray, estimate: np.ndarray, has_guess: np.ndarray, guess: np.ndarray,
          top: float, tol: float, margin: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The bisection of ``optimal_rate`` per row, each branch taken from an exact evaluation, a
    settled sign (monotonicity from one, ``margin`` away) or, failing both, the ``estimate`` of the root.

    Returns the lower end it reaches, the points to evaluate next (per row: the largest and the
    smallest estimated point with a positive / non-positive branch, ``nan`` for none) and the first
    estimated point of each row's path (``nan`` for none).
    """
    rows = len(estimate)
    valid = ~np.isnan(known_x)
    pos_known = valid & (known_e > 0)
    neg_known = valid & ~(known_e > 0)
    big_pos = np.full(rows, -np.inf)
    small_neg = np.full(rows, np.inf)
    first_open = np.full(rows, np.nan)

    def decide(x: np.ndarray, live: np.ndarray) -> np.ndarray:
        same = valid & (known_x == x[:, None])
        exact = same.any(1)
        sure_pos = (pos_known & (known_x >= (x + margin)[:, None])).any(1)
        sure_neg = (neg_known & (known_x <= (x - margin)[:, None])).any(1)
        open_ = live & ~exact & ~sure_pos & ~sure_neg
        positive = np.where(exact, (same & pos_known).any(1), np.where(sure_pos | sure_neg, sure_pos, x < estimate))
        np.maximum(big_pos, np.where(open_ & positive, x, -np.inf), out=big_pos)
        np.minimum(small_neg, np.where(open_ & ~positive, x, np.inf), out=small_neg)
        first_open[open_ & np.isnan(first_open)] = x[open_ & np.isnan(first_open)]
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
        lo = np.where(going & up, mid, lo)
        hi = np.where(going & ~up, mid, hi)
        going &= hi - lo > tol
    need = np.stack([np.where(np.isfinite(big_pos), big_pos, np.nan),
                     np.where(np.isfinite(small_neg), small_neg, np.nan)], axis=1)
    return lo, need, first_open


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
