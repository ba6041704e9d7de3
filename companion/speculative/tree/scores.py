"""The certified tree policy's scores: the drafter-side ``tree:m`` certificates from the top of the drafter's row.

The certified policy reads, at every node of its spine, ``u_m = 1 - exp(-rho_m(q))`` for ``m = 1 .. M``, where
``rho_m(q)`` is the drafter-side certificate of a greedy tree of width ``m`` (:mod:`companion.drafter.certificates`):
the least ``KL(p || q)`` of a target whose greedy token lies outside ``q``'s top ``m``. Its minimiser lifts
``q(m+1)``'s token to the top, pooled at one level ``G`` (the pooled values' geometric mean) with the ``j``
strongest tokens it must reach, the others keeping their mass, so that

    ``rho_m = min_j -log(1 - S_j + (j + 1) G_j)``, ``S_j = q(m+1) + sum_{i <= j} q(i)``,

over the pools ``j = 1 .. m`` whose level is not below the strongest token left out (``G_j >= q(j+1)`` for
``j < m``: otherwise the lifted token is not the top), each a rejected target, the best of them the minimiser.
That reads only the top ``M + 1`` probabilities: one softmax and one ``topk`` over the row, under a
millisecond for a float32 row of 151,936 tokens on this book's CPU, where the library's certified path (its
summary of the top 64, the tail summed apart, the rounding bounds) costs tens of milliseconds. The score steers
a shape and promises nothing (the policy calibrates it online), so it takes float32 probabilities (relative
error about 1e-6) without the lowering that makes a printed certificate a promise;
``tests/test_tree_scores.py`` holds it to the library's certificate.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["tree_scores"]


def tree_scores(rows: Tensor, width: int) -> np.ndarray:
    """``u_m = 1 - exp(-rho_m)`` for ``m = 1 .. min(width, V - 1)`` of every row of drafter logits ``rows``
    (``[N, V]`` or ``[V]``): float64 ``[N, M]`` (``[M]`` for one row)."""
    one = rows.dim() == 1
    x = (rows[None] if one else rows).float()
    widths = min(width, x.shape[-1] - 1)
    if widths < 1:
        raise ValueError(f"tree scores need a vocabulary of at least 2 tokens, got {x.shape[-1]}")
    # torch's softmax is one vectorised pass; its float32 values carry a relative error of about 1e-6
    q = torch.softmax(x, dim=-1).topk(widths + 1, dim=-1).values.double()   # q(1) >= .. >= q(M+1)
    logq = torch.log(q)
    out = torch.empty(q.shape[0], widths, dtype=torch.float64)
    prefix = torch.cumsum(q, dim=-1)
    prefix_log = torch.cumsum(logq, dim=-1)
    for m in range(1, widths + 1):
        best = torch.full((q.shape[0],), torch.inf, dtype=torch.float64)
        for j in range(1, m + 1):
            g = torch.exp((prefix_log[:, j - 1] + logq[:, m]) / (j + 1))
            z = 1.0 - (prefix[:, j - 1] + q[:, m]) + (j + 1) * g
            cost = -torch.log(z.clamp(min=1e-300))
            ok = torch.ones_like(cost, dtype=torch.bool) if j == m else g >= q[:, j]
            best = torch.where(ok, torch.minimum(best, cost), best)
        out[:, m - 1] = best.clamp(min=0.0)
    u = -torch.expm1(-out).numpy()
    return u[0] if one else u
