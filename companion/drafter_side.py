"""Drafter-side certificates: what the drafter's own distribution ``q`` guarantees at decode time.

The target-side certificate needs the target ``p``, which the decoder only sees after the
verification forward. Swapping the roles gives a number the drafter can compute before it
proposes anything. For the drafter's greedy token ``d = argmax q`` and a criterion ``c`` that
accepts ``y`` iff ``p_y >= tau(p)`` (typical acceptance: iff ``p_y > tau(p)``),

    rho~_c(q) = inf { KL(p || q) : c rejects d under p }      (over the closure of that set),

and any target with ``KL(p || q) < rho~_c(q)`` accepts ``d``. Ties: every maximiser of ``q``
counts as the draft and the certificate is the worst case over them; every formula below reads
only the sorted values ``q(1) >= q(2) >= ...``, so it is the same for each maximiser. For a
greedy tree the drafter proposes its top ``m`` tokens (again the worst choice among ties at
``q(m)``), and the tree fails iff the target's greedy token lies outside them.

How each is computed (``KL(p||q)`` is minimised over ``p``; on a set cut out by linear
constraints the minimiser is ``q`` exponentially tilted on the constrained tokens, and the
minimum is ``-log`` of the tilted normaliser; ``R`` is the drafter's mass outside the named
tokens):

* ``greedy``: some ``z`` reaches ``p_z >= p_d``; the cheapest ``z`` is the runner-up and
  ``rho~ = -log(1 - (sqrt q(1) - sqrt q(2))^2)``.
* ``topm:M``: ``M`` tokens reach ``p_z >= p_d``. The cheapest are ``q(2..M+1)``; ``d`` is pooled
  with the ``j`` weakest of them at one level ``p = G / Z`` (``G`` the geometric mean of the
  pooled ``q``, ``j`` minimising ``G``), ``Z = R + (j+1) G``, ``rho~ = -log Z``.
* ``tree:M``: the token ``q(M+1)`` must reach the top tokens ``q(1..M)``: pooled with the ``j``
  strongest of them (``j`` maximising ``G``), ``rho~ = -log(R + (j+1) G)``.
* ``multiplicative:A``: ``p_d <= A p_z`` with ``z`` the runner-up. The tilt
  ``lambda = log(q(1) / (A q(2))) / (1 + A)`` gives ``Z = R + q(1) e^-lambda + q(2) e^(A lambda)
  = R + W`` with ``W = (1 + 1/A) q(1)^(A/(1+A)) (A q(2))^(1/(1+A))``; ``rho~ = -log Z``, and 0
  when ``q(1) <= A q(2)``.
* ``additive:D``: ``p_z - p_d >= D`` with ``z`` the runner-up. The tilt ``x = e^lambda`` solves
  ``q(2)(1 - D) x^2 - D R x - q(1)(1 + D) = 0``; ``rho~ = D lambda - log Z``,
  ``Z = R + q(2) x + q(1) / x``; ``+inf`` for ``D >= 1`` (nothing is ever rejected).
* ``topk-delta:K,D``: rejected iff rejected by ``topm:K`` or by ``additive:D``: the minimum
  of the two (the first is empty, ``+inf``, when ``K = V``).
* ``typical:E,D``: rejected iff ``p_d <= min(E, D e^-H(p))``, i.e. iff ``p_d <= E`` *and*
  ``p_d <= D e^-H(p)`` (Medusa accepts iff ``p_d`` is strictly above the smaller threshold).
  Write ``p = (s, (1-s) r)`` with ``r`` a distribution on the other tokens and ``qbar`` the
  drafter without ``d``, renormalised: ``KL(p||q) = KL_b(s || q_d) + (1-s) KL(r || qbar)`` and
  the entropy condition reads ``H(r) <= c(s) = log(D)/(1-s) - logit s``. For a fixed ``s`` the
  cheapest ``r`` solves ``g(c) = min { KL(r || qbar) : H(r) <= c }``, attained on the power
  family ``r ~ qbar^beta`` (``beta >= 1``; with ties at ``q(2)``, uneven splits between them
  below ``H = log t``); ``g`` is convex and non-increasing with slope ``1/beta - 1``. So
  ``rho~ = inf_s KL_b(s || q_d) + (1-s) g(c(s))``, a one-dimensional problem that is not convex
  (it can have narrow basins). It is solved by branch and bound over ``logit s`` with lower
  bounds that hold by construction: tangents of ``g`` at exact points of the power family
  bound ``g`` from below, and each interval of ``s`` is bounded using the monotonicity of ``g``
  and the shape of ``KL_b`` (see :func:`_typical_rows`). The value returned is the smallest
  bound left, never above the infimum; the witness is the best rejected target found, and
  the two agree to about 1e-12 relative (checked against an exhaustive search on ``V = 3``).
  With ``E = 1`` and ``D >= 1`` the point mass on ``d`` is rejected too (``p_d = 1`` is not
  strictly above ``min(1, D e^0) = 1``); at ``D = 1`` it is an isolated point of the rejection
  region, and it is counted: Medusa's comparison rejects it, and a softmax in float32 rounds a
  peaked row to exactly 1.

Greedy, top-m and trees are the target side's reverse-divergence formulas with ``q`` in the
place of ``p``: ``topm:M`` is the reverse greedy-tree certificate of width ``M`` (``M = 1``:
greedy), and ``tree:M`` is the reverse cost of lifting ``q``'s ``(M+1)``-th token to the top
(the reverse ``topm:M`` certificate of ``q`` when ``q(M) > q(M+1)``; with a tie there the
worst tree leaves out a token as likely as one it keeps, and the cost is that token's).

The runner-up is the best competitor in every case: swapping the target masses of two
competitors ``z, z'`` with ``q_z' >= q_z`` changes ``KL(p||q)`` by
``-(p_z - p_z')(log q_z' - log q_z) <= 0`` whenever ``p_z >= p_z'``. The derivations, in
sympy, are in :mod:`companion.symbolic_drafter`.

Precision: a pooled normaliser is ``Z = 1 - E`` with the "excess" ``E = G sum w h(log x - log G)``,
``h(u) = e^u - 1 - u >= 0``, a sum of non-negative terms; ``-log1p(-E)`` is used while
``E <= 1/2`` (near ties, ``rho~ ~ E``), ``-log(R + G)`` otherwise (peaked ``q``, where ``R``, the
mass outside the pool, is read from one masked pass over the row rather than as ``1 - sum``).
Everything is float64; results have shape ``q.shape[:-1]``.

API: :func:`drafter_certificate` (one criterion, or ``"tree:M"``), :func:`drafter_certificates`
(several from one pass over ``q``, keyed by spec and ``"tree:M"``), :func:`drafter_witness` and
:func:`drafter_tree_witness` (the minimising target ``p*``). ``q`` may be probabilities or logits
(``from_logits=True``) of shape ``[..., V]``, any float dtype, any device.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.criteria import (
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criterion,
)
from companion.summary import DEFAULT_TOP, map_rows, normalized_probabilities, summarize
from companion.validation import check_distribution_tensor, check_tree_width

__all__ = [
    "drafter_certificate",
    "drafter_certificates",
    "drafter_tree_certificate",
    "drafter_tree_witness",
    "drafter_witness",
]

_SERIES_CUTOFF = 1e-2
# Typical acceptance: grid over w = log(beta - 1) with this many points (beta from 1 to 1e6),
# then Brent-style refinement on the bracket around the best grid point.
_BETA_MAX = 1e6
# Newton and interpolation in log beta may go far beyond the table: runners-up within a relative
# 1e-9 of each other need beta ~ 1e9 and more to split.
_LOG_BETA_TOP = 690.0
_ROOT_STEPS = 30
# Typical acceptance's branch and bound over logit p_d (see _typical_rows): the table of g starts
# with this many values of beta (1, then 1 + e^w for w evenly spaced up to log 1e6) and gains an
# exact point in each of the rounds listed; each round splits the _BB_SELECT lowest intervals in
# _BB_SPLIT and keeps up to _BB_KEEP other candidates. The first grid spans [x_cap - 60, x_cap].
_TABLE_POINTS = 24
_X_SPAN = 60.0
_BB_SELECT = 8
_BB_SPLIT = 16
_BB_KEEP = 1024
_BB_GRID = 256
_BB_ROUNDS = 9
_CUT_ROUNDS = (1, 2, 3, 4, 5, 6, 7)
_CUT_POINTS = 8
_CUT_NEWTON = 5
_TOP_COMPETITORS = 1024
_ELL_FLOOR = -1e4
_TYPICAL_CHUNK_BYTES = 64 * 2**20
_TYPICAL_CHUNK_ROWS = 32
_TAIL_DIRECT = 1e-3


# ---------------------------------------------------------------------------------------------
# Rows: the sorted top of q and the mass beyond it.


@dataclass(frozen=True)
class _Rows:
    """Normalised float64 top-``K`` of each row of ``q`` (``[N, K]``, decreasing), the token ids,
    and ``beyond``: the mass of the ``V - K`` other tokens, summed on its own scale."""

    values: Tensor
    indices: Tensor
    beyond: Tensor
    vocab: int
    lead_shape: torch.Size
    norm: Tensor
    flat: Tensor
    from_logits: bool

    def rest(self, start: int) -> Tensor:
        """``sum_{i > start} q(i)`` (1-based ``i``): the mass below the top ``start`` tokens."""
        return self.beyond + self.values[:, start:].sum(1)


def _beyond_mass(rows: Tensor, kth: Tensor, n_top: Tensor, norm: Tensor, from_logits: bool) -> Tensor:
    """Mass of the tokens outside the top ``K``: those strictly below the ``K``-th value plus
    the ties with it that ``topk`` left out. Accumulated in float64 from the row's own dtype."""
    work = rows if rows.dtype in (torch.float32, torch.float64) else rows.float()
    k = kth.to(work.dtype).unsqueeze(1)
    below = work < k
    ties = (work == k).sum(1) - n_top
    if from_logits:
        # Shift by the K-th logit itself (exactly representable), not by the float64 normaliser
        # rounded to the row's dtype, which would bias every term alike.
        terms = torch.exp(work - k)
        kth_mass = torch.exp(kth.to(torch.float64) - norm)
        return (torch.where(below, terms, torch.zeros_like(terms)).sum(1, dtype=torch.float64) + ties) * kth_mass
    s = torch.where(below, work, torch.zeros_like(work)).sum(1, dtype=torch.float64)
    return (s + ties * kth.to(torch.float64)) / norm


