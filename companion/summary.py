"""One pass over a batch of target distributions: what every criterion and certificate needs.

Every criterion's threshold depends on the target only through a few order statistics
(``p(1)``, ``p(k)``) and, for typical acceptance, the entropy ``H(p)``; every certificate
depends only on the tokens at or above the boundary of the rejection region. So instead of
sorting 151,936 probabilities we take the top ``K`` of each row once (``torch.topk``), lift
those few values to float64, and reuse them for all criteria. Rows whose boundary lies
beyond ``K`` are rare and are recomputed from a full sort (see ``certificates``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from companion.validation import logsumexp_checked, row_sums

DEFAULT_TOP = 64


@dataclass(frozen=True)
class TopSummary:
    """Normalised float64 top-``K`` probabilities of a batch of rows, flattened to ``[N, K]``.

    ``values[n]`` is sorted in decreasing order, ``indices[n]`` are the token ids, ``vocab`` is
    ``V``; ``entropy`` (nats, float64) is present when requested. ``lead_shape`` restores the
    caller's leading dimensions.
    """

    values: Tensor
    indices: Tensor
    vocab: int
    lead_shape: torch.Size
    entropy: Tensor | None = None

    @property
    def k(self) -> int:
        return self.values.shape[-1]

    @property
    def complete(self) -> bool:
        """True when the summary holds the whole sorted distribution (``K == V``)."""
        return self.k == self.vocab


def summarize(
    p: Tensor,
    *,
    from_logits: bool = False,
    k: int = DEFAULT_TOP,
    with_entropy: bool = False,
    what: str = "p",
) -> TopSummary:
    """Validate ``p`` (probabilities, or logits with ``from_logits=True``) and summarise it.

    Probabilities: ``values = topk(p) / sum(p)`` in float64.
    Logits ``l``: ``values = exp(topk(l) - logsumexp(l))`` computed in float64 from the logits,
    so near-ties keep the precision of the logits rather than that of a float32 softmax.
    Entropy: ``H = -sum_i p_i log p_i`` accumulated in float64.
    """
    vocab = p.shape[-1] if p.dim() >= 1 else 0
    k = max(1, min(int(k), vocab)) if vocab else 1
    if from_logits:
        lse = logsumexp_checked(p, what="logits" if what == "p" else what)
        top_l, idx = torch.topk(p, k, dim=-1, largest=True, sorted=True)
        values = torch.exp(top_l.to(torch.float64) - lse.unsqueeze(-1))
        entropy = None
        if with_entropy:
            work = p if p.dtype in (torch.float32, torch.float64) else p.float()
            logp = work - lse.to(work.dtype).unsqueeze(-1)
            # -sum p log p with p log p := 0 where p == 0 (masked tokens have logp = -inf).
            plogp = torch.where(torch.isneginf(logp), torch.zeros_like(logp), logp.exp() * logp)
            entropy = -plogp.sum(-1, dtype=torch.float64)
    else:
        sums = row_sums(p, what=what)
        top_p, idx = torch.topk(p, k, dim=-1, largest=True, sorted=True)
        values = top_p.to(torch.float64) / sums.unsqueeze(-1)
        entropy = None
        if with_entropy:
            work = p if p.dtype in (torch.float32, torch.float64) else p.float()
            ent = torch.special.entr(work).sum(-1, dtype=torch.float64)
            # H of p/s equals (H(p) + s log s) / s for an unnormalised row with sum s.
            entropy = (ent + torch.xlogy(sums, sums)) / sums
    lead = p.shape[:-1]
    return TopSummary(
        values=values.reshape(-1, k),
        indices=idx.reshape(-1, k),
        vocab=vocab,
        lead_shape=lead,
        entropy=None if entropy is None else entropy.reshape(-1),
    )


def sorted_rows(p: Tensor, *, from_logits: bool = False, with_entropy: bool = False, what: str = "p") -> TopSummary:
    """The complete summary (``K = V``): every row fully sorted. For witnesses and fallbacks."""
    return summarize(p, from_logits=from_logits, k=p.shape[-1], with_entropy=with_entropy, what=what)


def normalized_probabilities(p: Tensor, *, from_logits: bool = False, what: str = "p") -> Tensor:
    """Validated float64 probabilities ``p / sum(p)`` (or ``softmax(logits)``), same shape."""
    if from_logits:
        lse = logsumexp_checked(p, what="logits" if what == "p" else what)
        return torch.exp(p.to(torch.float64) - lse.unsqueeze(-1))
    sums = row_sums(p, what=what)
    return p.to(torch.float64) / sums.unsqueeze(-1)
