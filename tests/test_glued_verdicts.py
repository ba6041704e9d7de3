"""Every verdict a chapter glues is the one its own glued numbers imply.

Chapters 8 and 10 will be rerun on other model pairs, so their summaries must follow the data:
here the executed chapter 10 of the built book (the ``built_book`` fixture runs the real
pipeline) is read back, and each glued verdict is recomputed from the glued numbers it
summarises with the same functions (``companion.book.prose``), whose branches
``tests/test_book_prose.py`` checks one by one. A verdict glued from other numbers than the ones
the page prints, or a summary that drops a null result or a caveat, fails here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from companion.book import prose
from companion.book.layout import Layout
from companion.book.stage import glued_values
from tests.conftest import ROOT

pytestmark = pytest.mark.book


@pytest.fixture
def chapter_10(built_book: Path) -> dict:
    path = Layout.at(ROOT).executed / "10_decode_time.ipynb"
    assert path.is_file(), f"{path} is missing after the book was built"
    return glued_values(path)


def test_chapter_10_box_quotes_the_clocks_own_ratios(chapter_10: dict) -> None:
    """The result box of chapter 10 glues the committed benchmark's ratios, recomputed from its runs,
    and each modelled ratio with an interval around it (the box once said "no resolved difference"
    where the clock resolved one: the numbers now come from the record, not from a sentence)."""
    from companion.speculative.clock import committed_wallclock, speedups

    v = chapter_10
    clock = speedups(committed_wallclock("qwen2.5-coder"))
    for key, name in (("vs_default", "ours certificate / hf default"), ("vs_best", "ours certificate / hf best")):
        for part, suffix in (("geomean", ""), ("lo", "_lo"), ("hi", "_hi")):
            assert v[f"ch10_clock_{key}{suffix}"] == pytest.approx(clock[name][part], rel=1e-12)
    plain = [clock[f"{m} / plain"]["geomean"] for m in ("hf default", "hf best", "ours certificate", "ours best")]
    assert (v["ch10_clock_x_min"], v["ch10_clock_x_max"]) == (pytest.approx(min(plain)), pytest.approx(max(plain)))
    for stem in ("ch10_ratio_default", "ch10_heldout", "ch10_ratio_top1", "ch10_ratio_margin"):
        assert v[f"{stem}_lo"] <= v[stem] <= v[f"{stem}_hi"], stem


def test_chapter_8_low_margin_summary_follows_its_numbers(built_book: Path) -> None:
    v = glued_values(Layout.at(ROOT).executed / "08_real_drafter.ipynb")
    expected = prose.low_margin_tightness(
        v["ch8_tight_greedy_lo"], {"multiplicative relaxation": v["ch8_tight_mult_lo"], "top-4": v["ch8_tight_topm_lo"]},
        overall_greedy=v["ch8_greedy_tight"])
    assert v["ch8_lowmargin_verdict"] == expected
    assert v["ch8_margin_trend"] == prose.margin_trend(v["ch8_tight_greedy_lo"], v["ch8_tight_greedy_hi"], "strict greedy")


def stability_verdicts_follow(v: dict) -> None:
    """Chapter 7's precision-and-batch sentences, recomputed from the numbers it glues beside them."""
    from companion.analysis import stability as st

    parted = outside = 0
    for key in ("prec", "batch", "fp"):
        if f"ch7_stab_{key}_answers" not in v:
            assert v[f"ch7_stab_{key}_words"] == "", f"{key}: words without numbers"
            continue
        steps, gaps, (a, b), cut = (v[f"ch7_stab_{key}_{x}"] for x in ("steps", "gaps", "names", "cut"))
        expected = (f"Over the first {cut} steps, " if cut else "") + st.parting_sentence(
            a, b, v[f"ch7_stab_{key}_answers"], steps, gaps, v["ch7_stab_band"])
        assert v[f"ch7_stab_{key}_words"] == expected
        assert ("outside" in expected) == any(g > v["ch7_stab_band"] for g in gaps)
        parted += len(steps)
        outside += sum(g > v["ch7_stab_band"] for g in gaps)
    shifts = [st.Shift(r, inside, total, float(largest), label) for r, inside, total, largest, label in v["ch7_stab_shifts"]]
    if shifts:
        assert st.statistics_sentence("this run", v["ch7_stab_common"], shifts) in v["ch7_stab_table_words"]
    moved = sum(s.inside < s.total for s in shifts)
    assert (v["ch7_stab_parted_total"], v["ch7_stab_outside_total"], v["ch7_stab_moved"]) == (parted, outside, moved)
    if parted or shifts:
        assert v["ch7_stab_conclusion"] == st.conclusion(parted, outside, moved)


def test_chapter_7_stability_verdicts_follow_its_numbers(built_book: Path) -> None:
    stability_verdicts_follow(glued_values(Layout.at(ROOT).executed / "07_paper_evaluation.ipynb"))
