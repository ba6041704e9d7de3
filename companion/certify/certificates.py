"""Exact KL certificates of acceptance.

For a target ``p`` and a criterion with rejection region ``R(p)``, the certificate is

    rho*(p) = inf { D(p, q) : argmax q in R(p) },

with ``D(p, q) = KL(p || q)`` (``divergence="forward"``) or ``KL(q || p)`` (``"reverse"``).
A drafter whose ``q`` satisfies ``D(p, q) < rho*(p)`` has every maximiser of ``q`` accepted,
and no larger number has that property.

Ties: the worst case over tie-breaks, by default (``ties="worst"``). Real decoders break exact
ties by token id (transformers, vLLM and TensorRT-LLM take the target's token with ``argmax``,
first index wins; a width-``m`` tree succeeds iff that token is in the drafter's ``topk(m)``).
A certificate must hold for every such decoder, so a token counts as accepted only if every
fixed tie-break accepts it: ``p_y > tau_worst(p)`` (:mod:`companion.certify.criteria`; strict greedy:
``y`` the unique maximiser; top-m: ``p_y > p(m+1)``). Only rank conditions depend on a
tie-break: a token exactly at an additive, multiplicative or top-k-delta threshold is accepted,
as every decoder's ``p_y >= tau`` accepts it, so the certificates are exact there too. The
drafter's ties are broken against us (every maximiser of ``q`` must be accepted). At an exact
rank tie the certificate is the limit of the untied one from the unfavourable side; off such
ties nothing changes.
The threshold rule read as a level set, which accepts every maximiser of ``p`` (``ties="level-set"``), overstates
what decoders do and stays available for analysis only::

    p = [0.4, 0.4, 0.2], q = [0.39, 0.41, 0.2]: KL(p || q) = 0.0003
    ties="level-set": rho* = 0.0437, "certified", yet argmax p = 0 != 1 = argmax q: rejected;
    ties="worst":     rho* = 0 (the top of p is tied), not certified.

A greedy tree of width ``m`` (worst case) fails once ``m`` tokens other than the decoder's token
``g`` (any maximiser of ``p``) have ``q_z >= q_g``; under ``"level-set"``, once ``m``
non-maximisers beat every maximiser. Under either convention the width-1 tree and strict
greedy have the same certificate on every row, exact ties included.

MARS (``mars:T``, :class:`~companion.certify.criteria.Mars`) is decided per row by the target's logits:
strict greedy where ``z(1) <= 0`` or ``z(2) / z(1) <= T``, top-2 where ``z(1) > 0`` and
``z(2) / z(1) > T``. For a fixed row of logits its rejection region is one of those two lower
level sets, so ``rho*_mars(z) = rho*_greedy(p)`` or ``rho*_top2(p)`` on that row, in either
divergence and tie convention, with the same witness. It needs logits (``from_logits=True``):
``p`` alone does not determine the ratio, and probabilities are refused with ``ValueError``.

Acceptance and ties are decided on the float64 probabilities the engine normalises (the same
numbers :mod:`companion.harvest` compares): inputs closer than float64 resolves after
normalisation (logits within ~1e-16 of each other) count as tied.

``+inf`` means exactly one of: nothing is rejected (``R(p)`` empty; for level-set trees, fewer
than ``m`` tokens are not maximisers of ``p``), or, in the reverse direction, the most likely rejected
token has probability exactly 0 (no ``q`` with ``KL(q || p) < inf`` can put mass there, so
``+inf`` is then the exact value, not an overflow).

How it is computed (no loop over the vocabulary or the batch):

1. Per-token cost ``C(p, y) = min { D(p, q) : q_y >= q_z for all z }``. Its minimiser pools
   ``y`` with the top tokens above a level ``L`` into a set ``A`` on which ``q`` is flat, and
   leaves the rest proportional to ``p``:

   * forward: ``q = p`` off ``A``, ``q = L = mean_A(p)`` on ``A``;
     ``C = sum_{i in A} p_i log(p_i / L)``.
   * reverse: ``q = t p`` off ``A``, ``q = t G_A`` on ``A`` (``G_A`` the geometric mean),
     ``t = 1 / (T_A + |A| G_A)`` with ``T_A = sum_{i not in A} p_i`` the mass outside the pool;
     ``C = -log(T_A + |A| G_A) = -log(1 - (P_A - |A| G_A))``, ``P_A = sum_A p``.

   Pooling the top ``j`` tokens with ``y`` gives level ``L_j`` (arithmetic or geometric mean);
   the scan "add the next top token while it exceeds the current level" stops at the first
   maximum of ``L_j``, which is also its global maximum (``L_j`` rises while it scans, then
   falls), so ``A`` is found by one ``argmax`` over ``j``. Tied values are pooled together
   (if one of them exceeds the level, so do the others).
2. ``C(p, y)`` is non-increasing in ``p_y``, so ``rho*(p) = C(p, y*)`` for the most likely
   rejected token ``y*``, which sits at sorted position ``r`` (0-based), ``r`` the number of
   accepted tokens. Only the top ``r + 1`` probabilities matter: these come from a ``topk``
   summary, and the rare rows with ``r >= K`` are redone from a wider one.
3. Greedy trees of width ``m``: failure needs ``m`` competitors ``z`` with ``q_z >= q_g`` for
   the ``t`` maximisers ``g`` that must lose (worst case: ``t = 1``, the decoder's one token,
   other maximisers being competitors; level-set: all ``t`` maximisers ``p(1) = ... = p(t)``
   against non-maximisers). The cheapest such ``q`` uses the competitors ``p(t+1..t+m)`` and
   pools the ``t`` tokens with the lowest ``j`` of them (the same scan, from below, minimising
   the level; ``j >= 1``).

Precision. Sums of ``p log(p/L)`` cancel badly near ties (``rho* ~ Delta^2``), so the forward
pooled cost is evaluated as ``L * sum g(1 + u_i)`` with ``u_i = (p_i - L) / L``, the deviations
``p_i - L`` taken as differences of nearby floats (exact) rather than from ``p_i / L`` (which
would lose ``1e-16 / delta`` of the relative digits at a relative gap ``delta``), and
``g(1 + u) = (1 + u) log(1 + u) - u`` from its series; the result is rounded down by a relative
8e-15, so that it stays within 1e-12 of the exact cost of its float64 inputs and never above
it. The reverse excess ``e = P_A - |A| G_A`` is evaluated as ``G * sum h(log p_i - log G)`` with
``h(d) = e^d - 1 - d >= 0``, from its Taylor series near zero: every term is non-negative
and nothing cancels. On peaked rows (top-1 gaps of tens or hundreds of nats) ``e`` is close to 1
and ``-log(1 - e)`` would lose every digit; there (``e >= 1/2``) the cost is evaluated in log
space as ``-log(T_A + |A| G_A)``, with ``T_A`` summed from the probabilities left out of the
pool plus the summary's separately summed tail mass, and ``log G_A`` the mean of the pooled
log-probabilities (taken from the logits, when given, so that nothing underflows). Float64
inputs thus give certificates and witnesses to about 1e-12 relative for top-1 gaps up to 700
nats and beyond; the one floor is at exact-tie scale, where each normalised probability carries
its own 1e-16 rounding, which moves a certificate of order ``Delta^2`` by about
``1e-16 sqrt(rho*)``. float32 and bfloat16 inputs are exact in their float64 upcast, except
that the tail beyond the top ``K`` is summed in float32 (1e-7 of the tail). All arithmetic is
float64 on the input's device; results are float64 with the input's leading shape.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from companion.certify.criteria import Criterion, check_ties, parse_criteria, parse_criterion
from companion.certify.costs import accepted_count, level_set_pool, tree_pool
from companion.certify.pooling import cost_of_pool, reverse_tilt
from companion.certify.precision import lower_log_normaliser, normalisation_mismatch, xlog_bound
from companion.certify.summary import (
    DEFAULT_TOP,
    TopSummary,
    entropy_with_error,
    map_rows,
    normalized_probabilities,
    row_tiles,
    sorted_rows,
    summarize,
    summarize_partial,
)
from companion.certify.validation import (check_distribution_tensor, check_divergence, check_token, check_tree_width,
                                  warn_if_probabilities)


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the public functions.


def _check_p(p: Tensor, from_logits: bool) -> int:
    """Shape and dtype of ``p`` (a scalar or an empty tensor is refused); returns ``V``."""
    check_distribution_tensor(p, "logits" if from_logits else "p")
    return p.shape[-1]


def _divergence_list(divergences: Iterable[str] | str) -> list[str]:
    """One divergence name, or several: ``"forward"`` is taken as ``["forward"]``."""
    if isinstance(divergences, str):
        divergences = [divergences]
    try:
        items = list(divergences)
    except TypeError as err:
        raise ValueError(f"divergences must be 'forward', 'reverse' or a list of them, got {divergences!r}") from err
    return [check_divergence(d) for d in items]


def _width_list(tree_widths: Iterable[int] | int, vocab: int) -> list[int]:
    """One tree width, or several."""
    if isinstance(tree_widths, int) and not isinstance(tree_widths, bool):
        tree_widths = [tree_widths]
    try:
        items = list(tree_widths)
    except TypeError as err:
        raise ValueError(f"tree_widths must be an integer or a list of integers, got {tree_widths!r}") from err
    return [check_tree_width(m, vocab) for m in items]


def _bound_for(x_dtype: torch.dtype, bound: Tensor, strict: bool) -> Tensor:
    """``bound`` (float64) rounded to the rows' working precision so that the comparison stays exact.

    Rejected means ``x < bound`` (``x <= bound`` when ``strict``). For float32, bfloat16 or float16
    rows (every such value is a float32) returns a float32 ``c`` with ``x < c`` iff ``x < bound``
    (``x <= c`` iff ``x <= bound``): the nearest float32, moved one step where it rounded the
    wrong way. float64 rows keep ``bound``.
    """
    if x_dtype == torch.float64:
        return bound
    c = bound.to(torch.float32)
    c64 = c.to(torch.float64)
    if strict:
        return torch.where(c64 > bound, torch.nextafter(c, torch.full_like(c, -torch.inf)), c)
    return torch.where(c64 < bound, torch.nextafter(c, torch.full_like(c, torch.inf)), c)


def _deepest_rejected(flat: Tensor, sums: Tensor, tau: Tensor, strict: bool, from_logits: bool) -> Tensor:
    """``max { p_z : z rejected }`` per row and its log, ``[n, 2]`` float64 (normalised);
    ``(-1, -inf)`` where nothing is rejected.

    One masked pass over the rows given, in their own precision (the bound is rounded so that the
    comparison is exact); used only when every one of the top ``K`` is accepted.
    """
    if from_logits:
        # p_z < tau  <=>  logit_z < log(tau) + logsumexp.
        bound = _bound_for(flat.dtype, (torch.log(tau.clamp(min=0)) + sums).unsqueeze(1), strict)
        rejected = flat <= bound if strict else flat < bound
        best = torch.where(rejected, flat, -torch.inf).amax(1).to(torch.float64)
        log_best = best - sums
        value = torch.where(torch.isneginf(best), torch.full_like(best, -1.0), torch.exp(log_best))
        return torch.stack([value, log_best], dim=1)
    # p_z / S < tau  <=>  p_z < tau S (probabilities are >= 0, so -1 marks "none")
    bound = _bound_for(flat.dtype, (tau * sums).unsqueeze(1), strict)
    rejected = flat <= bound if strict else flat < bound
    best = torch.where(rejected, flat, -1.0).amax(1).to(torch.float64)
    return _deepest_value(best, sums)


def _deepest_value(best: Tensor, sums: Tensor) -> Tensor:
    """``[n, 2]``: ``best / sums`` and its log, ``(-1, -inf)`` where ``best < 0`` (nothing rejected)."""
    value = torch.where(best < 0, best, best / sums)
    return torch.stack([value, torch.where(best < 0, torch.full_like(best, -torch.inf), torch.log(value))], dim=1)


def _deepest_rejected_probs(flat: Tensor, idx: Tensor, sums: Tensor, tau: Tensor, strict: bool) -> Tensor:
    """:func:`_deepest_rejected` for float32/float64 probability rows ``flat[idx]`` (``sums``, ``tau``
    per selected row), tile by tile in one work buffer allocated once, in integer arithmetic.

    Non-negative floats order as their bit patterns read as signed integers (``b(x)``, int32 for
    float32, int64 for float64; ``-0.0`` is read as ``+0``), so with the exactly rounded bound ``B``
    (``x`` rejected iff ``x < B``) the difference ``v = b(x) - b(B)`` is negative exactly on the
    rejected tokens, and ``max { v : v < 0 }`` gives the deepest one, ``b(x*) = b(B) + v``. That
    maximum is one ``amax`` of ``v XOR sign bit`` (which orders ``v`` as unsigned: the negatives
    above the rest; the result is ``>= 0`` iff some token is rejected). Three integer sweeps
    (sign-clear, subtract, XOR) and a maximum, all exact, no overflow (``b(x), b(B)`` lie in
    ``[0, b(inf)]``): cheaper than a float ``torch.where`` (several times slower than plain
    arithmetic on the CPU) or the float arithmetic ``x s + (s - 1)``, ``s = sign(max(B - x, 0))``.
    Fresh tile-sized temporaries would each be new pages from the OS, so the buffer is reused.
    """
    vocab, n = flat.shape[1], idx.numel()
    ints = torch.int32 if flat.dtype == torch.float32 else torch.int64
    sign = torch.iinfo(ints).min
    tiles = list(row_tiles(n, vocab, flat.element_size(), flat.device))
    per = max((t.stop - t.start for t in tiles), default=0)
    work = torch.empty((per, vocab), dtype=ints, device=flat.device)
    bound = _bound_for(flat.dtype, (tau * sums).unsqueeze(1), strict).to(flat.dtype)
    if strict:  # x <= c  <=>  x < the next float above c
        bound = torch.nextafter(bound, torch.full_like(bound, torch.inf))
    bound = torch.where(bound > 0, bound, torch.zeros_like(bound))  # +0 (never -0.0) when nothing is below
    b_bits = bound.view(ints)
    bits = flat.view(ints)
    top = torch.empty(n, dtype=ints, device=flat.device)
    # idx comes from nonzero: when it holds every row they are in order, so slice instead of copying
    every = n == flat.shape[0]
    for tile in tiles:
        m = tile.stop - tile.start
        if every:
            v = torch.bitwise_and(bits[tile], -sign - 1, out=work[:m])
        else:
            v = torch.index_select(bits, 0, idx[tile], out=work[:m]).bitwise_and_(-sign - 1)
        # v: the bits with the sign cleared (-0.0 reads as +0), then v - b(B), then v XOR sign bit
        v.sub_(b_bits[tile]).bitwise_xor_(sign)
        top[tile] = v.amax(1)
    found = top >= 0
    best_bits = torch.where(found, (top ^ sign) + b_bits.squeeze(1), torch.zeros_like(top))
    best = torch.where(found, best_bits.view(flat.dtype).to(torch.float64), torch.full_like(sums, -1.0))
    return _deepest_value(best, sums)


def _entropy_bounds(s: TopSummary, crits: list[Criterion], ties: str) -> tuple[Tensor, Tensor]:
    """``(upper bound of H, rows whose exact H is needed)`` from the top ``K`` of each row alone.

    The certificate depends on ``tau = min(eps, delta e^{-H})`` only through which of the top
    ``K`` probabilities exceed it. From the top ``K`` alone (tail mass ``R`` over ``V - K``
    tokens, each at most ``p(K)``):

        H_top + R log(1 / p(K))  <=  H  <=  H_top + R log((V - K) / R).

    Where every ``H`` in that interval puts the same top-``K`` tokens above ``tau`` (and the
    boundary inside the top ``K``), the exact entropy is not needed and the upper bound stands
    in for it.
    """
    v = s.values
    h_top = -torch.xlogy(v, v).sum(1)
    tail = s.tail_mass()
    # The computed values are within e^eta of the exact ones (d/dlambda of -lambda v log(lambda v) is
    # -v log(lambda v) - v), the tail within its own bound; the float64 sums within 1e-9 relative.
    eta = s.log_err if s.guarded() else torch.zeros_like(h_top)
    spread = torch.expm1(eta) * (h_top + v.sum(1)) + 1e-9 * h_top + 1e-12
    t_err = s.tail_err if (s.guarded() and s.tail_err is not None) else torch.zeros_like(tail)
    upper, lower = h_top + spread, (h_top - spread).clamp(min=0)
    if s.k < s.vocab:
        upper = upper + xlog_bound(tail + t_err, s.vocab - s.k)
        lower = lower + (tail - t_err).clamp(min=0) * (-torch.log(v[:, -1]) - eta).clamp(min=0)
    need = torch.zeros_like(upper, dtype=torch.bool)
    for c in crits:
        if c.needs_entropy:
            # The certificate's threshold for this interval (guarded: the interval's midpoint with
            # its half-width as the error) against the most favourable one (the top of the interval):
            # where both accept the same top-K tokens, the exact entropy cannot change the certificate.
            tau_hi = c.threshold_from_summary(_with_entropy_interval(s, lower, upper), ties)
            tau_lo = c.threshold_from_summary(replace(s, entropy=upper, entropy_err=None, band=None), "level-set")
            r_hi = accepted_count(v, tau_hi, c, ties)
            r_lo = accepted_count(v, tau_lo, c, ties)
            need |= (r_hi != r_lo) | (r_lo >= s.k)
    return upper, lower, need


def _with_entropy_interval(s: TopSummary, lower: Tensor, upper: Tensor) -> TopSummary:
    """``s`` with the entropy ``(lower + upper) / 2`` and its error half the interval: the guard of
    :meth:`~companion.certify.criteria.Typical.guard` then holds for every entropy in it."""
    return replace(s, entropy=(lower + upper) / 2, entropy_err=(upper - lower) / 2,
                   log_err=s.log_err if s.log_err is not None else torch.zeros_like(lower),
                   working_dtype=s.working_dtype if s.guarded() else torch.float32)


def _entropy_where_needed(flat: Tensor, s: TopSummary, crits: list[Criterion], from_logits: bool,
                          ties: str = "worst", known: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Entropies for typical thresholds and their error bounds, computing the full ``-sum p log p``
    only where it matters (:func:`_entropy_bounds`); elsewhere the interval's midpoint stands in for
    it, with half the interval as its error. ``known``: exact
    entropies already computed for some rows (NaN elsewhere), used as they are. The returned
    values are therefore not general-purpose entropies: local to :func:`certificates`.
    """
    upper, lower, need = _entropy_bounds(s, crits, ties)
    out = (lower + upper) / 2
    err = (upper - lower) / 2
    if known is not None:
        have = ~torch.isnan(known)
        out = torch.where(have, known, out)
        if s.entropy_err is not None:
            err = torch.where(have, s.entropy_err, err)
        need = need & ~have
    if bool(need.any()):
        idx = torch.nonzero(need).squeeze(1)
        log_err = s.log_err if s.log_err is not None else torch.zeros_like(out)
        both = map_rows(lambda x, norm, le: torch.stack(entropy_with_error(x, norm, from_logits, le), dim=1),
                        flat, s.norm, log_err, idx=idx)
        out = out.index_copy(0, idx, both[:, 0])
        err = err.index_copy(0, idx, both[:, 1])
    return out, err


