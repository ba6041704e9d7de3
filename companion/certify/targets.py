"""Families of target distributions the chapters and tests compute on.

* :func:`random_targets`: Dirichlet draws over small vocabularies, concentrations from 0.05 to
  5, with exact and near ties mixed in (every third row an exact tie, every fifth a near tie).
* :func:`two_top_target`: ``p = (p1, p2, r, ..., r)`` with the rest ``1 - p1 - p2`` spread evenly.
* :func:`geometric_tail_target`: top-1 ``p1``, the rest ``1 - p1`` spread over ``V - 1`` tokens
  geometrically; :func:`geometric_tail_tie` is the ``p1`` where the top two tie.
* :func:`perturb`: drafts ``q = softmax(log p + scale * noise)``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

CONCENTRATIONS = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)


def random_targets(n: int, seed: int, v_min: int = 3, v_max: int = 8, floor: float = 0.0) -> list[np.ndarray]:
    """``n`` targets over V in [v_min, v_max]: Dirichlet with concentrations from 0.05 to 5;
    every third has an exact tie (a copy of another entry, the top pair among them) and every
    fifth a near-tie (relative gap 1e-4). ``floor`` mixes in a uniform component so that
    every probability is positive (for the reverse-KL oracle, which needs ``p > 0``)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = int(rng.integers(v_min, v_max + 1))
        p = rng.dirichlet(np.full(v, CONCENTRATIONS[i % len(CONCENTRATIONS)]))
        order = np.argsort(-p)
        if i % 3 == 0:
            # exact tie: the top pair, or a lower pair, copied bit for bit
            a, b = (order[0], order[1]) if i % 2 == 0 else (order[1], order[2 % v])
            p[b] = p[a]
        elif i % 5 == 0:
            p[order[1]] = p[order[0]] * (1 - 1e-4)
        if floor:
            p = p + floor
        p = p / p.sum()
        out.append(p)
    return out


def two_top_target(p1: Tensor, p2: Tensor, vocab: int) -> Tensor:
    """``[..., V]`` targets ``(p1, p2, r, ..., r)`` with ``r = (1 - p1 - p2)/(V - 2)``.

    Raises if some row would not be sorted (``r > p2``) or ``p1 < p2``: the rest must stay below
    the runner-up for ``p2`` to be the boundary of the strict greedy rejection region.
    """
    p1 = torch.as_tensor(p1, dtype=torch.float64)
    p2 = torch.as_tensor(p2, dtype=torch.float64)
    if vocab < 3:
        raise ValueError("vocab must be at least 3")
    rest = (1 - p1 - p2) / (vocab - 2)
    if bool((rest < -1e-12).any()) or bool((rest > p2).any()) or bool((p2 > p1).any()):
        raise ValueError("need p1 >= p2 >= (1 - p1 - p2)/(V - 2) >= 0 on every row")
    rest = rest.clamp(min=0.0)
    tail = rest.unsqueeze(-1).expand(*rest.shape, vocab - 2)
    return torch.cat([p1.unsqueeze(-1), p2.unsqueeze(-1), tail], dim=-1)


def geometric_tail_target(p1: Tensor, vocab: int = 32, ratio: float = 0.7) -> Tensor:
    """``[..., V]`` targets: top-1 ``p1``, then ``p_i = (1 - p1) ratio**(i-2) / Z`` for ``i = 2..V``.

    ``Z = sum_{i=0}^{V-2} ratio**i``. The runner-up is ``p2 = (1 - p1)/Z``, so the family runs
    from a tie (``p1 = 1/(1 + Z)``) to a point mass (``p1 = 1``); rows with ``p1 < p2`` are
    rejected.
    """
    if not 0 < ratio < 1:
        raise ValueError("ratio must lie in (0, 1)")
    p1 = torch.as_tensor(p1, dtype=torch.float64)
    shape = ratio ** torch.arange(vocab - 1, dtype=torch.float64)
    shape = shape / shape.sum()
    tail = (1 - p1).unsqueeze(-1) * shape
    if bool((tail[..., 0] > p1 + 1e-15).any()):
        raise ValueError(f"p1 must be at least the tie point {geometric_tail_tie(vocab, ratio):.6g}")
    return torch.cat([p1.unsqueeze(-1), tail], dim=-1)


def geometric_tail_tie(vocab: int = 32, ratio: float = 0.7) -> float:
    """The ``p1`` at which :func:`geometric_tail_target` has ``p1 = p2``: ``1 / (1 + Z)``."""
    z = sum(ratio**i for i in range(vocab - 1))
    return 1.0 / (1.0 + z)


def perturb(p: Tensor, noise: Tensor, scale: float | Tensor) -> Tensor:
    """Drafts ``q = softmax(log p + scale * noise)`` in float64.

    ``scale`` is a number or a tensor broadcastable to ``p.shape[:-1]`` (one scale per row).
    """
    scale = torch.as_tensor(scale, dtype=torch.float64).unsqueeze(-1)
    return torch.softmax(torch.log(p.to(torch.float64)) + scale * noise.to(torch.float64), dim=-1)
