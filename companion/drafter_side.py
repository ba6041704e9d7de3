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
  ``p_d <= D e^-H(p)`` (an intersection: typical acceptance takes the smaller threshold). The
  optimal ``p`` puts ``s`` on ``d`` and ``(1-s) r`` on the rest with ``r_i`` proportional to
  ``qbar_i^beta`` (``qbar`` the drafter without ``d``, renormalised; ``beta >= 1``: the KKT
  condition off ``d`` is a power transform), and the entropy condition reads
  ``(1-s)(log(s/(1-s)) + H(r)) <= log D``. For each ``beta`` the best ``s`` is a
  one-dimensional convex problem (Newton with a bisection safeguard) capped at ``s <= E``;
  ``beta`` is searched on a grid over ``log(beta - 1)`` (``beta`` from 1 to 1e6), refined by
  parabolic and golden-section steps, and compared with ``beta = inf`` and with the kink where
  ``s = E`` meets the entropy condition (found by a root in ``beta``): a global search up to
  the grid's resolution, checked against SLSQP. With exact ties among the
  runners-up, ``r`` may also split unevenly between the tied tokens
  (``KL(r||qbar) = -H(r) - log qbar(1)``), searched the same way. When the entropy condition
  is slack this is the Bernoulli projection ``KL(E || q(1))``.

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
from companion.validation import check_tree_width

__all__ = [
    "TYPICAL_GRID",
    "drafter_certificate",
    "drafter_certificates",
    "drafter_tree_certificate",
    "drafter_tree_witness",
    "drafter_witness",
]

_SERIES_CUTOFF = 1e-2
# Typical acceptance: grid over w = log(beta - 1) with this many points (beta from 1 to 1e6),
# then Brent-style refinement on the bracket around the best grid point.
TYPICAL_GRID = 29
_BETA_MAX = 1e6
_W_MIN = -30.0
_REFINE_STEPS = 60
_REFINE_TOL = 1e-8
_ROOT_STEPS = 30
_TOP_COMPETITORS = 1024
_ELL_FLOOR = -1e4
_TYPICAL_CHUNK_BYTES = 64 * 2**20
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
    mask = torch.ones(r.values.shape[0], 2, dtype=torch.bool, device=r.values.device)
    return _equal_pool(r, mask)


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

    def beta_for_entropy(self, target: Tensor, m: Tensor, active: Tensor) -> Tensor:
        """``u = log beta`` with ``H(r_beta) = target`` (rows in ``active``; ``H`` falls with ``beta``,
        ``dH/du = -beta^2 Var_r(ell)``), in ``[0, 40]``."""

        def fn(u: Tensor) -> tuple[Tensor, Tensor]:
            beta = torch.exp(u)
            h, _, var = self._moments(beta, m, True)
            return target - h, (beta * beta * var).clamp(min=1e-300)

        lo, hi = torch.zeros_like(target), torch.full_like(target, 40.0)
        return _root(fn, lo, hi, torch.ones_like(target), active=active)


