"""The chapters' assertion helpers: they pass on what holds and say what failed, with numbers."""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch

from companion.book.checks import check_all, check_close, check_identical, check_le


def test_check_close_passes_within_tolerance_and_on_equal_infinities() -> None:
    check_close(torch.tensor([1.0, math.inf, 3.0]), np.array([1.0 + 1e-13, math.inf, 3.0]), "x", rtol=1e-12)
    check_close(np.array([math.nan]), np.array([math.nan]), "nan", equal_nan=True)


def test_check_close_names_the_worst_entry() -> None:
    with pytest.raises(AssertionError, match=r"tree vs greedy: 1 of 3 entries differ .* worst at \(1,\): 2\.5 vs 2\.0"):
        check_close([1.0, 2.5, 3.0], [1.0, 2.0, 3.0], "tree vs greedy")
    with pytest.raises(AssertionError, match="nan"):
        check_close([math.nan], [1.0], "nan is not close")
    with pytest.raises(AssertionError, match="1 of 1"):
        check_close([math.inf], [-math.inf], "opposite infinities")


def test_check_all_shows_values_at_the_first_failure() -> None:
    check_all(np.ones(4, dtype=bool), "all true")
    a = np.array([0.1, 0.5, 0.2])
    with pytest.raises(AssertionError, match=r"floor: fails on 2 of 3 entries \(first at 0, 2\); values there: 0\.1"):
        check_all(a > 0.3, "floor", a)


def test_check_le_allows_slack_and_reports_the_excess() -> None:
    check_le([1.0, math.inf], [1.0 - 1e-14, math.inf], "le", rtol=1e-12)
    with pytest.raises(AssertionError, match=r"ceiling: 1 of 2 entries break <=.*0\.8 > 0\.693"):
        check_le([0.5, 0.8], [math.log(2)] * 2, "ceiling")


def test_check_identical_uses_sympy() -> None:
    x = sp.symbols("x")
    check_identical(sp.sin(x) ** 2 + sp.cos(x) ** 2, 1, "pythagoras")
    with pytest.raises(AssertionError, match="differ by"):
        check_identical(x**2, x, "not equal")
