"""Strict greedy's margin bounds: Delta^2/(2s) <= rho* <= (log 2) Delta^2/s, both sharp, no exact tie."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.certify.bounds import greedy_margin_bounds
from companion.certify.certificates import certificate
from companion.certify.targets import random_targets


def test_sharp_bounds_hold_on_random_targets_without_ties() -> None:
    for p in random_targets(300, seed=5, v_min=2, v_max=12):
        pt = torch.tensor(p, dtype=torch.float64)
        top = np.sort(p)[::-1]
        if top[0] == top[1]:
            continue
        rho = float(certificate(pt, "greedy"))
        lo, hi = (float(x) for x in greedy_margin_bounds(pt))
        _, loose = (float(x) for x in greedy_margin_bounds(pt, upper="chi-square"))
        assert lo <= rho * (1 + 1e-12), (p, lo, rho)
        assert rho <= hi * (1 + 1e-12), (p, rho, hi)
        assert hi < loose or hi == loose == 0.0


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.02, 1.0), frac=st.floats(1e-6, 0.999), rest_share=st.floats(0.0, 0.9))
def test_the_upper_constant_log2_is_never_exceeded(a: float, frac: float, rest_share: float) -> None:
    b = a * frac
    rest = rest_share * b  # spread below b over 10 tokens, so p(2) = b stays the boundary
    p = torch.tensor([a, b] + [rest / 10] * 10, dtype=torch.float64)
    p = p / p.sum()
    rho = float(certificate(p, "greedy"))
    _, hi = greedy_margin_bounds(p)
    assert rho <= float(hi) * (1 + 1e-12)


def test_the_upper_constant_is_approached_as_the_runner_up_vanishes() -> None:
    ratios = []
    for eps in (1e-1, 1e-3, 1e-6, 1e-9):
        p = torch.tensor([1 - eps, eps], dtype=torch.float64)
        _, hi = greedy_margin_bounds(p)
        ratios.append(float(certificate(p, "greedy")) / float(hi))
    assert all(r1 < r2 for r1, r2 in zip(ratios, ratios[1:])), ratios
    assert ratios[-1] > 1 - 1e-6, ratios


def test_ties_get_no_upper_bound_because_the_formula_fails_there() -> None:
    # ties="level-set": two maximisers a and the boundary b, the pool holds three tokens and the
    # two-token formula (log 2) Delta^2 / s with Delta = a - b, s = a + b underestimates rho*.
    # The default worst case gives rho* = 0 on a tied top, and the lower bound 0 too.
    worst = 0.0
    for b in np.linspace(0.001, 0.3, 300):
        a = (1 - b) / 2
        p = torch.tensor([a, a, b], dtype=torch.float64)
        rho = float(certificate(p, "greedy", ties="level-set"))
        worst = max(worst, rho / (math.log(2) * (a - b) ** 2 / (a + b)))
        lo, hi = greedy_margin_bounds(p, ties="level-set")
        assert math.isinf(float(hi)) and float(lo) <= rho * (1 + 1e-12)
        lo, hi = greedy_margin_bounds(p)
        assert float(certificate(p, "greedy")) == 0.0 == float(lo) and math.isinf(float(hi))
    assert 1.15 < worst < 1.2, worst  # two tied maximisers; more ties push it higher


def test_upper_must_be_named() -> None:
    with pytest.raises(ValueError, match="sharp"):
        greedy_margin_bounds(torch.tensor([0.6, 0.4]), upper="tight")
