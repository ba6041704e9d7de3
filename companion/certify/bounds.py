"""Margin bounds on the certificates: what the top of the target alone guarantees.

Notation: ``p(1) >= p(2) >= ...`` sorted target probabilities, ``y*`` the most likely rejected
token, ``Delta = p(1) - p_{y*}``, ``s = p(1) + p_{y*}``, ``gamma = p(1) - p(2)``.

* Two-point bound (every criterion): any ``q`` whose argmax is ``y*`` has ``q_{y*} >= q_1``,
  and dropping the other constraints can only lower the minimum, so
  ``rho* >= s [log 2 - h(p(1)/s)]`` (forward; ``h`` binary entropy, nats) and
  ``rho* >= -log(1 - (sqrt p(1) - sqrt p_{y*})^2)`` (reverse). By Pinsker on the pair,
  ``s [log 2 - h(p(1)/s)] >= Delta^2 / (2 s)``.
* Strict greedy (forward), no exact tie at the top: the pool is exactly ``{1, 2}``, so ``rho*``
  equals the two-point value ``s [log 2 - h(p(1)/s)]`` and
  ``Delta^2/(2s) <= rho* <= (log 2) Delta^2/s``. Both constants are sharp: the lower one as
  ``Delta -> 0`` (Pinsker), the upper one as ``p(2) -> 0``, since ``[log 2 - h((1+u)/2)] / u^2``
  increases in ``u = Delta/s`` from ``1/2`` to ``log 2``. The chi-square bound ``Delta^2/s`` is
  valid but loose. At an exact tie under ``ties="level-set"`` the boundary is the token below
  the ``k`` tied maximisers and the pool holds ``k + 1`` tokens: ``rho*`` then exceeds
  ``(log 2) Delta^2/s`` by a factor up to ``k log(1 + 1/k) / log 2`` (approached as the boundary
  token's probability tends to 0), that is by up to 17.0 % with two tied maximisers and 28.8 %
  with four, so no upper bound of this form is returned on tied rows.
* Margin only: ``rho* >= phi_m(gamma) = [(1+m gamma) log(1+m gamma) + m(1-gamma) log(1-gamma)]/(m+1)``
  for a width-``m`` greedy tree (``m = 1``: strict greedy), attained when all mass sits on
  ``g`` and ``m`` competitors at ``p(1) - gamma``; leading term ``m gamma^2 / 2`` (a lower bound
  on ``phi_1`` only: for ``m >= 2`` the cubic term is negative, so ``phi_m < m gamma^2 / 2`` near 0).
* Floors: additive ``delta`` gives ``rho* >= delta^2 / 2`` on every target, multiplicative
  ``alpha`` gives ``rho* >= (1-alpha)^2 p(1) / (2 (1+alpha))``; width-``m`` trees give
  ``rho*_tree >= Delta_m^2 / 2`` with ``Delta_m = p(1) - p(m+1)``, and ``rho*_tree -> log(m+1)``.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from companion.certify.costs import accepted_count
from companion.certify.pooling import ROUND_DOWN, pooled_cost
from companion.certify.criteria import Criterion, check_ties, parse_criterion
from companion.certify.summary import summarize
from companion.certify.validation import check_divergence, check_tree_width


def _as_tensor(x: float | Tensor) -> Tensor:
    return x.to(torch.float64) if isinstance(x, Tensor) else torch.tensor(float(x), dtype=torch.float64)


def pair_cost(a: Tensor, b: Tensor, divergence: str = "forward") -> Tensor:
    """Cost of pooling exactly two tokens with probabilities ``a >= b`` into one level.

    forward: ``a log(2a/(a+b)) + b log(2b/(a+b)) = s [log 2 - h(a/s)]``;
    reverse: ``-log(1 - (sqrt a - sqrt b)^2)``.
    """
    check_divergence(divergence)
    a, b = _as_tensor(a), _as_tensor(b)
    if divergence == "forward":
        # The engine's pooled cost of the pair (deviations from the level without cancellation,
        # rounded down): equal bit for bit to a strict-greedy certificate pooling the same two.
        a, b = torch.broadcast_tensors(a, b)
        vals = torch.stack([a.reshape(-1), b.reshape(-1)], dim=1)
        pool = torch.ones_like(vals, dtype=torch.bool)
        return pooled_cost(vals, torch.log(vals), pool, None, "forward").reshape(a.shape)
    # sqrt a - sqrt b = (a - b) / (sqrt a + sqrt b): no cancellation near a tie; rounded down as the engine's.
    return -torch.log1p(-(((a - b) / (a.sqrt() + b.sqrt())) ** 2)) * (1 - ROUND_DOWN)


def _top_and_boundary(p: Tensor, criterion: Criterion, from_logits: bool,
                      ties: str = "worst") -> tuple[Tensor, Tensor, Tensor]:
    """``(p(1), p_{y*}, rejected_nonempty)`` per row, float64, shape ``p.shape[:-1]``; ``y*`` the most
    likely token of the rejection region of the tie convention ``ties`` (as the certificates)."""
    check_ties(ties)
    criterion.check_vocab(p.shape[-1])
    # The full sort keeps this exact for any boundary depth; bounds are not on a hot path.
    s = summarize(p, from_logits=from_logits, k=p.shape[-1], with_entropy=criterion.needs_entropy)
    tau = criterion.threshold_from_summary(s, ties)
    r = accepted_count(s.values, tau, criterion, ties)
    nonempty = (r < s.vocab) & ~(tau < 0) & ~((tau <= 0) & (not criterion.is_strict(ties)))
    p_star = s.values.gather(1, r.clamp(max=s.vocab - 1).unsqueeze(1)).squeeze(1)
    shape = s.lead_shape
    return s.values[:, 0].reshape(shape), p_star.reshape(shape), nonempty.reshape(shape)


def two_point_bound(p: Tensor, criterion: Criterion | str, divergence: str = "forward", *, from_logits: bool = False,
                    ties: str = "worst") -> Tensor:
    """Lower bound ``pair_cost(p(1), p_{y*})`` on ``rho*`` valid for every criterion (``+inf`` if nothing is rejected);
    ``y*`` and ``rho*`` of the tie convention ``ties`` (default ``"worst"``, as the certificates)."""
    c = parse_criterion(criterion)
    top, star, nonempty = _top_and_boundary(p, c, from_logits, ties)
    bound = pair_cost(top, star, divergence)
    return torch.where(nonempty, bound, torch.full_like(bound, torch.inf))


def margin_quadratic_bound(p: Tensor, criterion: Criterion | str, *, from_logits: bool = False,
                           ties: str = "worst") -> Tensor:
    """``Delta^2 / (2 s)`` with ``Delta = p(1) - p_{y*}``, ``s = p(1) + p_{y*}`` (forward; any criterion;
    ``y*`` of the tie convention ``ties``, default ``"worst"``)."""
    c = parse_criterion(criterion)
    top, star, nonempty = _top_and_boundary(p, c, from_logits, ties)
    # Rounded down (a lower bound stays one) by more than the certificate's own ROUND_DOWN, so that
    # at near ties, where the two agree to O(Delta^2/s^2), it never exceeds the computed certificate.
    bound = (top - star) ** 2 / (2 * (top + star)) * (1 - 4 * ROUND_DOWN)
    return torch.where(nonempty, bound, torch.full_like(bound, torch.inf))


def greedy_margin_bounds(p: Tensor, *, from_logits: bool = False, upper: str = "sharp",
                         ties: str = "worst") -> tuple[Tensor, Tensor]:
    """Strict greedy, forward: ``(Delta^2/(2s), c Delta^2/s)`` with ``Delta = p(1)-p(2)``, ``s = p(1)+p(2)``.

    ``upper="sharp"`` gives ``c = log 2``, the best constant (approached as ``p(2) -> 0``);
    ``upper="chi-square"`` gives ``c = 1``, the looser chi-square bound. Both upper bounds assume
    no exact tie at the top (``p(1) > p(2)``): on rows with a tie the upper bound is ``+inf``.
    There the lower bound uses the boundary token of ``ties``: ``p(2) = p(1)``, so 0, under the
    default ``"worst"`` (whose certificate is 0 there), or the largest probability below ``p(1)``
    under ``"level-set"``; the lower bound holds on every row.
    """
    if upper not in ("sharp", "chi-square"):
        raise ValueError(f"upper must be 'sharp' or 'chi-square', got {upper!r}")
    lower = margin_quadratic_bound(p, "greedy", from_logits=from_logits, ties=ties)
    s = summarize(p, from_logits=from_logits, k=2)
    tie = (s.values[:, 0] == s.values[:, 1]).reshape(s.lead_shape)
    factor = 2 * math.log(2) if upper == "sharp" else 2.0
    bound = factor * lower
    return lower, torch.where(tie, torch.full_like(bound, torch.inf), bound)


def margin_only_bound(gamma: float | Tensor, m: int = 1) -> Tensor:
    """``phi_m(gamma) = [(1+m gamma) log(1+m gamma) + m (1-gamma) log(1-gamma)] / (m+1)``.

    The tight lower bound on the width-``m`` tree certificate (``m = 1``: strict greedy) given
    only the top-2 margin ``gamma = p(1) - p(2)`` in ``[0, 1]``. Its leading term is
    ``m gamma^2 / 2``; ``phi_1(gamma) >= gamma^2 / 2`` holds everywhere, but for ``m >= 2`` the
    ``gamma^3`` coefficient ``-m(m-1)/6`` is negative and ``phi_m`` dips below ``m gamma^2 / 2``.
    """
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be an integer >= 1, got {m!r}")
    g = _as_tensor(gamma)
    if bool(((g < 0) | (g > 1) | torch.isnan(g)).any()):
        raise ValueError("gamma must lie in [0, 1]")
    return (torch.xlogy(1 + m * g, 1 + m * g) + m * torch.xlogy(1 - g, 1 - g)) / (m + 1)


def margin_only_leading_term(gamma: float | Tensor, m: int = 1) -> Tensor:
    """Leading term ``m gamma^2 / 2`` of :func:`margin_only_bound` as ``gamma -> 0`` (a bound only for ``m = 1``)."""
    return m * _as_tensor(gamma) ** 2 / 2


def additive_floor(delta: float | Tensor) -> Tensor:
    """``delta^2 / 2``: additive relaxation certifies at least this on every target with ``R(p)`` non-empty."""
    return _as_tensor(delta) ** 2 / 2


def multiplicative_floor(alpha: float | Tensor, p1: float | Tensor) -> Tensor:
    """``(1-alpha)^2 p(1) / (2 (1+alpha))``: multiplicative relaxation's floor given the top probability."""
    a = _as_tensor(alpha)
    return (1 - a) ** 2 * _as_tensor(p1) / (2 * (1 + a))


