"""The experiment figures draw what companion.analysis.traces computes (read back through the artists' gids)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from matplotlib.figure import Figure

from companion import analysis as A
from companion.certify.criteria import PAPER_CRITERIA
from companion.figures import experiments as E
from companion.figures import save_figure
from tests.test_analysis import synthetic_traces


@pytest.fixture(scope="module")
def tr() -> A.Traces:
    return synthetic_traces(seed=2, lengths=(9, 14, 3, 11, 6))[0]


def by_gid(fig: Figure, gid: str):
    found = fig.findobj(lambda o: o.get_gid() == gid)
    assert found, f"no artist with gid {gid!r}"
    return found


def line_y(fig: Figure, gid: str) -> np.ndarray:
    (ln,) = by_gid(fig, gid)
    return np.asarray(ln.get_ydata(), dtype=float)


def test_names_are_stable_and_valid(tmp_path):
    assert len(set(E.FIGURE_NAMES.values())) == len(E.FIGURE_NAMES)
    for fn in E.FIGURE_NAMES:
        assert callable(getattr(E, fn))
    fig = Figure()
    fig.subplots().plot([0, 1])
    for name in E.FIGURE_NAMES.values():
        assert save_figure(fig, name, tmp_path)


def test_certificate_cdf(tr):
    fig = E.certificate_cdf(tr, tree_widths=(2, 4, 8))
    for spec in PAPER_CRITERIA:
        (ln,) = by_gid(fig, f"cdf:{spec}")
        x, y = E.ecdf(tr.cert(spec))
        assert np.allclose(ln.get_xdata(), np.maximum(x, 1e-8)) and np.allclose(ln.get_ydata(), y)
    # width 8 is not stored in these traces: drawn from the top-k, as the analysis computes it
    (ln,) = by_gid(fig, "cdf:tree:8")
    assert np.allclose(ln.get_ydata(), E.ecdf(tr.tree_cert(8))[1])
    (vl,) = by_gid(fig, "ceiling:4")
    assert vl.get_xdata()[0] == pytest.approx(math.log(5))


def test_ecdf_leaves_infinite_mass_out():
    x, y = E.ecdf(np.array([2.0, math.inf, 1.0, 3.0]))
    assert x.tolist() == [1.0, 2.0, 3.0] and y.tolist() == [0.25, 0.5, 0.75]


def test_certificate_vs_margin(tr):
    budgets = (0.01, 0.2)
    fig = E.certificate_vs_margin(tr, budgets, n_bins=4, tree_widths=(2, 8))
    margin = tr.column("margin")
    edges = A.margin_bin_edges(margin, 4)
    series = {c: tr.cert(c) for c in PAPER_CRITERIA} | {"tree:2": tr.tree_cert(2), "tree:8": tr.tree_cert(8)}
    curves = A.certified_fraction_by_bin(margin, series, budgets, edges)
    bins = A.bin_index(margin, edges)
    for label in series:
        for e, eps in enumerate(budgets):
            assert np.allclose(line_y(fig, f"frac:{label}:eps={eps:g}"), curves.values[label][e], equal_nan=True)
        med = A.median_by_bin(series[label], bins, curves.n_bins)
        drawn = line_y(fig, f"median:{label}")
        fin = np.isfinite(med)
        assert np.allclose(drawn[fin], np.maximum(med[fin], 1e-8))
        assert np.all(drawn[~fin] > np.nanmax(np.where(fin, med, np.nan)))  # +inf at the top edge


def test_run_length_vs_budget(tr):
    eps = np.logspace(-3, 0, 7)
    fig = E.run_length_vs_budget(tr, eps, tree_widths=(2, 4))
    curves = A.run_length_curves(tr, eps, tree_widths=(2, 4))
    for label, y in curves.items():
        assert np.allclose(line_y(fig, f"runs:{label}"), y)
    (ln,) = by_gid(fig, "runs:greedy")
    assert np.allclose(ln.get_xdata(), eps)
    # the cap: the mean remaining length of a trajectory from a uniformly random step, (T_i + 1) / 2 averaged over steps
    (cap,) = by_gid(fig, "runs:cap")
    want = sum(n * (n + 1) / 2 for n in tr.lengths) / tr.n_rows
    assert cap.get_ydata()[0] == pytest.approx(want)
    # the title's mean trajectory length is the number chapter 7 prints ({glue:text}`ch7_mean_len:.1f`)
    title = fig.axes[0].get_title()
    assert f"trajectories of {float(tr.lengths.mean()):.1f} steps on average" in title, title


def test_drafter_acceptance(tr):
    fig = E.drafter_acceptance(tr)
    for r in A.acceptance_table(tr):
        for attr in ("accepted", "certified_fwd", "certified_rev"):
            (patch,) = by_gid(fig, f"{attr}:{r.criterion}")
            assert patch.get_height() == pytest.approx(getattr(r, attr))


def test_tightness_by_margin(tr):
    fig = E.tightness_by_margin(tr, n_bins=3)
    edges = A.margin_bin_edges(tr.column("margin"), 3)
    tight = A.tightness_by_bin(tr, edges)
    bins = A.bin_index(tr.column("margin"), edges)
    for c in PAPER_CRITERIA:
        assert np.allclose(line_y(fig, f"tight:{c}"), tight.values[c], equal_nan=True)
        acc, _ = A.fraction_by_bin(tr.column(f"accepted[{c}]"), bins, tight.n_bins)
        assert np.allclose(line_y(fig, f"accept:{c}"), acc, equal_nan=True)


def test_kl_vs_certificate(tr):
    fig = E.kl_vs_certificate(tr)
    kl = tr.column("kl_fwd")
    for c in PAPER_CRITERIA:
        acc = tr.column(f"accepted[{c}]")
        (a,) = by_gid(fig, f"scatter:{c}:accepted")
        (r,) = by_gid(fig, f"scatter:{c}:rejected")
        assert len(a.get_offsets()) == acc.sum() and len(r.get_offsets()) == (~acc).sum()
        finite = np.concatenate([tr.cert(s)[np.isfinite(tr.cert(s))] for s in PAPER_CRITERIA])
        x_floor = max(1e-8, finite[finite > 0].min() / 2)
        y_floor = max(1e-8, kl[kl > 0].min() / 2)
        assert np.allclose(np.asarray(a.get_offsets())[:, 1], np.maximum(kl[acc], y_floor))
        rho = tr.cert(c)[acc]
        fin = np.isfinite(rho)
        assert np.allclose(np.asarray(a.get_offsets())[fin, 0], np.maximum(rho[fin], x_floor))
        assert np.all(np.asarray(a.get_offsets())[~fin, 0] > finite.max())  # +inf at the right edge
        # soundness, as drawn: no rejected point strictly below the diagonal
        off = np.asarray(r.get_offsets())
        assert len(off) == 0 or not np.any(off[:, 1] < off[:, 0])
    small = E.kl_vs_certificate(tr, max_points=10)
    pts = sum(len(s.get_offsets()) for s in small.findobj(lambda o: str(o.get_gid()).startswith("scatter:greedy:")))
    assert pts == 10


def test_tree_coverage(tr):
    fig = E.tree_coverage(tr, range(1, 9))
    cov = A.tree_coverage(tr, range(1, 9))
    assert np.allclose(line_y(fig, "covered"), cov.covered)
    assert np.allclose(line_y(fig, "certified"), cov.certified)


def test_round_lengths(tr):
    ks = (1, 2, 3, 5, 8)
    fig = E.round_lengths(tr, ks)
    r = A.accepted_length_per_round(tr, ks)
    for c in PAPER_CRITERIA:
        assert np.allclose(line_y(fig, f"measured:{c}"), r.measured[c])
        assert np.allclose(line_y(fig, f"certified:{c}"), r.certified[c])
        assert np.allclose(line_y(fig, f"budget:{c}"), r.budget[c])


# -- what a reader needs: legends, labels, sizes, colours, +inf apart --------------------------

from companion.figures import palette as P  # noqa: E402
from companion.figures import theory as T  # noqa: E402
from tests.figure_checks import assert_panels_clear, drawn, extent, overlapping, small_texts, too_small_when_shown  # noqa: E402


def _all_figures(tr) -> dict[str, Figure]:
    return {
        "certificate_cdf": E.certificate_cdf(tr),
        "certificate_vs_margin": E.certificate_vs_margin(tr, (0.01, 0.1, 0.5), n_bins=4),
        "run_length_vs_budget": E.run_length_vs_budget(tr, np.logspace(-3, 0, 7)),
        "drafter_acceptance": E.drafter_acceptance(tr),
        "tightness_by_margin": E.tightness_by_margin(tr, n_bins=3),
        "kl_vs_certificate": E.kl_vs_certificate(tr),
        "tree_coverage": E.tree_coverage(tr),
        "round_lengths": E.round_lengths(tr, (1, 2, 4, 8)),
    }


@pytest.fixture(scope="module")
def figs(tr) -> dict[str, Figure]:
    return _all_figures(tr)


def test_every_experiment_figure_is_readable(figs):
    assert set(figs) == set(E.FIGURE_NAMES)
    for name, fig in figs.items():
        assert small_texts(fig) == [], f"{name}: text under 8 pt"
        assert too_small_when_shown(fig) == [], f"{name}: text under 9 pt at the book's column width"


def test_experiment_panels_and_legends_do_not_overlap(figs):
    """No panel (ticks, labels, title) runs into another or into a figure legend, and none is
    cut off at the figure's edge."""
    for name, fig in figs.items():
        assert_panels_clear(name, fig, figure_legends=True)


