"""The theory chapters' plumbing: the log 2 ceiling sweep, the precision price, the tree quadratic."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.analysis.ceiling import LOG2, check_ceiling, uniform_always_infinite
from companion.analysis.precision_price import lm_shaped_logits, precision_price
from companion.certify.oracle import brute_force_certificate
from companion.symbolic.tree_quadratic import check_quadratic
from companion import certificate, parse_criterion


def test_ceiling_sweep_counts_every_target_and_reaches_log2() -> None:
    specs = ["greedy", "additive:0.3", "topm:2"]
    stats = check_ceiling(specs, [3, 4], n_random=10, seed=0, ties="worst")
    # every family: 10 random + 12 near point masses + 11 two-point + 41 uniform-ish + 5 tiny rows
    assert stats.targets["greedy"] == 2 * (10 + 12 + 11 + 41 + 5)
    assert stats.finite["greedy"] + stats.infinite["greedy"] == stats.targets["greedy"]
    assert stats.infinite["greedy"] == 0 and stats.infinite["topm:2"] == 0
    assert abs(stats.largest["greedy"] - LOG2) < 1e-12        # the point mass reaches log 2
    assert all(v <= LOG2 + 1e-12 for v in stats.largest.values())
    assert uniform_always_infinite(stats, specs) == ["additive:0.3"]


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(0.01, 1.0), min_size=3, max_size=5))
def test_ceiling_holds_against_the_brute_force_oracle(weights: list[float]) -> None:
    p = np.array(weights) / sum(weights)
    for spec in ("greedy", "multiplicative:0.5"):
        brute = brute_force_certificate(p, parse_criterion(spec), "forward")
        ours = float(certificate(torch.tensor(p), spec))
        assert math.isinf(brute) == math.isinf(ours)       # infinite: nothing rejected
        if math.isfinite(brute):
            assert brute <= LOG2 + 1e-6 and abs(ours - brute) < 1e-5


def test_precision_price_is_zero_in_float64_and_small_in_bfloat16() -> None:
    z = lm_shaped_logits(2, 4096, seed=1)
    exact = precision_price(z, ["greedy", "multiplicative:0.1"], torch.float64)
    assert exact.error <= exact.bound and exact.price < 1e-12
    low = precision_price(z, ["greedy", "multiplicative:0.1", "typical:0.09,0.3"], torch.bfloat16)
    assert 0.0 <= low.price < 1e-3 and low.error <= low.bound
    assert set(low.prices) == {(s, d) for s in ("greedy", "multiplicative:0.1", "typical:0.09,0.3")
                               for d in ("forward", "reverse")}
    price, crit, div = low.largest(lambda c: not c.startswith("typical"))
    assert price == max(v for (c, _), v in low.prices.items() if not c.startswith("typical"))


@pytest.mark.parametrize("m, valid", [(1, True), (2, True), (6, True), (7, False), (8, False)])
def test_tree_quadratic_validity(m: int, valid: bool) -> None:
    grid = torch.linspace(1e-4, 1, 20001, dtype=torch.float64)
    q = check_quadratic(m, grid)
    assert q.valid is valid
    if m >= 2:
        assert q.c_m == pytest.approx(m * m * math.log(m) / (m * m - 1), rel=1e-15)
    if not valid:
        # at the reported margin the quadratic meets phi_m (independent evaluation of phi_m)
        g = q.first_failure
        phi = ((1 + m * g) * math.log(1 + m * g) + m * (1 - g) * math.log(1 - g)) / (m + 1)
        assert phi == pytest.approx((m + 1) * g * g / 4, abs=1e-9)