def _entropy_guess(vocab: int, k: int, crits: list[Criterion], ties: str) -> Callable[[Tensor], Tensor]:
    """For :func:`~companion.certify.summary.summarize_partial`: from a row's raw top values (before the
    pass that normalises it), the rows that will likely need their exact entropy, so that it is
    summed in that same pass. Probability rows sum to 1 within the validation tolerance, so the
    raw values stand in for the normalised ones; a wrong guess costs time only (a row that turns
    out to need it after all gets its own pass in :func:`_entropy_where_needed`)."""

    def guess(top: Tensor) -> Tensor:
        vals = top[:, :k]
        tail = (1 - vals.sum(1)).clamp(min=0)
        rough = TopSummary(values=vals, indices=torch.zeros_like(vals, dtype=torch.long), vocab=vocab,
                           lead_shape=torch.Size([vals.shape[0]]), norm=torch.ones_like(tail), tail=tail)
        return _entropy_bounds(rough, crits, ties)[2]

    return guess


def round_down(cost: Tensor, s: TopSummary, divergence: str) -> Tensor:
    """A pooled cost computed from the summary ``s``, lowered to at most the exact cost of its pool.

    Every value of ``s`` is the exact probability times ``lambda`` with ``|log lambda| <= eta``
    (:attr:`~companion.certify.summary.TopSummary.log_err`). Forward,
    ``C = sum_A p log(p / mean_A p)`` is homogeneous of degree 1 in ``p``: ``C >= C_hat e^-eta``.
    Reverse, ``C = -log X`` with ``X = T_A + |A| G_A``:
    :func:`~companion.certify.precision.lower_log_normaliser`, with the tail's bound ``tail_err``
    and the values' and tail's distance from summing to 1.
    Unchanged for float64 rows (:meth:`~companion.certify.summary.TopSummary.guarded`) and ``+inf``.
    """
    if not s.guarded():
        return cost
    eta = s.log_err
    if divergence == "forward":
        return cost * torch.exp(-eta)
    tail = s.tail_mass()
    t_err = s.tail_err if s.tail_err is not None else torch.full_like(tail, torch.inf)
    return lower_log_normaliser(cost, eta, t_err, normalisation_mismatch(s.values, tail))


