"""The pooling kernel: the cost of flattening a distribution on a set of tokens, for both sides.

Every exact certificate of the library is the cost of one *pooled tilt*. On the target side
(:mod:`companion.certify.certificates`) the drafter ``q`` is flattened on a pool ``A`` of the target's
top tokens and the cost is ``min D(p, q)``; on the drafter side (:mod:`companion.drafter.certificates`)
the roles are swapped and the target ``p`` is flattened on a pool of the drafter's top tokens at
the cost ``min KL(p || q)``, which is the target side's *reverse* cost with ``p`` and ``q``
exchanged. So both sides call the one kernel here, :func:`pooled_cost`:

* forward, ``min_q KL(p || q)`` with ``q`` flat on ``A``: ``C = sum_A p_i log(p_i / L)``,
  ``L = mean_A p``;
* reverse, ``min_q KL(q || p)`` with ``q_i = w_i G_w / Z`` on ``A`` (weights ``w_i > 0``
  summing to 1 over ``A``; equal weights unless given) and ``q = p / Z`` elsewhere:
  ``G_w = prod_A (p_i / w_i)^(w_i)``, ``Z = T_A + G_w`` with ``T_A`` the mass outside the pool,
  ``C = -log Z = -log(1 - e)`` with the excess ``e = P_A - G_w = G_w sum_A w_i h(d_i) >= 0``,
  ``h(d) = e^d - 1 - d`` and ``d_i = log(p_i / w_i) - log G_w``. Equal weights give
  ``G_w = |A| G_A`` (``G_A`` the geometric mean); unequal ones are the drafter side's
  multiplicative relaxation (``p_d <= alpha p_z`` pools ``d`` and ``z`` with weights
  ``(alpha, 1) / (1 + alpha)``).

Precision (the same on both sides, which is the point of one kernel): deviations are taken as
differences of nearby floats, never as ratios of rounded levels, so a near tie of relative gap
``delta`` costs no digits; ``h`` and ``g(1 + u) = (1 + u) log(1 + u) - u`` come from their series
near 0; peaked rows (``e >= 1/2``) are evaluated in log space as ``-log(T_A + G_w)`` with
``T_A`` summed from the values left out plus a separately summed tail. Every branch is rounded
down by a relative ``ROUND_DOWN`` (8e-15), some thirty times the evaluation error measured before
rounding (at most 2.8e-16 relative above the exact value, on 2,961 reverse certificates of dyadic
rows against 60-digit enumeration), so that costs stay at or below the exact cost of their
float64 inputs: an error analysis and a measurement, not a proof.
"""
from __future__ import annotations

import torch
from torch import Tensor

_U64 = 2.0**-53
_SERIES_CUTOFF = 1e-2
# Pooled costs are multiplied by 1 - ROUND_DOWN: their float64 evaluation is good to about 1e-15
# relative (measured: at most 2.8e-16 above exact), so the result stays below the exact cost.
ROUND_DOWN = 8e-15
_DEVIATION_SERIES_CUTOFF = 0.1
# Above this reverse excess e = P_A - |A| G_A, 1 - e is evaluated as T_A + |A| G_A (log space).
_LARGE_EXCESS = 0.5


def xlogx_minus_x_plus_1(x: Tensor) -> Tensor:
    """``g(x) = x log x - x + 1`` (``g(0) = 1``), accurate to float64 precision near ``x = 1``."""
    u = x - 1
    # g(1+u) = sum_{n>=2} (-1)^n u^n / (n (n-1)); truncation error < |u|^9 / 72.
    series = u * u * (0.5 - u * (1 / 6 - u * (1 / 12 - u * (1 / 20 - u * (1 / 30 - u * (1 / 42 - u / 56))))))
    direct = torch.xlogy(x, x) - x + 1
    return torch.where(u.abs() < _SERIES_CUTOFF, series, direct)


def one_plus_u_log1p_u_minus_u(u: Tensor) -> Tensor:
    """``g(1 + u) = (1 + u) log(1 + u) - u`` for ``u >= -1`` (``g(0) = 1`` at ``u = -1``), from ``u``
    itself: its series for ``|u| < 0.1`` (relative error ~1e-16 however small ``u`` is), else with
    ``log1p`` (relative error below 2e-15). Unlike :func:`xlogx_minus_x_plus_1`, no ``x = 1 + u`` is formed, so a ``u`` known
    to full relative precision (a deviation from a level computed without cancellation) keeps it."""
    # sum_{n>=2} (-1)^n u^n / (n (n-1)) to n = 17: truncation < |u|^18 / 306, below 1e-16 of the
    # value for |u| < 0.1; beyond, (1 + u) log1p(u) - u loses at most ~2e-16 / |u| <= 2e-15.
    series = u * u * (1 / 2 + u * (-1 / 6 + u * (1 / 12 + u * (-1 / 20 + u * (1 / 30 + u * (-1 / 42 + u * (
        1 / 56 + u * (-1 / 72 + u * (1 / 90 + u * (-1 / 110 + u * (1 / 132 + u * (-1 / 156 + u * (
            1 / 182 + u * (-1 / 210 + u * (1 / 240 + u * (-1 / 272))))))))))))))))
    safe = u.clamp(min=-1.0)
    direct = torch.where(safe <= -1, torch.ones_like(u), (1 + safe) * torch.log1p(safe) - safe)
    return torch.where(u.abs() < _DEVIATION_SERIES_CUTOFF, series, direct)


