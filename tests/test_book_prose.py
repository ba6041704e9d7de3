"""The book's computed verdicts (companion.book.prose): one test per outcome branch, each checked
against the numbers it summarises, and the table directive (companion.book.tables)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from companion.book import prose
from companion.book.tables import table_directive


@dataclass(frozen=True)
class R:
    point: float
    lo: float
    hi: float


SAME, CHEAP, DEAR, OPEN = R(1.0, 1.0, 1.0), R(0.9, 0.85, 0.95), R(1.2, 1.1, 1.3), R(0.98, 0.9, 1.05)


def test_outcome_branches_follow_the_interval() -> None:
    assert prose.outcome(SAME) == prose.SAME
    assert prose.outcome(CHEAP) == prose.CHEAPER
    assert prose.outcome(DEAR) == prose.DEARER
    assert prose.outcome(OPEN) == prose.UNRESOLVED
    # a ratio of exactly 1 by point estimate but an interval around it is not "the same"
    assert prose.outcome(R(1.0, 0.99, 1.01)) == prose.UNRESOLVED
    # interval touching 1 is not resolved
    assert prose.outcome(R(0.95, 0.9, 1.0)) == prose.UNRESOLVED


@given(st.floats(0.2, 3.0), st.floats(0.0, 0.5), st.floats(0.0, 0.5))
def test_outcome_agrees_with_the_interval_everywhere(point: float, below: float, above: float) -> None:
    est = R(point, point - below, point + above)
    kind = prose.outcome(est)
    if kind == prose.CHEAPER:
        assert est.hi < 1
    elif kind == prose.DEARER:
        assert est.lo > 1
    elif kind == prose.UNRESOLVED:
        assert est.lo <= 1 <= est.hi and not (est.lo == est.hi == 1)
    else:
        assert est.lo == est.point == est.hi == 1


def test_table_directive_numbers_and_captions() -> None:
    md = "| a | b |\n|---|---|\n| 1 | 2 |"
    out = table_directive(md, "A caption\n over two lines.", "tbl-x1")
    assert out.startswith("::::{table} A caption over two lines.\n:name: tbl-x1\n")
    assert md in out and out.rstrip().endswith("::::")
    with pytest.raises(ValueError, match="name must be lower case"):
        table_directive(md, "c", "Tbl X")
    with pytest.raises(ValueError, match="caption must be a non-empty"):
        table_directive(md, "  ", "tbl-x")
    with pytest.raises(ValueError, match="pipe table"):
        table_directive("not a table", "c", "tbl-x")


def test_percent_drops_the_sign_of_a_value_that_rounds_to_zero():
    assert prose.percent(-0.001) == "0%" and prose.percent(0.001) == "0%"
    assert prose.percent(-0.006) == "-1%" and prose.percent(-0.10) == "-10%" and prose.percent(0.1234, 1) == "12.3%"
    assert prose.percent(-0.0004, 1) == "0.0%" and prose.percent(-0.0006, 1) == "-0.1%"
