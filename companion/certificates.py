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

import torch
from torch import Tensor

from companion.criteria import Criterion, parse_criteria, parse_criterion
from companion.summary import DEFAULT_TOP, TopSummary, normalized_probabilities, sorted_rows, summarize
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


def level_set_cost(values: Tensor, r: Tensor, vocab: int, divergence: str) -> tuple[Tensor, Tensor, Tensor]:
    """Certificate from sorted values: ``C(p, y*)`` with ``y*`` at sorted position ``r``.

    ``values``: ``[N, K]`` float64, each row sorted decreasingly (the top ``K`` of a
    distribution over ``vocab`` tokens). ``r``: ``[N]`` number of tokens strictly above the
    pooling candidate set boundary, i.e. the 0-based position of ``y*``.
    Returns ``(cost, j_star, incomplete)``: ``cost`` is ``+inf`` where ``r >= vocab`` (nothing
    rejected); ``j_star`` the number of top tokens pooled with ``y*``; ``incomplete`` marks rows
    whose ``y*`` lies beyond the ``K`` values given (their ``cost`` is meaningless).
    """
    n, k = values.shape
    empty = r >= vocab
    incomplete = (r >= k) & ~empty
    pos = r.clamp(max=k - 1)
    p_y = values.gather(1, pos.unsqueeze(1)).squeeze(1)
    j = torch.arange(k, device=values.device)
    zero_col = torch.zeros(n, 1, dtype=values.dtype, device=values.device)
    if divergence == "forward":
        prefix = torch.cat([zero_col, values[:, : k - 1].cumsum(1)], dim=1)
        score = (p_y.unsqueeze(1) + prefix) / (j + 1)
    else:
        logs = torch.log(values[:, : k - 1])
        prefix = torch.cat([zero_col, logs.cumsum(1)], dim=1)
        score = (torch.log(p_y).unsqueeze(1) + prefix) / (j + 1)
    allowed = j.unsqueeze(0) <= pos.unsqueeze(1)
    score = torch.where(allowed, score, torch.full_like(score, -torch.inf))
    j_star = score.argmax(1)  # first maximum: the scan's stopping point
    level = score.gather(1, j_star.unsqueeze(1)).squeeze(1)
    # Pool = top j_star tokens plus y* itself (position pos).
    pool = (j.unsqueeze(0) < j_star.unsqueeze(1)) | (j.unsqueeze(0) == pos.unsqueeze(1))
    if divergence == "forward":
        cost = _forward_pool_cost(values, pool, level)
    else:
        cost = _reverse_pool_cost(values, pool, level)
        # y* with p = 0 cannot be lifted to a maximum at finite KL(q || p).
        cost = torch.where(p_y > 0, cost, torch.full_like(cost, torch.inf))
    cost = torch.where(empty, torch.full_like(cost, torch.inf), cost)
    return cost, j_star, incomplete


def tree_cost(values: Tensor, m: int, divergence: str) -> tuple[Tensor, Tensor]:
    """Exact greedy-tree certificate from sorted values ``[N, K >= m+1]``.

    Pools ``g`` (position 0) with the ``j*`` lowest of the competitors ``p(2..m+1)``, at the
    level minimising the (arithmetic or geometric) mean. Returns ``(cost, j_star)``.
    """
    n = values.shape[0]
    g = values[:, 0]
    ascending = values[:, 1 : m + 1].flip(1)  # competitors, lowest first
    j = torch.arange(m + 1, device=values.device)
    zero_col = torch.zeros(n, 1, dtype=values.dtype, device=values.device)
    if divergence == "forward":
        prefix = torch.cat([zero_col, ascending.cumsum(1)], dim=1)
        score = (g.unsqueeze(1) + prefix) / (j + 1)
    else:
        prefix = torch.cat([zero_col, torch.log(ascending).cumsum(1)], dim=1)
        score = (torch.log(g).unsqueeze(1) + prefix) / (j + 1)
    j_star = score.argmin(1)
    level = score.gather(1, j_star.unsqueeze(1)).squeeze(1)
    pooled_vals = torch.cat([g.unsqueeze(1), ascending], dim=1)
    jj = torch.arange(m + 1, device=values.device)
    pool = torch.cat([torch.ones(n, 1, dtype=torch.bool, device=values.device),
                      jj[:m].unsqueeze(0) < j_star.unsqueeze(1)], dim=1)
    if divergence == "forward":
        cost = _forward_pool_cost(pooled_vals, pool, level)
    else:
        cost = _reverse_pool_cost(pooled_vals, pool, level)
    return cost, j_star