def value_error(s: TopSummary) -> tuple[Tensor, Tensor]:
    """``(a, b)`` per row: each float64 value of ``s`` is within a relative ``2^-53 (a |log p_i| + b)``
    of the exact probability times a factor common to the row (which :func:`round_down` covers).
    From logits ``p_i = exp(l_i - lse)``: the subtraction rounds by ``|log p_i|`` units, ``exp`` by
    two (``a = 1, b = 3``); from probabilities ``p_i = x_i / S``: the division, one unit (none
    where ``S`` is a power of two); every dtype, float64 included."""
    ones = torch.ones_like(s.norm)
    if s.top_logits is not None:
        return ones, 3 * ones
    exact = torch.frexp(s.norm).mantissa == 0.5  # S = 2^k: the division is exact
    return torch.zeros_like(ones), torch.where(exact, 0.0, 1.0) * ones


def _nothing_rejected(r: Tensor, vocab: int, tau: Tensor, strict: bool) -> Tensor:
    """Rows whose rejection region is empty: all ``V`` tokens accepted, or a threshold no
    probability can fall below (``tau < 0``; ``tau = 0`` when the comparison is ``>=``)."""
    return (r >= vocab) | (tau < 0) | ((tau <= 0) & (not strict))


def _boundary(s: TopSummary, flat: Tensor, rows: Tensor | None, tau: Tensor, c: Criterion,
              from_logits: bool, ties: str = "worst") -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The most likely rejected token ``y*`` of each row of the summary ``s``.

    ``rows``: the rows of ``flat`` that ``s`` summarises (None: all). Returns
    ``(y_pos, y_val, y_log, n_above, empty, r)``: its sorted position (``K`` when it lies beyond
    the summary: then found by one masked pass over those rows), probability, log-probability,
    the number of tokens strictly above it (the vocabulary size when unknown), whether nothing
    is rejected, and the number of accepted tokens within the summary.
    """
    k = s.k
    r = accepted_count(s.values, tau, c, ties)
    pos = r.clamp(max=k - 1).unsqueeze(1)
    y_val = s.values.gather(1, pos).squeeze(1)
    y_log = s.log_values().gather(1, pos).squeeze(1)
    # Every probability is >= 0, so tau <= 0 accepts everything (typical is strict: tau > 0).
    empty = _nothing_rejected(r, s.vocab, tau, c.is_strict(ties))
    deep = (r >= k) & ~empty
    y_pos = r.clamp(max=k)
    n_above = r
    if bool(deep.any()):
        idx = torch.nonzero(deep).squeeze(1)
        flat_idx = idx if rows is None else rows.index_select(0, idx)
        if from_logits or flat.dtype not in (torch.float32, torch.float64):
            best = map_rows(lambda x, norm, t: _deepest_rejected(x, norm, t, c.is_strict(ties), from_logits), flat,
                            _over_rows(s.norm, rows, flat), _over_rows(tau, rows, flat), idx=flat_idx)
        else:
            best = _deepest_rejected_probs(flat, flat_idx, s.norm.index_select(0, idx), tau.index_select(0, idx),
                                           c.is_strict(ties))
        y_val = y_val.index_copy(0, idx, best[:, 0].clamp(min=0))
        y_log = y_log.index_copy(0, idx, best[:, 1])
        empty = empty.index_copy(0, idx, best[:, 0] < 0)
        # Unknown count beyond K: let the scan run over all K values.
        n_above = n_above.index_copy(0, idx, torch.full_like(idx, s.vocab))
    return y_pos, y_val, y_log, n_above, empty, r


def _over_rows(x: Tensor, rows: Tensor | None, flat: Tensor) -> Tensor:
    """A per-row vector of a summary of ``flat[rows]`` laid out over all rows of ``flat`` (for :func:`map_rows`)."""
    if rows is None:
        return x
    return torch.zeros(flat.shape[0], dtype=x.dtype, device=x.device).index_copy(0, rows, x)


def _level_set_costs(s: TopSummary, flat: Tensor, rows: Tensor | None, tau: Tensor, c: Criterion, divs: list[str],
                     from_logits: bool, ties: str = "worst") -> dict[str, Tensor]:
    """``rho*`` of criterion ``c`` on the rows that ``s`` summarises, per divergence; rows whose
    pool reaches beyond the summary are redone from a wider one (the last a full sort)."""
    y_pos, y_val, y_log, n_above, empty, _ = _boundary(s, flat, rows, tau, c, from_logits, ties)
    values, logs, tail = s.values, s.log_values(), s.tail_mass()
    out = {}
    for div in divs:
        pool_k, extra, _, incomplete = level_set_pool(values, logs, n_above, y_pos, y_val, y_log, div)
        cost = round_down(cost_of_pool(values, logs, tail, pool_k, y_val, y_log, extra, div, value_error(s)), s, div)
        if div == "reverse":
            # y* with p = 0 cannot carry the maximum of any q with KL(q || p) < inf: +inf is exact.
            cost = torch.where(torch.isneginf(y_log), torch.full_like(cost, torch.inf), cost)
        incomplete &= ~empty
        if bool(incomplete.any()):
            idx = torch.nonzero(incomplete).squeeze(1)
            sub_rows = idx if rows is None else rows.index_select(0, idx)
            wider = _wider_summary(flat, sub_rows, s, idx, from_logits)
            redone = _level_set_costs(wider, flat, sub_rows, tau.index_select(0, idx), c, [div], from_logits,
                                      ties)[div]
            cost = cost.index_copy(0, idx, redone)
        out[div] = torch.where(empty, torch.full_like(cost, torch.inf), cost)
    return out


def _wider_summary(flat: Tensor, rows: Tensor, s: TopSummary, idx: Tensor, from_logits: bool, need: int = 0) -> TopSummary:
    """A summary of ``flat[rows]`` (rows ``idx`` of the summary ``s``) with eight times ``s.k`` values
    (at least ``need``; at most ``V``), normalised by the same normaliser, with its error bound."""
    vocab = flat.shape[1]
    k_new = min(vocab, max(8 * s.k, need))
    log_err = s.log_err.index_select(0, idx) if s.log_err is not None else None
    return summarize(flat.index_select(0, rows), from_logits=from_logits, k=k_new, norm=s.norm.index_select(0, idx),
                     log_err=log_err, logits_dtype="exact")


def _tree_costs(s: TopSummary, flat: Tensor, rows: Tensor | None, m: int, divs: list[str],
                from_logits: bool, ties: str = "worst") -> dict[str, Tensor]:
    """Width-``m`` tree certificates on the rows that ``s`` summarises, per divergence; rows whose
    ``t`` maximisers and ``m`` competitors do not fit in the summary are redone from a wider one."""
    values, logs, tail = s.values, s.log_values(), s.tail_mass()
    zeros = torch.zeros_like(tail)
    out = {}
    # under ties="worst", the kernel-path band (bfloat16/float16 logits) lets the decoder's token be
    # any token within it of the top one (tree_pool)
    band = s.band if ties == "worst" else None
    for div in divs:
        pool_k, _, t, known = tree_pool(values, logs, m, div, ties, band)
        cost = cost_of_pool(values, logs, tail, pool_k, zeros, zeros, torch.zeros_like(known), div, value_error(s))
        if band is not None:
            # never above the exact-ties certificate: equal in exact arithmetic at an exact tie (the same
            # pool, summed in another order), it could exceed it by an ulp
            pool_e, _, _, known_e = tree_pool(values, logs, m, div, ties)
            exact = cost_of_pool(values, logs, tail, pool_e, zeros, zeros, torch.zeros_like(known_e), div,
                                 value_error(s))
            cost = torch.where(known_e, torch.minimum(cost, exact), cost)
        cost = round_down(cost, s, div)
        infeasible = t + m > s.vocab
        # a summary of the whole vocabulary knows every row (a band may hold all of its tokens: cost 0)
        redo = ~known & ~infeasible & (values.shape[1] < s.vocab)
        if bool(redo.any()):
            idx = torch.nonzero(redo).squeeze(1)
            sub_rows = idx if rows is None else rows.index_select(0, idx)
            need = int((t.index_select(0, idx) + m).max())
            wider = _wider_summary(flat, sub_rows, s, idx, from_logits, need)
            if band is not None:
                wider = replace(wider, band=band.index_select(0, idx))
            cost = cost.index_copy(0, idx, _tree_costs(wider, flat, sub_rows, m, [div], from_logits, ties)[div])
        out[div] = torch.where(infeasible, torch.full_like(cost, torch.inf), cost)
    return out


def _warn_if_probabilities_as_logits(p: Tensor, row_max: Tensor | None = None) -> None:
    """One ``UserWarning`` when the rows of ``p``, given with ``from_logits=True``, look like probabilities.

    The same check and warning as :func:`companion.certify.verdicts.certified` (``warn_if_probabilities``):
    softmax of probabilities is nearly uniform, so every certificate comes out wrong without an
    error (MARS reads the logits themselves: its relaxation ``z(2) / z(1) > theta`` then compares
    two probabilities). The warning points at the first caller outside this module (the public
    wrappers :func:`certificate` and :func:`tree_certificate` call :func:`certificates`), and is
    not repeated when that caller is ``certified()``, which has just run the check on this ``p``.
    """
    depth = 2  # this function's caller (certificates), then its callers
    while sys._getframe(depth).f_globals.get("__name__") == __name__:
        depth += 1
    caller = sys._getframe(depth)
    if caller.f_globals.get("__name__") == "companion.certify.verdicts" and caller.f_code.co_name == "certified":
        return
    # stacklevel counts from warn_if_probabilities (1); this function is 2, the frame `depth` above it depth + 2
    warn_if_probabilities(p, "target logits", stacklevel=depth + 2, row_max=row_max)


def certificates(
    p: Tensor,
    criteria: Sequence[Criterion | str] | Criterion | str = (),
    divergences: Iterable[str] | str = ("forward", "reverse"),
    *,
    tree_widths: Iterable[int] | int = (),
    from_logits: bool = False,
    top: int = DEFAULT_TOP,
    summary: TopSummary | None = None,
    ties: str = "worst",
    logits_dtype: str | None = None,
) -> dict[tuple[str, str], Tensor]:
    """Certificates of several criteria (and tree widths) from one pass over ``p``.

    Returns ``{(str(criterion), divergence): rho*}`` and ``{("tree:m", divergence): rho*_tree}``,
    each float64 of shape ``p.shape[:-1]`` (``+inf`` where nothing is rejected, or, reverse, where
    the most likely rejected token has probability 0: see the module docstring). ``divergences``
    and ``tree_widths`` take one value or several (``"forward"`` means ``["forward"]``).
    ``top`` is the size of the shared ``topk`` summary; rows whose rejection boundary lies
    deeper get one masked pass, and rows whose pooled set is deeper still are redone from a
    wider summary. ``summary``: a :func:`~companion.certify.summary.summarize` of this same ``p`` (same
    ``from_logits``) that the caller already has, with at least ``top`` values; it saves the
    ``topk`` pass. ``ties``: ``"worst"`` (default; sound for every decoder that breaks exact ties
    in a fixed way, e.g. by token id) or ``"level-set"`` (every token tied at the threshold counts
    as accepted; for analysis only): see the module docstring. ``logits_dtype``: the dtype the
    logits were computed in, whose kernel-path band counts as a tie under ``ties="worst"``
    (:func:`~companion.certify.summary.summarize_partial`; default: bfloat16 and float16 tensors
    their own, float32 and float64 none; ignored when ``summary`` is given, which carries its band).
    Every value is at most the exact ``rho*`` of the input as given (module docstring, Precision).
    With ``from_logits=True``, a ``p``
    whose every row lies in [0, 1] and sums to 1 (probabilities, most likely) draws one
    ``UserWarning`` per call, as in :func:`companion.certify.verdicts.certified`.
    """
    check_ties(ties)
    vocab = _check_p(p, from_logits)
    crits = parse_criteria(criteria) if criteria else []
    divs = _divergence_list(divergences)
    widths = _width_list(tree_widths, vocab)
    for c in crits:
        c.check_vocab(vocab)
        c.check_inputs(from_logits)
    k = max([top] + [c.top_needed(ties) + 1 for c in crits] + [m + 1 for m in widths])
    known = None
    if summary is None:
        # Typical acceptance: the entropy is summed in the pass that sums the tails (one pass over
        # the vocabulary, not two). From logits every row gets it (one product per token of the
        # exp(l - l(1)) that pass takes anyway); on probabilities it costs a log per token, so only
        # the rows whose threshold the top K may not settle get it there.
        guess = None
        wants_entropy = any(c.needs_entropy for c in crits)
        if not from_logits and wants_entropy:
            guess = _entropy_guess(vocab, min(k, vocab), crits, ties)
        s, known = summarize_partial(p, from_logits=from_logits, k=k, entropy_rows=guess, logits_dtype=logits_dtype,
                                     with_entropy=from_logits and wants_entropy)  # validates p
    else:
        if summary.k < min(k, vocab) or summary.vocab != vocab or summary.lead_shape != p.shape[:-1]:
            raise ValueError(
                f"summary does not fit p: it holds {summary.values.shape[0]} rows x top {summary.k} of V={summary.vocab}, "
                f"these certificates need {p.shape[:-1].numel()} rows x top {min(k, vocab)} of V={vocab}"
            )
        s = summary
    if from_logits:  # after the summary: its top logits answer the check without a pass of its own
        _warn_if_probabilities_as_logits(p, None if s.top_logits is None else s.top_logits[:, 0])
    flat = p.reshape(-1, vocab)
    if any(c.needs_entropy for c in crits) and s.entropy is None:
        entropy, entropy_err = _entropy_where_needed(flat, s, crits, from_logits, ties, known)
        s = replace(s, entropy=entropy, entropy_err=entropy_err)
    out: dict[tuple[str, str], Tensor] = {}
    for c in crits:
        tau = c.threshold_from_summary(s, ties)
        for div, cost in _level_set_costs(s, flat, None, tau, c, divs, from_logits, ties).items():
            out[(str(c), div)] = cost.reshape(s.lead_shape)
    for m in widths:
        for div, cost in _tree_costs(s, flat, None, m, divs, from_logits, ties).items():
            out[(f"tree:{m}", div)] = cost.reshape(s.lead_shape)
    return out


def certificate(
    p: Tensor,
    criterion: Criterion | str,
    divergence: str = "forward",
    *,
    from_logits: bool = False,
    top: int = DEFAULT_TOP,
    ties: str = "worst",
) -> Tensor:
    """``rho*(p)`` for one criterion: float64, shape ``p.shape[:-1]``.

    ``+inf`` where ``R(p)`` is empty, and in the reverse direction where the most likely
    rejected token has probability exactly 0 (then no finite ``KL(q || p)`` reaches it).
    ``p``: probabilities ``[..., V]`` (or logits with ``from_logits=True``), any float dtype,
    any device. ``divergence``: ``"forward"`` for ``KL(p || q)``, ``"reverse"`` for ``KL(q || p)``.
    ``ties``: ``"worst"`` (default) or ``"level-set"`` (module docstring).
    """
    check_ties(ties)
    _check_p(p, from_logits)
    c = parse_criterion(criterion)
    check_divergence(divergence)
    return certificates(p, [c], [divergence], from_logits=from_logits, top=top, ties=ties)[(str(c), divergence)]


def tree_certificate(
    p: Tensor, m: int, divergence: str = "forward", *, from_logits: bool = False, ties: str = "worst"
) -> Tensor:
    """Exact certificate that the drafter's top ``m`` contains the decoder's greedy token.

    ``ties="worst"`` (default): the decoder's token ``g`` may be any maximiser of ``p``, and the
    drafter's ties are broken against us:
    ``rho*_tree = min_g inf { D(p, q) : m tokens z != g have q_z >= q_g }``, which pools ``p(1)``
    with the cheapest of the competitors ``p(2..m+1)`` (other maximisers among them: 0 when more
    than ``m`` tokens tie at the top). ``"level-set"``: the tree succeeds if the top ``m`` holds
    *any* maximiser, ``inf { D(p, q) : m non-maximisers z have q_z >= q_g for every maximiser g }``,
    ``+inf`` where fewer than ``m`` tokens are not maximisers. Either way ``m = 1`` equals the
    strict-greedy certificate of the same convention on every row, exact ties included, and the
    two agree off ties (``p(1) > p(2)``). Tends to ``log(m + 1)`` (forward) as ``p(1) -> 1``.
    Under ``"worst"``, logits computed in bfloat16 or float16 also count their near ties (the
    kernel-path band, :func:`certificates`' ``logits_dtype``): the decoder's token may be any token
    within the band of the top one, and the top ``m`` must hold every one
    (:func:`companion.certify.costs.tree_pool`: 0 when more than ``m`` are).
    Raises for ``m >= V``.
    """
    check_ties(ties)
    vocab = _check_p(p, from_logits)
    check_divergence(divergence)
    check_tree_width(m, vocab)
    return certificates(p, (), [divergence], tree_widths=[m], from_logits=from_logits,
                        ties=ties)[(f"tree:{m}", divergence)]


def exact_top_tie(p: Tensor, *, from_logits: bool = False) -> Tensor:
    """Whether ``p(1) == p(2)`` exactly (after float64 normalisation), bool of shape ``p.shape[:-1]``.

    Such rows have several maximisers, all accepted by strict greedy; bfloat16 logits produce
    them often. ``False`` when ``V = 1``.
    """
    vocab = _check_p(p, from_logits)
    s = summarize(p, from_logits=from_logits, k=2)
    if vocab < 2:
        return torch.zeros(s.lead_shape, dtype=torch.bool, device=p.device)
    return (s.values[:, 0] == s.values[:, 1]).reshape(s.lead_shape)


def per_token_cost(p: Tensor, token: Tensor | int, divergence: str = "forward", *, from_logits: bool = False) -> Tensor:
    """``C(p, y) = min { D(p, q) : q_y >= q_z for all z }`` for a token ``y`` (id or ids ``[...]``).

    A property of ``q``'s order alone: no tie convention enters (``rho* = C(p, y*)`` for the most
    likely token ``y*`` of the rejection region of whichever convention). Computed from a full sort (every token can be asked for), so prefer :func:`certificate`
    on large batches. Reverse: ``+inf`` when ``p_y = 0``.
    """
    _check_p(p, from_logits)
    check_divergence(divergence)
    # Float64 over the whole (sorted) vocabulary, on purpose: any token may be asked for, and its
    # cost reads every token above it.
    full = sorted_rows(p, from_logits=from_logits)
    tok = check_token(token, full.lead_shape, full.vocab, p.device).reshape(-1)
    # p_y is read from the sorted row: position of the token in the sort.
    where = (full.indices == tok.unsqueeze(1)).to(torch.long).argmax(1)
    p_y = full.values.gather(1, where.unsqueeze(1)).squeeze(1)
    log_y = full.logs.gather(1, where.unsqueeze(1)).squeeze(1)
    n_above = (full.values > p_y.unsqueeze(1)).sum(1)
    pool_k, extra, _, _ = level_set_pool(full.values, full.logs, n_above, where, p_y, log_y, divergence)
    cost = cost_of_pool(full.values, full.logs, full.tail, pool_k, p_y, log_y, extra, divergence)
    if divergence == "reverse":
        cost = torch.where(torch.isneginf(log_y), torch.full_like(cost, torch.inf), cost)
    return cost.reshape(full.lead_shape)


# ---------------------------------------------------------------------------------------------
# Witnesses: the minimisers themselves.


def _witness_from_pool(full: TopSummary, pool: Tensor, cost: Tensor, divergence: str) -> Tensor:
    """``q*`` from the pooled set (a mask over sorted positions) and its cost, in token order.

    Forward: ``q = mean_A p`` on the pool, ``p`` elsewhere. Reverse: the kernel's tilt
    (:func:`companion.certify.pooling.reverse_tilt`), ``q = e^C G_A`` on the pool and ``e^C p`` elsewhere,
    renormalised to sum to one. Rows with an infinite cost get NaN.
    """
    values, logs = full.values, full.logs
    if divergence == "forward":
        zero = torch.zeros_like(values)
        level = torch.where(pool, values, zero).sum(1) / pool.sum(1).to(values.dtype)
        q_sorted = torch.where(pool, level.unsqueeze(1).expand_as(values), values)
        q_sorted = torch.where(torch.isfinite(cost).unsqueeze(1), q_sorted, torch.full_like(q_sorted, torch.nan))
    else:
        q_sorted = reverse_tilt(values, logs, pool, cost)
        # The cost is rounded down (companion.certify.pooling.ROUND_DOWN) to stay a sound certificate; on a
        # peaked row (C of hundreds of nats) that shifts e^C by ~1e-12 relative, so the full row is
        # renormalised: the witness is the minimiser of its float64 inputs, not of the rounded cost.
        q_sorted = q_sorted / q_sorted.sum(1, keepdim=True)
    q = torch.empty_like(q_sorted).scatter_(1, full.indices, q_sorted)
    return q.reshape(full.lead_shape + (full.vocab,))


def witness(p: Tensor, criterion: Criterion | str, divergence: str = "forward", *, from_logits: bool = False,
            ties: str = "worst") -> Tensor:
    """The minimiser ``q*`` with ``D(p, q*) = rho*(p)``: float64 ``[..., V]``, normalised.

    ``q*`` ties the most likely rejected token ``y*`` (of the rejection region of ``ties``) with
    the top of ``q*``, so under worst-case tie-breaking its greedy token is rejected (at an exact
    top tie of ``p`` under ``ties="worst"``, strict greedy's ``q* = p``). Rows whose certificate
    is ``+inf`` get NaN: an empty rejection region, or (reverse) a boundary token with ``p_{y*} = 0``.
    """
    check_ties(ties)
    vocab = _check_p(p, from_logits)
    c = parse_criterion(criterion)
    check_divergence(divergence)
    c.check_vocab(vocab)
    c.check_inputs(from_logits)
    # Float64 over the whole (sorted) vocabulary, on purpose: the witness is a full float64 distribution.
    full = sorted_rows(p, from_logits=from_logits, with_entropy=c.needs_entropy)
    tau = c.threshold_from_summary(full, ties)
    r = accepted_count(full.values, tau, c, ties)
    pos = r.clamp(max=full.vocab - 1)
    p_y = full.values.gather(1, pos.unsqueeze(1)).squeeze(1)
    log_y = full.logs.gather(1, pos.unsqueeze(1)).squeeze(1)
    pool_k, extra, _, _ = level_set_pool(full.values, full.logs, r, pos, p_y, log_y, divergence)
    cost = cost_of_pool(full.values, full.logs, full.tail, pool_k, p_y, log_y, extra, divergence)
    empty = _nothing_rejected(r, full.vocab, tau, c.is_strict(ties))
    if divergence == "reverse":
        empty |= torch.isneginf(log_y)
    cost = torch.where(empty, torch.full_like(cost, torch.inf), cost)
    return _witness_from_pool(full, pool_k, cost, divergence)


def tree_witness(p: Tensor, m: int, divergence: str = "forward", *, from_logits: bool = False,
                 ties: str = "worst") -> Tensor:
    """The minimiser of the tree certificate of the same ``ties``: under ``q*``, ``m`` tokens other
    than the first maximiser of ``p`` (``"worst"``), or ``m`` non-maximisers (``"level-set"``), tie
    or beat it (every maximiser), which attains the certificate. NaN rows where it is ``+inf``."""
    check_ties(ties)
    vocab = _check_p(p, from_logits)
    check_divergence(divergence)
    check_tree_width(m, vocab)
    full = sorted_rows(p, from_logits=from_logits)  # float64, whole vocabulary: the witness is a full row
    pool_k, _, t, known = tree_pool(full.values, full.logs, m, divergence, ties)
    zeros = torch.zeros_like(full.tail)
    cost = cost_of_pool(full.values, full.logs, full.tail, pool_k, zeros, zeros, torch.zeros_like(known), divergence)
    cost = torch.where(known, cost, torch.full_like(cost, torch.inf))
    return _witness_from_pool(full, pool_k, cost, divergence)


def kl_divergence(p: Tensor, q: Tensor, direction: str = "forward", *, from_logits: bool = False) -> Tensor:
    """``D(p, q)``: ``KL(p || q) = sum p log(p/q)`` (forward) or ``KL(q || p)`` (reverse), in nats.

    float64, shape ``[...]``; ``+inf`` where the support condition fails.
    """
    check_divergence(direction)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    # Float64 over the whole vocabulary, on purpose: a reference divergence for tests and checks
    # (not on the certificates' path), exact to float64 on every token.
    own, cross = kl_terms(p, q, direction, from_logits=from_logits)
    # a > 0 where b == 0: xlogy gives +inf; a == 0: term 0.
    return (own - cross).sum(-1).clamp(min=0.0)


def kl_terms(p: Tensor, q: Tensor, direction: str, *, from_logits: bool = False) -> tuple[Tensor, Tensor]:
    """``(a log a, a log b)`` per token, float64, with ``(a, b) = (p, q)`` (forward) or ``(q, p)`` (reverse):
    the two halves of each term of :func:`kl_divergence` (``xlogy``: 0 where ``a = 0``)."""
    a = normalized_probabilities(p, from_logits=from_logits, what="p")
    b = normalized_probabilities(q, from_logits=from_logits, what="q")
    if direction == "reverse":
        a, b = b, a
    return torch.xlogy(a, a), torch.xlogy(a, b)
