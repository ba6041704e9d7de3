"""Figure text is readable at the size the book shows it (the text column, 672 px at 1280 px).

The theory and experiment figures are checked in their own test files; here: the check itself
catches a figure drawn too wide, and the decode-time figures pass it too.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from companion.figures import decode_time as D
from companion.figures import palette as P
from companion.speculative.compare import PolicySummary, RatioEstimate
from companion.speculative.replay import GridRow
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


def _grid_row(shape: str, c: float) -> GridRow:
    """A cost model of the replay grid with made-up ratios (only the drawing is under test)."""
    to_oracle = {"constant:3": 1.3 + c, "constant:9": 1.2 + c, "confidence:0.4": 1.4, "certificate": 1.2 + c / 2,
                 "top1": 1.25, "margin": 1.1 + c / 2}
    best = min(to_oracle, key=to_oracle.get)
    return GridRow(shape=shape, c=c, oracle_cost=0.3, costs={p: 0.3 * x for p, x in to_oracle.items()},
                   to_oracle=to_oracle, best_constant="constant:9", best_policy=best, default="confidence:0.4",
                   cert_vs_constant=RatioEstimate(0.95, 0.9, 1.01), cert_vs_default=RatioEstimate(0.9, 0.85, 0.95),
                   cert_vs_oracle=RatioEstimate(1.2 + c / 2, 1.1 + c / 2, 1.3 + c / 2),
                   best_vs_oracle=RatioEstimate(1.1, 1.05, 1.15), gap_closed={p: 0.5 for p in to_oracle})


def test_replay_figure_is_readable_and_its_tick_labels_do_not_collide() -> None:
    from companion.figures import replay as R
    from tests.figure_checks import extent, overlapping

    # the chapter's grid: c = 0.02 .. 1 (replay_c_grid) and three shapes of V, with its panel titles
    rows = [_grid_row(shape, c) for shape in ("flat", "gentle", "cpu") for c in (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)]
    labels = {"flat": "flat V(k) = 1 (GPU, batch 1)", "gentle": "gently rising V(k) = 1 + 0.02 k",
              "cpu": "the CPU's measured V"}
    fig = R.oracle_ratios(rows, labels)
    assert too_small_when_shown(fig) == [], "oracle_ratios: text under 9 pt at the book's column width"
    assert saved_width_in(fig) <= P.DISPLAY_WIDTH_IN
    shown = {text for text, _ in displayed_sizes(fig)}
    assert set(labels.values()) <= shown and {"0.02", "0.05", "1"} <= shown, shown
    labelled = 0
    for ax in fig.axes:
        if not ax.axison:
            continue
        ticks = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        assert [t.get_text() for t in ticks] in ([], ["0.02", "0.05", "0.1", "0.2", "0.5", "1"])
        boxes = [extent(t, fig) for t in ticks]
        assert overlapping(boxes) == [], f"{ax.get_title()}: c tick labels collide"
        labelled += bool(ticks)
    assert labelled == 2, f"the bottom panels (gentle, cpu) carry the c ticks; {labelled} panels do"


# -- the phone variant save_figure writes beside a figure that reads too small on a phone -------

def _four_panels() -> Figure:
    """Two rows of two panels and a three-column figure legend below, 6.6 in wide (the book's width)."""
    fig = P.new_figure(5.5)
    axes = fig.subplots(2, 2, sharex=True, sharey=True).ravel()
    for i, ax in enumerate(axes):
        for k in range(3):
            ax.plot(np.arange(10), np.arange(10) * (k + 1) + i, label=f"series number {k}")
        ax.set_title(f"panel {i}", fontsize=P.TITLE_SIZE)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=P.LEGEND_SIZE, frameon=False,
               title="series")
    return P.set_sizes(fig)


def phone_px(png) -> float:
    """The smallest text of a saved PNG, in CSS px, when the book shows it on a 390 px phone
    (342 px wide): its smallest font (points, from the PNG's text chunk) at the PNG's dpi, times
    the shown width over the PNG's width."""
    from PIL import Image

    from companion.figures import DPI_KEY, MIN_FONT_KEY, PHONE_COLUMN_PX

    with Image.open(png) as im:
        font_px = float(im.info[MIN_FONT_KEY]) / 72 * float(im.info[DPI_KEY])
        return font_px * PHONE_COLUMN_PX / im.size[0]