def _minimise(fn: Callable[[Tensor], Tensor], a: Tensor, b: Tensor, c: Tensor,
              fa: Tensor, fb: Tensor, fc: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Minimise ``fn`` (elementwise over rows) from a bracket ``a <= b <= c`` with ``f(b)`` the
    smallest, in the manner of Brent: a parabola through the three points when it lands inside
    the bracket and moves less than half the step before last, a golden-section step into the
    larger side otherwise. Stops once every row's last step is below ``_REFINE_TOL``, or its
    bracket is narrow and its value has not improved (beyond rounding) in three steps.
    Returns ``(b, f(b))``."""
    golden = (3 - math.sqrt(5)) / 2
    before_last = c - a
    last = c - a
    history = [fb]
    for _ in range(steps):
        wide_right = (c - b) >= (b - a)
        g = torch.where(wide_right, b + golden * (c - b), b - golden * (b - a))
        num = (b - a) ** 2 * (fb - fc) - (b - c) ** 2 * (fb - fa)
        den = (b - a) * (fb - fc) - (b - c) * (fb - fa)
        u = b - 0.5 * num / den
        tol = 1e-12 * (1 + b.abs())
        ok = (u > a + tol) & (u < c - tol) & ((u - b).abs() < 0.5 * before_last)
        u = torch.where(ok, u, g)
        before_last, last = last, (u - b).abs()
        fu = fn(u)
        fu = torch.where(torch.isnan(fu), torch.full_like(fu, torch.inf), fu)
        better = fu < fb
        right = u > b
        a, fa = (torch.where(better & right, b, torch.where(~better & ~right, u, a)),
                 torch.where(better & right, fb, torch.where(~better & ~right, fu, fa)))
        c, fc = (torch.where(better & ~right, b, torch.where(~better & right, u, c)),
                 torch.where(better & ~right, fb, torch.where(~better & right, fu, fc)))
        b, fb = torch.where(better, u, b), torch.where(better, fu, fb)
        history.append(fb)
        # Converged: the step is tiny, or the bracket is narrow and three steps gained nothing
        # above rounding.
        narrow = (c - a) <= 1e-5 * (1 + b.abs())
        stalled = narrow & (history[-4] - fb <= 1e-12 * (1 + fb.abs())) if len(history) > 3 else torch.zeros_like(better)
        if bool(((last <= _REFINE_TOL * (1 + b.abs())) | ((c - a) <= _REFINE_TOL * (1 + b.abs())) | stalled).all()):
            break
    return b, fb


def _bracket(grid: Tensor, vals: Tensor) -> tuple[Tensor, ...]:
    """Bracket ``(a, b, c, fa, fb, fc)`` around each row's best grid point (``grid``: ``[n, J]``)."""
    j = vals.argmin(1, keepdim=True)
    jl, jr = (j - 1).clamp(min=0), (j + 1).clamp(max=vals.shape[1] - 1)
    pick = lambda t, i: t.gather(1, i).squeeze(1)
    return (pick(grid, jl), pick(grid, j), pick(grid, jr), pick(vals, jl), pick(vals, j), pick(vals, jr))


@dataclass(frozen=True)
class _TypicalB:
    cost: Tensor  # [N]
    x: Tensor  # logit of p_d
    beta: Tensor  # inf for the tie family and the beta = inf end
    eta: Tensor  # entropy of r
    ties: Tensor  # number of runners-up tied at q(2)


def _typical_rows(comp: _Competitors, log_qd: Tensor, log_rd: Tensor, m: Tensor, log_delta: float,
                  x_cap: float) -> _TypicalB:
    """Typical acceptance's certificate for the rows of ``comp`` (see the module doc)."""
    n = log_qd.shape[0]
    dev = log_qd.device
    # Grid over w = log(beta - 1) (the scale on which the objective varies, from beta = 1 + 1e-13
    # to 1e6): one moment pass per point, one solve for all of them.
    us = torch.cat([torch.tensor([_W_MIN], dtype=torch.float64, device=dev),
                    torch.linspace(-16.0, math.log(_BETA_MAX), TYPICAL_GRID - 1, dtype=torch.float64, device=dev)])
    mom = [comp.moments(1 + torch.exp(u).expand(n), m) for u in us]
    etas = torch.stack([e for e, _ in mom], 1)
    kls = torch.stack([k for _, k in mom], 1)
    vals, _ = _best_s(log_qd.unsqueeze(1), log_rd.unsqueeze(1), etas, kls, log_delta, x_cap)

    def at_u(u: Tensor) -> Tensor:
        eta, kl = comp.moments(1 + torch.exp(u), m)
        return _best_s(log_qd, log_rd, eta, kl, log_delta, x_cap)[0]

    log_t = torch.log(comp.ties.to(torch.float64))
    a, b, c, fa, fb, fc = _bracket(us.expand(n, -1), vals)
    cost = torch.full_like(log_qd, torch.inf)
    x, beta, eta = torch.full_like(cost, torch.nan), torch.full_like(cost, torch.nan), torch.full_like(cost, torch.nan)

    def keep(v: Tensor, xx: Tensor, bb: Tensor, ee: Tensor, where: Tensor) -> None:
        nonlocal cost, x, beta, eta
        better = where & (v < cost)
        cost, x = torch.where(better, v, cost), torch.where(better, xx, x)
        beta, eta = torch.where(better, bb, beta), torch.where(better, ee, eta)

    # The objective has a kink (no derivative there, so refinement would crawl to it) where
    # s = eps meets the entropy condition: (1 - eps)(logit eps + H(r)) = log delta. Solve for
    # that H directly; rows whose best grid bracket holds a kink no worse than the grid need no
    # further refinement.
    eta_eps = None
    if math.isfinite(x_cap):
        eta_eps = log_delta / (1 / (1 + math.exp(x_cap))) - x_cap
        inside = (eta_eps < etas[:, 0]) & (eta_eps > log_t)
        if bool(inside.any()):
            u_k = comp.beta_for_entropy(torch.full_like(log_t, eta_eps), m, inside)
            eta_k, kl_k = comp.moments(torch.exp(u_k), m)
            v, xx = _best_s(log_qd, log_rd, eta_k, kl_k, log_delta, x_cap)
            keep(v, xx, torch.exp(u_k), eta_k, inside)
            u_k = torch.log(torch.expm1(u_k).clamp(min=math.exp(_W_MIN)))  # to w = log(beta - 1)
            done = inside & (v <= fb) & (u_k >= a) & (u_k <= c)
            a, b, c = torch.where(done, u_k, a), torch.where(done, u_k, b), torch.where(done, u_k, c)
            fb = torch.where(done, v, fb)
    u_best, _ = _minimise(at_u, a, b, c, fa, fb, fc, steps=_REFINE_STEPS)
    eta_g, kl_g = comp.moments(1 + torch.exp(u_best), m)
    v, xx = _best_s(log_qd, log_rd, eta_g, kl_g, log_delta, x_cap)
    keep(v, xx, 1 + torch.exp(u_best), eta_g, torch.ones_like(log_t, dtype=torch.bool))
    # beta = inf: r uniform on the t runners-up tied at q(2). With t >= 2, r may also split
    # unevenly among them: entropy e in [0, log t] at KL(r || qbar) = -e - m.
    tie_kl = lambda e: (-e - m.unsqueeze(-1) if e.dim() > 1 else -e - m).clamp(min=0.0)
    cands = [log_t]
    if eta_eps is not None:
        cands.append(torch.clamp(torch.full_like(log_t, eta_eps), min=0.0).minimum(log_t))
    if bool((comp.ties > 1).any()):
        grid = torch.linspace(0.0, 1.0, TYPICAL_GRID, dtype=torch.float64, device=dev).unsqueeze(0) * log_t.unsqueeze(1)
        tv, _ = _best_s(log_qd.unsqueeze(1), log_rd.unsqueeze(1), grid, tie_kl(grid), log_delta, x_cap)
        e_best, _ = _minimise(lambda e: _best_s(log_qd, log_rd, e, tie_kl(e), log_delta, x_cap)[0],
                              *_bracket(grid, tv), steps=_REFINE_STEPS)
        cands.append(e_best)
    every = torch.ones_like(log_t, dtype=torch.bool)
    for e in cands:
        v, xx = _best_s(log_qd, log_rd, e, tie_kl(e), log_delta, x_cap)
        keep(v, xx, torch.full_like(beta, torch.inf), e, every)
    return _TypicalB(cost, x, beta, eta, comp.ties)


def _typical(r: _Rows, crit: Typical) -> tuple[Tensor, _TypicalB]:
    """``(cost, state)``: typical acceptance rejects ``d`` iff ``p_d <= eps`` and
    ``p_d <= delta e^-H(p)`` (``p_d`` at or below the smaller threshold)."""
    qd = r.values[:, 0]
    rd = r.rest(1)  # 1 - q(1), summed on its own scale
    eps, delta = crit.eps, crit.delta
    n = qd.shape[0]
    log_qd, log_rd = torch.log(qd), torch.log(rd)
    x_cap = math.log(eps) - math.log1p(-eps) if eps < 1 else math.inf
    # A point mass on d: only p = q itself (p_d = 1, H = 0), rejected iff eps = 1 <= delta.
    point = rd <= 0
    nan = torch.full_like(qd, torch.nan)
    state = _TypicalB(torch.where(point & (eps >= 1) & (delta >= 1), 0.0, torch.inf).to(qd), nan, nan, nan,
                      torch.zeros_like(qd, dtype=torch.long))
    idx = torch.nonzero(~point).squeeze(1)
    if idx.numel():
        per = max(1, _TYPICAL_CHUNK_BYTES // max(1, 8 * r.vocab))
        m_all = torch.log(r.values[:, 1]) - log_rd
        parts = []
        for start in range(0, idx.numel(), per):
            sel = idx[start:start + per]
            parts.append(_typical_rows(_Competitors(r, sel), log_qd[sel], log_rd[sel], m_all[sel],
                                       math.log(delta), x_cap))
        fields = {}
        for name in ("cost", "x", "beta", "eta", "ties"):
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
    vocab = q.shape[-1] if isinstance(q, Tensor) and q.dim() >= 1 else 0
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
    counts as accepted when the criterion accepts *every* maximiser of ``q`` (the certificate
    is the worst case over them). For ``tree:M`` only rows where ``q(M) > q(M+1)`` count (the
    drafter's tree is then unique), and the tree succeeds iff a maximiser of ``p`` lies in it.
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
        rejected = (crit.rejection_mask(p) & top_q).any(-1)
        certified = kl < rho[str(crit)]
        out[str(crit)] = DrafterSoundness(str(crit), p.shape[0], int((~rejected).sum()), int(certified.sum()),
                                          int((certified & rejected).sum()))
    srt = q.sort(-1, descending=True)
    top_p = p == p.amax(-1, keepdim=True)
    for m in widths:
        unique = srt.values[:, m - 1] > srt.values[:, m]
        succeeds = top_p.gather(-1, srt.indices[:, :m]).any(-1)
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
    vocab = q.shape[-1] if isinstance(q, Tensor) and q.dim() >= 1 else 0
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
    rows = torch.nonzero(torch.isfinite(st.x)).squeeze(1)
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
    c = parse_criterion(criterion)
    vocab = q.shape[-1] if isinstance(q, Tensor) and q.dim() >= 1 else 0
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
    vocab = q.shape[-1] if isinstance(q, Tensor) and q.dim() >= 1 else 0
    check_tree_width(m, vocab)
    r = _rows(q, from_logits, m + 1)
    q64 = normalized_probabilities(q, from_logits=from_logits)
    pool = _tree(r, m)
    out = _pool_witness(r, q64, pool)
    out = torch.where(torch.isfinite(pool.cost).unsqueeze(1), out, torch.full_like(out, torch.nan))
    return out.reshape(q.shape)
