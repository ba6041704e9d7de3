"""Brute-force references for the worst case over tie-breaks (tests only).

The oracles themselves live in :mod:`companion.certify.oracle` (``ties="worst"``): independent of the
engine's ``tau_worst`` formulas, a token is *worst-case rejected* when the rule as written (the
level-set rule, recomputed in NumPy) rejects it under an arbitrarily small perturbation of ``p``
(:func:`companion.certify.oracle.perturbed_against`: ``p_y`` lowered, every other probability raised by
a relative ``rel``). The worst-case certificate is ``min`` over those tokens of the SLSQP
per-token cost, and the worst-case tree certificate the minimum over every maximiser ``g`` of
``p`` and every set ``S`` of ``m`` tokens other than ``g`` of ``min { D(p, q) : q_z >= q_g, z in S }``.
This module keeps the names the tests use, and pairs the worst case with the level-set oracle.
"""
from __future__ import annotations

import math

import numpy as np

from companion.certify.oracle import brute_force_cost, brute_force_tree_certificate, perturbed_against, rejected_tokens

__all__ = ["perturbed_against", "worst_rejected_tokens", "worst_certificate", "worst_tree_certificate"]


def worst_rejected_tokens(p: np.ndarray, spec: str, rel: float = 1e-9) -> np.ndarray:
    """Tokens the level-set rule rejects under the perturbation most unfavourable to each."""
    return rejected_tokens(p, spec, ties="worst", rel=rel)


def worst_certificate(p: np.ndarray, spec: str, divergence: str, restarts: int = 2, seed: int = 0,
                      rel: float = 1e-9) -> tuple[float, float]:
    """``(worst-case oracle, level-set oracle)``: min of :func:`brute_force_cost` over the worst-case
    and over the level-set rejected tokens (the latter a subset of the former: asserted)."""
    p = np.asarray(p, dtype=np.float64)
    worst = set(worst_rejected_tokens(p, spec, rel).tolist())
    level = set(rejected_tokens(p, spec).tolist())
    assert level <= worst, (p.tolist(), spec, sorted(level), sorted(worst))
    costs = {y: brute_force_cost(p, y, divergence, restarts, seed) for y in sorted(worst)}
    return (min((costs[y] for y in worst), default=math.inf), min((costs[y] for y in level), default=math.inf))


def worst_tree_certificate(p: np.ndarray, m: int, divergence: str, restarts: int = 2, seed: int = 0) -> float:
    """``min_g min_S min { D(p, q) : q_z >= q_g for z in S }`` over maximisers ``g`` of ``p`` and
    sets ``S`` of ``m`` tokens other than ``g`` (enumerated); ``inf`` when ``m >= V``."""
    return brute_force_tree_certificate(p, m, divergence, restarts, seed, ties="worst")
