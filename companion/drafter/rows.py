"""The drafter's rows as the drafter-side certificates read them: the sorted top of ``q`` and
the mass beyond it (float64, normalised). One module that both :mod:`companion.drafter.certificates` and
:mod:`companion.drafter.typical` import, so that neither imports the other's internals."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from companion.certify.summary import DEFAULT_TOP, map_rows, summarize
from companion.certify.precision import lower_log_normaliser, normalisation_mismatch

# Tails below this are summed directly (1 - sum(top K) would carry an absolute error ~1e-15).
_TAIL_DIRECT = 1e-3


@dataclass(frozen=True)
class Rows:
    """Normalised float64 top-``K`` of each row of ``q`` (``[N, K]``, decreasing), the token ids,
    and ``beyond``: the mass of the ``V - K`` other tokens, summed on its own scale.

    ``log_err``, ``mismatch``: for rows worked in float32 (float32, bfloat16 and float16 inputs),
    the bounds of :mod:`companion.certify.precision` (``None`` for float64 rows): the summary's
    normaliser bound, ``beyond``'s (``|beyond - tail| + tail_err``, ``tail`` the summary's own
    estimate of the same mass), and how far ``values`` and ``beyond`` are from summing to 1
    (:func:`~companion.certify.precision.normalisation_mismatch`)."""

    values: Tensor
    logs: Tensor  # log(values); from the logits themselves when given (finite where values underflow)
    indices: Tensor
    beyond: Tensor
    vocab: int
    lead_shape: torch.Size
    norm: Tensor
    flat: Tensor
    from_logits: bool
    log_err: Tensor | None = None  # every value within e^log_err of the exact one (float32-worked rows)
    beyond_err: Tensor | None = None  # |beyond - exact beyond| at most this (float32-worked rows)
    mismatch: Tensor | None = None  # |sum(values) + beyond - 1| at most this (float32-worked rows)

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


def rows(q: Tensor, from_logits: bool, k: int) -> Rows:
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
    log_err = beyond_err = mismatch = None
    if s.guarded():
        log_err = s.log_err
        # beyond and the summary's tail estimate the same mass: the triangle inequality
        beyond_err = (beyond - s.tail).abs() + s.tail_err
        mismatch = normalisation_mismatch(s.values, beyond)
    return Rows(s.values, s.log_values(), s.indices, beyond, s.vocab, s.lead_shape, s.norm, flat, from_logits,
                log_err, beyond_err, mismatch)


def round_down(cost: Tensor, r: Rows) -> Tensor:
    """A drafter-side certificate computed from ``r``, lowered to at most the exact one.

    Every drafter-side certificate is ``-log Z`` with ``Z`` a tilted normaliser: the mass beyond
    the pool plus a homogeneous function of the pool's values. The values are the exact ones times
    a common ``lambda`` (``|log lambda| <= log_err``), ``beyond`` is within ``beyond_err`` of the
    exact mass and makes them sum to 1 up to ``mismatch``:
    :func:`~companion.certify.precision.lower_log_normaliser`. Unchanged for float64
    rows and ``+inf``."""
    if r.log_err is None:
        return cost
    return lower_log_normaliser(cost, r.log_err, r.beyond_err, r.mismatch)


def lower_by_log_error(cost: Tensor, r: Rows) -> Tensor:
    """A drafter-side certificate that reads ``q`` through the logs of its values, lowered to at most the exact one.

    Typical acceptance's branch and bound (:mod:`companion.drafter.typical`) minimises
    ``sum_i p_i log(p_i / q^_i)`` over the rejected targets ``p``, where ``q^`` is the row as worked:
    ``log q^_i`` is within ``eta`` of ``log q_i`` for every token (``eta = log_err``: the draft's value and
    the runner-up's, which scales the other tokens' exact ratios, are each within ``e^log_err``), and
    ``q^`` need not sum to 1. For any distribution ``p``,
    ``|KL(p || q) - sum_i p_i log(p_i / q^_i)| = |sum_i p_i log(q^_i / q_i)| <= eta``, so the infimum
    over the rejected targets moves by at most ``eta``: the certificate is lowered by ``eta`` (plus
    float64 rounding), not by a relative factor (its cost is not of the ``-log Z`` kind
    :func:`round_down` assumes). Unchanged for float64 rows and ``+inf``; never below 0.
    """
    if r.log_err is None:
        return cost
    finite = torch.isfinite(cost)
    eta = r.log_err.to(cost.dtype) * (1 + 1e-6) + 1e-12 * (1 + torch.where(finite, cost.abs(), 0.0))
    return torch.where(finite, (cost - eta).clamp(min=0.0), cost)