def test_tree_widths_have_one_colour_across_the_book(tr):
    """A width is drawn in the same colour in chapter 5 (theory) and chapters 7-8 (experiments)."""
    widths = (1, 2, 4, 8)
    theory = T.tree_margin(widths, n_grid=20)
    cdf = E.certificate_cdf(tr, tree_widths=(2, 4, 8))
    runs = E.run_length_vs_budget(tr, np.logspace(-3, 0, 4), tree_widths=(2, 4, 8))
    margin = E.certificate_vs_margin(tr, (0.1,), n_bins=3, tree_widths=(2, 4, 8))
    for m in widths:
        (phi,) = by_gid(theory, f"phi:{m}")
        drawn_in = {"chapter 5": phi.get_color()}
        (c,) = by_gid(cdf, f"cdf:tree:{m}")
        drawn_in["chapter 7 cdf"] = c.get_color()
        if m > 1:
            (r,) = by_gid(runs, f"runs:tree:{m}")
            (med,) = by_gid(margin, f"median:tree:{m}")
            drawn_in |= {"chapter 7 runs": r.get_color(), "chapter 7 margin": med.get_color()}
        assert set(drawn_in.values()) == {P.tree_color(m)}, (m, drawn_in)
    assert E.series_color("tree:4") == P.tree_color(4) and E.series_color("topm:4") == P.criterion_color("topm:4")