def _rows(q: Tensor, from_logits: bool, k: int) -> _Rows:
    """Validate and summarise ``q``: its top ``max(k, 64)`` and the mass beyond them."""
    k = max(k, DEFAULT_TOP)
    s = summarize(q, from_logits=from_logits, k=k)  # validates q
    flat = q.reshape(-1, s.vocab)
    if s.k >= s.vocab:
        beyond = torch.zeros_like(s.norm)
    else:
        # 1 - sum(top K) carries an absolute error ~1e-15: relative 1e-12 for a tail above
        # 1e-3. Smaller tails (peaked rows, where Z ~ R matters) are summed on their own.
        beyond = (1 - s.values.sum(1)).clamp(min=0.0)
        small = beyond < _TAIL_DIRECT
        if bool(small.any()):
            idx = torch.nonzero(small).squeeze(1)
            raw_top = flat.index_select(0, idx).gather(1, s.indices.index_select(0, idx))
            kth = raw_top[:, -1]
            n_top = (raw_top == kth.unsqueeze(1)).sum(1)
            full_kth = torch.zeros_like(s.norm, dtype=kth.dtype).index_copy(0, idx, kth)
            full_n = torch.zeros_like(s.norm, dtype=n_top.dtype).index_copy(0, idx, n_top)
            exact = map_rows(lambda x, kt, nt, nrm: _beyond_mass(x, kt, nt, nrm, from_logits),
                             flat, full_kth, full_n, s.norm, idx=idx)
            beyond = beyond.index_copy(0, idx, exact)
    return _Rows(s.values, s.indices, beyond, s.vocab, s.lead_shape, s.norm, flat, from_logits)


# ---------------------------------------------------------------------------------------------
# Weighted pools: greedy, top-m, trees and multiplicative relaxation.


def _h(u: Tensor) -> Tensor:
    """``h(u) = e^u - 1 - u >= 0``, accurate near ``u = 0``."""
    series = u * u * (0.5 + u * (1 / 6 + u * (1 / 24 + u * (1 / 120 + u * (1 / 720 + u * (1 / 5040 + u / 40320))))))
    return torch.where(u.abs() < _SERIES_CUTOFF, series, torch.expm1(u) - u)


@dataclass(frozen=True)
class _Pool:
    """A tilt that flattens ``p`` on pooled sorted positions: ``p_i = w_i G / Z`` there,
    ``q_i / Z`` elsewhere, with ``Z = R + G`` and ``G = prod (q_i / w_i)^w_i``."""

    mask: Tensor  # [N, K] bool, sorted positions
    weights: Tensor  # [N, K], summing to 1 over the pool
    log_level: Tensor  # [N]  log G  (-inf when a pooled q is 0)
    z: Tensor  # [N]  normaliser
    cost: Tensor  # [N]


def _pool(r: _Rows, mask: Tensor, weights: Tensor) -> _Pool:
    """``-log Z`` of the tilt flattening ``q`` on ``mask`` with ``weights`` (see :class:`_Pool`)."""
    vals = r.values[:, : mask.shape[1]]
    zero = torch.zeros_like(vals)
    rest_out = r.beyond + r.values[:, mask.shape[1]:].sum(1) + torch.where(mask, zero, vals).sum(1)
    safe_w = torch.where(mask, weights, torch.ones_like(weights))
    logx = torch.where(mask, torch.log(vals) - torch.log(safe_w), zero)
    log_g = torch.where(mask, weights * logx, zero).sum(1)
    finite = torch.isfinite(log_g)
    lg = torch.where(finite, log_g, torch.zeros_like(log_g))
    g = torch.exp(lg)
    dev = torch.where(mask & torch.isfinite(logx), logx - lg.unsqueeze(1), zero)
    excess = g * torch.where(mask, weights * _h(dev), zero).sum(1)
    near = excess <= 0.5
    cost = torch.where(near, -torch.log1p(-excess.clamp(max=0.5)), -torch.log(rest_out + g))
    z = torch.where(near, 1 - excess, rest_out + g)
    # A pooled zero forces the whole pool to 0: Z is the mass outside it.
    cost = torch.where(finite, cost, -torch.log(rest_out))
    z = torch.where(finite, z, rest_out)
    return _Pool(mask, weights, log_g, z, cost.clamp(min=0.0))


def _equal_pool(r: _Rows, mask: Tensor) -> _Pool:
    size = mask.sum(1, keepdim=True).to(torch.float64)
    return _pool(r, mask, torch.where(mask, 1.0 / size, torch.zeros_like(size).expand_as(mask)))


def _greedy(r: _Rows) -> _Pool:
    """``rho~ = -log(1 - (sqrt q(1) - sqrt q(2))^2)`` without cancellation at near ties:
    ``sqrt q(1) - sqrt q(2) = (q(1) - q(2)) / (sqrt q(1) + sqrt q(2))``, whose difference of two
    close doubles is exact, so the relative error stays at a few ulps however small the gap;
    ``-log1p(-gap^2)`` while ``gap^2 <= 1/2``, else ``-log(R + 2 sqrt(q(1) q(2)))`` (peaked ``q``,
    ``R`` the mass outside the top two)."""
    mask = torch.ones(r.values.shape[0], 2, dtype=torch.bool, device=r.values.device)
    pool = _equal_pool(r, mask)
    q1, q2 = r.values[:, 0], r.values[:, 1]
    root1, root2 = torch.sqrt(q1), torch.sqrt(q2)
    gap2 = ((q1 - q2) / (root1 + root2)) ** 2
    near = gap2 <= 0.5
    z = torch.where(near, 1 - gap2, r.rest(2) + 2 * root1 * root2)
    cost = torch.where(near, -torch.log1p(-gap2.clamp(max=0.5)), -torch.log(z))
    return _Pool(pool.mask, pool.weights, pool.log_level, z, cost.clamp(min=0.0))


def _topm(r: _Rows, m: int) -> _Pool:
    """``d`` pooled with the ``j`` weakest of ``q(2..m+1)``, ``j`` minimising the geometric mean."""
    logs = torch.log(r.values[:, : m + 1])
    ascending = logs[:, 1:].flip(1)
    n = logs.shape[0]
    zero_col = torch.zeros(n, 1, dtype=logs.dtype, device=logs.device)
    j = torch.arange(m + 1, device=logs.device)
    levels = (logs[:, :1] + torch.cat([zero_col, ascending.cumsum(1)], 1)) / (j + 1)
    j_star = levels.argmin(1)  # first minimum
    pos = torch.arange(m + 1, device=logs.device).unsqueeze(0)
    mask = (pos == 0) | (pos > (m - j_star).unsqueeze(1))
    return _equal_pool(r, mask)


def _tree(r: _Rows, m: int) -> _Pool:
    """``q(m+1)`` pooled with the ``j`` strongest of ``q(1..m)``, ``j`` maximising the geometric mean."""
    logs = torch.log(r.values[:, : m + 1])
    n = logs.shape[0]
    zero_col = torch.zeros(n, 1, dtype=logs.dtype, device=logs.device)
    j = torch.arange(m + 1, device=logs.device)
    levels = (logs[:, m:] + torch.cat([zero_col, logs[:, :m].cumsum(1)], 1)) / (j + 1)
    j_star = levels.argmax(1)  # first maximum
    pos = torch.arange(m + 1, device=logs.device).unsqueeze(0)
    mask = (pos < j_star.unsqueeze(1)) | (pos == m)
    out = _equal_pool(r, mask)
    # A token the drafter gives probability 0 cannot become the target's argmax at finite KL(p||q).
    dead = r.values[:, m] <= 0
    return _Pool(out.mask, out.weights, out.log_level, out.z, torch.where(dead, torch.inf, out.cost))


