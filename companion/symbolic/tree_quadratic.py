"""Whether the quadratic ``(m+1) gamma**2 / 4`` bounds the margin-only tree certificate.

``phi_m(gamma)`` (:func:`companion.symbolic.certificates.phi`) is the tight certificate of a
greedy tree of width ``m`` that knows only the top-2 margin ``gamma``. A quadratic ``a gamma**2``
is below it at every margin in ``(0, 1]`` exactly when ``a <= c_m = min phi_m(gamma)/gamma**2``,
and ``c_m = m**2 log m / (m**2 - 1)`` at ``gamma = (m - 1)/m``
(:func:`companion.symbolic.certificates.tree_quadratic_constant`). :func:`check_quadratic`
verifies that minimiser in sympy (stationarity and value), confirms on a numeric grid that it is
the global minimum, decides ``(m+1)/4 <= c_m`` both ways, and finds the first margin where the
quadratic crosses above ``phi_m`` when it does. Chapter 5 tabulates it for ``m = 1..10``.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp
import torch
from scipy.optimize import brentq

from companion.checks import check_identical
from companion.certify.bounds import margin_only_bound
from companion.symbolic import certificates as S

GAMMA = sp.Symbol("gamma", positive=True)


@dataclass(frozen=True)
class QuadraticCheck:
    """For one width ``m``: the sharp constant ``c_m``, whether ``(m+1)/4 <= c_m``, and the first
    margin where ``(m+1) gamma**2/4 > phi_m(gamma)`` (None when it never is)."""

    m: int
    c_m: float
    valid: bool
    first_failure: float | None


def check_quadratic(m: int, grid: torch.Tensor) -> QuadraticCheck:
    """Check ``(m+1) gamma**2/4`` against ``phi_m`` (raises ``AssertionError`` when sympy and the
    float64 ``grid`` of margins in ``(0, 1]`` disagree)."""
    c_m = S.tree_quadratic_constant(m)
    if m >= 2:
        star = sp.Rational(m - 1, m)
        ratio = S.phi(m, GAMMA) / GAMMA**2
        check_identical(sp.diff(ratio, GAMMA).subs(GAMMA, star), 0,
                        f"m = {m}: phi_m/gamma^2 stationary at gamma = {star}")
        check_identical(ratio.subs(GAMMA, star), c_m, f"m = {m}: phi_m/gamma^2 at gamma = {star} is c_m")
        grid_min = float((margin_only_bound(grid, m) / grid**2).min())
        assert grid_min >= float(c_m) - 1e-9, \
            f"m = {m}: phi_m/gamma^2 reaches {grid_min:.12f} on the grid, below c_m = {float(c_m):.12f}"
    valid = bool(sp.Rational(m + 1, 4) <= c_m)
    diff = margin_only_bound(grid, m) - (m + 1) * grid**2 / 4
    assert valid == bool((diff >= -1e-12).all()), \
        (f"m = {m}: (m + 1)/4 <= c_m is {valid}, but the grid says {not valid} "
         f"(min of phi_m - (m + 1) gamma^2/4 on it: {float(diff.min()):.3g})")
    first = None
    if not valid:
        lo = float(grid[torch.nonzero(diff < 0)[0, 0] - 1])
        first = brentq(lambda x: float(margin_only_bound(x, m)) - (m + 1) * x * x / 4, lo, lo + 1e-3)
    return QuadraticCheck(m, float(c_m), valid, first)