def test_certificate_vs_margin_marks_infinity_and_vacuous_shares(tr, figs):
    fig = figs["certificate_vs_margin"]
    ax0 = fig.axes[0]
    drawn(fig)
    labels = [t.get_text() for t in ax0.get_yticklabels()]
    assert "+\u221e" in labels
    at = ax0.get_yticks()[labels.index("+\u221e")]
    margin = tr.column("margin")
    edges = A.margin_bin_edges(margin, 4)
    bins = A.bin_index(margin, edges)
    med = A.median_by_bin(tr.cert("additive:0.3"), bins, 4)
    assert np.isinf(med).any()  # the synthetic traces have +inf medians, so the band is exercised
    assert np.allclose(line_y(fig, "median:additive:0.3")[np.isinf(med)], at)
    # the vacuous share (rho* = +inf) is drawn apart under the certified share, per bin
    for spec in PAPER_CRITERIA:
        inf = np.isinf(tr.cert(spec))
        found = fig.findobj(lambda o: o.get_gid() == f"vacuous:{spec}:eps=0.1")
        if not inf.any():
            assert not found
            continue
        (area,) = found
        want, _ = A.fraction_by_bin(inf, bins, 4)
        v = area.get_paths()[0].vertices
        top = [v[np.isclose(v[:, 0], b), 1].max() for b in range(4)]
        assert np.allclose(top, want), spec
        assert np.all(want <= line_y(fig, f"frac:{spec}:eps=0.1") + 1e-12)  # vacuous is part of certified
    ticks = [t for t in fig.axes[-1].get_xticklabels() if t.get_text()]
    assert len(ticks) == 4 and not overlapping([extent(t, fig) for t in ticks])