def tree_delta_bound(p: Tensor, m: int, *, from_logits: bool = False) -> Tensor:
    """``Delta_m^2 / 2`` with ``Delta_m = p(1) - p(m+1)``: a simple lower bound on the width-``m`` tree certificate."""
    check_tree_width(m, p.shape[-1])
    s = summarize(p, from_logits=from_logits, k=m + 1)
    gap = s.values[:, 0] - s.values[:, m]
    return (gap**2 / 2).reshape(s.lead_shape)


def tree_ceiling(m: int) -> float:
    """``log(m + 1)``: the forward tree certificate's limit as ``p(1) -> 1``."""
    if isinstance(m, bool) or not isinstance(m, int) or m < 1:
        raise ValueError(f"m must be an integer >= 1, got {m!r}")
    return math.log(m + 1)


def tree_quadratic_constant(m: int) -> float:
    """``c_m = min_{0 < gamma <= 1} phi_m(gamma) / gamma**2 = m**2 log m / (m**2 - 1)`` (``c_1 = 1/2``).

    Attained at ``gamma = (m - 1)/m`` for ``m >= 2``; the sharp global quadratic margin-only
    bound on the width-``m`` tree certificate is ``phi_m(gamma) >= c_m gamma**2``.
    """
    if m < 1:
        raise ValueError("m must be >= 1")
    return 0.5 if m == 1 else m * m * math.log(m) / (m * m - 1)