def _multiplicative(r: _Rows, alpha: float) -> _Pool:
    """Tilt ``(d, z)`` by ``(e^-lambda, e^(alpha lambda))``: weights ``(alpha, 1) / (1 + alpha)``."""
    n = r.values.shape[0]
    mask = torch.ones(n, 2, dtype=torch.bool, device=r.values.device)
    w = torch.tensor([alpha / (1 + alpha), 1 / (1 + alpha)], dtype=torch.float64, device=r.values.device)
    out = _pool(r, mask, w.expand(n, 2))
    # Already rejected under q itself (only at alpha = 1 with a tie): nothing to pay.
    done = r.values[:, 0] <= alpha * r.values[:, 1]
    return _Pool(out.mask & ~done.unsqueeze(1), out.weights, out.log_level,
                 torch.where(done, torch.ones_like(out.z), out.z), torch.where(done, torch.zeros_like(out.cost), out.cost))


# ---------------------------------------------------------------------------------------------
# Additive relaxation: a two-token tilt whose multiplier is the root of a quadratic.


@dataclass(frozen=True)
class _Additive:
    lam: Tensor  # [N] tilt multiplier (d gets e^-lam, z gets e^lam), NaN where infeasible
    z: Tensor
    cost: Tensor


def _additive(r: _Rows, delta: float) -> _Additive:
    qd, qz = r.values[:, 0], r.values[:, 1]
    rest = r.rest(2)
    if delta >= 1:
        inf = torch.full_like(qd, torch.inf)
        return _Additive(torch.full_like(qd, torch.nan), inf, inf)
    if delta == 0:
        g = _greedy(r)
        lam = 0.5 * (torch.log(qd) - torch.log(qz))
        return _Additive(torch.where(torch.isfinite(g.cost), lam, torch.nan), g.z, g.cost)
    a = qz * (1 - delta)
    b = delta * rest
    c = qd * (1 + delta)
    x = (b + torch.sqrt(b * b + 4 * a * c)) / (2 * a)  # the positive root; no cancellation (b >= 0)
    lam = torch.log(x)
    zm1 = qz * torch.expm1(lam) + qd * torch.expm1(-lam)  # Z - 1, accurate near ties
    z = torch.where(zm1 > -0.5, 1 + zm1, rest + qz * x + qd / x)  # Z directly when small (peaked q)
    log_z = torch.where(zm1 > -0.5, torch.log1p(zm1), torch.log(z))
    cost = (delta * lam - log_z).clamp(min=0.0)
    feasible = qz > 0
    cost = torch.where(feasible, cost, torch.inf)
    return _Additive(torch.where(feasible, lam, torch.nan), z, cost)


# ---------------------------------------------------------------------------------------------
# Typical acceptance.


def _bern_kl_logit(x: Tensor, log_qd: Tensor, log_rd: Tensor) -> Tensor:
    """``KL(Bernoulli(s) || Bernoulli(q_d))`` with ``s = sigmoid(x)`` (``x`` may be ``+inf``);
    ``log_rd = log(1 - q_d)``."""
    s, s_c = torch.sigmoid(x), torch.sigmoid(-x)
    log_s, log_sc = -F.softplus(-x), -F.softplus(x)
    zero = torch.zeros_like(s)
    return torch.where(s > 0, s * (log_s - log_qd), zero) + torch.where(s_c > 0, s_c * (log_sc - log_rd), zero)


def _phi(x: Tensor, eta: Tensor) -> Tensor:
    """``log s + H(p)`` for ``p = (s, (1-s) r)``, ``H(r) = eta``, ``s = sigmoid(x)``:
    ``(1-s)(log(s/(1-s)) + eta)``."""
    return torch.sigmoid(-x) * (x + eta)


def _dphi(x: Tensor, eta: Tensor) -> Tensor:
    """``d phi / dx = (1-s)(1 - s (x + eta))``."""
    return torch.sigmoid(-x) * (1 - torch.sigmoid(x) * (x + eta))


def _root(fn: Callable[[Tensor], tuple[Tensor, Tensor]], lo: Tensor, hi: Tensor, x: Tensor,
          steps: int = _ROOT_STEPS, active: Tensor | None = None) -> Tensor:
    """Root of an increasing function on ``[lo, hi]`` (``fn(lo) <= 0 <= fn(hi)``), elementwise:
    Newton steps from ``x``, replaced by bisection whenever they leave the current bracket.
    Returns the iterate with the smallest ``|fn|``; entries outside ``active`` (no root there)
    are left at ``x``."""
    best, best_v = x, torch.full_like(x, torch.inf)
    for _ in range(steps):
        v, dv = fn(x)
        if active is not None:
            v = torch.where(active, v, torch.zeros_like(v))
        closer = v.abs() < best_v
        best, best_v = torch.where(closer, x, best), torch.where(closer, v.abs(), best_v)
        lo = torch.where(v < 0, x, lo)
        hi = torch.where(v > 0, x, hi)
        step = x - v / dv
        inside = (step >= lo) & (step <= hi)
        new = torch.where(v == 0, x, torch.where(inside, step, 0.5 * (lo + hi)))
        scale = 1e-14 * (1 + x.abs())
        if bool((((new - x).abs() <= scale) | ((hi - lo) <= scale) | (v.abs() <= 1e-15)).all()):
            break
        x = new
    return best


def _best_s(log_qd: Tensor, log_rd: Tensor, eta: Tensor, kl_r: Tensor, log_delta: float,
            x_cap: float) -> tuple[Tensor, Tensor]:
    """``min_s KL_b(s || q_d) + (1-s) kl_r`` subject to ``(1-s)(logit s + eta) <= log delta`` and
    ``logit s <= x_cap`` (``s <= eps``).

    Returns ``(value, x)`` with ``x = logit s`` (broadcast shapes). The objective is convex in
    ``s`` with its free minimum at ``logit s0 = logit q_d + kl_r``, so the answer is ``s0`` when
    feasible and otherwise an end of a feasible interval. The constraint function ``phi`` is
    concave in ``s``, ``-inf`` at ``s = 0``, 0 at ``s = 1`` and negative below
    ``logit s = -eta``: for ``delta < 1`` its feasible set is ``[0, s1]`` with ``s1`` the root on
    ``logit s < -eta``; for ``delta >= 1`` it is ``[0, s1] u [s2, 1]`` around the peak of ``phi``.
    The candidates ``s0, s1, s2, eps`` are compared among those that are feasible.
    """
    x0 = log_qd - log_rd + kl_r
    zeros = torch.zeros_like(x0)
    f = lambda x: _bern_kl_logit(x, log_qd, log_rd) + torch.sigmoid(-x) * kl_r
    left = lambda x: (_phi(x, eta) - log_delta, _dphi(x, eta))
    cap = torch.full_like(x0, x_cap)
    if log_delta < 0:
        hi = -eta + zeros
        lo = log_delta - eta - 40.0 + zeros
        x1 = _root(left, lo, hi, (log_delta - eta).clamp(max=0.0) + zeros)
        best_x = torch.minimum(torch.minimum(x0, x1), cap)
        return f(best_x), best_x
    # delta >= 1: the peak of phi solves 1 + e^-x = x + eta.
    peak_fn = lambda x: (x + eta - 1 - torch.exp(-x), 1 + torch.exp(-x))
    lo_p = 1 - eta + zeros
    hi_p = torch.clamp(2 - eta, min=0.0) + 1.0 + zeros
    x_peak = _root(peak_fn, lo_p, hi_p, 0.5 * (lo_p + hi_p))
    # Without a crossing (peak <= log delta) every s is allowed: x1 = x2 = the peak will do.
    crossing = _phi(x_peak, eta) > log_delta
    start = torch.minimum(log_delta - eta + zeros, x_peak)
    x1 = torch.where(crossing, _root(left, start - 40.0, x_peak, start - 1.0, active=crossing), x_peak)
    if log_delta > 0:
        right = lambda x: (log_delta - _phi(x, eta), -_dphi(x, eta))
        x2 = _root(right, x_peak, x_peak + 800.0, x_peak + 1.0, steps=3 * _ROOT_STEPS, active=crossing)
        x2 = torch.where(crossing, x2, x_peak)
    else:
        x2 = torch.full_like(x0, torch.inf)  # delta = 1: s2 = 1, p the point mass on d
    inf = torch.full_like(x0, torch.inf)
    best_v, best_x = inf, cap
    for cand, ok in ((x0, (x0 <= cap) & (_phi(x0, eta) <= log_delta)),
                     (x1, x1 <= cap),
                     (x2, x2 <= cap),
                     (cap, (_phi(cap, eta) <= log_delta) | (cap <= x1) | (cap >= x2))):
        v = torch.where(ok, f(cand), inf)
        better = v < best_v
        best_v, best_x = torch.where(better, v, best_v), torch.where(better, cand, best_x)
    return best_v, best_x


