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


def test_ratio_phrase_states_the_numbers() -> None:
    assert "about 10% cheaper than X" in prose.ratio_phrase(CHEAP, "X")
    assert "about 20% dearer than X" in prose.ratio_phrase(DEAR, "X")
    # a resolved difference under 1 % keeps a decimal: it once read "about 0% dearer"
    assert "about 0.3% dearer than X" in prose.ratio_phrase(type(DEAR)(1.003, 1.001, 1.004), "X")
    assert "not resolved from X" in prose.ratio_phrase(OPEN, "X") and "below 1 by 2.0%" in prose.ratio_phrase(OPEN, "X")
    # a point estimate that rounds to 0.0% off 1 is given as the ratio, not as "below 1 by 0.0%"
    tiny = prose.ratio_phrase(type(OPEN)(0.99983, 0.98, 1.01), "X")
    assert "0.9998, within 0.05% of 1, and its interval contains 1" in tiny and "0.0%" not in tiny, tiny
    assert "the ratio is exactly 1 and its interval contains 1" in prose.ratio_phrase(type(OPEN)(1.0, 0.99, 1.01), "X")
    assert "cost the same on every prompt" in prose.ratio_phrase(SAME, "X")


def test_two_identical_outcomes_are_said_once() -> None:
    """The sentence once read "... so the two cost the same on every prompt, and ... so the two
    cost the same on every prompt": the same outcome must be stated once for both."""
    text = prose.comparisons_phrase([(SAME, "A"), (SAME, "B")])
    assert text.count("cost the same on every prompt") == 1, text
    assert "A and B" in text
    mixed = prose.comparisons_phrase([(SAME, "A"), (CHEAP, "B")])
    assert mixed.count("cost the same") == 1 and "cheaper than B" in mixed, mixed
    assert "on every prompt; and it is about 10% cheaper than B" in mixed, mixed


@pytest.mark.parametrize("top1, margin, expect", [
    (SAME, SAME, "added nothing measurable over q(1) or the plain margin"),
    (OPEN, SAME, "added nothing measurable"),
    (OPEN, OPEN, "added nothing measurable"),
    (CHEAP, CHEAP, "as a score, paid"),
    (DEAR, OPEN, "cost more than it bought"),
    (CHEAP, DEAR, "had mixed effects"),
    (CHEAP, OPEN, "had mixed effects"),
])
def test_score_added_has_a_branch_per_outcome(top1: R, margin: R, expect: str) -> None:
    text = prose.score_added(top1, margin)
    assert expect in text, text
    assert text.count("cost the same on every prompt") <= 1, text


def test_at_ceiling_compares_at_the_printed_digits() -> None:
    assert prose.at_ceiling(4.4213, 4.4187)      # both print as 4.42
    assert not prose.at_ceiling(4.40, 4.42)


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


@pytest.mark.parametrize("relaxed, expect", [
    ({"multiplicative relaxation": 0.4, "top-4": 0.5}, "explain more: 40.0% of multiplicative relaxation's, 50.0% of top-4's"),
    ({"multiplicative relaxation": 0.05, "top-4": 0.1}, "explain no more than strict greedy"),
    ({"multiplicative relaxation": 0.4, "top-4": 0.05}, "some relaxed criteria explain more"),
])
def test_low_margin_tightness_follows_the_numbers(relaxed: dict, expect: str) -> None:
    text = prose.low_margin_tightness(0.1, relaxed, overall_greedy=0.6)
    assert expect in text and "against 10.0% of strict greedy's" in text, text
    assert text.startswith("They explain only part")
    assert prose.low_margin_tightness(0.1, relaxed, overall_greedy=1.0).startswith("Here they explain every one")


def test_margin_trend_follows_the_numbers() -> None:
    assert "more of the acceptances at large margins" in prose.margin_trend(0.6, 0.9, "Strict greedy")
    assert "fewer of the acceptances at large margins" in prose.margin_trend(0.9, 0.6, "Strict greedy")
    assert "the same share" in prose.margin_trend(0.9, 0.9, "Strict greedy")
    assert "(90.0% against 60.0%)" in prose.margin_trend(0.6, 0.9, "Strict greedy")


def test_percent_drops_the_sign_of_a_value_that_rounds_to_zero():
    assert prose.percent(-0.001) == "0%" and prose.percent(0.001) == "0%"
    assert prose.percent(-0.006) == "-1%" and prose.percent(-0.10) == "-10%" and prose.percent(0.1234, 1) == "12.3%"
    assert prose.percent(-0.0004, 1) == "0.0%" and prose.percent(-0.0006, 1) == "-0.1%"


def test_two_comparisons_of_one_outcome_are_said_in_one_clause() -> None:
    """On the Qwen pair's CI runs both calibrated rules came out unresolved, at 0.7% and 0.7%, then at 2.8% and
    2.6%: the sentence names both in one clause, each number once, and repeats no clause (the book's own check)."""
    import re

    from companion.book.prose import comparisons_phrase
    from companion.speculative.compare import RatioEstimate

    def clauses(text: str) -> list[str]:
        return [c.strip() for c in re.split(r"[,;:.]", text) if len(c.strip()) > 20]

    for a, b in ((RatioEstimate(0.9931, 0.97, 1.01), RatioEstimate(0.9934, 0.975, 1.02)),
                 (RatioEstimate(0.972, 0.93, 1.01), RatioEstimate(0.974, 0.94, 1.02)),
                 (RatioEstimate(0.95, 0.93, 0.97), RatioEstimate(0.90, 0.85, 0.93)),
                 (RatioEstimate(1.05, 1.02, 1.08), RatioEstimate(1.30, 1.2, 1.4))):
        text = comparisons_phrase([(a, "the rule driven by q(1) alone"), (b, "the rule driven by the plain margin")])
        cs = clauses(text)
        assert len(cs) == len(set(cs)), text
        assert "q(1) alone and the rule driven by the plain margin" in text and "respectively" in text, text
    text = comparisons_phrase([(RatioEstimate(0.972, 0.93, 1.01), "A"), (RatioEstimate(0.95, 0.93, 0.97), "B")])
    assert "not resolved from A" in text and "cheaper than B" in text
    # one ratio below 1 and one within 0.05% of it (this build's chapter 10): each is a number with its side of 1
    text = comparisons_phrase([(RatioEstimate(0.9941, 0.986, 1.002), "A"), (RatioEstimate(1.0002, 0.993, 1.007), "B")])
    assert "the ratios are 0.994 (below 1 by 0.6%) and 1.0002 (within 0.05% of 1) respectively" in text, text
