"""The theory figures draw what the engine computes (read back through the artists' gids)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from companion import PAPER_CRITERIA, certificate, parse_criterion, per_token_cost, tree_certificate, witness
from companion.figures import save_figure
from companion.figures import theory as T
from companion.certify import bounds, targets


def _phi(m: int, g: np.ndarray) -> np.ndarray:
    """phi_m written out independently of the library (numpy, with 0 log 0 = 0)."""
    a = 1 + m * g
    b = 1 - g
    with np.errstate(divide="ignore", invalid="ignore"):
        tb = np.where(b > 0, b * np.log(np.where(b > 0, b, 1.0)), 0.0)
    return (a * np.log(a) + m * tb) / (m + 1)


def _by_gid(fig: Figure, gid: str):
    found = [a for a in fig.findobj(lambda o: o.get_gid() == gid)]
    assert found, f"no artist with gid {gid!r}"
    return found


# -- families ------------------------------------------------------------------------------


def test_geometric_tail_family():
    tie = targets.geometric_tail_tie(32, 0.7)
    p1 = torch.tensor([tie, 0.5, 0.99], dtype=torch.float64)
    p = targets.geometric_tail_target(p1, 32, 0.7)
    assert p.shape == (3, 32)
    assert torch.allclose(p.sum(-1), torch.ones(3, dtype=torch.float64))
    assert bool((p[:, :-1] >= p[:, 1:] - 1e-15).all())
    assert float(p[0, 0] - p[0, 1]) == pytest.approx(0.0, abs=1e-12)
    assert torch.allclose(p[:, 2] / p[:, 1], torch.full((3,), 0.7, dtype=torch.float64))
    with pytest.raises(ValueError):
        targets.geometric_tail_target(torch.tensor([tie / 2], dtype=torch.float64), 32, 0.7)


def test_two_top_target_and_perturb():
    p = targets.two_top_target(torch.tensor([0.5]), torch.tensor([0.3]), 12)
    assert torch.allclose(p.sum(-1), torch.ones(1, dtype=torch.float64))
    assert float(p[0, 2]) == pytest.approx(0.02)
    with pytest.raises(ValueError):
        targets.two_top_target(torch.tensor([0.5]), torch.tensor([0.01]), 12)  # rest above p2
    noise = torch.randn(1, 12, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q = targets.perturb(p, noise, 0.0)
    assert torch.allclose(q, p)
    q2 = targets.perturb(p.expand(3, 12), noise.expand(3, 12), torch.tensor([0.0, 0.5, 1.0]))
    assert torch.allclose(q2.sum(-1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(q2[0], p[0])


def test_tree_quadratic_constant_float():
    assert bounds.tree_quadratic_constant(1) == 0.5
    g = np.linspace(1e-6, 1, 200001)
    for m in (2, 4, 8):
        assert float(np.min(_phi(m, g) / g**2)) == pytest.approx(bounds.tree_quadratic_constant(m), rel=1e-8)


# -- figures -------------------------------------------------------------------------------


def test_criteria_level_sets_draws_engine_thresholds(tmp_path):
    p = targets.geometric_tail_target(torch.tensor(0.365, dtype=torch.float64), 12, 0.64)
    fig = T.criteria_level_sets(p)
    assert isinstance(fig, Figure)
    assert sum(ax.get_visible() for ax in fig.axes) == len(PAPER_CRITERIA)
    for spec in PAPER_CRITERIA:
        c = parse_criterion(spec)
        bars = _by_gid(fig, f"bars:{c}")
        heights = np.array([b.get_height() for b in bars])
        assert np.allclose(heights, np.sort(p.numpy())[::-1])
        red = np.array([b.get_facecolor()[0] > 0.6 and b.get_facecolor()[1] < 0.5 for b in bars])
        assert np.array_equal(red, c.rejection_mask(torch.sort(p, descending=True).values).numpy())
        (line,) = _by_gid(fig, f"tau:{c}")
        assert line.get_ydata()[0] == pytest.approx(float(c.threshold(p)))
    written = save_figure(fig, T.FIGURE_NAMES["criteria_level_sets"], tmp_path)
    assert [w.suffix for w in written] == [".png", ".pdf"] and all(w.stat().st_size > 0 for w in written)


def test_exact_certificate_witness():
    p = torch.tensor([0.30, 0.27, 0.18, 0.10, 0.06, 0.04, 0.03, 0.02], dtype=torch.float64)
    fig = T.exact_certificate_witness(p, "topm:2")
    for div in ("forward", "reverse"):
        bars = _by_gid(fig, f"witness:{div}")
        assert np.allclose([b.get_height() for b in bars], witness(p, "topm:2", div).numpy())
        (line,) = _by_gid(fig, f"cost:{div}")
        expected = per_token_cost(p.expand(8, 8), torch.arange(8), div).numpy()
        assert np.allclose(line.get_ydata(), expected)
        assert np.all(np.diff(line.get_ydata()) >= -1e-12)  # monotonicity lemma on the drawing


def test_strict_greedy_margin_curves():
    fig = T.strict_greedy_margin((0.4, 1.0), n_grid=40, vocab=512)
    for s in (0.4, 1.0):
        (line,) = _by_gid(fig, f"cert:s={s:g}")
        d, rho = line.get_xdata(), line.get_ydata()
        assert d[0] > 0
        assert np.allclose(rho, s * _phi(1, d / s), rtol=1e-9, atol=1e-15)
        (ratio,) = _by_gid(fig, f"ratio:s={s:g}")
        r = ratio.get_ydata()
        assert np.all(r >= 1 - 1e-9) and np.all(r <= 2 * math.log(2) + 1e-9)


def test_relaxed_criteria_certificates():
    fig = T.relaxed_criteria_certificates(n_grid=60, vocab=16, ratio=0.6, budget=0.02)
    (greedy,) = _by_gid(fig, "cert:greedy")
    p1 = torch.tensor(greedy.get_xdata(), dtype=torch.float64)
    p = targets.geometric_tail_target(p1, 16, 0.6)
    assert np.allclose(greedy.get_ydata(), certificate(p, "greedy").numpy())
    for spec in PAPER_CRITERIA[1:]:
        (line,) = _by_gid(fig, f"ratio:{spec}")
        r = line.get_ydata()
        assert np.all(r[np.isfinite(r)] >= 1 - 1e-12)  # greedy's rejection region is the largest
    (budget,) = _by_gid(fig, "budget")
    assert budget.get_ydata()[0] == 0.02


def test_tree_margin_curves_and_scatter():
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(3 * torch.randn(300, 12, generator=gen, dtype=torch.float64), -1)
    fig = T.tree_margin((1, 2, 8), random_targets=p, n_grid=100)
    assert len(fig.axes) == 3
    for m in (1, 2, 8):
        (line,) = _by_gid(fig, f"phi:{m}")
        assert np.allclose(line.get_ydata(), _phi(m, line.get_xdata()), atol=1e-12)
        (sec,) = _by_gid(fig, f"secondary:{m}")
        assert np.allclose(sec.get_ydata(), (m + 1) * sec.get_xdata() ** 2 / 4)
        (sc,) = _by_gid(fig, f"scatter:{m}")
        xy = sc.get_offsets()
        assert np.allclose(xy[:, 1], tree_certificate(p, m).numpy())
        assert np.all(xy[:, 1] >= _phi(m, xy[:, 0]) - 1e-12)


def test_stochastic_contrast_worst_case_paths():
    gen = torch.Generator().manual_seed(2)
    p = torch.softmax(2 * torch.randn(200, 10, generator=gen, dtype=torch.float64), -1)
    q = targets.perturb(p, torch.randn(200, 10, generator=gen, dtype=torch.float64), 0.5)
    paths = torch.stack([targets.two_top_target(torch.tensor(0.6), torch.tensor(0.2), 10),
                         targets.two_top_target(torch.tensor(0.4), torch.tensor(0.35), 10)])
    fig = T.stochastic_contrast(p, q, paths, n_steps=81)
    counts = sum(len(_by_gid(fig, f"pairs:{k}")[0].get_offsets()) for k in ("certified", "accepted", "rejected"))
    assert counts == 200
    cert = _by_gid(fig, "pairs:certified")[0].get_offsets()
    assert np.all(cert[:, 1] < 1)  # expected acceptance below 1 even where greedy is certain
    for idx in range(2):
        (step,) = _by_gid(fig, f"greedy:{idx}")
        kl, ok = step.get_xdata(), step.get_ydata()
        rho = float(certificate(paths[idx], "greedy"))
        assert np.all(ok[kl < rho * (1 - 1e-9)] == 1)  # certified region: accepted
        assert np.all(ok[kl > rho * (1 + 1e-9)] == 0)  # beyond the witness: rejected (tightness)


# -- what a reader needs: legends, labels, sizes, colours --------------------------------------

from companion.certify.bounds import additive_floor, multiplicative_floor  # noqa: E402
from companion.figures import palette as P  # noqa: E402
from tests.figure_checks import (  # noqa: E402
    assert_panels_clear,
    drawn,
    extent,
    inside,
    overlapping,
    saved_width_in,
    small_texts,
    too_small_when_shown,
)


def _theory_figures() -> dict[str, Figure]:
    """Every theory figure, on small versions of the inputs the chapters use."""
    gen = torch.Generator().manual_seed(3)
    rand = torch.softmax(3 * torch.randn(200, 12, generator=gen, dtype=torch.float64), -1)
    q = targets.perturb(rand, torch.randn(200, 12, generator=gen, dtype=torch.float64), 0.5)
    paths = torch.stack([targets.two_top_target(torch.tensor(0.7), torch.tensor(0.1), 12),
                         targets.two_top_target(torch.tensor(0.4), torch.tensor(0.37), 12)])
    return {
        "criteria_level_sets": T.criteria_level_sets(torch.softmax(-0.45 * torch.arange(12, dtype=torch.float64), 0)),
        "exact_certificate_witness": T.exact_certificate_witness(
            torch.tensor([0.30, 0.27, 0.18, 0.10, 0.06, 0.04, 0.03, 0.02], dtype=torch.float64)),
        "strict_greedy_margin": T.strict_greedy_margin(n_grid=40, vocab=512),
        "relaxed_criteria_certificates": T.relaxed_criteria_certificates(n_grid=80),
        "tree_margin": T.tree_margin((1, 2, 4, 8), random_targets=rand, n_grid=80),
        "stochastic_contrast": T.stochastic_contrast(rand, q, paths, n_steps=61),
    }


@pytest.fixture(scope="module")
def theory_figs() -> dict[str, Figure]:
    return _theory_figures()


def test_every_theory_figure_is_drawn_and_readable(theory_figs):
    assert set(theory_figs) == set(T.FIGURE_NAMES)
    for name, fig in theory_figs.items():
        assert small_texts(fig) == [], f"{name}: text under 8 pt"
        assert too_small_when_shown(fig) == [], f"{name}: text under 9 pt at the book's column width"
        assert saved_width_in(fig) <= P.DISPLAY_WIDTH_IN, f"{name}: wider than the column, shrunk on the page"


def test_theory_panels_do_not_overlap(theory_figs):
    """Stacked or side by side, no panel (with its tick labels, axis labels and title) runs
    into another, and every one lies inside the saved figure."""
    for name, fig in theory_figs.items():
        assert_panels_clear(name, fig)


def _legend_texts(fig: Figure) -> list[str]:
    return [t.get_text() for leg in fig.findobj(lambda o: type(o).__name__ == "Legend") for t in leg.get_texts()]


def test_relaxed_figure_legend_names_every_floor(theory_figs):
    fig = theory_figs["relaxed_criteria_certificates"]
    texts = _legend_texts(fig)
    ax_a = fig.axes[0]
    (greedy,) = _by_gid(fig, "cert:greedy")
    p1 = torch.tensor(greedy.get_xdata(), dtype=torch.float64)
    expected = {
        "additive:0.3": np.full(1, float(additive_floor(0.3))),
        "multiplicative:0.1": multiplicative_floor(0.1, p1).numpy(),
        "typical:0.09,0.3": multiplicative_floor(0.3, p1).numpy(),  # alpha = delta
    }
    (legend,) = fig.legends  # one legend under both panels
    legend_handles = legend.legend_handles
    for spec, want in expected.items():
        (floor,) = _by_gid(fig, f"floor:{spec}")
        assert any(t.startswith(f"floor of {spec}") for t in texts), (spec, texts)
        # the legend entry is the floor's own line: same colour and dash as drawn
        entry = [h for h, t in zip(legend_handles, [t.get_text() for t in legend.get_texts()])
                 if t.startswith(f"floor of {spec}")]
        assert entry and entry[0].get_color() == floor.get_color() and entry[0].get_linestyle() == floor.get_linestyle()
        assert floor.get_color() == P.criterion_color(spec)
        got = np.asarray(floor.get_ydata(), dtype=float)
        assert np.allclose(got if want.size > 1 else got[:1], want, rtol=1e-12)
    # every criterion stays at or above its floor, as the legend says
    for spec in expected:
        (cert,) = _by_gid(fig, f"cert:{spec}")
        (floor,) = _by_gid(fig, f"floor:{spec}")
        f = np.asarray(floor.get_ydata(), dtype=float)
        assert np.all(np.asarray(cert.get_ydata()) >= (f if f.size > 2 else f[0]) * (1 - 1e-9))


def test_relaxed_figure_marks_infinity_in_a_labelled_band(theory_figs):
    fig = theory_figs["relaxed_criteria_certificates"]
    ax_a = fig.axes[0]
    (band,) = _by_gid(fig, "inf-band")
    drawn(fig)
    labels = [t.get_text() for t in ax_a.get_yticklabels()]
    assert "+\u221e" in labels
    at = ax_a.get_yticks()[labels.index("+\u221e")]
    (add,) = _by_gid(fig, "cert:additive:0.3")
    y = np.asarray(add.get_ydata())
    p = targets.geometric_tail_target(torch.tensor(add.get_xdata(), dtype=torch.float64), 32, 0.7)
    inf = ~torch.isfinite(certificate(p, "additive:0.3")).numpy()
    assert inf.any() and np.allclose(y[inf], at)  # +inf drawn on the +inf tick ...
    assert np.all(y[~inf] < at / 1.8)  # ... and no finite value inside the band
    assert any(P.INF_LABEL in t.get_text() for t in ax_a.texts)


def test_witness_label_sits_inside_its_panel(theory_figs):
    fig = theory_figs["exact_certificate_witness"]
    (label,) = _by_gid(fig, "rho-label")
    ax_c = fig.axes[1]
    box = extent(label, fig)
    assert inside(box, ax_c.get_window_extent()), (box, ax_c.get_window_extent())
    assert not overlapping([box, ax_c.get_legend().get_window_extent()])


def test_tree_widths_have_the_palette_colours(theory_figs):
    fig = theory_figs["tree_margin"]
    for m in (1, 2, 4, 8):
        for gid in (f"phi:{m}", f"ratio:{m}"):
            (ln,) = _by_gid(fig, gid)
            assert ln.get_color() == P.tree_color(m)
        (sc,) = _by_gid(fig, f"scatter:{m}")
        assert np.allclose(sc.get_facecolor()[0][:3], _rgb(P.tree_color(m)))
    assert P.tree_color(1) == P.criterion_color("greedy")  # the width-1 tree is strict greedy


def _rgb(color: str) -> tuple[float, float, float]:
    from matplotlib.colors import to_rgb

    return to_rgb(color)


def test_palette_gives_each_meaning_its_own_colour():
    trees = [P.tree_color(m) for m in range(2, 9)]
    kinds = list(P.CRITERION_COLORS.values())
    assert len(set(trees)) == len(trees) and len(set(kinds)) == len(kinds)
    assert not set(trees) & set(kinds)
    assert not set(P.EXAMPLE_COLORS) & (set(trees) | set(kinds) | {P.ACCEPT, P.REJECT, P.NOT_CERTIFIED})
    # parameters do not change a criterion's colour
    assert P.criterion_color("additive:0.1") == P.criterion_color("additive:0.3")
    assert T.criterion_color is P.criterion_color
    with pytest.raises(ValueError, match="tree width"):
        P.tree_color(0)
