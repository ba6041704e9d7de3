"""Brute-force references for the worst case over tie-breaks (tests only).

Independent of the engine's ``tau_worst`` formulas: a token is *worst-case rejected* when the
rule as written (the level-set rule, recomputed in NumPy by :func:`companion.oracle.rejected_tokens`)
rejects it under an arbitrarily small perturbation of ``p``. For a token ``y`` the most
unfavourable perturbation lowers ``p_y`` and raises every other probability; a relative step of
``rel`` (far below every gap that is not an exact tie) breaks every tie against ``y`` and moves
``y`` below a threshold it sits exactly on, and nothing else. The worst-case certificate is then
``min`` over those tokens of the SLSQP per-token cost, and the worst-case tree certificate the
minimum over every maximiser ``g`` of ``p`` (the decoder's token under some tie-break) and every
set ``S`` of ``m`` tokens other than ``g`` of ``min { D(p, q) : q_z >= q_g, z in S }``.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from companion.oracle import _solve, brute_force_cost, rejected_tokens


def perturbed_against(p: np.ndarray, y: int, rel: float = 1e-9) -> np.ndarray:
    """``p`` with ``p_y`` lowered and every other entry raised by a relative ``rel`` (plus 1e-300
    absolute, so that zeros move too), renormalised."""
    d = np.ones(len(p))
    d[y] = -1.0
    q = p * (1 + rel * d) + 1e-300 * d
    return q / q.sum()


def worst_rejected_tokens(p: np.ndarray, spec: str, rel: float = 1e-9) -> np.ndarray:
    """Tokens the level-set rule rejects under the perturbation most unfavourable to each."""
    p = np.asarray(p, dtype=np.float64)
    return np.array([y for y in range(len(p)) if y in set(rejected_tokens(perturbed_against(p, y, rel), spec).tolist())],
                    dtype=np.int64)


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
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    best = math.inf
    for g in np.nonzero(p == p.max())[0]:
        others = [z for z in range(len(p)) if z != g]
        for subset in itertools.combinations(others, m):
            best = min(best, _solve(p, divergence, [(z, int(g)) for z in subset], restarts, rng))
    return best
