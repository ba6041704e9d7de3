"""Exact KL certificates of acceptance (THEORY.md, "Exact certificate").

For a target ``p`` and a criterion with rejection region ``R(p)``, the certificate is

    rho*(p) = inf { D(p, q) : argmax q in R(p) },

with ``D(p, q) = KL(p || q)`` (``divergence="forward"``) or ``KL(q || p)`` (``"reverse"``).
A drafter whose ``q`` satisfies ``D(p, q) < rho*(p)`` has every maximiser of ``q`` accepted,
and no larger number has that property. ``rho* = +inf`` when nothing is rejected.

How it is computed (no loop over the vocabulary or the batch):

1. Per-token cost ``C(p, y) = min { D(p, q) : q_y >= q_z for all z }``. Its minimiser pools
   ``y`` with the top tokens above a level ``L`` into a set ``A`` on which ``q`` is flat, and
   leaves the rest proportional to ``p``:

   * forward: ``q = p`` off ``A``, ``q = L = mean_A(p)`` on ``A``;
     ``C = sum_{i in A} p_i log(p_i / L)``.
   * reverse: ``q = t p`` off ``A``, ``q = t G_A`` on ``A`` (``G_A`` the geometric mean);
     ``C = -log(1 - (P_A - |A| G_A))`` with ``P_A = sum_A p`` and ``t = 1 / (1 - (P_A - |A| G_A))``.

   Pooling the top ``j`` tokens with ``y`` gives level ``L_j`` (arithmetic or geometric mean);
   the scan "add the next top token while it exceeds the current level" stops at the first
   maximum of ``L_j``, which is also its global maximum (``L_j`` rises while it scans, then
   falls), so ``A`` is found by one ``argmax`` over ``j``.
2. ``C(p, y)`` is non-increasing in ``p_y``, so ``rho*(p) = C(p, y*)`` for the most likely
   rejected token ``y*``, which sits at sorted position ``r`` (0-based), ``r`` the number of
   accepted tokens. Only the top ``r + 1`` probabilities matter: these come from a ``topk``
   summary, and the rare rows with ``r >= K`` are redone from a full sort.
3. Greedy trees of width ``m`` fail iff ``m`` tokens tie or beat the target's greedy token
   ``g`` under ``q``; the cheapest such ``q`` uses ``p(2..m+1)`` and pools ``g`` with the lowest
   of them (the same scan, from below, minimising the level).

Sums of ``p log(p/L)`` cancel badly near ties (``rho* ~ Delta^2``), so the pooled costs are
evaluated as ``L * sum g(p_i / L)`` with ``g(x) = x log x - x + 1 >= 0`` and
``G * sum h(log p_i - log G)`` with ``h(d) = e^d - 1 - d >= 0``, each from its Taylor series
near zero: every term is non-negative and nothing cancels. All arithmetic is float64 on the
input's device; results are float64 with the input's leading shape.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch
from torch import Tensor

from companion.criteria import Criterion, parse_criteria, parse_criterion
from companion.summary import (
    DEFAULT_TOP,
    TopSummary,
    entropy_of_rows,
    map_rows,
    normalized_probabilities,
    sorted_rows,
    summarize,
)
from companion.validation import check_divergence, check_token, check_tree_width

_SERIES_CUTOFF = 1e-2


def xlogx_minus_x_plus_1(x: Tensor) -> Tensor:
    """``g(x) = x log x - x + 1`` (``g(0) = 1``), accurate to float64 precision near ``x = 1``."""
    u = x - 1
    # g(1+u) = sum_{n>=2} (-1)^n u^n / (n (n-1)); truncation error < |u|^9 / 72.
    series = u * u * (0.5 - u * (1 / 6 - u * (1 / 12 - u * (1 / 20 - u * (1 / 30 - u * (1 / 42 - u / 56))))))
    direct = torch.xlogy(x, x) - x + 1
    return torch.where(u.abs() < _SERIES_CUTOFF, series, direct)


def expm1_minus_x(d: Tensor) -> Tensor:
    """``h(d) = e^d - 1 - d``, accurate to float64 precision near ``d = 0``."""
    series = d * d * (0.5 + d * (1 / 6 + d * (1 / 24 + d * (1 / 120 + d * (1 / 720 + d * (1 / 5040 + d / 40320))))))
    direct = torch.expm1(d) - d
    return torch.where(d.abs() < _SERIES_CUTOFF, series, direct)


def _forward_pool_cost(vals: Tensor, mask: Tensor, level: Tensor) -> Tensor:
    """``sum_{i in A} p_i log(p_i / L)`` for ``A = mask`` with ``sum_A p = |A| L``."""
    terms = xlogx_minus_x_plus_1(vals / level.unsqueeze(-1))
    return level * torch.where(mask, terms, torch.zeros_like(terms)).sum(-1)


def _reverse_pool_cost(vals: Tensor, mask: Tensor, mean_log: Tensor) -> Tensor:
    """``-log(1 - (P_A - |A| G_A))`` for ``A = mask``, ``log G_A = mean_log``."""
    zero = torch.zeros_like(vals)
    finite_level = torch.isfinite(mean_log)
    safe_mean = torch.where(finite_level, mean_log, torch.zeros_like(mean_log))
    d = torch.log(vals) - safe_mean.unsqueeze(-1)
    terms = torch.where(mask, expm1_minus_x(torch.where(mask, d, zero)), zero)
    excess = torch.exp(safe_mean) * terms.sum(-1)
    # A pooled zero probability makes G_A = 0: then P_A - |A| G_A is simply P_A.
    excess = torch.where(finite_level, excess, torch.where(mask, vals, zero).sum(-1))
    return -torch.log1p(-excess.clamp(max=1.0))


def _pool_levels(anchor: Tensor, others: Tensor, divergence: str) -> Tensor:
    """Level of the pool {anchor} + first ``j`` of ``others``, for ``j = 0..n``: ``[N, n+1]``.

    Forward: the arithmetic mean of the pooled probabilities. Reverse: the mean of their logs
    (the log of the geometric mean ``G``), so that comparisons need no ``exp``.
    """
    zero_col = torch.zeros(others.shape[0], 1, dtype=others.dtype, device=others.device)
    j = torch.arange(others.shape[1] + 1, device=others.device)
    if divergence == "forward":
        return (anchor.unsqueeze(1) + torch.cat([zero_col, others.cumsum(1)], dim=1)) / (j + 1)
    # log 0 = -inf only enters levels that the callers mask or that are exact (zeros pooled).
    return (torch.log(anchor).unsqueeze(1) + torch.cat([zero_col, torch.log(others).cumsum(1)], dim=1)) / (j + 1)


def _pool_cost(vals: Tensor, pool: Tensor, level: Tensor, divergence: str) -> Tensor:
    """Cost of flattening ``q`` on the pooled entries ``vals[pool]`` at the given level."""
    if divergence == "forward":
        return _forward_pool_cost(vals, pool, level)
    return _reverse_pool_cost(vals, pool, level)


def level_set_cost(values: Tensor, p_y: Tensor, n_above: Tensor, divergence: str) -> tuple[Tensor, Tensor, Tensor]:
    """``C(p, y)`` from the top of a sorted distribution: the pooled-minimiser scan.

    ``values``: ``[N, K]`` float64, each row the ``K`` largest probabilities in decreasing order.
    ``p_y``: ``[N]`` the probability of the token ``y`` to be lifted to a maximum.
    ``n_above``: ``[N]`` how many tokens have probability strictly above ``p_y`` (the pooling
    candidates; may exceed ``K``). Pooling the top ``j`` gives the level
    ``L_j = (p_y + sum_{i<=j} p(i)) / (j+1)`` (forward) or its geometric analogue (reverse); the
    minimiser pools ``j* = argmax_j L_j`` (first maximum) tokens.

    Returns ``(cost, j_star, incomplete)``; ``incomplete`` marks rows whose scan had not stopped
    within the ``K`` values given (``j* = K < n_above``): their ``cost`` must be recomputed from
    more values.
    """
    n, k = values.shape
    j = torch.arange(k + 1, device=values.device)
    score = _pool_levels(p_y, values, divergence)
    allowed = j.unsqueeze(0) <= n_above.unsqueeze(1)
    score = torch.where(allowed, score, torch.full_like(score, -torch.inf))
    j_star = score.argmax(1)  # first maximum: where the scan stops
    level = score.gather(1, j_star.unsqueeze(1)).squeeze(1)
    incomplete = (j_star == k) & (n_above > k)
    pool_vals = torch.cat([values, p_y.unsqueeze(1)], dim=1)
    pool = torch.cat([j[:k].unsqueeze(0) < j_star.unsqueeze(1),
                      torch.ones(n, 1, dtype=torch.bool, device=values.device)], dim=1)
    cost = _pool_cost(pool_vals, pool, level, divergence)
    if divergence == "reverse":
        # y with p_y = 0 cannot be lifted to a maximum at finite KL(q || p).
        cost = torch.where(p_y > 0, cost, torch.full_like(cost, torch.inf))
    return cost, j_star, incomplete


def tree_cost(values: Tensor, m: int, divergence: str) -> tuple[Tensor, Tensor]:
    """Exact greedy-tree certificate from sorted values ``[N, K >= m+1]``.

    Pools ``g`` (position 0) with the ``j*`` lowest of the competitors ``p(2..m+1)``, at the
    level minimising the (arithmetic or geometric) mean. Returns ``(cost, j_star)``.
    """
    n = values.shape[0]
    g = values[:, 0]
    ascending = values[:, 1 : m + 1].flip(1)  # competitors, lowest first
    score = _pool_levels(g, ascending, divergence)
    j_star = score.argmin(1)  # first minimum: the scan from below stops here
    level = score.gather(1, j_star.unsqueeze(1)).squeeze(1)
    pooled_vals = torch.cat([g.unsqueeze(1), ascending], dim=1)
    j = torch.arange(m, device=values.device)
    pool = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=values.device),
                      j.unsqueeze(0) < j_star.unsqueeze(1)], dim=1)
    return _pool_cost(pooled_vals, pool, level, divergence), j_star


def _accepted_count(values: Tensor, tau: Tensor, criterion: Criterion) -> Tensor:
    accepted = criterion.accept_from(values, tau.unsqueeze(1))
    return accepted.sum(1)


def _deepest_rejected(flat: Tensor, sums: Tensor, tau: Tensor, criterion: Criterion, from_logits: bool) -> Tensor:
    """``max { p_z : z rejected }`` per row (normalised, float64), ``-1`` where nothing is rejected.

    One masked pass over the rows given; used only when every one of the top ``K`` is accepted.
    """
    if from_logits:
        # p_z < tau  <=>  logit_z < log(tau) + logsumexp.
        bound = (torch.log(tau.clamp(min=0)) + sums).unsqueeze(1)
        work = flat.to(torch.float64) if flat.dtype != torch.float64 else flat
        rejected = work <= bound if criterion.strict else work < bound
        best = torch.where(rejected, work, torch.full_like(work, -torch.inf)).amax(1)
        return torch.where(torch.isneginf(best), torch.full_like(best, -1.0), torch.exp(best - sums))
    bound = (tau * sums).unsqueeze(1)
    rejected = ~criterion.accept_from(flat, bound)
    best = torch.where(rejected, flat, torch.full_like(flat, -1.0)).amax(1).to(torch.float64)
    return torch.where(best < 0, best, best / sums)


def _entropy_where_needed(flat: Tensor, s: TopSummary, crits: list[Criterion], from_logits: bool) -> Tensor:
    """Entropies for typical thresholds, computing the full ``-sum p log p`` only where it matters.

    The certificate depends on ``tau = min(eps, delta e^{-H})`` only through which of the top
    ``K`` probabilities exceed it. From the top ``K`` alone (tail mass ``R`` over ``V - K``
    tokens, each at most ``p(K)``):

        H_top + R log(1 / p(K))  <=  H  <=  H_top + R log((V - K) / R).

    Where every ``H`` in that interval puts the same top-``K`` tokens above ``tau`` (and the
    boundary inside the top ``K``), the exact entropy is not needed and the upper bound stands
    in for it; only the other rows pay the pass over the vocabulary. The returned values are
    therefore not general-purpose entropies: local to :func:`certificates`.
    """
    v = s.values
    h_top = -torch.xlogy(v, v).sum(1)
    tail = (1 - v.sum(1)).clamp(min=0)
    upper, lower = h_top, h_top
    if s.k < s.vocab:
        upper = h_top + torch.xlogy(tail, (s.vocab - s.k) / tail.clamp(min=1e-300))
        lower = h_top - torch.xlogy(tail, v[:, -1])
    need = torch.zeros_like(upper, dtype=torch.bool)
    for c in crits:
        if c.needs_entropy:
            # Guard the bounds by a relative 1e-9 against rounding in H_top.
            tau_hi = c.threshold_from_summary(replace(s, entropy=lower * (1 - 1e-9)))
            tau_lo = c.threshold_from_summary(replace(s, entropy=upper * (1 + 1e-9) + 1e-12))
            r_hi = _accepted_count(v, tau_hi, c)
            r_lo = _accepted_count(v, tau_lo, c)
            need |= (r_hi != r_lo) | (r_lo >= s.k)
    if not bool(need.any()):
        return upper
    idx = torch.nonzero(need).squeeze(1)
    exact = map_rows(lambda x, norm: entropy_of_rows(x, norm, from_logits), flat, s.norm, idx=idx)
    return upper.index_copy(0, idx, exact)


def certificates(
    p: Tensor,
    criteria: Sequence[Criterion | str] | Criterion | str = (),
    divergences: Iterable[str] = ("forward", "reverse"),
    *,
    tree_widths: Iterable[int] = (),
    from_logits: bool = False,
    top: int = DEFAULT_TOP,
    summary: TopSummary | None = None,
) -> dict[tuple[str, str], Tensor]:
    """Certificates of several criteria (and tree widths) from one pass over ``p``.

    Returns ``{(str(criterion), divergence): rho*}`` and ``{("tree:m", divergence): rho*_tree}``,
    each float64 of shape ``p.shape[:-1]`` (``+inf`` where nothing is rejected). ``top`` is the
    size of the shared ``topk`` summary; rows whose rejection boundary lies deeper get one
    masked pass, and rows whose pooled set is deeper still are redone from a full sort.
    ``summary``: a :func:`~companion.summary.summarize` of this same ``p`` (same ``from_logits``)
    that the caller already has, with at least ``top`` values; it saves the ``topk`` pass.
    """
    crits = parse_criteria(criteria) if criteria else []
    divs = [check_divergence(d) for d in divergences]
    vocab = p.shape[-1] if isinstance(p, Tensor) and p.dim() >= 1 else 0
    widths = [check_tree_width(m, vocab) for m in tree_widths]
    for c in crits:
        c.check_vocab(vocab)
    k = max([top] + [c.top_needed() + 1 for c in crits] + [m + 1 for m in widths])
    if summary is None:
        s = summarize(p, from_logits=from_logits, k=k)  # validates p
    else:
        if summary.k < min(k, vocab) or summary.vocab != vocab or summary.lead_shape != p.shape[:-1]:
            raise ValueError(
                f"summary does not fit p: it holds {summary.values.shape[0]} rows x top {summary.k} of V={summary.vocab}, "
                f"these certificates need {p.shape[:-1].numel()} rows x top {min(k, vocab)} of V={vocab}"
            )
        s = summary
    flat = p.reshape(-1, vocab)
    if any(c.needs_entropy for c in crits) and s.entropy is None:
        s = replace(s, entropy=_entropy_where_needed(flat, s, crits, from_logits))
    out: dict[tuple[str, str], Tensor] = {}
    for c in crits:
        tau = c.threshold_from_summary(s)
        r = _accepted_count(s.values, tau, c)
        pos = r.clamp(max=s.k - 1)
        p_y = s.values.gather(1, pos.unsqueeze(1)).squeeze(1)
        # Every probability is >= 0, so tau <= 0 accepts everything (typical is strict: tau > 0).
        empty = (r >= s.vocab) | ((tau <= 0) & (not c.strict))
        deep = (r >= s.k) & ~empty
        n_above = r
        if bool(deep.any()):
            idx = torch.nonzero(deep).squeeze(1)
            best = map_rows(lambda x, norm, t: _deepest_rejected(x, norm, t, c, from_logits), flat, s.norm, tau, idx=idx)
            p_y = p_y.index_copy(0, idx, best.clamp(min=0))
            empty = empty.index_copy(0, idx, best < 0)
            # Unknown count beyond K: let the scan run over all K values.
            n_above = n_above.index_copy(0, idx, torch.full_like(idx, s.vocab))
        for div in divs:
            cost, _, incomplete = level_set_cost(s.values, p_y, n_above, div)
            incomplete &= ~empty
            if bool(incomplete.any()):
                cost = _redo_from_sort(flat, s.norm, from_logits, incomplete, tau, c, div, cost)
            cost = torch.where(empty, torch.full_like(cost, torch.inf), cost)
            out[(str(c), div)] = cost.reshape(s.lead_shape)
    for m in widths:
        for div in divs:
            cost, _ = tree_cost(s.values, m, div)
            out[(f"tree:{m}", div)] = cost.reshape(s.lead_shape)
    return out


def _redo_from_sort(
    flat: Tensor, norm: Tensor, from_logits: bool, rows: Tensor, tau: Tensor, c: Criterion, div: str, cost: Tensor
) -> Tensor:
    """Exact costs for rows whose pooled set reaches beyond the top-K summary.

    Widens the summary eightfold per round (``topk`` on those rows only) until every scan has
    stopped; the last round is a full sort, so this always terminates exactly.
    """
    idx = torch.nonzero(rows).squeeze(1)
    vocab = flat.shape[1]
    k = DEFAULT_TOP
    while idx.numel():
        k = min(vocab, 8 * k)
        sub_norm = norm.index_select(0, idx)
        sub = summarize(flat.index_select(0, idx), from_logits=from_logits, k=k, norm=sub_norm)
        sub_tau = tau.index_select(0, idx)
        r = _accepted_count(sub.values, sub_tau, c)
        p_y = sub.values.gather(1, r.clamp(max=k - 1).unsqueeze(1)).squeeze(1)
        n_above = r
        deep = r >= k
        if bool(deep.any()):
            # y* lies beyond the wider summary too: find it by one masked pass.
            didx = torch.nonzero(deep).squeeze(1)
            best = map_rows(lambda x, nrm, t: _deepest_rejected(x, nrm, t, c, from_logits),
                            flat, norm, tau, idx=idx.index_select(0, didx))
            p_y = p_y.index_copy(0, didx, best.clamp(min=0))
            n_above = n_above.index_copy(0, didx, torch.full_like(didx, vocab))
        redone, _, still = level_set_cost(sub.values, p_y, n_above, div)
        done = ~still
        cost = cost.index_copy(0, idx[done], redone[done])
        idx = idx[still]
    return cost


def certificate(
    p: Tensor,
    criterion: Criterion | str,
    divergence: str = "forward",
    *,
    from_logits: bool = False,
    top: int = DEFAULT_TOP,
) -> Tensor:
    """``rho*(p)`` for one criterion: float64, shape ``p.shape[:-1]``, ``+inf`` if ``R(p)`` is empty.

    ``p``: probabilities ``[..., V]`` (or logits with ``from_logits=True``), any float dtype,
    any device. ``divergence``: ``"forward"`` for ``KL(p || q)``, ``"reverse"`` for ``KL(q || p)``.
    """
    c = parse_criterion(criterion)
    check_divergence(divergence)
    return certificates(p, [c], [divergence], from_logits=from_logits, top=top)[(str(c), divergence)]


def tree_certificate(
    p: Tensor, m: int, divergence: str = "forward", *, from_logits: bool = False
) -> Tensor:
    """Exact certificate that the target's greedy token is in the drafter's top ``m``.

    ``rho*_tree = inf { D(p, q) : m tokens other than g have q_z >= q_g }``; ``m = 1`` is strict
    greedy. Tends to ``log(m + 1)`` (forward) as ``p(1) -> 1``. Raises for ``m >= V``.
    """
    check_divergence(divergence)
    return certificates(p, (), [divergence], tree_widths=[m], from_logits=from_logits)[(f"tree:{m}", divergence)]


def per_token_cost(p: Tensor, token: Tensor | int, divergence: str = "forward", *, from_logits: bool = False) -> Tensor:
    """``C(p, y) = min { D(p, q) : q_y >= q_z for all z }`` for a token ``y`` (id or ids ``[...]``).

    Computed from a full sort (every token can be asked for), so prefer :func:`certificate`
    on large batches.
    """
    check_divergence(divergence)
    full = sorted_rows(p, from_logits=from_logits)
    tok = check_token(token, full.lead_shape, full.vocab, p.device).reshape(-1)
    # p_y is read from the sorted row: position of the token in the sort.
    where = (full.indices == tok.unsqueeze(1)).to(torch.long).argmax(1)
    p_y = full.values.gather(1, where.unsqueeze(1)).squeeze(1)
    n_above = (full.values > p_y.unsqueeze(1)).sum(1)
    cost, _, _ = level_set_cost(full.values, p_y, n_above, divergence)
    return cost.reshape(full.lead_shape)


# ---------------------------------------------------------------------------------------------
# Witnesses: the minimisers themselves.


def _scatter_witness(
    p64: Tensor, full: TopSummary, pool_sorted: Tensor, level: Tensor, divergence: str
) -> Tensor:
    """Build ``q*`` from the pooled set (a mask over sorted positions) and its level."""
    flat = p64.reshape(-1, full.vocab)
    pool = torch.zeros_like(flat, dtype=torch.bool).scatter(1, full.indices, pool_sorted)
    if divergence == "forward":
        q = torch.where(pool, level.unsqueeze(1).expand_as(flat), flat)
    else:
        pooled_sum = torch.where(pool, flat, torch.zeros_like(flat)).sum(1)
        size = pool.sum(1)
        g = torch.exp(level)
        t = 1.0 / (1.0 - (pooled_sum - size * g))
        q = torch.where(pool, (t * g).unsqueeze(1).expand_as(flat), t.unsqueeze(1) * flat)
    return q.reshape(p64.shape)


def witness(p: Tensor, criterion: Criterion | str, divergence: str = "forward", *, from_logits: bool = False) -> Tensor:
    """The minimiser ``q*`` with ``D(p, q*) = rho*(p)``: float64 ``[..., V]``.

    ``q*`` ties the most likely rejected token ``y*`` with the top of ``q*``, so under
    worst-case tie-breaking its greedy token is rejected. Rows with an empty rejection region
    (``rho* = +inf``) get NaN.
    """
    c = parse_criterion(criterion)
    check_divergence(divergence)
    c.check_vocab(p.shape[-1])
    full = sorted_rows(p, from_logits=from_logits, with_entropy=c.needs_entropy)
    tau = c.threshold_from_summary(full)
    r = _accepted_count(full.values, tau, c)
    pos = r.clamp(max=full.vocab - 1)
    p_y = full.values.gather(1, pos.unsqueeze(1)).squeeze(1)
    _, j_star, _ = level_set_cost(full.values, p_y, r, divergence)
    j = torch.arange(full.vocab, device=p.device)
    pool = (j.unsqueeze(0) < j_star.unsqueeze(1)) | (j.unsqueeze(0) == pos.unsqueeze(1))
    vals = torch.where(pool, full.values, torch.zeros_like(full.values))
    size = pool.sum(1)
    if divergence == "forward":
        level = vals.sum(1) / size
    else:
        level = torch.where(pool, torch.log(full.values), torch.zeros_like(full.values)).sum(1) / size
    q = _scatter_witness(normalized_probabilities(p, from_logits=from_logits), full, pool, level, divergence)
    empty = (r >= full.vocab).reshape(full.lead_shape)
    return torch.where(empty.unsqueeze(-1), torch.full_like(q, torch.nan), q)


def tree_witness(p: Tensor, m: int, divergence: str = "forward", *, from_logits: bool = False) -> Tensor:
    """The minimiser of the tree certificate: ``m`` competitors tie or beat ``g`` under ``q*``."""
    check_divergence(divergence)
    check_tree_width(m, p.shape[-1])
    full = sorted_rows(p, from_logits=from_logits)
    _, j_star = tree_cost(full.values, m, divergence)
    j = torch.arange(full.vocab, device=p.device)
    # Sorted positions pooled: 0 (g) and the j* lowest of positions 1..m, i.e. m-j*+1..m.
    pool = (j.unsqueeze(0) == 0) | ((j.unsqueeze(0) <= m) & (j.unsqueeze(0) > (m - j_star).unsqueeze(1)))
    size = pool.sum(1)
    if divergence == "forward":
        level = torch.where(pool, full.values, torch.zeros_like(full.values)).sum(1) / size
    else:
        level = torch.where(pool, torch.log(full.values), torch.zeros_like(full.values)).sum(1) / size
    return _scatter_witness(normalized_probabilities(p, from_logits=from_logits), full, pool, level, divergence)


def kl_divergence(p: Tensor, q: Tensor, direction: str = "forward", *, from_logits: bool = False) -> Tensor:
    """``D(p, q)``: ``KL(p || q) = sum p log(p/q)`` (forward) or ``KL(q || p)`` (reverse), in nats.

    float64, shape ``[...]``; ``+inf`` where the support condition fails.
    """
    check_divergence(direction)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    a = normalized_probabilities(p, from_logits=from_logits, what="p")
    b = normalized_probabilities(q, from_logits=from_logits, what="q")
    if direction == "reverse":
        a, b = b, a
    terms = torch.xlogy(a, a) - torch.xlogy(a, b)
    # a > 0 where b == 0: xlogy gives +inf; a == 0: term 0.
    return terms.sum(-1).clamp(min=0.0)
