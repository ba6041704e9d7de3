"""A brute-force reference for the certificates, for small vocabularies (tests and chapters).

It uses none of the structure the fast engine relies on (pooling, monotonicity, the sorted
scan): for every rejected token ``y`` it minimises ``D(p, q)`` over ``q = softmax(theta)``
subject to the linear constraints ``theta_y >= theta_z`` with scipy's SLSQP from several
starts, and takes the minimum over ``y``. Thresholds are recomputed here in NumPy from the
criterion's parameters, again independently of the engine. Cost grows like ``V`` solves of a
``V``-dimensional problem: keep ``V`` small (<= 10).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import minimize

from companion.criteria import (
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criterion,
)


def _softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max())
    return z / z.sum()


def _objective(p: np.ndarray, divergence: str):
    logp = np.log(np.where(p > 0, p, 1.0))

    def forward(theta: np.ndarray) -> tuple[float, np.ndarray]:
        q = _softmax(theta)
        lse = theta.max() + math.log(np.exp(theta - theta.max()).sum())
        value = float(np.sum(p * (logp - theta)) + lse)
        return value, q - p

    def reverse(theta: np.ndarray) -> tuple[float, np.ndarray]:
        shift = theta.max()
        logq = theta - shift - math.log(np.exp(theta - shift).sum())
        q = np.exp(logq)
        g = logq - logp
        value = float(np.sum(q * g))
        return value, q * (g - value)

    if divergence == "forward":
        return forward
    if divergence == "reverse":
        if np.any(p <= 0):
            raise ValueError("the reverse-KL oracle needs p > 0 everywhere")
        return reverse
    raise ValueError(f"unknown divergence {divergence!r}")


def _solve(p: np.ndarray, divergence: str, pairs: list[tuple[int, int]], restarts: int, rng: np.random.Generator) -> float:
    """min D(p, softmax(theta)) s.t. theta_hi >= theta_lo for each (hi, lo) in pairs."""
    fun = _objective(p, divergence)
    v = len(p)
    a = np.zeros((len(pairs), v))
    for row, (hi, lo) in enumerate(pairs):
        a[row, hi], a[row, lo] = 1.0, -1.0
    constraints = [{"type": "ineq", "fun": lambda t: a @ t, "jac": lambda t: a}]
    # Starts: uniform q, q = p itself (feasible or not), then perturbations of p. Tiny entries
    # of p sit at theta ~ log p far from 0, which SLSQP reaches slowly from the uniform start.
    base = np.log(np.clip(p, 1e-300, None))
    starts = [np.zeros(v), base] + [base + rng.normal(scale=1.0, size=v) for _ in range(max(restarts - 2, 0))]
    best = math.inf
    for theta0 in starts:
        res = minimize(fun, theta0, jac=True, method="SLSQP", constraints=constraints,
                       options={"ftol": 1e-15, "maxiter": 1000})
        if np.all(a @ res.x >= -1e-9):
            best = min(best, float(res.fun))
    return best


def _entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def rejected_tokens(p: np.ndarray, criterion: Criterion | str) -> np.ndarray:
    """Indices of the rejection region, computed in NumPy from the criterion's definition."""
    c = parse_criterion(criterion)
    s = np.sort(p)[::-1]
    if isinstance(c, StrictGreedy):
        tau = s[0]
    elif isinstance(c, AdditiveRelaxed):
        tau = s[0] - c.delta
    elif isinstance(c, MultiplicativeRelaxed):
        tau = c.alpha * s[0]
    elif isinstance(c, TopM):
        tau = s[c.m - 1]
    elif isinstance(c, TopKDelta):
        tau = max(s[c.k - 1], s[0] - c.delta)
    elif isinstance(c, Typical):
        tau = min(c.eps, c.delta * math.exp(-_entropy(p)))
        return np.nonzero(p <= tau)[0]
    else:
        raise TypeError(f"no oracle for {type(c).__name__}")
    return np.nonzero(p < tau)[0]


def brute_force_cost(p: np.ndarray, y: int, divergence: str = "forward", restarts: int = 3, seed: int = 0) -> float:
    """``min { D(p, q) : q_y >= q_z for all z }`` by SLSQP."""
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    pairs = [(y, z) for z in range(len(p)) if z != y]
    return _solve(p, divergence, pairs, restarts, rng)


def brute_force_certificate(p: np.ndarray, criterion: Criterion | str, divergence: str = "forward",
                            restarts: int = 3, seed: int = 0) -> float:
    """``min over rejected y`` of :func:`brute_force_cost`; ``inf`` when nothing is rejected."""
    p = np.asarray(p, dtype=np.float64)
    rejected = rejected_tokens(p, criterion)
    return min((brute_force_cost(p, int(y), divergence, restarts, seed) for y in rejected), default=math.inf)


def brute_force_tree_certificate(p: np.ndarray, m: int, divergence: str = "forward",
                                 restarts: int = 3, seed: int = 0) -> float:
    """Min over every set ``S`` of ``m`` non-maximisers of ``p`` of
    ``min { D(p, q) : q_z >= q_g for z in S and every maximiser g of p }`` (enumerates all
    subsets): the drafter's top ``m``, ties broken against us, then holds no maximiser of ``p``.
    ``inf`` when fewer than ``m`` tokens are not maximisers."""
    p = np.asarray(p, dtype=np.float64)
    maximisers = np.nonzero(p == p.max())[0]
    rng = np.random.default_rng(seed)
    others = [z for z in range(len(p)) if p[z] != p.max()]
    return min((_solve(p, divergence, [(z, int(g)) for z in subset for g in maximisers], restarts, rng)
                for subset in itertools.combinations(others, m)), default=math.inf)
