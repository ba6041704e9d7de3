"""The stochastic contrast: speculative sampling's acceptance in expectation.

Distribution-preserving speculative sampling accepts a draft ``x ~ q`` with probability
``min(1, p_x / q_x)``; averaged over ``x`` this is ``sum_x min(p_x, q_x) = 1 - TV(p, q)``.
Pinsker's inequality ``TV <= sqrt(KL/2)`` turns any KL budget into ``1 - TV >= 1 - sqrt(KL/2)``,
a guarantee in expectation, not per step (contrast with the certificates, which are per step).
"""
from __future__ import annotations

import torch
from torch import Tensor

from companion.certify.summary import normalized_probabilities


def total_variation(p: Tensor, q: Tensor, *, from_logits: bool = False) -> Tensor:
    """``TV(p, q) = (1/2) sum |p - q|``, float64 ``[...]``."""
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    a = normalized_probabilities(p, from_logits=from_logits, what="p")
    b = normalized_probabilities(q, from_logits=from_logits, what="q")
    return 0.5 * (a - b).abs().sum(-1)


def acceptance_probability(p: Tensor, q: Tensor, *, from_logits: bool = False) -> Tensor:
    """``sum min(p, q) = 1 - TV(p, q)``: speculative sampling's expected acceptance of one draft."""
    return 1.0 - total_variation(p, q, from_logits=from_logits)


def pinsker_lower_bound(kl: float | Tensor) -> Tensor:
    """``max(0, 1 - sqrt(KL / 2))``: Pinsker's lower bound on ``1 - TV`` from ``KL(p || q)`` (either direction)."""
    k = torch.as_tensor(kl, dtype=torch.float64)
    if bool((k < 0).any()):
        raise ValueError("KL must be non-negative")
    return (1.0 - torch.sqrt(k / 2)).clamp(min=0.0)