def test_a_wide_figure_gets_a_phone_variant_that_reads_at_9_px(tmp_path) -> None:
    from companion.figures import PHONE_MIN_PX, save_figure

    fig = _four_panels()
    before = (tuple(fig.get_size_inches()), fig.legends[0]._ncols, round(saved_width_in(fig), 6))
    written = save_figure(fig, "four", tmp_path)
    assert [p.name for p in written] == ["four.png", "four.pdf"]
    assert phone_px(tmp_path / "four.png") < 7, "the figure as drawn should read too small on a phone"
    assert phone_px(tmp_path / "four.phone.png") >= PHONE_MIN_PX
    # the notebook still shows the figure as drawn: size, legend columns and layout restored
    assert (tuple(fig.get_size_inches()), fig.legends[0]._ncols, round(saved_width_in(fig), 6)) == before
    assert [t.get_text() for t in fig.legends[0].texts] == [f"series number {k}" for k in range(3)]
    assert fig.legends[0].get_title().get_text() == "series"


def test_a_figure_drawn_for_a_phone_gets_no_variant_and_a_stale_one_goes(tmp_path) -> None:
    from companion.figures import PHONE_MIN_PX, save_figure

    (tmp_path / "narrow.phone.png").write_bytes(b"from an earlier run")
    fig = _panel(P.new_figure(3.5, width=P.PHONE_FIG_WIDTH))
    save_figure(fig, "narrow", tmp_path)
    assert phone_px(tmp_path / "narrow.png") >= PHONE_MIN_PX
    assert sorted(p.name for p in tmp_path.iterdir()) == ["narrow.pdf", "narrow.png"]


def test_publishing_moves_a_phone_variant_with_its_figure(tmp_path) -> None:
    from companion.book.figure_files import publish_figures
    from companion.book.record import RunRecord

    work, target = tmp_path / "work", tmp_path / "figures"
    work.mkdir()
    target.mkdir()
    for name in ("a.png", "a.pdf", "a.phone.png", "b.png", "b.pdf"):
        (work / name).write_bytes(b"x")
    (target / "b.phone.png").write_bytes(b"stale")   # b no longer needs one
    names = publish_figures("01_x", sorted(work.iterdir()), RunRecord(), target)
    assert names == ["a", "b"]
    assert sorted(p.name for p in target.iterdir()) == ["a.pdf", "a.phone.png", "a.png", "b.pdf", "b.png"]


def test_every_experiment_figure_reads_at_9_px_on_a_phone_and_its_labels_stay_apart(tmp_path) -> None:
    """The chapter 7-8 figures (drawn on synthetic traces): each one's phone variant reads >= 9 px
    at 342 px, its x tick labels and axis labels do not run into each other there, and the figure
    the notebook shows afterwards is the one drawn."""
    from companion.figures import PHONE_MIN_PX, phone_variant, save_figure
    from tests.figure_checks import drawn, overlapping
    from tests.test_analysis import synthetic_traces
    from tests.test_experiment_figures import _all_figures

    traces = synthetic_traces(seed=2, lengths=(9, 14, 3, 11, 6))[0]
    for name, fig in _all_figures(traces).items():
        size = tuple(fig.get_size_inches())
        save_figure(fig, name, tmp_path)
        variant = tmp_path / f"{name}.phone.png"
        assert variant.is_file(), f"{name}: no phone variant"
        assert phone_px(variant) >= PHONE_MIN_PX, (name, phone_px(variant))
        assert tuple(fig.get_size_inches()) == size
        with phone_variant(fig):
            renderer = drawn(fig).canvas.get_renderer()
            for ax in fig.axes:
                shown = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text().strip()]
                flat = [t.get_window_extent(renderer) for t in shown if t.get_rotation() == 0]
                assert overlapping(flat, pad=1.0) == [], f"{name}: x tick labels collide on a phone"
                angled = sorted((t for t in shown if t.get_rotation() != 0), key=lambda t: t.get_position()[0])
                for a, b in zip(angled, angled[1:]):   # parallel slanted lines: apart by spacing x sin(angle)
                    spacing = abs(ax.transData.transform((b.get_position()[0], 0))[0]
                                  - ax.transData.transform((a.get_position()[0], 0))[0])
                    lines = max(a.get_text().count("\n"), b.get_text().count("\n")) + 1
                    height = a.get_fontsize() * fig.dpi / 72 * 1.2 * lines
                    assert spacing * np.sin(np.radians(a.get_rotation())) >= height * 0.9, \
                        f"{name}: slanted x tick labels {a.get_text()!r}, {b.get_text()!r} collide on a phone"
            xlabels = [ax.xaxis.label.get_window_extent(renderer) for ax in fig.axes
                       if ax.get_visible() and ax.xaxis.label.get_text().strip()]
            assert overlapping(xlabels, pad=1.0) == [], f"{name}: axis labels collide on a phone"
