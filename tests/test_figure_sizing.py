"""Figure text is readable at the size the book shows it (the text column, 672 px at 1280 px).

The theory and experiment figures are checked in their own test files; here: the check itself
catches a figure drawn too wide, and the decode-time figures pass it too.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from companion.figures import decode_time as D
from companion.figures import palette as P
from companion.speculative.compare import PolicySummary
from tests.figure_checks import displayed_sizes, saved_width_in, too_small_when_shown


def _panel(fig: Figure) -> Figure:
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_title("title", fontsize=P.TITLE_SIZE)
    ax.legend(fontsize=P.LEGEND_SIZE)
    return P.set_sizes(fig)


def test_check_flags_a_wide_figure_and_passes_the_book_width() -> None:
    wide = _panel(Figure(figsize=(12, 4), layout="constrained"))
    small = dict(too_small_when_shown(wide))
    # at 12 in, 9-10 pt fonts are shown at about 5.2-5.8 pt
    assert "a line" in small and small["a line"] < 5.5, small
    book = _panel(P.new_figure(3.0))
    assert too_small_when_shown(book) == []
    assert min(pt for _, pt in displayed_sizes(book)) >= P.MIN_DISPLAY_PT
    assert saved_width_in(book) <= P.DISPLAY_WIDTH_IN


def test_displayed_size_is_the_column_over_the_saved_width() -> None:
    fig = _panel(P.new_figure(3.0))
    (pt,) = [pt for text, pt in displayed_sizes(fig) if text == "a line"]
    assert pt == P.LEGEND_SIZE * P.DISPLAY_WIDTH_IN / saved_width_in(fig)


def test_decode_time_figures_are_readable() -> None:
    rng = np.random.default_rng(0)
    u = rng.uniform(size=500)
    reliability = D.score_reliability({"certificate": u, "top1": 1 - u}, rng.uniform(size=500) < u, n_bins=5)
    rows = [PolicySummary(name, 100, 0.5, 0.5, 1.0, cost, 100.0)
            for name, cost in (("constant:0", 1.0), ("constant:3", 0.8), ("confidence:0.4", 0.9), ("certificate", 0.75))]
    costs = D.policy_costs(rows, builtins=["constant:0", "constant:3", "confidence:0.4"], best="constant:3")
    for name, fig in (("score_reliability", reliability), ("policy_costs", costs)):
        assert too_small_when_shown(fig) == [], f"{name}: text under 9 pt at the book's column width"
