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
  The certificate is a one-dimensional problem over ``p_d`` (not convex), solved by a branch
  and bound whose lower bounds hold by construction: :mod:`companion.drafter.typical`.

Greedy, top-m and trees are the target side's reverse-divergence formulas with ``q`` in the
place of ``p``: ``topm:M`` is the reverse greedy-tree certificate of width ``M`` (``M = 1``:
greedy), and ``tree:M`` is the reverse cost of lifting ``q``'s ``(M+1)``-th token to the top
(the reverse ``topm:M`` certificate of ``q`` when ``q(M) > q(M+1)``; with a tie there the
worst tree leaves out a token as likely as one it keeps, and the cost is that token's).

The runner-up is the best competitor in every case: swapping the target masses of two
competitors ``z, z'`` with ``q_z' >= q_z`` changes ``KL(p||q)`` by
``-(p_z - p_z')(log q_z' - log q_z) <= 0`` whenever ``p_z >= p_z'``. The derivations, in
sympy, are in :mod:`companion.symbolic.drafter_side`.

One kernel: every pooled tilt above (greedy, top-m, trees, multiplicative) is the target side's
reverse pooled cost with ``q`` in the place of ``p`` (:func:`companion.certify.pooling.pooled_cost`, with
weights for the multiplicative relaxation), so both sides share its precision: near ties keep
their digits (``rho~ ~ E``, the excess a sum of non-negative terms), and peaked ``q`` is
evaluated as ``-log(R + G_w)`` with ``R``, the mass outside the pool, read from one masked pass
over the row rather than as ``1 - sum``. Everything is float64; results have shape ``q.shape[:-1]``.

API: :func:`drafter_certificate` (one criterion, or ``"tree:M"``), :func:`drafter_certificates`
(several from one pass over ``q``, keyed by spec and ``"tree:M"``), :func:`drafter_witness` and
:func:`drafter_tree_witness` (the minimising target ``p*``). ``q`` may be probabilities or logits
(``from_logits=True``) of shape ``[..., V]``, any float dtype, any device.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from companion.certify.criteria import (
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criterion,
)
from companion.drafter.rows import Rows as _Rows
from companion.drafter.rows import lower_by_log_error, round_down
from companion.drafter.rows import rows as _rows
from companion.drafter.typical import typical_cost, typical_witness
from companion.certify.pooling import pooled_cost, reverse_tilt
from companion.certify.summary import normalized_probabilities
from companion.certify.validation import check_distribution_tensor, check_tree_width

__all__ = [
    "drafter_certificate",
    "drafter_certificates",
    "drafter_path_certificate",
    "drafter_tree_certificate",
    "drafter_tree_witness",
    "drafter_witness",
]


# ---------------------------------------------------------------------------------------------
# Pools: greedy, top-m, trees and multiplicative relaxation, all through the engine's kernel.


@dataclass(frozen=True)
class _Pool:
    """A tilt that flattens ``p`` on pooled sorted positions: ``p_i = w_i G_w / Z`` there,
    ``q_i / Z`` elsewhere (``G_w = prod (q_i / w_i)^w_i``, ``Z = R + G_w``), at ``cost = -log Z``."""

    mask: Tensor  # [N, K] bool, sorted positions
    weights: Tensor | None  # [N, K], summing to 1 over the pool; None: equal weights
    cost: Tensor  # [N]


def _pool(r: _Rows, mask: Tensor, weights: Tensor | None = None) -> _Pool:
    """``-log Z`` of the tilt flattening ``q`` on ``mask`` (see :class:`_Pool`): the reverse pooled
    cost of :func:`companion.certify.pooling.pooled_cost` with the drafter in the place of the target."""
    k = mask.shape[1]
    vals, logs = r.values[:, :k], r.logs[:, :k]
    outside = r.beyond + r.values[:, k:].sum(1) + torch.where(mask, torch.zeros_like(vals), vals).sum(1)
    cost = pooled_cost(vals, logs, mask, outside, "reverse", weights)
    return _Pool(mask, weights, cost.clamp(min=0.0))


def _greedy(r: _Rows) -> _Pool:
    """``rho~ = -log(1 - (sqrt q(1) - sqrt q(2))^2)``: ``d`` pooled with the runner-up."""
    return _pool(r, torch.ones(r.values.shape[0], 2, dtype=torch.bool, device=r.values.device))


def _topm(r: _Rows, m: int) -> _Pool:
    """``d`` pooled with the ``j`` weakest of ``q(2..m+1)``, ``j`` minimising the geometric mean."""
    logs = r.logs[:, : m + 1]
    ascending = logs[:, 1:].flip(1)
    n = logs.shape[0]
    zero_col = torch.zeros(n, 1, dtype=logs.dtype, device=logs.device)
    j = torch.arange(m + 1, device=logs.device)
    levels = (logs[:, :1] + torch.cat([zero_col, ascending.cumsum(1)], 1)) / (j + 1)
    j_star = levels.argmin(1)  # first minimum
    pos = torch.arange(m + 1, device=logs.device).unsqueeze(0)
    mask = (pos == 0) | (pos > (m - j_star).unsqueeze(1))
    return _pool(r, mask)


def _tree(r: _Rows, m: int) -> _Pool:
    """``q(m+1)`` pooled with the ``j`` strongest of ``q(1..m)``, ``j`` maximising the geometric mean."""
    logs = r.logs[:, : m + 1]
    n = logs.shape[0]
    zero_col = torch.zeros(n, 1, dtype=logs.dtype, device=logs.device)
    j = torch.arange(m + 1, device=logs.device)
    levels = (logs[:, m:] + torch.cat([zero_col, logs[:, :m].cumsum(1)], 1)) / (j + 1)
    j_star = levels.argmax(1)  # first maximum
    pos = torch.arange(m + 1, device=logs.device).unsqueeze(0)
    mask = (pos < j_star.unsqueeze(1)) | (pos == m)
    out = _pool(r, mask)
    # A token the drafter gives probability 0 cannot become the target's argmax at finite KL(p||q).
    dead = r.values[:, m] <= 0
    return _Pool(out.mask, out.weights, torch.where(dead, torch.inf, out.cost))


def _multiplicative(r: _Rows, alpha: float | Tensor) -> _Pool:
    """Tilt ``(d, z)`` by ``(e^-lambda, e^(alpha lambda))``: weights ``(alpha, 1) / (1 + alpha)``
    (``alpha``: one value, or one per row)."""
    n = r.values.shape[0]
    mask = torch.ones(n, 2, dtype=torch.bool, device=r.values.device)
    a = torch.as_tensor(alpha, dtype=torch.float64, device=r.values.device).reshape(-1).expand(n)
    w = torch.stack([a / (1 + a), 1 / (1 + a)], dim=1)
    out = _pool(r, mask, w)
    # Already rejected under q itself (only at alpha = 1 with a tie): nothing to pay, p* = q.
    done = r.values[:, 0] <= alpha * r.values[:, 1]
    return _Pool(out.mask & ~done.unsqueeze(1), out.weights, torch.where(done, torch.zeros_like(out.cost), out.cost))


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
        lam = 0.5 * (r.logs[:, 0] - r.logs[:, 1])
        return _Additive(torch.where(torch.isfinite(g.cost), lam, torch.nan), torch.exp(-g.cost), g.cost)
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
        return typical_cost(r, crit)
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
        # typical's cost is a branch and bound over KL, not a tilted normaliser: lowered by its own bound
        lower = lower_by_log_error if isinstance(c, Typical) else round_down
        out[str(c)] = lower(_cost(r, c), r).reshape(r.lead_shape)
    for m in widths:
        out[f"tree:{m}"] = round_down(_tree(r, m).cost, r).reshape(r.lead_shape)
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
    kl: Tensor | None = None,
) -> dict[str, DrafterSoundness]:
    """Check ``KL(p||q) < rho~_c(q)  =>  c accepts argmax q under p`` on every row; count both sides.

    ``p`` (target) and ``q`` (drafter): probabilities ``[N, V]`` (float64 recommended). A row
    counts as accepted when every decoder accepts the draft, whichever way it breaks ties: the
    criterion accepts *every* maximiser of ``q`` under the worst case over the target's ties
    (``rejection_mask(p, ties="worst")``: at an exact tie with the draft across a rank
    boundary it counts as rejected; exactly at an additive, multiplicative or top-k-delta
    threshold it is accepted, as the decoders' ``p_y >= tau`` accepts it). The drafter-side
    certificates are infima over the closures of the rejection conditions (``p_z >= p_d``,
    ``p_d <= A p_z``, ...), which contain every target rejected under either reading, so the
    check is sound for both. For ``tree:M`` only rows where ``q(M) > q(M+1)`` count (the drafter's tree is then
    unique), and the tree succeeds iff *every* maximiser of ``p`` lies in it (the decoder's
    token may be any of them).

    ``kl``: ``KL(p||q)`` per row when the caller has already computed it
    (:func:`companion.certify.certificates.kl_divergence` of the same ``p`` and ``q``); computed here otherwise.
    """
    if p.shape != q.shape or p.dim() != 2:
        raise ValueError(f"p and q must be [N, V] of the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    if kl is not None and tuple(kl.shape) != (p.shape[0],):
        raise ValueError(f"kl must hold one divergence per row, shape ({p.shape[0]},), got {tuple(kl.shape)}")
    widths = list(tree_widths)
    crits = [parse_criterion(c) for c in criteria]
    rho = drafter_certificates(q, [c for c in crits if not isinstance(c, Typical)], tree_widths=widths)
    from companion.certify.certificates import kl_divergence  # lazy: the engine imports nothing from here

    kl = kl_divergence(p, q) if kl is None else kl
    top_q = q == q.amax(-1, keepdim=True)
    out: dict[str, DrafterSoundness] = {}
    for crit in crits:
        rejected = (crit.rejection_mask(p, ties="worst") & top_q).any(-1)
        if isinstance(crit, Typical):
            certified = _typical_certified(kl, q, crit)
        else:
            certified = kl < rho[str(crit)]
        out[str(crit)] = DrafterSoundness(str(crit), p.shape[0], int((~rejected).sum()), int(certified.sum()),
                                          int((certified & rejected).sum()))
    # the top max(M) + 1 of q are all the trees read (a full sort of a 50k vocabulary costs ~10x more)
    srt = q.topk(min(max(widths) + 1, q.shape[-1]), -1) if widths else None
    top_p = p == p.amax(-1, keepdim=True)
    for m in widths:
        unique = srt.values[:, m - 1] > srt.values[:, m]
        in_tree = torch.zeros_like(top_p).scatter(-1, srt.indices[:, :m], True)
        succeeds = ~(top_p & ~in_tree).any(-1)
        certified = (kl < rho[f"tree:{m}"]) & unique
        out[f"tree:{m}"] = DrafterSoundness(f"tree:{m}", int(unique.sum()), int((succeeds & unique).sum()),
                                            int(certified.sum()), int((certified & ~succeeds).sum()))
    return out


def typical_bounds(q: Tensor, crit: Typical) -> tuple[Tensor, Tensor]:
    """Bounds ``lo <= rho~_typical(q) <= hi`` from ``q(1)`` alone (float64, one per row of ``q [N, V]``).

    Typical acceptance rejects ``d`` only where ``p_d <= min(eps, delta e^{-H(p)}) <= eps``, so
    ``rho~ >= inf {KL(p||q) : p_d <= eps}``, the Bernoulli divergence
    ``eps log(eps / q(1)) + (1 - eps) log((1 - eps) / (1 - q(1)))`` when ``q(1) > eps`` (else 0);
    and every target with ``p_d = 0`` is rejected, the cheapest being ``q`` renormalised off ``d``,
    so ``rho~ <= -log(1 - q(1))``.
    """
    q64 = q.to(torch.float64)
    q1, top = q64.max(-1, keepdim=True)
    rest = q64.scatter(-1, top, 0.0).sum(-1)     # 1 - q(1) without the cancellation near q(1) = 1
    q1 = q1[..., 0]
    eps = crit.eps
    # q(1) > eps needs eps < 1; where q(1) <= eps the bound is 0 and the formula is not evaluated
    log_rest_eps = math.log1p(-eps) if eps < 1.0 else 0.0
    bern = eps * torch.log(eps / q1) + (1.0 - eps) * (log_rest_eps - torch.log(rest))
    lo = torch.where(q1 > eps, bern, torch.zeros_like(q1)).clamp_min(0.0)
    hi = -torch.log(rest)
    return lo, hi


def _typical_certified(kl: Tensor, q: Tensor, crit: Typical) -> Tensor:
    """``kl < rho~_typical(q)`` per row, the exact certificate computed only where :func:`typical_bounds`
    (with a 1e-6 relative margin, far above the routine's accuracy) leave the answer open: the search
    costs tens of milliseconds a row at a 50k vocabulary, and most rows are decided by the bounds."""
    lo, hi = typical_bounds(q, crit)
    below = kl < lo * (1.0 - 1e-6)
    above = kl > hi * (1.0 + 1e-6)
    certified = below.clone()
    open_rows = ~(below | above)
    if open_rows.any():
        certified[open_rows] = kl[open_rows] < drafter_certificate(q[open_rows], crit)
    return certified


def drafter_certificate(q: Tensor, criterion: Criterion | str, *, from_logits: bool = False) -> Tensor:
    """``rho~_c(q) = inf { KL(p||q) : c rejects argmax q under p }``: float64, shape ``q.shape[:-1]``.

    ``criterion``: a :class:`~companion.certify.criteria.Criterion`, a spec string, or ``"tree:M"``.
    ``KL(p||q) < rho~`` guarantees that the target ``p`` accepts every maximiser of ``q``.
    """
    m = _tree_spec(criterion)
    if m is not None:
        return drafter_tree_certificate(q, m, from_logits=from_logits)
    c = parse_criterion(criterion)
    return drafter_certificates(q, [c], from_logits=from_logits)[str(c)]


def drafter_path_certificate(q: Tensor, target_band: float | Tensor, *, from_logits: bool = False,
                             drafter_dtype: str | None = None) -> Tensor:
    """Strict greedy's drafter-side certificate under kernel paths: float64, shape ``q.shape[:-1]``.

    A target whose two largest logits lie within its kernel-path band ``B`` (nats) may take either
    token, whichever path verifies (:mod:`companion.harvest.ties`), so the draft ``d`` is accepted on
    every path only if ``p_d > e^B p_z`` for every ``z != d``. The certificate is
    ``inf { KL(p||q) : p_d <= e^B p_z for some z }``, the I-projection onto a half-space: ``q``
    tilted on ``(d, z)`` by ``(e^-lambda, e^(A lambda))`` with ``A = e^B``,
    ``lambda = log(q_d / (A q_z)) / (1 + A)``, minimised at the runner-up ``z`` (the
    multiplicative relaxation's formula with ``alpha = A``; ``B = 0`` is strict greedy's) and 0 where
    ``q(1) <= A q(2)``. The band belongs to the target's logit scale, which ``q`` does not reveal:
    ``target_band`` is an assumed bound (e.g. :func:`companion.certify.precision.tie_band` at the
    largest top logit the target returns), a float or one value per row. With ``drafter_dtype``
    (``from_logits`` only) rows whose own top-2 logits are a near tie of that dtype get 0 too: the
    drafted token itself may differ between the drafter's kernel paths.
    """
    check_distribution_tensor(q, "q")
    if drafter_dtype is not None and not from_logits:
        raise ValueError("drafter_dtype needs the drafter's logits (from_logits=True): its band is in logit units")
    band = torch.as_tensor(target_band, dtype=torch.float64, device=q.device).reshape(-1)
    if bool((band < 0).any()) or not bool(torch.isfinite(band).all()):
        raise ValueError(f"target_band must be finite and >= 0, got {target_band!r}")
    r = _rows(q, from_logits, 2)
    if band.numel() not in (1, r.values.shape[0]):
        raise ValueError(f"target_band has {band.numel()} values for {r.values.shape[0]} rows")
    cost = round_down(_multiplicative(r, torch.exp(band)).cost, r)
    if drafter_dtype is not None:
        from companion.certify.precision import tie_band_tensor

        # the drafter's own two largest logits, as it computed them (the summary's top-2 positions)
        top = r.flat.gather(1, r.indices[:, :2]).to(torch.float64)
        near = (top[:, 0] - top[:, 1]) <= tie_band_tensor(top[:, 0], drafter_dtype)
        cost = torch.where(near, torch.zeros_like(cost), cost)
    return cost.reshape(r.lead_shape)


def drafter_tree_certificate(q: Tensor, m: int, *, from_logits: bool = False) -> Tensor:
    """``inf { KL(p||q) : argmax p lies outside the drafter's top m }``; ``m = 1`` is strict greedy."""
    check_distribution_tensor(q, "q")
    vocab = q.shape[-1]
    check_tree_width(m, vocab)
    return drafter_certificates(q, (), tree_widths=[m], from_logits=from_logits)[f"tree:{m}"]


def _scatter(r: _Rows, q64: Tensor, sorted_vals: Tensor, mask: Tensor, z: Tensor) -> Tensor:
    """``p`` in token order: ``sorted_vals`` (already normalised) on the sorted positions of ``mask``, ``q / Z`` elsewhere."""
    flat = q64.reshape(-1, r.vocab)
    k = mask.shape[1]
    idx = r.indices[:, :k]
    pooled = torch.zeros_like(flat, dtype=torch.bool).scatter(1, idx, mask)
    vals = torch.zeros_like(flat).scatter(1, idx, torch.where(mask, sorted_vals, torch.zeros_like(sorted_vals)))
    return torch.where(pooled, vals, flat / z.unsqueeze(1))


def _pool_witness(r: _Rows, q64: Tensor, pool: _Pool) -> Tensor:
    """The kernel's minimiser (:func:`companion.certify.pooling.reverse_tilt`) on the top, ``q e^C`` elsewhere."""
    k = pool.mask.shape[1]
    w = None if pool.weights is None else pool.weights[:, :k]
    tilted = reverse_tilt(r.values[:, :k], r.logs[:, :k], pool.mask, pool.cost, w)
    return _scatter(r, q64, tilted, pool.mask, torch.exp(-pool.cost))


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
        pool = _greedy(r)
        out, cost = _pool_witness(r, q64, pool), pool.cost
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
        out = _scatter(r, q64, tilted / add.z.unsqueeze(1), mask, add.z)
        cost = add.cost
        if isinstance(c, TopKDelta) and c.k < r.vocab:
            pool = _topm(r, c.k)
            use = pool.cost < cost
            out = torch.where(use.unsqueeze(1), _pool_witness(r, q64, pool), out)
            cost = torch.minimum(cost, pool.cost)
    elif isinstance(c, Typical):
        out = typical_witness(r, q64, c)
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