def expm1_minus_x(d: Tensor) -> Tensor:
    """``h(d) = e^d - 1 - d``, accurate to float64 precision near ``d = 0``."""
    series = d * d * (0.5 + d * (1 / 6 + d * (1 / 24 + d * (1 / 120 + d * (1 / 720 + d * (1 / 5040 + d / 40320))))))
    direct = torch.expm1(d) - d
    return torch.where(d.abs() < _SERIES_CUTOFF, series, direct)



# ---------------------------------------------------------------------------------------------
# The pooled cost, shared by level-set certificates, trees, per-token costs and witnesses.


def _reverse_levels(vals: Tensor, logs: Tensor, pool: Tensor, count: Tensor,
                    weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(x, log x, log level, log G_w)`` of a reverse pool: ``x_i = p_i / w_i``, the level
    ``w_i G_w`` of each pooled entry (one column when the weights are equal, then ``G_A``
    itself) and ``log G_w = sum_A w_i log x_i``. Equal weights keep the plain ``p`` and
    ``log p`` (no division), so the equal-weight kernel is exactly the target side's."""
    zero = torch.zeros_like(vals)
    if weights is None:
        mean_log = torch.where(pool, logs, zero).sum(1) / count
        return vals, logs, mean_log.unsqueeze(1), torch.log(count) + mean_log
    w = torch.where(pool, weights.to(vals.dtype), torch.ones_like(vals))
    log_w = torch.log(w)
    x_log = logs - log_w
    log_gw = torch.where(pool, w * x_log, zero).sum(1)
    return vals / w, x_log, log_w + log_gw.unsqueeze(1), log_gw


def _shrink(x: Tensor, by: Tensor) -> Tensor:
    """``x`` moved towards 0 by ``by >= 0`` (0 where ``|x| <= by``)."""
    return torch.sign(x) * (x.abs() - by).clamp(min=0)


def pooled_cost(vals: Tensor, logs: Tensor, pool: Tensor, outside: Tensor | None, divergence: str,
                weights: Tensor | None = None, value_err: Tensor | None = None) -> Tensor:
    """``min D(p, q)`` over ``q`` flat on the pool ``A = pool`` and proportional to ``p`` elsewhere.

    ``vals``, ``logs``: ``[N, C]`` float64 probabilities and their logs (any order of columns);
    ``pool``: bool ``[N, C]``, non-empty in every row; ``outside``: ``[N]`` the probability
    mass ``T_A`` of every token not in the pool, summed without cancellation (reverse only);
    ``weights`` (reverse only): ``[N, C]`` positive on the pool, summing to 1 there, for a pool
    on which ``q_i / w_i`` is constant (default: equal weights, ``q`` flat).

    * forward: ``L = mean_A p``, ``C = sum_A p_i log(p_i / L) = L sum_A g(1 + u_i)`` with
      ``u_i = (p_i - L) / L`` and ``g(1 + u) = (1 + u) log(1 + u) - u``. The deviations are taken
      without cancellation, ``p_i - L = (p_i - a) - mean_A (p_j - a)`` from the first pooled value
      ``a`` (differences of nearby floats are exact), so a near tie of relative gap ``delta``
      costs no digits (where ``p_i / L`` would lose ``1e-16 / delta`` of them); the result is
      rounded down by a relative ``ROUND_DOWN`` so that it stays below the exact value (module
      docstring: measured, not proved);
    * reverse: ``x_i = p_i / w_i``, ``log G_w = sum_A w_i log x_i``,
      ``e = P_A - G_w = G_w sum_A w_i h(log x_i - log G_w)``, ``C = -log1p(-e)`` for ``e < 1/2``
      (the deviations ``log x_i - log G_w`` taken as ``log1p`` of differences of nearby floats
      near ties; rounded down by ``ROUND_DOWN``), else ``C = -log(T_A + G_w)`` evaluated as
      ``-logaddexp(log T_A, log G_w)`` (rounded down by ``ROUND_DOWN`` as well); equal weights: ``G_w = |A| G_A``. A pooled zero makes
      ``G_w = 0`` and ``C = -log T_A`` (``+inf`` when ``T_A = 0`` too).

    ``value_err`` (``[N, C]``, default none): the values are themselves rounded, each within a relative
    ``value_err`` of the exact value times a factor common to the row (a float64 softmax: the
    subtraction ``l - lse`` and ``exp``). At a near tie the deviations are then only known to within
    about ``2 eps`` of the level (``eps`` the largest ``value_err`` of the pool), which is all of them at a gap of a few ulps. The cost is lowered
    for every such perturbation: forward, ``1 + u_i`` moves by a factor within ``(1 +- eps) / (1 -+ eps)``,
    so each ``u_i`` is moved towards 0 by ``e_i = 2.01 eps (1 + |u_i|)`` (plus ``2 U64`` of the
    deviations' own rounding) before ``g``, which is convex with its minimum at 0, and ``L`` is taken
    ``(1 - eps)`` lower; reverse, each ``d_i`` moves by at most ``2.01 eps`` (``h`` likewise convex,
    minimum 0), ``G_w`` by ``eps``, and ``-log(T_A + G_w)`` by at most ``1.01 eps``.
    """
    zero = torch.zeros_like(vals)
    count = pool.sum(1).to(vals.dtype)
    if value_err is not None:
        value_err = torch.where(pool, value_err, zero).amax(1)
    if divergence == "forward":
        if weights is not None:
            raise ValueError("weighted pools are defined for the reverse cost only")
        level = torch.where(pool, vals, zero).sum(1) / count
        anchor = vals.gather(1, pool.to(torch.int8).argmax(1, keepdim=True))  # the first pooled value
        diff = torch.where(pool, vals - anchor, zero)
        dev = diff - (diff.sum(1) / count).unsqueeze(1)  # p_i - L
        u = dev / level.unsqueeze(1)
        if value_err is not None:  # the values' own rounding (docstring): u_i towards 0, L lower
            eps = value_err.unsqueeze(1)
            spread = torch.where(pool, u.abs(), zero).amax(1, keepdim=True)
            u = _shrink(u, 2.01 * eps * (1 + u.abs()) + 2 * _U64 * (u.abs() + spread))
            level = level * (1 - 1.01 * value_err)
        terms = one_plus_u_log1p_u_minus_u(u)
        return level * torch.where(pool, terms, zero).sum(1) * (1 - ROUND_DOWN)
    x, x_log, log_level, log_gw = _reverse_levels(vals, logs, pool, count, weights)
    finite = torch.isfinite(log_gw)
    g = torch.exp(torch.where(finite.unsqueeze(1), log_level, torch.zeros_like(log_level)))  # w_i G_w
    # d_i = log x_i - log G_w = r_i - mean_w r with r_i = log(x_i / a), a the first pooled x:
    # log1p((x_i - a) / a) within a factor 1.5 of a (a difference of nearby floats, exact), the
    # difference of the logs beyond (no cancellation left there), so near ties keep their digits.
    first = pool.to(torch.int8).argmax(1, keepdim=True)
    a_val, a_log = x.gather(1, first), x_log.gather(1, first)
    close = pool & (a_val > 0) & ((x - a_val).abs() <= 0.5 * a_val)
    ratio = torch.where(close, (x - a_val) / torch.where(a_val > 0, a_val, torch.ones_like(a_val)), zero)
    rel = torch.where(pool, torch.where(close, torch.log1p(ratio), x_log - a_log), zero)
    centre = rel.sum(1) / count if weights is None else torch.where(pool, weights * rel, zero).sum(1)
    d = torch.where(pool, rel - centre.unsqueeze(1), zero)
    big = d > 1
    d_err = None
    g_plain = g
    if value_err is not None:  # the values' own rounding (docstring): d_i towards 0, G_w lower
        spread = torch.where(pool, rel.abs(), zero).amax(1, keepdim=True)
        d_err = 2.01 * value_err.unsqueeze(1) + 2 * _U64 * (d.abs() + spread)
        d = torch.where(big, d, _shrink(d, d_err))
        g = g * (1 - 1.01 * value_err.unsqueeze(1))
    # w_i G_w h(d_i): its series near 0, expm1(d) - d up to d = 1, and p_i - w_i G_w (1 + d_i)
    # beyond, where no cancellation is left and e^d could overflow.
    near = g * expm1_minus_x(torch.where(big, zero, d))
    far = vals - g_plain * (1 + d)
    if d_err is not None:  # h(d - e) >= h(d) (1 - 3 e) for d > 1 (h'/h <= 2.4 there), G_w within eps
        far = far * (1 - 3 * d_err) * (1 - 1.01 * value_err.unsqueeze(1))
    excess = torch.where(pool, torch.where(big, far, near), zero).sum(1)
    small = -torch.log1p(-excess.clamp(max=1.0)) * (1 - ROUND_DOWN)
    if outside is None:
        raise ValueError("the reverse pooled cost needs the mass outside the pool (outside=None given)")
    # Rounded down too: this branch is good to a few 1e-16 relative (measured on dyadic rows: up
    # to 2.8e-16 above the exact value before rounding), far inside ROUND_DOWN.
    large = -torch.logaddexp(torch.log(outside), log_gw) * (1 - ROUND_DOWN)
    if value_err is not None:
        large = large - 1.01 * value_err
    return torch.where(finite & (excess < _LARGE_EXCESS), small, large)


def reverse_tilt(vals: Tensor, logs: Tensor, pool: Tensor, cost: Tensor, weights: Tensor | None = None) -> Tensor:
    """The minimiser of the reverse pooled cost, in the columns' order: ``q_i = w_i G_w e^C`` on
    the pool and ``p_i e^C`` elsewhere (``e^C = 1 / Z``), computed as ``exp(log level + C)`` and
    ``exp(log p + C)`` so that nothing overflows on peaked rows. Rows with an infinite cost get NaN."""
    count = pool.sum(1).to(vals.dtype)
    _, _, log_level, _ = _reverse_levels(vals, logs, pool, count, weights)
    ok = torch.isfinite(cost).unsqueeze(1)
    c = torch.where(ok, cost.unsqueeze(1), torch.zeros_like(cost).unsqueeze(1))
    out = torch.where(pool, torch.exp(log_level + c).expand_as(vals), torch.exp(logs + c))
    return torch.where(ok, out, torch.full_like(out, torch.nan))


def pool_levels(anchor_val: Tensor, anchor_log: Tensor, weight: Tensor, others_val: Tensor, others_log: Tensor,
                 divergence: str) -> Tensor:
    """Level of the pool {``weight`` copies of the anchor} + first ``j`` of ``others``, ``j = 0..n``: ``[N, n+1]``.

    Forward: the arithmetic mean of the pooled probabilities. Reverse: the mean of their logs
    (the log of the geometric mean ``G``), so that comparisons need no ``exp``.
    """
    zero_col = torch.zeros(others_val.shape[0], 1, dtype=others_val.dtype, device=others_val.device)
    j = torch.arange(others_val.shape[1] + 1, device=others_val.device)
    w = weight.to(others_val.dtype).unsqueeze(1)
    if divergence == "forward":
        return (w * anchor_val.unsqueeze(1) + torch.cat([zero_col, others_val.cumsum(1)], dim=1)) / (w + j)
    # log 0 = -inf only enters levels that the callers mask or that are exact (zeros pooled).
    return (w * anchor_log.unsqueeze(1) + torch.cat([zero_col, others_log.cumsum(1)], dim=1)) / (w + j)


def cost_of_pool(values: Tensor, logs: Tensor, tail: Tensor, pool_k: Tensor, y_val: Tensor, y_log: Tensor,
                  extra: Tensor, divergence: str, value_err: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """:func:`pooled_cost` of a pool given as a mask over a summary's ``K`` sorted values plus,
    where ``extra``, one token beyond them (probability ``y_val``, log ``y_log``, counted in ``tail``).

    ``value_err = (a, b)`` (per row): each value is within a relative ``2^-53 (a |log p_i| + b)`` of
    the exact one times a common factor (:func:`pooled_cost`'s ``value_err``; zeros are exact).

    ``T_A = sum of the values left out + (tail - the extra token)``: no ``1 - P_A``.
    """
    vals = torch.cat([values, y_val.unsqueeze(1)], dim=1)
    lg = torch.cat([logs, y_log.unsqueeze(1)], dim=1)
    pool = torch.cat([pool_k, extra.unsqueeze(1)], dim=1)
    outside = None
    if divergence == "reverse":
        left = torch.where(pool_k, torch.zeros_like(values), values).sum(1)
        beyond = (tail - torch.where(extra, y_val, torch.zeros_like(y_val))).clamp(min=0)
        outside = left + beyond
    per_value = None
    if value_err is not None:
        a, b = value_err
        mag = torch.where(torch.isfinite(lg), lg.abs(), torch.zeros_like(lg))
        per_value = torch.where(vals > 0, _U64 * (a.unsqueeze(1) * mag + b.unsqueeze(1)), torch.zeros_like(vals))
    return pooled_cost(vals, lg, pool, outside, divergence, value_err=per_value)


