"""The cost of a certificate from the top of a sorted row: a level set's and a greedy tree's.

Every certificate of :mod:`companion.certify.certificates` is the cost of one pooled tilt
(:mod:`companion.certify.pooling`): the drafter ``q`` is flattened on a pool of the target's top
tokens. Which pool depends on the rejection region alone, so these functions take a row's sorted
top values and nothing else, for the engine and for every caller that holds only the top of a
distribution (a server's top-k logprobs, :mod:`companion.certify.server_logprobs`; a harvest's
stored top, :mod:`companion.analysis.traces`):

* :func:`level_set_pool` and :func:`level_set_cost`: ``C(p, y)``, the cost of lifting a token ``y``
  to the top, whose pool is the scan of the top tokens above ``p_y`` (a criterion's rejection
  region is a lower level set, so its certificate is ``C(p, y)`` at the most likely rejected ``y``);
* :func:`tree_pool` and :func:`tree_cost`: a width-``m`` greedy tree's, whose pool is the target's
  maximiser with the lowest of its ``m`` competitors;
* :func:`accepted_count`: how many tokens of a sorted row a criterion accepts.
"""
from __future__ import annotations

import torch
from torch import Tensor

from companion.certify.criteria import Criterion, band_factor, check_ties
from companion.certify.pooling import cost_of_pool, pool_levels
from companion.certify.validation import check_divergence