def _accepted_count(values: Tensor, tau: Tensor, criterion: Criterion) -> Tensor:
    accepted = criterion.accept_from(values, tau.unsqueeze(1))
    return accepted.sum(1)


def certificates(
    p: Tensor,
    criteria: Sequence[Criterion | str] | Criterion | str = (),
    divergences: Iterable[str] = ("forward", "reverse"),
    *,
    tree_widths: Iterable[int] = (),
    from_logits: bool = False,
    top: int = DEFAULT_TOP,
) -> dict[tuple[str, str], Tensor]:
    """Certificates of several criteria (and tree widths) from one pass over ``p``.

    Returns ``{(str(criterion), divergence): rho*}`` and ``{("tree:m", divergence): rho*_tree}``,
    each float64 of shape ``p.shape[:-1]``. ``top`` is the size of the shared ``topk``
    summary; rows whose rejection boundary lies deeper are recomputed exactly from a sort.
    """
    crits = parse_criteria(criteria) if criteria else []
    divs = [check_divergence(d) for d in divergences]
    vocab = p.shape[-1] if isinstance(p, Tensor) and p.dim() >= 1 else 0
    widths = [check_tree_width(m, vocab) for m in tree_widths]
    for c in crits:
        c.check_vocab(vocab)
    k = max([top] + [c.top_needed() + 1 for c in crits] + [m + 1 for m in widths])
    s = summarize(p, from_logits=from_logits, k=k, with_entropy=any(c.needs_entropy for c in crits))
    out: dict[tuple[str, str], Tensor] = {}
    for c in crits:
        tau = c.threshold_from_summary(s)
        r = _accepted_count(s.values, tau, c)
        for div in divs:
            cost, _, incomplete = level_set_cost(s.values, r, s.vocab, div)
            if bool(incomplete.any()):
                cost = _redo_from_sort(p, from_logits, incomplete, tau, c, div, cost)
            out[(str(c), div)] = cost.reshape(s.lead_shape)
    for m in widths:
        for div in divs:
            cost, _ = tree_cost(s.values, m, div)
            out[(f"tree:{m}", div)] = cost.reshape(s.lead_shape)
    return out


def _redo_from_sort(
    p: Tensor, from_logits: bool, rows: Tensor, tau: Tensor, c: Criterion, div: str, cost: Tensor
) -> Tensor:
    """Exact costs for the rows whose boundary lies beyond the top-K summary (full sort)."""
    flat = p.reshape(-1, p.shape[-1])
    idx = torch.nonzero(rows).squeeze(1)
    full = sorted_rows(flat.index_select(0, idx), from_logits=from_logits)
    r = _accepted_count(full.values, tau.index_select(0, idx), c)
    redone, _, still = level_set_cost(full.values, r, full.vocab, div)
    assert not bool(still.any()), "a full sort cannot be incomplete"
    return cost.index_copy(0, idx, redone)


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
    p_y = full.values.gather(1, where.unsqueeze(1))
    r = (full.values > p_y).sum(1)
    cost, _, _ = level_set_cost(full.values, r, full.vocab + 1, divergence)  # never "empty"
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
    _, j_star, _ = level_set_cost(full.values, r, full.vocab, divergence)
    j = torch.arange(full.vocab, device=p.device)
    pos = r.clamp(max=full.vocab - 1)
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
