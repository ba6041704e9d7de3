"""Certificates from the top-k logprobs an inference server returns.

vLLM and OpenAI-style servers return, for each generated position, the log-probabilities of
the ``k`` most likely next tokens (``k <= 20``), not the whole distribution. Write the known
probabilities in decreasing order ``v_1 >= ... >= v_k`` and ``T`` for the mass outside them
(the *tail*: ``T = 1 - sum_i v_i`` unless given). Every completion of the tail is a set of
``V - k`` probabilities, each at most ``v_k`` (else it would be in the top ``k``), summing to
``T``. :func:`certificates_from_logprobs` returns, per step, the certificate ``rho*(p)`` of the
full distribution when the top ``k`` determine it, and otherwise the smallest value it can
take over all such completions (or a number below that), flagging which.

**Ties.** As in :func:`companion.certify.certificates.certificates`, the default is the worst case
over tie-breaks (``ties="worst"``): a criterion rejects ``y`` iff ``p_y <= tau_worst(p)``
(:mod:`companion.certify.criteria`; strict greedy: ``tau_worst = p(2)``, top-m: ``p(M+1)``; a token
exactly at an additive, multiplicative or top-k-delta threshold is accepted, as the decoders'
``p_y >= tau`` accepts it). The rule as
written (``ties="level-set"``, for analysis) rejects ``y`` iff ``p_y < tau(p)`` (``<=`` for
typical acceptance). Below, "rejected" and ``tau`` are those of the convention chosen; every
threshold of both conventions has the monotonicity used here, and both rejection regions are
lower level sets, so the argument is the same.

**When the top k determine it.** A criterion rejects ``y`` iff ``p_y < tau(p)``. Suppose
``tau`` is pinned down well enough that the same top-``k`` tokens are accepted whatever the
tail, and at least one of them is rejected (``r < k`` accepted, in decreasing order). The most
likely rejected token ``y*`` is then the ``(r+1)``-th, since no tail token is more likely
than ``v_k``. The certificate is ``C(p, y*)``, the cost of lifting ``y*`` to a maximum of
``q``; its minimiser pools ``y*`` with tokens *more likely than* ``y*`` (all among the top
``r``) and leaves every other token as it is (forward: ``q = p`` there; reverse: ``q`` is
``p`` rescaled), so ``C`` is a function of the pooled probabilities alone:
``sum_A p_i log(p_i / mean_A p)`` (forward), ``-log(1 - (P_A - |A| G_A))`` (reverse). The tail
changes nothing: the value is exact. So is the worst-case tree certificate of width ``m`` when
``m + 1 <= k``: it pools the target's top token with some of the competitors ``p(2..m+1)``
(other maximisers among them; the decoder's token is one maximiser). Under ``"level-set"`` the
``t`` tied maximisers all join the pool and the competitors are ``p(t+1..t+m)``: exact when
``t + m <= k``.

**Otherwise: a lower bound.** Two things can be unknown.

1. *The threshold.* ``tau`` of ``topm:M`` with ``M > k`` reads ``p(M)`` (``tau_worst``: ``p(M+1)``
   when ``M + 1 > k``), of ``topk-delta:K,D`` with ``K > k`` reads ``p(K)`` (``p(K+1)``), the
   worst-case greedy threshold reads ``p(2)`` (unseen when ``k = 1``), and typical acceptance
   reads the entropy ``H``. Every
   threshold here is non-decreasing in each order statistic ``p(j)`` and non-increasing in
   ``H``, so ``tau`` lies in ``[tau_lo, tau_hi]``: ``tau_hi`` with each unseen ``p(j)``
   (``j > k``) at its largest, ``min(v_k, T / (j - k))`` (the ``j - k`` largest tail tokens
   share at most ``T``), and ``H`` at its smallest; ``tau_lo`` with unseen ``p(j) = 0`` and
   ``H`` at its largest. With ``H_top = -sum_i v_i log v_i``, each tail probability ``t <= v_k``
   gives ``-t log t >= t log(1 / v_k)``, and spreading ``T`` evenly maximises the tail's part:

       H_top + T log(1 / v_k)  <=  H  <=  H_top + T log((V - k) / T)

   (no upper bound when ``V`` is not given). A token more likely than ``y*`` has a smaller
   cost (``C(p, y)`` is non-increasing in ``p_y``), so the worst case is the highest threshold:
   if it rejects one of the top ``k``, the cost of the first such token is a lower bound, exact
   when ``tau_lo`` gives the same boundary.
2. *The boundary token.* When every top-``k`` token is accepted even at ``tau_hi``, ``y*`` is in
   the tail, with ``p_y* <= u = min(v_k, tau_hi, T / (1 + n))``, where ``n`` counts the tail tokens
   that must be accepted ahead of ``y*`` (``M - k`` for ``topm:M``: at least ``M`` tokens are at
   least as likely as ``y*`` under either convention, else 0). Drop the
   constraints ``q_y* >= q_z`` for the unseen tokens ``z != y*``: the minimum over fewer
   constraints is no larger, and it is the same pooled cost over the top ``k`` only, which
   depends on ``p_y*`` alone and decreases as ``p_y*`` grows (its derivative in ``p_y*`` is
   ``log(p_y* / L) < 0`` forward, ``1 - G_A / p_y* < 0`` inside the reverse cost, the pool level
   ``L`` or ``G_A`` being above ``p_y*``). Evaluated at ``p_y* = u`` it is a lower bound on
   ``rho*`` over every completion of the tail. For trees whose competitors reach beyond the top
   ``k`` the unseen ones are set to their largest values ``min(v_k, T / (j - k))``; the tree cost
   is non-increasing in each competitor's probability, so this is a lower bound too (under
   ``"level-set"`` a padded competitor equal to ``p(1)`` is lowered by a relative ``2^-50``: it
   is not counted as one more tied maximiser, whose exact tie would raise the certificate).
   Nothing is rejected by any completion (``+inf``, exact) when all ``V = k`` tokens are
   accepted or the highest threshold is below every probability (``tau_hi < 0``, or
   ``tau_hi <= 0`` where acceptance is ``p_y >= tau``).

A lower bound certifies like the certificate itself: ``KL(p || q) < bound <= rho*`` still
implies acceptance. It is only less often met.

The results are as exact as the logprobs given: servers compute them in float32 (about 7
digits), and the implied tail ``1 - sum_i v_i`` of a peaked step carries that absolute error.
Pass ``tail_mass`` when the server reports it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from companion.certify.costs import level_set_cost, tree_cost
from companion.certify.criteria import (
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    check_ties,
    parse_criteria,
)
from companion.certify.summary import TopSummary
from companion.certify.validation import check_divergences, check_positive_int, check_tensor_device, check_tree_widths

SUM_TOLERANCE = 1e-3
"""How far above 1 the known probabilities plus the tail may sum (server rounding) before the
input is refused. Within it, each step is renormalised to sum to 1."""

# Criteria whose threshold is non-decreasing in every order statistic and non-increasing in the
# entropy: the lower bound above relies on it.
_MONOTONE = (StrictGreedy, AdditiveRelaxed, MultiplicativeRelaxed, TopM, TopKDelta, Typical)


@dataclass(frozen=True)
class LogprobCertificate:
    """A certificate computed from top-k logprobs, per step (shape: the steps' leading shape).

    ``value``: float64 nats; ``rho*(p)`` where ``exact`` is true, else a lower bound on it
    (``+inf`` where nothing can be rejected). ``exact``: bool, whether the top ``k`` determine
    ``rho*``.
    """

    value: Tensor
    exact: Tensor

    def __repr__(self) -> str:
        return f"LogprobCertificate({int(self.exact.sum())}/{self.exact.numel()} exact, values {self.value})"


def _number(value: Any, where: str) -> float:
    if isinstance(value, (bool, str, bytes)):
        raise ValueError(f"{where}: expected a logprob (a number), got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a logprob (a number), got {value!r}") from None


def _entry_logprob(entry: Any, where: str) -> tuple[Any, float]:
    """``(token or None, logprob)`` of one entry; the token is None for a bare number."""
    if isinstance(entry, (bool, str, bytes)):
        raise ValueError(f"{where}: expected a logprob, got {entry!r}")
    if isinstance(entry, (int, float)):
        return None, float(entry)
    if isinstance(entry, Mapping) and "logprob" in entry:
        return entry.get("token"), _number(entry["logprob"], where)
    if hasattr(entry, "logprob"):
        return getattr(entry, "token", None), _number(entry.logprob, where)
    raise ValueError(f"{where}: expected a logprob (a number, a dict with 'logprob', or an object with .logprob), "
                     f"got {type(entry).__name__}")


def _same_logprob(a: float, b: float) -> bool:
    # Two copies of one server value may differ by a float32 round trip through JSON, no more.
    return a == b or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _step_logprobs(row: Any, i: int) -> list[float]:
    """One step's logprobs, each token once.

    A token may be listed twice only with the same logprob: vLLM appends the sampled token to
    the top k even when it is already among them. That copy is dropped. Two different values for
    one token cannot both be its probability, and counting both would certify two tied tokens
    where there is one: refused. (Dict keys are unique already; bare numbers carry no token.)
    """
    if isinstance(row, Mapping):
        return [_entry_logprob(lp, f"step {i}, token {tok!r}")[1] for tok, lp in row.items()]
    if isinstance(row, (str, bytes)) or not isinstance(row, Iterable):
        raise ValueError(f"step {i}: expected a dict or list of top logprobs, got {type(row).__name__}")
    seen: dict[Any, float] = {}
    out = []
    for j, entry in enumerate(row):
        token, lp = _entry_logprob(entry, f"step {i}, entry {j}")
        if token is not None:
            try:
                first = seen.get(token)
            except TypeError:  # an unhashable token: nothing to compare it with
                first = None
            if first is not None:
                if not _same_logprob(first, lp):
                    raise ValueError(f"step {i}: token {token!r} is listed twice with different logprobs "
                                     f"({first!r} and {lp!r}); each token may appear once per step")
                continue
            try:
                seen[token] = lp
            except TypeError:
                pass
        out.append(lp)
    return out


def _rows_from_lists(rows: Sequence[Any], top_k: int | None) -> tuple[Tensor, Tensor]:
    """Per step: the ``k`` largest logprobs given (sorted) and the probability of the ones dropped."""
    parsed = [_step_logprobs(row, i) for i, row in enumerate(rows)]
    if not parsed:
        raise ValueError("logprobs is empty: give the top logprobs of at least one step")
    empty = [i for i, r in enumerate(parsed) if not r]
    if empty:
        raise ValueError(f"logprobs: step {empty[0]} has no logprobs; every step needs at least one")
    k = min(len(r) for r in parsed) if top_k is None else top_k
    short = [i for i, r in enumerate(parsed) if len(r) < k]
    if short:
        raise ValueError(f"step {short[0]} has {len(parsed[short[0]])} logprobs; every step needs at least top_k={k}")
    width = max(len(r) for r in parsed)
    full = torch.full((len(parsed), width), -math.inf, dtype=torch.float64)
    for i, r in enumerate(parsed):
        full[i, : len(r)] = torch.tensor(r, dtype=torch.float64)
    return _split_top(full, k)


def _split_top(lp: Tensor, k: int) -> tuple[Tensor, Tensor]:
    if torch.isnan(lp).any() or torch.isposinf(lp).any():
        raise ValueError("logprobs has NaN or +inf entries")
    ordered = lp.sort(-1, descending=True).values
    dropped = ordered[..., k:].exp().sum(-1)
    return ordered[..., :k], dropped


def certificates_from_logprobs(
    logprobs: Tensor | Sequence[Any],
    criteria: Sequence[Criterion | str] | Criterion | str = (),
    divergences: Iterable[str] | str = ("forward", "reverse"),
    *,
    tree_widths: Iterable[int] | int = (),
    tail_mass: float | Tensor | Sequence[float] | None = None,
    vocab: int | None = None,
    top_k: int | None = None,
    ties: str = "worst",
) -> dict[tuple[str, str], LogprobCertificate]:
    """Certificates (exact, or sound lower bounds) from each step's top-k log-probabilities.

    ``logprobs``: natural-log probabilities of the target's most likely tokens, normalised over
    the whole vocabulary as servers return them, either a tensor ``[..., k]`` (any order) or one
    entry per step: a dict ``{token: logprob}`` (vLLM's ``{id: Logprob}`` works too) or a list of
    ``{"token": ..., "logprob": ...}`` (OpenAI's ``top_logprobs``). ``top_k``: keep the ``top_k``
    largest of each step (vLLM may add the sampled token beyond the top ``k``; pass the ``k``
    you asked for); lists default to the shortest step's length. Dropped entries count as tail.
    A token listed twice in one step must carry the same logprob both times (vLLM's appended
    sampled token); the copy is dropped. Different values for one token are refused.
    ``divergences`` and ``tree_widths`` take one value or a list, as in ``certificates``.

    ``tail_mass``: the probability outside the entries given, per step (scalar or leading
    shape); default ``1 - sum(exp(logprobs))``. ``vocab``: the vocabulary size ``V`` if known
    (Qwen3: 151,936); typical acceptance needs it to bound the entropy, and without it its
    certificates are only lower bounds. ``ties``: the tie convention of the certificate bounded,
    ``"worst"`` (default; the worst case over tie-breaks, sound for decoders that break exact
    ties by token id) or ``"level-set"`` (analysis only), as in
    :func:`companion.certify.certificates.certificates`.

    Returns ``{(spec, divergence): LogprobCertificate}`` and ``{("tree:m", divergence): ...}``,
    keyed like :func:`companion.certify.certificates.certificates`; each holds ``value`` (float64 nats,
    leading shape) and ``exact`` (bool). The module docstring derives when the value is exact
    and why it is otherwise a lower bound over every completion of the unseen tail.
    """
    # Every argument is checked before any work, so that a mistake is one line, not a traceback.
    check_ties(ties)
    if top_k is not None:
        check_positive_int("top_k", top_k)
    widths = check_tree_widths(tree_widths)
    divs = check_divergences(divergences)
    if isinstance(logprobs, Tensor):
        check_tensor_device(logprobs, "logprobs")
        if not logprobs.is_floating_point() or logprobs.dim() < 1 or logprobs.shape[-1] < 1 or logprobs.numel() == 0:
            raise ValueError(f"logprobs must be a float tensor [..., k] with k >= 1, got {logprobs.dtype} "
                             f"{tuple(logprobs.shape)}")
        lead = logprobs.shape[:-1]
        k = logprobs.shape[-1] if top_k is None else top_k
        if not 1 <= k <= logprobs.shape[-1]:
            raise ValueError(f"top_k must be between 1 and {logprobs.shape[-1]} (the logprobs given), got {top_k}")
        values_lp, dropped = _split_top(logprobs.detach().to("cpu", torch.float64).reshape(-1, logprobs.shape[-1]), k)
        device = logprobs.device
    else:
        if isinstance(logprobs, (str, bytes, Mapping)) or not isinstance(logprobs, Iterable):
            # None, a bare number, a string or one step's dict: name what was given (list() would raise TypeError)
            raise ValueError(f"logprobs must be a tensor [..., k] or a list with one entry per step, "
                             f"got {type(logprobs).__name__}")
        values_lp, dropped = _rows_from_lists(list(logprobs), top_k)
        lead, k, device = torch.Size([values_lp.shape[0]]), values_lp.shape[1], torch.device("cpu")
    n = values_lp.shape[0]
    if bool((values_lp > SUM_TOLERANCE).any()):
        bad = int(torch.nonzero((values_lp > SUM_TOLERANCE).any(-1))[0, 0])
        raise ValueError(f"logprobs must be log-probabilities (<= 0); step {bad} has {float(values_lp[bad].max()):.6g}")
    v = values_lp.exp()
    known = v.sum(-1) + dropped
    if tail_mass is None:
        tail = (1 - known).clamp(min=0) + dropped
    else:
        given = _tail_tensor(tail_mass)
        try:
            given = given.expand(lead).reshape(n)
        except RuntimeError:
            raise ValueError(f"tail_mass of shape {tuple(given.shape)} does not match the steps' shape {tuple(lead)}") from None
        if bool((given < -SUM_TOLERANCE).any()) or bool(torch.isnan(given).any()):
            raise ValueError("tail_mass must be >= 0 (the probability outside the top logprobs)")
        tail = given.clamp(min=0) + dropped
    total = v.sum(-1) + tail
    off = (total - 1).abs() > SUM_TOLERANCE
    if bool(off.any()):
        bad = int(torch.nonzero(off)[0, 0])
        raise ValueError(f"step {bad}: the top probabilities and the tail sum to {float(total[bad]):.6g}, not 1 "
                         f"(tolerance {SUM_TOLERANCE:g}); are these log-probabilities of the whole vocabulary?")
    v, tail = v / total.unsqueeze(-1), tail / total
    # A zero among the top k leaves no room for any tail mass: what is there is rounding.
    stuck = (v[:, -1] == 0) & (tail > 0)
    if bool((stuck & (tail > SUM_TOLERANCE)).any()):
        bad = int(torch.nonzero(stuck & (tail > SUM_TOLERANCE))[0, 0])
        raise ValueError(f"step {bad}: the top logprobs include a zero probability, yet the tail has mass "
                         f"{float(tail[bad]):.6g}; unseen tokens cannot be more likely than seen ones")
    tail = torch.where(stuck, torch.zeros_like(tail), tail)
    if vocab is not None:
        if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < k:
            raise ValueError(f"vocab must be an integer >= k = {k} (the top logprobs per step), got {vocab!r}")
        room = (vocab - k) * v[:, -1]
        crowded = tail > room + SUM_TOLERANCE
        if bool(crowded.any()):
            bad = int(torch.nonzero(crowded)[0, 0])
            raise ValueError(f"step {bad}: a tail of mass {float(tail[bad]):.6g} does not fit in V - k = {vocab - k} "
                             f"tokens of probability at most p(k) = {float(v[bad, -1]):.6g}; is vocab={vocab} right?")
        tail = torch.minimum(tail, room)   # within the tolerance: rounding (no tail at all when V = k)
    crits = parse_criteria(criteria) if criteria else []
    out: dict[tuple[str, str], LogprobCertificate] = {}
    for c in crits:
        value, exact = _criterion_bound(c, v, tail, vocab, divs, ties)
        for div in divs:
            out[(str(c), div)] = LogprobCertificate(value[div].reshape(lead).to(device), exact.reshape(lead).to(device))
    for m in widths:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1 or (vocab is not None and m >= vocab):
            raise ValueError(f"tree width m must be an integer with 1 <= m < V, got {m!r}")
        if ties == "worst":
            # The decoder's token is one maximiser; every other token, tied with it or not, competes:
            # the competitors are p(2..m+1), unseen ones at their largest (the cost is non-increasing
            # in each competitor, and a competitor equal to p(1) is allowed: it is a tie).
            competitors = _padded(v, tail, m + 1)
            exact = torch.full((n,), m + 1 <= k, dtype=torch.bool)
        else:
            # Tied maximisers all join the pool, so the competitors are p(t+1..t+m). An unseen token
            # is never counted as tied with the top: an exact tie would raise the certificate, while
            # completions approaching it drive it down to its infimum.
            n_tied = (v == v[:, :1]).sum(1)
            competitors = _padded(v, tail, max(m + 1, int(n_tied.max()) + m))
            if competitors.shape[1] > k:
                top, pads = competitors[:, :1], competitors[:, k:]
                competitors = torch.cat([competitors[:, :k], torch.where(pads >= top, top * (1 - 2.0**-50), pads)], 1)
            exact = n_tied + m <= k
        for div in divs:
            cost, _ = tree_cost(competitors, m, div, ties=ties)
            if competitors.shape[1] > k and bool(exact.any()):
                # Exact rows need no padding, and padded columns would count as mass outside the
                # pool in the reverse cost (T_A): take those rows from the top k and their tail.
                cost = torch.where(exact, tree_cost(v, m, div, tail=tail, ties=ties)[0], cost)
            out[(f"tree:{m}", div)] = LogprobCertificate(cost.reshape(lead).to(device), exact.reshape(lead).to(device))
    return out


def _tail_tensor(tail_mass: Any) -> Tensor:
    """``tail_mass`` as float64 on the CPU: a number, a sequence of numbers, or a real tensor."""
    bad = f"tail_mass must be a number, a sequence of numbers or a tensor, got {tail_mass!r}"
    if isinstance(tail_mass, (bool, str, bytes)):
        raise ValueError(bad)
    if isinstance(tail_mass, Tensor):
        check_tensor_device(tail_mass, "tail_mass")
        if tail_mass.dtype == torch.bool or tail_mass.is_complex():
            raise ValueError(f"tail_mass must be a real tensor, got dtype {tail_mass.dtype}")
    try:
        return torch.as_tensor(tail_mass, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(bad) from None


def _padded(v: Tensor, tail: Tensor, width: int) -> Tensor:
    """``v`` extended to ``width`` columns with each unseen ``p(j)`` at its largest, ``min(v_k, T/(j-k))``."""
    n, k = v.shape
    if width <= k:
        return v
    j = torch.arange(1, width - k + 1, dtype=torch.float64)
    pad = torch.minimum(v[:, -1:].expand(n, width - k), tail.unsqueeze(1) / j)
    return torch.cat([v, pad], dim=1)


def _threshold(c: Criterion, values: Tensor, entropy: Tensor | None, vocab: int, ties: str) -> Tensor:
    """``c.threshold_from_summary(s, ties)`` of sorted rows ``values`` (``p(j)`` = column ``j - 1``)
    with entropy ``entropy``: ``tau(p)`` (``ties="level-set"``) or ``tau_worst(p)`` (``"worst"``)."""
    s = TopSummary(values=values, indices=torch.zeros(values.shape, dtype=torch.long), vocab=vocab,
                   lead_shape=torch.Size([values.shape[0]]), norm=torch.ones(values.shape[0], dtype=torch.float64),
                   entropy=entropy)
    return c.threshold_from_summary(s, ties)


def _criterion_bound(c: Criterion, v: Tensor, tail: Tensor, vocab: int | None,
                     divs: list[str], ties: str = "worst") -> tuple[dict[str, Tensor], Tensor]:
    """``(value, exact)`` of criterion ``c`` from sorted top-``k`` probabilities ``v`` ``[N, k]`` and
    tail mass ``tail`` ``[N]`` (module docstring): ``C(p, y*)`` for the first top-``k`` token rejected
    at ``tau_hi`` (accepted iff ``v_i >= tau`` or ``> tau`` per ``c.is_strict(ties)``), exact when
    ``tau_lo`` rejects the same one; else the pooled cost over the top ``k`` of a tail token at
    ``u = min(v_k, tau_hi, T / (1 + n))``; ``+inf`` where no completion rejects anything."""
    if c.needs_logits:
        raise ValueError(f"{c} needs the target's raw logits: a server's logprobs are normalised (log-softmax), "
                         "which removes the offset its ratio z(2)/z(1) depends on")
    if not isinstance(c, _MONOTONE):
        raise ValueError(f"criterion {c} is not supported from top-k logprobs (its threshold's monotonicity is unknown)")
    n, k = v.shape
    if vocab is not None:
        c.check_vocab(vocab)
    width = max(k, c.top_needed(ties))
    summary_vocab = vocab if vocab is not None else width + 1
    h_lo = h_hi = None
    if c.needs_entropy:
        h_top = -torch.xlogy(v, v).sum(-1)
        h_lo = h_top - torch.xlogy(tail, v[:, -1])
        if vocab is None:
            h_hi = torch.where(tail > 0, torch.full_like(h_top, math.inf), h_top)
        else:
            h_hi = h_top + torch.xlogy(tail, (vocab - k) / tail.clamp(min=1e-300))
        # Widen by float64 rounding, so that an interval giving one boundary really does.
        h_lo, h_hi = h_lo * (1 - 1e-9), h_hi * (1 + 1e-9) + 1e-12
    tau_hi = _threshold(c, _padded(v, tail, width), h_lo, summary_vocab, ties)
    lower_pad = torch.cat([v, torch.zeros(n, width - k, dtype=torch.float64)], dim=1)
    tau_lo = _threshold(c, lower_pad, h_hi, summary_vocab, ties)
    r_hi = c.accept_from(v, tau_hi.unsqueeze(1), ties).sum(1)  # fewest top-k tokens accepted
    r_lo = c.accept_from(v, tau_lo.unsqueeze(1), ties).sum(1)  # most
    in_top = r_hi < k
    no_tail = vocab is not None and vocab == k
    forced = max(0, c.m - k) if isinstance(c, TopM) else 0
    u = torch.minimum(torch.minimum(v[:, -1], tau_hi.clamp(min=0)), tail / (1 + forced))
    p_y = torch.where(in_top, v.gather(1, r_hi.clamp(max=k - 1).unsqueeze(1)).squeeze(1), u)
    n_above = torch.where(in_top, r_hi, torch.full_like(r_hi, k))
    # Nothing can be rejected: all of the top k accepted and no tail, or no probability below the
    # highest threshold (tau < 0; tau <= 0 where acceptance is p_y >= tau).
    empty = (~in_top & no_tail) | (tau_hi < 0) | ((tau_hi <= 0) & (not c.is_strict(ties)))
    exact = (in_top & (r_hi == r_lo)) | empty
    values = {}
    for div in divs:
        cost, _, _ = level_set_cost(v, p_y, n_above, div)
        values[div] = torch.where(empty, torch.full_like(cost, math.inf), cost)
    return values, exact