def level_set_pool(values: Tensor, logs: Tensor, n_above: Tensor, y_pos: Tensor, y_val: Tensor, y_log: Tensor,
                   divergence: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The pooled set of ``C(p, y)`` over sorted values ``[N, K]``.

    ``y`` is at sorted position ``y_pos`` (``K``: beyond the values; then ``y_val``, ``y_log``
    are its probability and log); ``n_above`` tokens have probability strictly above ``p_y``
    (the pooling candidates, the top ``n_above``; may exceed ``K``). Pooling the top ``j``
    gives the level ``L_j = (p_y + sum_{i<=j} p(i)) / (j+1)`` (forward) or its geometric
    analogue (reverse); the pool is the top ``j* = argmax_j L_j`` (first maximum), at least one
    when ``n_above >= 1`` (a token above ``p_y`` cannot stay above ``q_y`` unpooled), extended
    over ties with its last member.

    Returns ``(pool_k, extra, j_star, incomplete)``: the mask over the ``K`` positions, whether
    ``y`` itself lies beyond them, the number of top tokens pooled, and the rows whose scan
    had not stopped within the ``K`` values (``j* = K < n_above``): redo those from more values.
    """
    k = values.shape[1]
    j = torch.arange(k + 1, device=values.device)
    score = pool_levels(y_val, y_log, torch.ones_like(n_above), values, logs, divergence)
    allowed = j.unsqueeze(0) <= n_above.unsqueeze(1)
    score = torch.where(allowed, score, torch.full_like(score, -torch.inf))
    j_star = score.argmax(1)  # first maximum: where the scan stops
    j_star = torch.maximum(j_star, n_above.clamp(max=1))
    last = values.gather(1, (j_star - 1).clamp(min=0).unsqueeze(1))
    ties = torch.minimum((values >= last).sum(1), n_above)
    j_star = torch.where(j_star > 0, torch.maximum(j_star, ties), j_star)
    incomplete = (j_star >= k) & (n_above > k)
    pool_k = (j[:k].unsqueeze(0) < j_star.unsqueeze(1)) | (j[:k].unsqueeze(0) == y_pos.unsqueeze(1))
    return pool_k, y_pos >= k, j_star, incomplete


def level_set_cost(values: Tensor, p_y: Tensor, n_above: Tensor, divergence: str, *,
                   tail: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``C(p, y)`` from the top of a sorted distribution, for callers that hold only its top ``K``.

    ``values``: ``[N, K]`` decreasing probabilities; ``p_y``: ``[N]`` the probability of the token
    ``y`` to lift to the top; ``n_above``: how many tokens lie strictly above ``p_y`` (when
    ``n_above < K``, ``y`` is taken to sit at sorted position ``n_above``, else beyond the values);
    ``tail``: the mass beyond the ``K`` values (default ``max(0, 1 - sum(values))``, which loses the
    digits of reverse costs above ~30 nats). The pooled minimiser is the one of
    :func:`certificates`. Returns ``(cost, j_star, incomplete)``: the cost, the number of top
    tokens pooled with ``y``, and the rows whose scan had not stopped within the ``K`` values.
    """
    check_divergence(divergence)
    values = values.to(torch.float64)
    p_y = p_y.to(torch.float64)
    k = values.shape[1]
    logs = torch.log(values)
    if tail is None:
        tail = (1 - values.sum(1)).clamp(min=0)
    y_pos = n_above.clamp(max=k)
    y_log = torch.log(p_y)
    pool_k, extra, j_star, incomplete = level_set_pool(values, logs, n_above, y_pos, p_y, y_log, divergence)
    cost = cost_of_pool(values, logs, tail.to(torch.float64), pool_k, p_y, y_log, extra, divergence)
    if divergence == "reverse":
        cost = torch.where(p_y > 0, cost, torch.full_like(cost, torch.inf))
    return cost, j_star, incomplete


def tree_pool(values: Tensor, logs: Tensor, m: int, divergence: str,
              ties: str = "worst", band: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The pooled set of the width-``m`` tree certificate over sorted values ``[N, K]``.

    ``t`` = the number of maximisers that must all lose: with ``ties="worst"`` the decoder's
    token may be any one maximiser, the others compete with it, so ``t = 1``; with
    ``"level-set"`` every maximiser counts, ``t = #{i : p_i = p(1)}``. Competitors ``p(t+1..t+m)``
    (positions ``t..t+m-1``), scanned from the lowest: pool all ``t`` maximisers with the
    ``j* = argmin_{1 <= j <= m} L_j`` lowest competitors (first minimum), extended over ties.

    ``band`` (``ties="worst"`` only; per row, in log-probability units, ``None``: exact ties): the
    kernel-path band. The decoder's token may then be any of the ``t`` tokens whose log-probability
    lies within ``band`` of the top one (:func:`band_count`), and the cheapest to push out of the
    drafter's top ``m`` is the least likely of them, ``p(t)``: the ``t - 1`` tokens above it already
    outrank it, so only ``m - t + 1`` competitors below it are needed, ``p(t+1..m+1)``, and the pool
    is ``p(t)`` with the ``j*`` lowest of those (a larger anchor or more competitors above it only
    cost more: pooling a superset, or the same set with a larger member, costs at least as much).
    With ``t = 1`` this is the ``"worst"`` pool; with ``t > m`` nothing need move (certificate 0),
    and the pool is ``p(t)`` alone. Here ``t`` is returned as 1, the number of anchors pooled.

    Returns ``(pool_k, j_star, t, known)``; ``known`` is False on rows whose competitors do not
    all lie within the ``K`` values given (``t + m > K``; with a band, ``m + 1 > K`` or the band
    reaches the last value given).
    """
    n, k = values.shape
    if check_ties(ties) == "worst" and band is not None:
        return _band_tree_pool(values, logs, m, divergence, band)
    if check_ties(ties) == "worst":
        t = torch.ones(n, dtype=torch.long, device=values.device)
    else:
        t = (values == values[:, :1]).sum(1)
    known = t + m <= k
    # competitor positions, lowest first: t+m-1, t+m-2, ..., t
    pos = (t.unsqueeze(1) + (m - 1) - torch.arange(m, device=values.device).unsqueeze(0)).clamp(max=k - 1)
    asc_val, asc_log = values.gather(1, pos), logs.gather(1, pos)
    score = pool_levels(values[:, 0], logs[:, 0], t, asc_val, asc_log, divergence)
    score[:, 0] = torch.inf  # at least one competitor must be pooled (all lie below p(1))
    j_star = score.argmin(1)  # first minimum: the scan from below stops here
    highest = asc_val.gather(1, (j_star - 1).unsqueeze(1))
    j_star = torch.maximum(j_star, (asc_val <= highest).sum(1))
    jj = torch.arange(k, device=values.device).unsqueeze(0)
    lo = (t + m - j_star).unsqueeze(1)
    pool_k = (jj < t.unsqueeze(1)) | ((jj >= lo) & (jj < (t + m).unsqueeze(1)))
    return pool_k, j_star, t, known


def band_count(values: Tensor, band: Tensor) -> Tensor:
    """``t``: how many of the sorted values ``[N, K]`` lie within ``band`` (log units, per row) of the
    largest, ``p(i) e^band >= p(1)``; a gap of exactly the band counts (:func:`band_factor` nudges the
    factor up by 1e-12). Exact ties count too, so ``t >= 1``."""
    return (values * band_factor(band).unsqueeze(1) >= values[:, :1]).sum(1).clamp(min=1)


def _band_tree_pool(values: Tensor, logs: Tensor, m: int, divergence: str,
                    band: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """:func:`tree_pool` under a kernel-path band: anchor ``p(t)``, competitors ``p(t+1..m+1)``."""
    n, k = values.shape
    dev = values.device
    t = band_count(values, band)
    known = (m + 1 <= k) & (t < k)
    anchor = (t - 1).clamp(max=k - 1)
    # competitor positions, lowest first: m, m-1, ..., 1; those above the anchor (< t) are not needed
    pos = (m - torch.arange(m, device=dev)).clamp(max=k - 1).unsqueeze(0).expand(n, m)
    asc_val, asc_log = values.gather(1, pos), logs.gather(1, pos)
    a_val = values.gather(1, anchor.unsqueeze(1)).squeeze(1)
    a_log = logs.gather(1, anchor.unsqueeze(1)).squeeze(1)
    one = torch.ones(n, dtype=torch.long, device=dev)
    score = pool_levels(a_val, a_log, one, asc_val, asc_log, divergence)
    needed = (m - t + 1).clamp(min=0)                      # competitors that must come from below
    jcol = torch.arange(m + 1, device=dev).unsqueeze(0)
    score = torch.where((jcol == 0) | (jcol > needed.unsqueeze(1)), torch.full_like(score, torch.inf), score)
    j_star = score.argmin(1)
    highest = asc_val.gather(1, (j_star - 1).clamp(min=0).unsqueeze(1))
    j_star = torch.minimum(torch.maximum(j_star, (asc_val <= highest).sum(1)), needed)
    j_star = torch.where(needed > 0, j_star, torch.zeros_like(j_star))
    jj = torch.arange(k, device=dev).unsqueeze(0)
    lo = (m + 1 - j_star).unsqueeze(1)
    pool_k = (jj == anchor.unsqueeze(1)) | ((jj >= lo) & (jj <= m))
    return pool_k, j_star, one, known


def tree_cost(values: Tensor, m: int, divergence: str, *, tail: Tensor | None = None,
              logs: Tensor | None = None, vocab: int | None = None, ties: str = "worst",
              band: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Exact greedy-tree certificate from sorted probabilities ``[N, K]`` (decreasing rows).

    ``ties="worst"`` (default): pools ``p(1)`` with the ``j*`` lowest of the competitors
    ``p(2..m+1)`` (tied maximisers among them). ``ties="level-set"``: with ``t`` tied maximisers,
    pools all of them with the ``j*`` lowest of the competitors
    ``p(t+1..t+m)``, at the level minimising the (arithmetic or geometric) mean. ``tail``: the
    mass beyond the ``K`` values (default ``max(0, 1 - sum(values))``, which loses the digits
    of a reverse certificate above ~30 nats: pass the summary's tail); ``logs``: their logs
    (default ``log(values)``); ``vocab``: ``V``, to give ``+inf`` where fewer than ``m`` tokens
    are not maximisers. Rows whose ``t + m`` exceeds ``K`` (the values given do not reach the
    ``m``-th competitor) get NaN. ``band`` (``"worst"`` only): the kernel-path band per row, in
    log-probability units (:func:`tree_pool`). Returns ``(cost, j_star)``, ``j_star`` the
    competitors pooled.
    """
    check_divergence(divergence)
    values = values.to(torch.float64)
    if logs is None:
        logs = torch.log(values)
    if tail is None:
        tail = torch.zeros_like(values[:, 0]) if vocab is not None and vocab <= values.shape[1] \
            else (1 - values.sum(1)).clamp(min=0)
    pool_k, j_star, t, known = tree_pool(values, logs, m, divergence, ties,
                                         None if band is None else band.to(torch.float64))
    zeros = torch.zeros_like(tail)
    cost = cost_of_pool(values, logs, tail, pool_k, zeros, zeros, torch.zeros_like(known), divergence)
    cost = torch.where(known, cost, torch.full_like(cost, torch.nan))
    if vocab is not None:
        cost = torch.where(t + m > vocab, torch.full_like(cost, torch.inf), cost)
    return cost, j_star


def accepted_count(values: Tensor, tau: Tensor, criterion: Criterion, ties: str = "level-set") -> Tensor:
    """``r = |{i : c accepts token i}|`` per row, for rows of probabilities sorted descending.

    A criterion's accepted set is a prefix of the sorted row (lower level sets, under either tie
    convention), so ``r`` tokens are accepted: ``values[:, :r]``. ``tau`` is the row's threshold
    (one per row), from ``criterion.threshold_from_summary(s, ties)`` with the same ``ties``.
    """
    accepted = criterion.accept_from(values, tau.unsqueeze(1), ties)
    return accepted.sum(1)
