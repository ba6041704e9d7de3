"""An exact reference for target-side certificates on small rows (tests only).

Independent of the engine (no sorted scan, no pooling formula from the library, no float
threshold): the rejected set is decided in exact rational arithmetic, and each rejected token's
cost is found by enumerating every pool, at 60 significant digits.

* Rejected set (worst case over tie-breaks, the decoders' comparisons): ``p`` as exact fractions
  (normalised exactly), the criterion's parameters as the decimals they are written as
  (``Fraction("0.1")``). A token is rejected when its threshold test fails (``p_y >= tau``;
  ``>`` for typical acceptance is not covered here) or when its rank condition can fail: at
  least ``m`` other tokens with ``p_z >= p_y`` (a tie-break may put them all first).
* Cost of a token ``y``: ``min { D(p, q) : q_y >= q_z for all z }``. The minimiser is constant on
  some set ``P`` containing ``y`` and, for ``D = KL(p || q)``, equals ``p`` elsewhere, with the
  pool at the mean ``a`` of ``p`` over ``P``; for ``D = KL(q || p)`` it is ``p / Z`` elsewhere and
  ``g / Z`` on the pool (``g`` the geometric mean, ``Z = sum_{z not in P} p_z + |P| g``). Every
  ``P`` whose constrained minimiser is feasible (``p_z <= a``, resp. ``<= g``, off the pool) is
  enumerated; the smallest cost is the minimum (the minimiser's own ``P`` is among them).
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import mpmath

# Precision: the calling test module's MP_DPS (60 by default), set per test by conftest.py.


def _rank_limit(spec: str) -> int | None:
    name, _, args = spec.partition(":")
    if name == "greedy":
        return 1
    if name == "topm":
        return int(args)
    if name == "topk-delta":
        return int(args.split(",")[0])
    return None


def _threshold(spec: str, p: list[Fraction]) -> Fraction | None:
    """The threshold part ``tau`` (accept iff ``p_y >= tau``), None when the rule has none."""
    name, _, args = spec.partition(":")
    top = max(p)
    if name == "additive":
        return top - Fraction(args)
    if name == "multiplicative":
        return Fraction(args) * top
    if name == "topk-delta":
        return top - Fraction(args.split(",")[1])
    if name in ("greedy", "topm"):
        return None
    raise ValueError(f"no exact oracle for {spec!r}")


def exact_rejected(weights: list, spec: str) -> list[int]:
    """Tokens some tie-break rejects, decided in exact arithmetic; ``weights`` are numbers or
    decimal strings, normalised exactly."""
    w = [Fraction(x) for x in weights]
    total = sum(w)
    p = [x / total for x in w]
    tau = _threshold(spec, p)
    m = _rank_limit(spec)
    out = []
    for y, py in enumerate(p):
        below = tau is not None and py < tau
        rank_fails = m is not None and sum(1 for z, pz in enumerate(p) if z != y and pz >= py) >= m
        if below or rank_fails:
            out.append(y)
    return out


def exact_cost(weights: list, y: int, divergence: str) -> mpmath.mpf:
    """``min { D(p, q) : q_y >= q_z for all z }`` by enumeration of pools, at 60 digits."""
    w = [Fraction(x) for x in weights]
    total = sum(w)
    p = [mpmath.mpf(x.numerator) / mpmath.mpf(x.denominator) for x in (v / total for v in w)]
    others = [z for z in range(len(p)) if z != y]
    best = mpmath.inf
    for size in range(len(others) + 1):
        for extra in itertools.combinations(others, size):
            pool = (y,) + extra
            rest = [z for z in range(len(p)) if z not in pool]
            if divergence == "forward":
                a = sum(p[z] for z in pool) / len(pool)
                if any(p[z] > a for z in rest):
                    continue
                cost = sum(p[z] * mpmath.log(p[z] / a) for z in pool if p[z] > 0)
            else:
                if any(p[z] == 0 for z in pool):
                    continue  # q puts mass where p has none: KL(q || p) = inf
                g = mpmath.exp(sum(mpmath.log(p[z]) for z in pool) / len(pool))
                if any(p[z] > g for z in rest):
                    continue
                cost = -mpmath.log(sum(p[z] for z in rest) + len(pool) * g)
            best = min(best, cost)
    return best


def exact_certificate(weights: list, spec: str, divergence: str) -> mpmath.mpf:
    """``rho*`` in the worst case over tie-breaks: the cheapest rejected token, ``+inf`` if none."""
    return min((exact_cost(weights, y, divergence) for y in exact_rejected(weights, spec)), default=mpmath.inf)