class _Competitors:
    """``ell_i = log q_i - log q(2)`` over every token but ``d`` (a floor of -1e4 at ``d`` and at zeros),
    with the top ``_TOP_COMPETITORS`` of each row kept apart: for large ``beta`` the others
    cannot matter, and a pass over the whole row is skipped when their total weight
    ``(V - K) e^(beta ell_(K))`` is below ``e^-42`` of the top's (which is at least 1)."""

    def __init__(self, r: _Rows, idx: Tensor) -> None:
        rows = r.flat.index_select(0, idx).to(torch.float64)
        d = r.indices.index_select(0, idx)[:, 0:1]
        z = r.indices.index_select(0, idx)[:, 1:2]
        logs = rows if r.from_logits else torch.log(rows)
        ell = logs - logs.gather(1, z)
        # d and zero-probability tokens: a finite floor whose e^(beta ell) is exactly 0 for
        # beta >= 1 (so that e * ell needs no masking).
        ell = ell.scatter(1, d, torch.full_like(ell[:, :1], -torch.inf)).clamp(min=_ELL_FLOOR)
        self.full = ell
        k = min(_TOP_COMPETITORS, r.vocab)
        self.top = torch.topk(self.full, k, dim=1).values
        self.log_rest_count = math.log(r.vocab - k) if r.vocab > k else -math.inf
        self.ties = (self.top == 0).sum(1)

    def moments(self, beta: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
        """``(H(r), KL(r || qbar))`` for ``r_i`` proportional to ``qbar_i^beta``, ``beta`` finite ``[n]``.

        ``S0 = sum e^(beta ell)``, ``S1 = sum ell e^(beta ell)``: ``H = log S0 - beta S1/S0`` and
        ``KL = (beta - 1) S1/S0 - log S0 - m`` with ``m = log max qbar``.
        """
        return self._moments(beta, m, False)[:2]

    def _moments(self, beta: Tensor, m: Tensor, with_var: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        tail = self.log_rest_count + beta * self.top[:, -1]
        ell = self.full if bool((tail > -42.0).any()) else self.top
        work = (ell * beta.unsqueeze(1)).exp_()  # one temporary, reused in place
        s0 = work.sum(1)
        mean = work.mul_(ell).sum(1) / s0
        var = (work.mul_(ell).sum(1) / s0 - mean * mean).clamp(min=0.0) if with_var else None
        log_s0 = torch.log(s0)
        return (log_s0 - beta * mean).clamp(min=0.0), ((beta - 1) * mean - log_s0 - m).clamp(min=0.0), var



@dataclass(frozen=True)
class _TypicalB:
    cost: Tensor  # [N] the certified lower bound (the value returned)
    x: Tensor  # logit of p_d at the witness
    beta: Tensor  # inf for the tie family and the beta = inf end
    eta: Tensor  # entropy of r at the witness
    ties: Tensor  # number of runners-up tied at q(2)
    gap: Tensor  # KL of the witness minus ``cost`` (>= 0 up to rounding): how tight the bound is


class _EntropyTable:
    """Points ``(H_j, K_j)`` of ``g(c) = min { KL(r || qbar) : H(r) <= c }`` with the slopes ``b_j = 1/beta_j - 1``.

    ``g`` is convex and non-increasing (the Gibbs family ``r ~ qbar^beta``, ``beta >= 1``, attains
    it, with ``dg/dc = 1/beta - 1``), so every tangent is a lower bound and every chord an upper
    bound. Always present: ``beta = 1`` (``(H(qbar), 0)``, slope 0) and ``beta = inf``
    (``(log t, -log t - m)``, slope -1; below ``log t``, ``g(c) = -c - m`` exactly).
    """

    def __init__(self, comp: _Competitors, m: Tensor, log_t: Tensor, betas: Tensor) -> None:
        self.comp, self.m, self.log_t = comp, m, log_t
        n = m.shape[0]
        self.h, self.k = log_t.unsqueeze(1), (-log_t - m).unsqueeze(1)
        self.b = torch.full_like(self.h, -1.0)
        self.log_beta = torch.full_like(self.h, torch.inf)
        self._append(betas.to(m).expand(n, -1), torch.ones(n, dtype=torch.bool, device=m.device))
        self.h_top = self.h[:, -1]  # H(qbar), at beta = 1 (the first of betas)

    def _append(self, beta: Tensor, active: Tensor) -> None:
        """Exact points at ``beta`` (``[n, P]``, ``>= 1``); inactive rows get copies of ``beta = 1``."""
        beta = torch.where(active.unsqueeze(1), beta.clamp(min=1.0), torch.ones_like(beta))
        cols = [self.comp.moments(beta[:, j].contiguous(), self.m) for j in range(beta.shape[1])]
        h, k = torch.stack([c[0] for c in cols], 1), torch.stack([c[1] for c in cols], 1)
        k = torch.where(beta > 1, k, torch.zeros_like(k))
        self.h, self.k = torch.cat([self.h, h], 1), torch.cat([self.k, k], 1)
        self.b = torch.cat([self.b, 1 / beta - 1], 1)
        self.log_beta = torch.cat([self.log_beta, torch.log(beta)], 1)
        # Sorted by entropy; among equal entropies (H underflows to 0 for large beta) the larger
        # beta first, so that the point next to a higher entropy is the smallest such beta and
        # brackets for Newton stay tight.
        by_beta = self.log_beta.argsort(dim=1, descending=True, stable=True)
        order = by_beta.gather(1, self.h.gather(1, by_beta).argsort(dim=1, stable=True))
        self.h, self.k = self.h.gather(1, order), self.k.gather(1, order)
        self.b, self.log_beta = self.b.gather(1, order), self.log_beta.gather(1, order)

    def log_beta_at(self, c: Tensor, newton: int = 0) -> Tensor:
        """``u = log beta`` with ``H(r_beta) = c`` (``[n]``): interpolated between the finite points that
        bracket ``c`` (no pass over the vocabulary), then ``newton`` safeguarded Newton steps inside
        that bracket (one pass each; ``dH/du = -beta^2 Var(ell)``)."""
        finite = torch.isfinite(self.log_beta)
        h = torch.where(finite, self.h, torch.full_like(self.h, -torch.inf))
        lb = torch.where(finite, self.log_beta, torch.zeros_like(self.log_beta))
        t = h.shape[1]
        i = torch.searchsorted(h.contiguous(), c.unsqueeze(1).contiguous()).clamp(1, t - 1)
        h0, h1, l0, l1 = h.gather(1, i - 1), h.gather(1, i), lb.gather(1, i - 1), lb.gather(1, i)
        top = _LOG_BETA_TOP
        inside = torch.isfinite(h0) & (h1 > h0)
        w = ((c.unsqueeze(1) - h0) / (h1 - h0)).clamp(0.0, 1.0)
        u0 = torch.where(inside, l0 + w * (l1 - l0), l1 + 1.0).squeeze(1).clamp(0.0, top)
        if newton == 0:
            return u0
        # H falls as u grows: the point below c (h0, larger beta) bounds u from above.
        lo = l1.squeeze(1).clamp(0.0, top)
        hi = torch.where(inside, l0, torch.full_like(l0, top)).squeeze(1).clamp(0.0, top)

        def fn(u: Tensor) -> tuple[Tensor, Tensor]:
            beta = torch.exp(u)
            h_u, _, var = self.comp._moments(beta, self.m, True)
            return c - h_u, (beta * beta * var).clamp(min=1e-300)

        return _root(fn, torch.minimum(lo, hi), torch.maximum(lo, hi), u0, steps=newton)

    def add_range(self, c_lo: Tensor, c_hi: Tensor, active: Tensor) -> None:
        """Add ``_CUT_POINTS`` exact points with entropies spread over ``[c_lo, c_hi]`` (``[n]``): ``log beta``
        evenly spaced between the ends' (found by Newton). A tangent is exact only where it
        touches; points spread over the range where the minimum may lie make the lower model
        tight there, and the range shrinks from round to round."""
        ends = [self.log_beta_at(torch.where(active, c, self.h_top), newton=_CUT_NEWTON) for c in (c_lo, c_hi)]
        frac = torch.linspace(0.0, 1.0, _CUT_POINTS, dtype=c_lo.dtype, device=c_lo.device)
        u = ends[0].unsqueeze(1) + (ends[1] - ends[0]).unsqueeze(1) * frac
        self._append(torch.exp(u), active)

    def add_point(self, log_beta: Tensor, active: Tensor) -> None:
        """Add the exact point at ``beta = e^log_beta`` (``[n]``) for rows in ``active``."""
        if bool(active.any()):
            self._append(torch.exp(log_beta).unsqueeze(1), active)

    def around(self, c: Tensor) -> Tensor:
        """Columns of the two points bracketing each ``c`` (``[n, J]`` -> ``[n, J, 2]``)."""
        t = self.h.shape[1]
        i = torch.searchsorted(self.h.contiguous(), c.contiguous()).clamp(1, t - 1)
        return torch.stack([i - 1, i], 2)

    def lower(self, c: Tensor) -> Tensor:
        """``max(0, tangents)`` at ``c`` (``[n, J]``): a lower bound of ``g``; ``+inf`` where ``c < 0``.
        Only the tangents at the two points bracketing ``c`` are taken: on a convex function they
        are the highest there."""
        cols = self.around(c)
        take = lambda t: t.unsqueeze(1).expand(-1, c.shape[1], -1).gather(2, cols)
        out = (take(self.k) + take(self.b) * (c.unsqueeze(2) - take(self.h))).amax(2).clamp(min=0.0)
        return torch.where(c < 0, torch.inf, out)

    def upper(self, c: Tensor) -> Tensor:
        """Chords between the points at ``c``: an upper bound of ``g``; exact below ``log t``."""
        t = self.h.shape[1]
        i = torch.searchsorted(self.h.contiguous(), c.contiguous()).clamp(1, t - 1)
        h0, h1 = self.h.gather(1, i - 1), self.h.gather(1, i)
        k0, k1 = self.k.gather(1, i - 1), self.k.gather(1, i)
        w = ((c - h0) / (h1 - h0)).clamp(0.0, 1.0)
        chord = torch.where(h1 > h0, k0 + w * (k1 - k0), torch.maximum(k0, k1))
        out = torch.where(c >= self.h[:, -1:], torch.zeros_like(c), chord)
        out = torch.where(c <= self.log_t.unsqueeze(1), -c - self.m.unsqueeze(1), out)
        return torch.where(c < 0, torch.inf, out)


def _entropy_room(lo: Tensor, hi: Tensor, log_delta: float) -> Tensor:
    """An upper bound, over ``x`` in ``[lo, hi]``, of ``c(x) = log(delta) (1 + e^x) - x``: the largest
    entropy ``r`` may have when ``logit p_d = x`` (the entropy condition divided by ``1 - s``)."""
    if log_delta > 0:
        return log_delta * (1 + torch.exp(hi)) - lo
    if log_delta < 0:
        return log_delta * (1 + torch.exp(lo)) - lo
    return -lo


def _tangent_bound(table: _EntropyTable, lo: Tensor, hi: Tensor, lq: Tensor, lr: Tensor, log_delta: float) -> Tensor:
    """A second-order lower bound of ``F`` on each interval ``x`` in ``[lo, hi]``: ``max_j min_I P_j``.

    With the tangent ``g(c) >= K_j + b_j (c - H_j)`` and ``(1 - s) c(x) = log delta - (1 - s) logit s``,
    ``F(s) >= P_j(s) = KL_b(s || q_d) + (1 - s) A_j + b_j log delta - b_j (1 - s) logit s``,
    ``A_j = K_j - b_j H_j``. ``P_j'' = (1 - |b_j|)/(s(1 - s)) - |b_j|/s^2``: concave below ``s = |b_j|``
    (minimum at an end) and convex above (minimum at least the meeting point of the end tangents).
    Unlike the first bound, which takes ``KL_b`` and the entropy term at their best ends
    separately, this one is tight to second order where ``F`` is flat, so few intervals survive
    near the minimum.
    """
    logit_qd = lq - lr

    def at(x: Tensor, lq_: Tensor, lr_: Tensor, lqd: Tensor) -> tuple[Tensor, ...]:
        """What ``P_j`` and ``P_j'`` need at ``s = sigmoid(x)``: ``P_j = kl + (1 - s) a_j + b_j w`` and
        ``P_j' = d0 - a_j + b_j d1``, with ``w = log delta - (1 - s) x``."""
        s = torch.sigmoid(x)
        return s, _bern_kl_logit(x, lq_, lr_), torch.sigmoid(-x), log_delta - torch.sigmoid(-x) * x, x - lqd, x - 1 / s

    # For each interval, the tangents at the table points bracketing c(x) at its ends and middle
    # (for a convex g, the tangents at the neighbours of c dominate every other at c); a subset
    # of tangents still gives a lower bound, and this one is tight once the interval is small.
    cols = torch.cat([table.around(_entropy_room(x, x, log_delta)) for x in (lo, 0.5 * (lo + hi), hi)], 2)
    take = lambda t: t.unsqueeze(1).expand(-1, lo.shape[1], -1).gather(2, cols)
    b, h, k = take(table.b), take(table.h), take(table.k)
    a = k - b * h
    lq_, lr_, lqd = lq.unsqueeze(2), lr.unsqueeze(2), logit_qd.unsqueeze(2)
    ea = [t.unsqueeze(2) for t in at(lo, lq, lr, logit_qd)]
    eb = [t.unsqueeze(2) for t in at(hi, lq, lr, logit_qd)]
    # At the kinks s = |b_j| (x = -inf when b = 0): once per table point, then gathered.
    ek = [take(t) for t in at(torch.logit(-table.b), lq, lr, logit_qd)]
    value = lambda e: e[1] + e[2] * a + b * e[3]
    slope = lambda e: e[4] - a + b * e[5]
    sa, sb, kappa = ea[0], eb[0], ek[0]
    va, vb, vk = value(ea), value(eb), torch.where(b < 0, value(ek), torch.inf)
    # Concave part [s_a, min(s_b, kappa)]: the smaller end value.
    concave = torch.where(kappa > sa, torch.minimum(va, torch.where(sb <= kappa, vb, vk)), torch.inf)
    # Convex part [u, s_b], u = max(s_a, kappa): an end, or above the end tangents' meeting point.
    u_is_a, u_is_k = sa >= kappa, kappa <= sb
    u = torch.where(u_is_a, sa, torch.where(u_is_k, kappa, sb))
    pu = torch.where(u_is_a, va, torch.where(u_is_k, vk, vb))
    du = torch.where(u_is_a, slope(ea), torch.where(u_is_k, slope(ek), slope(eb)))
    pv, dv = vb, slope(eb)
    meet = (pv - pu + du * u - dv * sb) / (du - dv)
    inner = pu + du * (torch.minimum(torch.maximum(meet, u), sb) - u)
    convex = torch.where(du >= 0, pu, torch.where(dv <= 0, pv, torch.minimum(inner, torch.minimum(pu, pv))))
    piece = torch.minimum(concave, convex)
    out = torch.where(torch.isnan(piece), -torch.inf, piece).amax(2)
    return out


def _typical_rows(comp: _Competitors, log_qd: Tensor, log_q2: Tensor, log_delta: float,
                  x_cap: float) -> _TypicalB:
    """Typical acceptance's certificate for the rows of ``comp``, by branch and bound over ``x = logit p_d``.

    ``rho~ = inf_x F(x)``, ``F(x) = KL_b(s || q_d) + (1 - s) g(c(x))`` (``s = sigmoid(x) <= eps``). On an
    interval ``[lo, hi]``, ``F >= min KL_b + (1 - s(hi)) g_lower(c_max)``: ``KL_b`` is convex in ``s``
    (its minimum on the interval is at ``q_d`` clamped into it), ``g`` is non-increasing and
    non-negative, and ``c_max`` bounds ``c`` over the interval (:func:`_entropy_room`). Intervals whose
    bound exceeds a feasible value (chord upper bounds at midpoints) are dropped; the
    ``_BB_SELECT`` lowest are split into ``_BB_SPLIT`` each, the other candidates are kept (up to
    ``_BB_KEEP``; beyond that their bounds enter the result directly). Between rounds the table
    of ``g`` gains the exact point at the best midpoint's ``c`` (a cutting plane). The value returned
    is the smallest lower bound left, so it is never above the infimum (up to rounding), whatever
    the shape of ``F``; its distance to the witness's KL is reported as ``gap``.
    """
    n = log_qd.shape[0]
    dev = log_qd.device
    # qbar normalised by the competitors' own total S (m = log max qbar), and the same S in
    # KL_b: KL(r || qbar) is then exactly 0 at beta = 1, every point of the table lies on one
    # and the same g, and F is KL(p || q) for the q the witness is measured against. (1 - q_d
    # summed elsewhere differs from S by ~1e-8 on float32 rows: a constant offset of the table
    # that would let lower bounds pass upper bounds.)
    m = -torch.logsumexp(comp.full, 1)
    log_rd = log_q2 - m
    log_t = torch.log(comp.ties.to(torch.float64))
    betas = torch.cat([torch.ones(1, dtype=torch.float64),
                       1 + torch.exp(torch.linspace(-9.0, math.log(_BETA_MAX), _TABLE_POINTS - 1, dtype=torch.float64))])
    table = _EntropyTable(comp, m, log_t, betas)
    lq, lr = log_qd.unsqueeze(1), log_rd.unsqueeze(1)
    x_free = lq - lr  # logit q_d: where KL_b is smallest
    x_hi = x_cap if math.isfinite(x_cap) else _X_SPAN
    x_lo = min(-_X_SPAN, x_hi - _X_SPAN)

    def bound(lo: Tensor, hi: Tensor) -> Tensor:
        kl = _bern_kl_logit(torch.minimum(torch.maximum(x_free, lo), hi), lq, lr)
        g = table.lower(_entropy_room(lo, hi, log_delta))
        out = kl + torch.where(torch.isinf(g), torch.inf, torch.sigmoid(-hi) * g)
        out = torch.maximum(out, torch.where(torch.isinf(out), out, _tangent_bound(table, lo, hi, lq, lr, log_delta)))
        return torch.where(torch.isnan(out), torch.inf, out)  # NaN marks a dropped interval

    def feasible(x: Tensor) -> Tensor:
        g = table.upper(_entropy_room(x, x, log_delta))
        out = _bern_kl_logit(x, lq, lr) + torch.where(torch.isinf(g), torch.inf, torch.sigmoid(-x) * g)
        return torch.where(torch.isnan(out), torch.inf, out)

    # The tails, bounded once: s -> 0 (the entropy condition is slack there, g = 0) and, with eps = 1,
    # s -> 1 (slack when delta > 1; impossible when delta <= 1).
    lo_tail = torch.tensor([[-math.inf]], dtype=torch.float64, device=dev).expand(n, 1)
    floor = bound(lo_tail, torch.full_like(lo_tail, x_lo)).squeeze(1)
    if not math.isfinite(x_cap):
        hi_tail = torch.full((n, 1), math.inf, dtype=torch.float64, device=dev)
        floor = torch.minimum(floor, bound(torch.full_like(hi_tail, x_hi), hi_tail).squeeze(1))
    edges = torch.linspace(x_lo, x_hi, _BB_GRID + 1, dtype=torch.float64, device=dev)
    lo, hi = edges[:-1].expand(n, -1).clone(), edges[1:].expand(n, -1).clone()
    best_ub = torch.full_like(log_qd, torch.inf)
    best_x = torch.full_like(log_qd, x_lo)
    def at_level(c: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """The best target whose ``r`` has entropy ``c`` (Gibbs at ``beta = e^u``; the tie family below
        ``log t``; ``qbar`` itself above ``H(qbar)``), with ``p_d`` chosen by :func:`_best_s`:
        ``(KL, logit p_d, beta, H(r))``, a feasible point of the rejection region."""
        gibbs = (c > log_t) & (c < table.h_top)
        beta = torch.where(gibbs, torch.exp(u), torch.ones_like(c))
        beta = torch.where(c <= log_t, torch.inf, beta)
        eta_g, kl_g = comp.moments(torch.where(torch.isfinite(beta), beta, torch.ones_like(beta)), m)
        eta_t = c.clamp(min=0.0).minimum(log_t)
        eta = torch.where(torch.isfinite(beta), torch.where(gibbs, eta_g, table.h_top), eta_t)
        kl_r = torch.where(torch.isfinite(beta), torch.where(gibbs, kl_g, torch.zeros_like(kl_g)),
                           (-eta_t - m).clamp(min=0.0))
        v, x = _best_s(log_qd, log_rd, eta, kl_r, log_delta, x_cap)
        v = torch.where(c < 0, torch.inf, v)
        return v, x, beta, eta

    best = (torch.full_like(log_qd, torch.inf),) + tuple(torch.full_like(log_qd, torch.nan) for _ in range(3))
    rows = torch.arange(n, device=dev)
    frac = torch.linspace(0.0, 1.0, _BB_SPLIT + 1, dtype=torch.float64, device=dev)
    for rnd in range(_BB_ROUNDS):
        mid = 0.5 * (lo + hi)
        ub = feasible(mid)
        j = ub.argmin(1)
        better = ub[rows, j] < best_ub
        best_ub = torch.where(better, ub[rows, j], best_ub)
        best_x = torch.where(better, mid[rows, j], best_x)
        lb = bound(lo, hi)
        if rnd in _CUT_ROUNDS:
            # Cutting planes: exact points of g over the entropy levels of the intervals that may
            # hold the minimum; then, at the lowest bound and at the best midpoint, the exact best
            # target for that level: a feasible value (the upper bound) and the witness candidate.
            cand = torch.isfinite(lb) & (lb <= best_ub.unsqueeze(1))
            ends = torch.cat([_entropy_room(lo, lo, log_delta), _entropy_room(hi, hi, log_delta)], 1)
            cands = torch.cat([cand, cand], 1)
            c_lo = torch.where(cands, ends, torch.inf).amin(1).clamp(min=0.0).maximum(log_t)
            c_hi = torch.where(cands, ends, -torch.inf).amax(1).minimum(table.h_top)
            active = cand.any(1) & (c_hi > c_lo)
            if bool(active.any()):
                table.add_range(c_lo, c_hi, active)
            i = lb.argmin(1)
            for x_cut in (0.5 * (lo[rows, i] + hi[rows, i]), best_x):
                c_star = _entropy_room(x_cut, x_cut, log_delta)
                u = table.log_beta_at(c_star.clamp(min=0.0), newton=_CUT_NEWTON)
                found = at_level(c_star, u)
                better = found[0] < best[0]
                best = tuple(torch.where(better, new, old) for new, old in zip(found, best))
                # Kelley's cut: the exact point there joins the table.
                table.add_point(u, (c_star > log_t) & (c_star < table.h_top))
            best_ub = torch.minimum(torch.minimum(best_ub, best[0]), feasible(best_x.unsqueeze(1)).squeeze(1))
            lb = bound(lo, hi)
        # Beyond a feasible value (with room for rounding) an interval cannot hold the infimum.
        slack = (best_ub + 1e-13 + 1e-12 * best_ub.abs()).unsqueeze(1)
        lb = torch.where(lb <= slack, lb, torch.inf)
        # A row whose lowest bound is within rounding of its best feasible value is finished:
        # its bound is final and its intervals are dropped.
        low = lb.amin(1)
        done = (low >= slack.squeeze(1) - 2e-13 - 2e-12 * best_ub.abs()) | torch.isinf(low)
        floor = torch.where(done, torch.minimum(floor, low), floor)
        lb = torch.where(done.unsqueeze(1), torch.inf, lb)
        order = lb.argsort(1)
        lb_sorted = lb.gather(1, order)
        if rnd == _BB_ROUNDS - 1 or bool(done.all()):
            floor = torch.minimum(floor, lb_sorted[:, 0])
            break
        # Keep the other candidates, as many as the row with most of them has (up to _BB_KEEP).
        keep = int(torch.isfinite(lb_sorted[:, _BB_SELECT:_BB_SELECT + _BB_KEEP]).sum(1).max()) if lb.shape[1] > _BB_SELECT else 0
        floor = torch.minimum(floor, lb_sorted[:, _BB_SELECT + keep:].amin(1)) if lb.shape[1] > _BB_SELECT + keep else floor
        sel, kept = order[:, :_BB_SELECT], order[:, _BB_SELECT:_BB_SELECT + keep]
        a, b = lo.gather(1, sel), hi.gather(1, sel)
        pts = a.unsqueeze(2) + (b - a).unsqueeze(2) * frac
        # Dropped intervals (bound +inf) become NaN: their bound stays +inf and they are never split.
        dead = torch.isinf(lb_sorted[:, :_BB_SELECT]).unsqueeze(2)
        pts = torch.where(dead, torch.nan, pts)
        k_dead = torch.isinf(lb_sorted[:, _BB_SELECT:_BB_SELECT + keep])
        k_lo = torch.where(k_dead, torch.nan, lo.gather(1, kept))
        k_hi = torch.where(k_dead, torch.nan, hi.gather(1, kept))
        lo = torch.cat([pts[..., :-1].reshape(n, -1), k_lo], 1)
        hi = torch.cat([pts[..., 1:].reshape(n, -1), k_hi], 1)
    cost = floor.clamp(min=0.0)
    # The witness: the best exact candidate found, or the exact target at the best midpoint
    # (where the chords put the least feasible value), whichever is cheaper.
    c_star = _entropy_room(best_x, best_x, log_delta)
    found = at_level(c_star, table.log_beta_at(c_star.clamp(min=0.0), newton=_CUT_NEWTON))
    better = found[0] < best[0]
    v, x, beta, eta = (torch.where(better, new, old) for new, old in zip(found, best))
    # The point mass on d is rejected when eps >= 1 and delta >= 1 (p_d = 1 <= min(eps, delta e^0)):
    # with delta = 1 an isolated point of the rejection region, counted since Medusa's strict
    # comparison rejects it (and softmax rounds peaked rows to exactly 1).
    if not math.isfinite(x_cap) and log_delta >= 0:
        point = -log_qd
        use = point <= v
        v, x = torch.where(use, point, v), torch.where(use, torch.inf, x)
        cost = torch.minimum(cost, point)
        beta, eta = torch.where(use, 1.0, beta), torch.where(use, 0.0, eta)
    # No bound may exceed the KL of a target known to be rejected (only rounding could make it so).
    cost = torch.minimum(cost, v).clamp(min=0.0)
    # q itself rejected (q_d <= eps and log q_d + H(q) <= log delta): exactly 0, witness q.
    x_q = log_qd - log_rd
    h_q = _bern_kl_logit(x_q, torch.zeros_like(x_q), torch.zeros_like(x_q)).neg() + torch.sigmoid(-x_q) * table.h_top
    own = (x_q <= x_cap) & (log_qd + h_q <= log_delta)
    cost, v, x = torch.where(own, 0.0, cost), torch.where(own, 0.0, v), torch.where(own, x_q, x)
    beta, eta = torch.where(own, 1.0, beta), torch.where(own, table.h_top, eta)
    infeasible = torch.isinf(cost)
    x = torch.where(infeasible, torch.nan, x)
    return _TypicalB(cost, x, beta, eta, comp.ties, (v - cost).clamp(min=0.0))


def _typical(r: _Rows, crit: Typical) -> tuple[Tensor, _TypicalB]:
    """``(cost, state)``: typical acceptance rejects ``d`` iff ``p_d <= eps`` and
    ``p_d <= delta e^-H(p)`` (``p_d`` at or below the smaller threshold)."""
    qd = r.values[:, 0]
    rd = r.rest(1)  # 1 - q(1), summed on its own scale
    eps, delta = crit.eps, crit.delta
    n = qd.shape[0]
    log_qd = torch.log(qd)
    x_cap = math.log(eps) - math.log1p(-eps) if eps < 1 else math.inf
    # A point mass on d: only p = q itself (p_d = 1, H = 0), rejected iff eps = 1 <= delta.
    point = rd <= 0
    nan = torch.full_like(qd, torch.nan)
    state = _TypicalB(torch.where(point & (eps >= 1) & (delta >= 1), 0.0, torch.inf).to(qd), nan, nan, nan,
                      torch.zeros_like(qd, dtype=torch.long), torch.zeros_like(qd))
    idx = torch.nonzero(~point).squeeze(1)
    if idx.numel():
        # Rows in chunks: memory for the full-vocabulary passes, and a branch and bound whose
        # interval lists are as long as the chunk's hardest row needs.
        per = max(1, min(_TYPICAL_CHUNK_ROWS, _TYPICAL_CHUNK_BYTES // max(1, 8 * r.vocab)))
        parts = []
        for start in range(0, idx.numel(), per):
            sel = idx[start:start + per]
            parts.append(_typical_rows(_Competitors(r, sel), log_qd[sel], torch.log(r.values[sel, 1]),
                                       math.log(delta), x_cap))
        fields = {}
        for name in ("cost", "x", "beta", "eta", "ties", "gap"):
            part = torch.cat([getattr(p, name) for p in parts])
            fields[name] = getattr(state, name).index_copy(0, idx, part.to(getattr(state, name).dtype))
        state = _TypicalB(**fields)
    del n
    return state.cost, state


# ---------------------------------------------------------------------------------------------
# Public API.


def _top_needed(crit: Criterion | None, vocab: int, tree: int | None = None) -> int:
    if tree is not None:
        return tree + 1
    if isinstance(crit, TopM):
        return crit.m + 1
    if isinstance(crit, TopKDelta):
        return min(crit.k + 1, vocab)
    return 2


def _check_vocab(crit: Criterion, vocab: int) -> None:
    if crit.needs_logits:
        # Over every target logit vector consistent with some p, the relaxation can always be
        # switched off (z = log p is never relaxed), so the infimum is strict greedy's.
        raise ValueError(f"no drafter-side certificate for {crit}: its relaxation reads the target's logits "
                         "z(2)/z(1), which the drafter side does not know; over all target logits the bound is "
                         "strict greedy's: use 'greedy'")
    crit.check_vocab(vocab)
    if vocab < 2:
        raise ValueError(f"drafter-side certificates need a vocabulary of at least 2 tokens, got V={vocab}")


def _tree_spec(spec: object) -> int | None:
    if isinstance(spec, str) and spec.startswith("tree:"):
        body = spec[len("tree:"):]
        if not body.isdigit():
            raise ValueError(f"malformed tree spec {spec!r}; expected tree:M with an integer M >= 1")
        return int(body)
    return None


def _cost(r: _Rows, crit: Criterion) -> Tensor:
    if isinstance(crit, StrictGreedy):
        return _greedy(r).cost
    if isinstance(crit, TopM):
        return _topm(r, crit.m).cost
    if isinstance(crit, MultiplicativeRelaxed):
        return _multiplicative(r, crit.alpha).cost
    if isinstance(crit, AdditiveRelaxed):
        return _additive(r, crit.delta).cost
    if isinstance(crit, TopKDelta):
        add = _additive(r, crit.delta).cost
        return add if crit.k >= r.vocab else torch.minimum(_topm(r, crit.k).cost, add)
    if isinstance(crit, Typical):
        return _typical(r, crit)[0]
    raise TypeError(f"no drafter-side certificate for {type(crit).__name__}")


def drafter_certificates(
    q: Tensor,
    criteria: Sequence[Criterion | str] | Criterion | str = (),
    *,
    tree_widths: Iterable[int] = (),
    from_logits: bool = False,
) -> dict[str, Tensor]:
    """Drafter-side certificates of several criteria and greedy-tree widths from one pass over ``q``.

    Returns ``{str(criterion): rho~}`` and ``{"tree:m": rho~_tree}``, each float64 of shape
    ``q.shape[:-1]`` (``+inf`` where the rejection region is empty, e.g. ``additive:D`` with
    ``D >= 1``). ``q``: probabilities ``[..., V]`` or logits (``from_logits=True``). Criterion
    specs may also be ``"tree:M"``.
    """
    check_distribution_tensor(q, "q")
    if isinstance(criteria, (str, Criterion)):
        criteria = [criteria]
    crits: list[Criterion] = []
    widths = list(tree_widths)
    for spec in criteria:
        m = _tree_spec(spec)
        if m is None:
            crits.append(parse_criterion(spec))
        else:
            widths.append(m)
    vocab = q.shape[-1]
    widths = [check_tree_width(m, vocab) for m in widths]
    for c in crits:
        _check_vocab(c, vocab)
    k = max([2] + [_top_needed(c, vocab) for c in crits] + [m + 1 for m in widths])
    r = _rows(q, from_logits, k)
    out: dict[str, Tensor] = {}
    for c in crits:
        out[str(c)] = _cost(r, c).reshape(r.lead_shape)
    for m in widths:
        out[f"tree:{m}"] = _tree(r, m).cost.reshape(r.lead_shape)
    return out


@dataclass(frozen=True)
class DrafterSoundness:
    """Counts of one criterion (or tree width) over rows of ``(p, q)`` pairs."""

    spec: str
    rows: int
    accepted: int  # the target accepts every maximiser of q (trees: the tree of q's top m succeeds)
    certified: int  # KL(p || q) < rho~(q)
    certified_and_rejected: int  # must be 0: the certificate is sound


def drafter_soundness(
    p: Tensor,
    q: Tensor,
    criteria: Sequence[Criterion | str],
    *,
    tree_widths: Iterable[int] = (),
) -> dict[str, DrafterSoundness]:
    """Check ``KL(p||q) < rho~_c(q)  =>  c accepts argmax q under p`` on every row; count both sides.

    ``p`` (target) and ``q`` (drafter): probabilities ``[N, V]`` (float64 recommended). A row
    counts as accepted when every decoder accepts the draft, whichever way it breaks ties: the
    criterion accepts *every* maximiser of ``q`` under the worst case over the target's ties
    (``rejection_mask(p, ties="worst")``: at an exact tie with the draft, or exactly at a
    threshold, it counts as rejected). The drafter-side certificates count exactly those
    targets as rejecting (their rejection conditions are closed: ``p_z >= p_d``, ``p_d <= A p_z``,
    ...). For ``tree:M`` only rows where ``q(M) > q(M+1)`` count (the drafter's tree is then
    unique), and the tree succeeds iff *every* maximiser of ``p`` lies in it (the decoder's
    token may be any of them).
    """
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must be [N, V] of the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    widths = list(tree_widths)
    rho = drafter_certificates(q, criteria, tree_widths=widths)
    from companion.kl_certificates import kl_divergence  # lazy: the engine imports nothing from here

    kl = kl_divergence(p, q)
    top_q = q == q.amax(-1, keepdim=True)
    out: dict[str, DrafterSoundness] = {}
    for c in criteria:
        crit = parse_criterion(c)
        rejected = (crit.rejection_mask(p, ties="worst") & top_q).any(-1)
        certified = kl < rho[str(crit)]
        out[str(crit)] = DrafterSoundness(str(crit), p.shape[0], int((~rejected).sum()), int(certified.sum()),
                                          int((certified & rejected).sum()))
    srt = q.sort(-1, descending=True)
    top_p = p == p.amax(-1, keepdim=True)
    for m in widths:
        unique = srt.values[:, m - 1] > srt.values[:, m]
        in_tree = torch.zeros_like(top_p).scatter(-1, srt.indices[:, :m], True)
        succeeds = ~(top_p & ~in_tree).any(-1)
        certified = (kl < rho[f"tree:{m}"]) & unique
        out[f"tree:{m}"] = DrafterSoundness(f"tree:{m}", int(unique.sum()), int((succeeds & unique).sum()),
                                            int(certified.sum()), int((certified & ~succeeds).sum()))
    return out


def drafter_certificate(q: Tensor, criterion: Criterion | str, *, from_logits: bool = False) -> Tensor:
    """``rho~_c(q) = inf { KL(p||q) : c rejects argmax q under p }``: float64, shape ``q.shape[:-1]``.

    ``criterion``: a :class:`~companion.criteria.Criterion`, a spec string, or ``"tree:M"``.
    ``KL(p||q) < rho~`` guarantees that the target ``p`` accepts every maximiser of ``q``.
    """
    m = _tree_spec(criterion)
    if m is not None:
        return drafter_tree_certificate(q, m, from_logits=from_logits)
    c = parse_criterion(criterion)
    return drafter_certificates(q, [c], from_logits=from_logits)[str(c)]


def drafter_tree_certificate(q: Tensor, m: int, *, from_logits: bool = False) -> Tensor:
    """``inf { KL(p||q) : argmax p lies outside the drafter's top m }``; ``m = 1`` is strict greedy."""
    check_distribution_tensor(q, "q")
    vocab = q.shape[-1]
    check_tree_width(m, vocab)
    return drafter_certificates(q, (), tree_widths=[m], from_logits=from_logits)[f"tree:{m}"]


def _scatter(r: _Rows, q64: Tensor, sorted_vals: Tensor, mask: Tensor, z: Tensor) -> Tensor:
    """``p = where(sorted mask, sorted_vals, q) / Z`` scattered back to token order."""
    flat = q64.reshape(-1, r.vocab)
    k = mask.shape[1]
    idx = r.indices[:, :k]
    pooled = torch.zeros_like(flat, dtype=torch.bool).scatter(1, idx, mask)
    vals = torch.zeros_like(flat).scatter(1, idx, torch.where(mask, sorted_vals, torch.zeros_like(sorted_vals)))
    return torch.where(pooled, vals, flat) / z.unsqueeze(1)


def _pool_witness(r: _Rows, q64: Tensor, pool: _Pool) -> Tensor:
    level = torch.exp(pool.log_level).unsqueeze(1) * pool.weights
    return _scatter(r, q64, level, pool.mask, pool.z)


def _typical_witness(r: _Rows, q64: Tensor, crit: Typical) -> Tensor:
    """``p_d = s``, ``(1 - s) r`` elsewhere: ``r`` proportional to ``qbar^beta``, or (``beta = inf``)
    ``(a, b, ..., b)`` on the ``t`` runners-up tied at ``q(2)`` with entropy ``eta``."""
    cost, st = _typical(r, crit)
    flat = q64.reshape(-1, r.vocab)
    out = torch.where(torch.isfinite(cost).unsqueeze(1), flat, torch.full_like(flat, torch.nan))
    rows = torch.nonzero(~torch.isnan(st.x)).squeeze(1)  # x = +inf: the point mass on d
    if rows.numel():
        d = r.indices[rows, 0:1]
        ell = _Competitors(r, rows).full
        s, s_c = torch.sigmoid(st.x[rows]), torch.sigmoid(-st.x[rows])
        beta = st.beta[rows]
        gibbs = torch.isfinite(beta)
        w = torch.exp(torch.where(gibbs, beta, torch.ones_like(beta)).unsqueeze(1) * ell)
        t = st.ties[rows].to(torch.float64)
        eta = st.eta[rows]
        top = ell == 0
        first = top & (torch.cumsum(top.to(torch.long), 1) == 1)

        def ent(a: Tensor) -> Tensor:
            share = (1 - a) / (t - 1).clamp(min=1)
            return -torch.xlogy(a, a) - (t - 1) * torch.xlogy(share, share)

        # The entropy falls from log t (a = 1/t) to 0 (a = 1): bisect for a.
        lo, hi = 1 / t, torch.ones_like(t)
        for _ in range(100):
            mid = 0.5 * (lo + hi)
            above = ent(mid) > eta
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        a = torch.where(t > 1, 0.5 * (lo + hi), torch.ones_like(t))
        share = torch.where(t > 1, (1 - a) / (t - 1).clamp(min=1), torch.zeros_like(a))
        tie_r = torch.where(first, a.unsqueeze(1), torch.where(top, share.unsqueeze(1), torch.zeros_like(ell)))
        rr = torch.where(gibbs.unsqueeze(1), w / w.sum(1, keepdim=True), tie_r)
        out = out.index_copy(0, rows, (s_c.unsqueeze(1) * rr).scatter(1, d, s.unsqueeze(1)))
    return out


def drafter_witness(q: Tensor, criterion: Criterion | str, *, from_logits: bool = False) -> Tensor:
    """The minimiser ``p*`` with ``KL(p*||q) = rho~_c(q)``: float64 ``[..., V]``, NaN where ``rho~ = +inf``.

    ``p*`` lies on the boundary of the rejection region (a runner-up tied with ``d``, ``p_d``
    exactly at the relaxed threshold, ...): any step further along the tilt is rejected.
    ``criterion`` may also be ``"tree:M"``.
    """
    m = _tree_spec(criterion)
    if m is not None:
        return drafter_tree_witness(q, m, from_logits=from_logits)
    check_distribution_tensor(q, "q")
    c = parse_criterion(criterion)
    vocab = q.shape[-1]
    _check_vocab(c, vocab)
    r = _rows(q, from_logits, _top_needed(c, vocab))
    q64 = normalized_probabilities(q, from_logits=from_logits)
    if isinstance(c, StrictGreedy):
        out = _pool_witness(r, q64, _greedy(r))
        cost = _greedy(r).cost
    elif isinstance(c, TopM):
        pool = _topm(r, c.m)
        out, cost = _pool_witness(r, q64, pool), pool.cost
    elif isinstance(c, MultiplicativeRelaxed):
        pool = _multiplicative(r, c.alpha)
        out, cost = _pool_witness(r, q64, pool), pool.cost
    elif isinstance(c, (AdditiveRelaxed, TopKDelta)):
        add = _additive(r, c.delta)
        lam = torch.where(torch.isfinite(add.lam), add.lam, torch.zeros_like(add.lam))
        n = lam.shape[0]
        mask = torch.ones(n, 2, dtype=torch.bool, device=lam.device)
        tilted = r.values[:, :2] * torch.stack([torch.exp(-lam), torch.exp(lam)], 1)
        out = _scatter(r, q64, tilted, mask, add.z)
        cost = add.cost
        if isinstance(c, TopKDelta) and c.k < r.vocab:
            pool = _topm(r, c.k)
            use = pool.cost < cost
            out = torch.where(use.unsqueeze(1), _pool_witness(r, q64, pool), out)
            cost = torch.minimum(cost, pool.cost)
    elif isinstance(c, Typical):
        out = _typical_witness(r, q64, c)
        return out.reshape(q.shape)
    else:
        raise TypeError(f"no drafter-side witness for {type(c).__name__}")
    out = torch.where(torch.isfinite(cost).unsqueeze(1), out, torch.full_like(out, torch.nan))
    return out.reshape(q.shape)


def drafter_tree_witness(q: Tensor, m: int, *, from_logits: bool = False) -> Tensor:
    """The minimiser of the drafter-side tree certificate: ``q(m+1)``'s token tied with the top of ``p*``."""
    check_distribution_tensor(q, "q")
    vocab = q.shape[-1]
    check_tree_width(m, vocab)
    r = _rows(q, from_logits, m + 1)
    q64 = normalized_probabilities(q, from_logits=from_logits)
    pool = _tree(r, m)
    out = _pool_witness(r, q64, pool)
    out = torch.where(torch.isfinite(pool.cost).unsqueeze(1), out, torch.full_like(out, torch.nan))
    return out.reshape(q.shape)
