"""Drafter-side certificate of typical acceptance (Medusa's rule): a branch and bound over ``p_d``.

Typical acceptance rejects the draft ``d`` iff ``p_d <= min(E, D e^-H(p))``, i.e. iff ``p_d <= E``
*and* ``p_d <= D e^-H(p)``. The drafter-side certificate is
``rho~(q) = inf { KL(p || q) : p rejects d }``. Write ``p = (s, (1-s) r)`` with ``r`` a distribution on
the other tokens and ``qbar`` the drafter without ``d``, renormalised:
``KL(p||q) = KL_b(s || q_d) + (1-s) KL(r || qbar)``, and the entropy condition reads
``H(r) <= c(s) = log(D)/(1-s) - logit s``. For a fixed ``s`` the cheapest ``r`` solves
``g(c) = min { KL(r || qbar) : H(r) <= c }``, attained on the power family ``r ~ qbar^beta``
(``beta >= 1``; with ties at ``q(2)``, uneven splits between them below ``H = log t``); ``g`` is
convex and non-increasing with slope ``1/beta - 1``. So ``rho~ = inf_s KL_b(s || q_d) + (1-s) g(c(s))``,
a one-dimensional problem that is not convex (it can have narrow basins), solved here by branch
and bound over ``logit s`` with lower bounds that hold by construction (:func:`_typical_rows`): the
value returned is the smallest bound left, never above the infimum, and the witness is the best
rejected target found. Measured against an exhaustive search on ``V = 3``
(``companion.certify.oracle.exhaustive_drafter_typical``, 300 drafters in each of the ten regimes of
``tests/test_drafter_side.py``): the value is never above the search's (to 1e-13 of rounding),
and it lies below the best rejected target known (search or witness) by at most 1.1e-8
relative, 8.4e-11 absolute, at ``typical:1,1`` (2.4e-9 relative at ``typical:0.9,1``, 7.8e-11
at ``typical:0.5,0.5``, below 3e-14 at five others; at ``typical:1,1.02`` and ``typical:1,3``,
whose certificates are 0 or nearly so, at most 8.4e-12 absolute). What holds by construction is
the direction: never above the infimum.

With ``E = 1`` and ``D >= 1`` the point mass on ``d`` is rejected too (``p_d = 1`` is not strictly
above ``min(1, D e^0) = 1``); at ``D = 1`` it is an isolated point of the rejection region, and it is
counted: Medusa's comparison rejects it, and a softmax in float32 rounds a peaked row to exactly 1.

The rows come from :mod:`companion.drafter.certificates` (its sorted top of ``q`` and the mass beyond);
this module only adds the search. Everything is float64.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from companion.certify.criteria import Typical
from companion.drafter.rows import Rows as _Rows

__all__ = ["typical_cost", "typical_witness"]

# The table of g starts at beta = 1, then 1 + e^w for w evenly spaced up to log _BETA_MAX.
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


# ---------------------------------------------------------------------------------------------
# The one-dimensional problem in logit p_d and its pieces.


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


def typical_cost(r: _Rows, crit: Typical) -> Tensor:
    """``rho~`` of typical acceptance for every row of ``r`` (float64 ``[N]``)."""
    return _typical(r, crit)[0]


def typical_witness(r: _Rows, q64: Tensor, crit: Typical) -> Tensor:
    """The best rejected target found for every row: float64 ``[N, V]`` in token order (see :func:`_typical_witness`)."""
    return _typical_witness(r, q64, crit)