def test_drafter_acceptance_labels_legend_and_vacuous_bars(tr, figs):
    fig = figs["drafter_acceptance"]
    ax = fig.axes[0]
    drawn(fig)
    labels = ax.get_xticklabels()
    assert [t.get_text().replace("\n", "") for t in labels] == [r.criterion for r in A.acceptance_table(tr)]
    boxes = [extent(t, fig) for t in labels]
    assert not overlapping(boxes)
    fig_box = fig.bbox
    assert all(b.x0 >= fig_box.x0 and b.x1 <= fig_box.x1 and b.y0 >= fig_box.y0 for b in boxes)
    legend = extent(ax.get_legend(), fig)
    bars = [extent(p, fig) for p in ax.patches if p.get_gid()]
    assert bars and all(i != 0 for i, _ in overlapping([legend] + bars))  # the legend covers no bar
    for r in A.acceptance_table(tr):
        share = float(np.mean(np.isinf(tr.cert(r.criterion))))
        for attr in ("fwd", "rev"):
            found = fig.findobj(lambda o: o.get_gid() == f"vacuous_{attr}:{r.criterion}")
            assert len(found) == 1 and found[0].get_height() == pytest.approx(share)
            assert share <= getattr(r, f"certified_{attr}") + 1e-12


def test_tightness_hatches_vacuous_acceptances(tr, figs):
    fig = figs["tightness_by_margin"]
    edges = A.margin_bin_edges(tr.column("margin"), 3)
    bins = A.bin_index(tr.column("margin"), edges)
    for spec in PAPER_CRITERIA:
        inf = np.isinf(tr.cert(spec))
        found = fig.findobj(lambda o: o.get_gid() == f"vacuous:{spec}")
        assert bool(found) == bool(inf.any())
        if found:
            want, _ = A.fraction_by_bin(inf, bins, 3, where=tr.column(f"accepted[{spec}]"))
            v = found[0].get_paths()[0].vertices
            assert np.allclose([v[np.isclose(v[:, 0], b), 1].max() for b in range(3)], np.nan_to_num(want))


def test_infinity_is_named_in_cdf_legend_and_kl_axis(tr, figs):
    cdf = figs["certificate_cdf"]
    texts = [t.get_text() for t in cdf.axes[0].get_legend().get_texts()]
    for spec in PAPER_CRITERIA:
        share = float(np.mean(np.isinf(tr.cert(spec))))
        (entry,) = [t for t in texts if t.split(" (")[0] == spec]
        assert (f"({share:.0%} of steps at +\u221e)" in entry) == (share > 0), entry
    kl = figs["kl_vs_certificate"]
    drawn(kl)
    bottom_left = kl.axes[4]  # two per row, shared x: the bottom row carries the tick labels
    assert "+\u221e" in [t.get_text() for t in bottom_left.get_xticklabels()]


def test_margin_bin_labels_are_distinct() -> None:
    from companion.figures.experiments import distinct_labels

    centers = np.array([0.0047, 0.029, 0.62, 0.99, 0.9991, 0.99962, 0.99981, 0.99994])
    labels = distinct_labels(centers)
    assert len(set(labels)) == len(centers), labels
    assert labels[:3] == ["0.0047", "0.029", "0.62"], labels   # no more digits than needed
    assert distinct_labels(np.array([0.1, 0.5])) == ["0.1", "0.5"]
