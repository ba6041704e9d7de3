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


