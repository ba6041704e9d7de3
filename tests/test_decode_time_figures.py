"""The decode-time chapter's figures draw exactly the numbers they are given."""
from __future__ import annotations

import numpy as np
import pytest

from companion.figures import decode_time as F
from companion.speculative.compare import PolicySummary


def _artist(fig, gid):
    for ax in fig.axes:
        for a in list(ax.lines) + list(ax.patches):
            if a.get_gid() == gid:
                return a
    raise AssertionError(f"no artist {gid!r}")


def test_score_reliability_plots_bin_acceptance() -> None:
    rng = np.random.default_rng(0)
    u = rng.uniform(size=2000)
    acc = rng.uniform(size=2000) < u  # acceptance rises with the score
    fig = F.score_reliability({"certificate": u, "top1": 1 - u}, acc, n_bins=5)
    xs, ys = _artist(fig, "curve:certificate").get_data()
    assert np.allclose(xs, [0.1, 0.3, 0.5, 0.7, 0.9])
    lowest = np.argsort(u, kind="stable")[:400]
    assert ys[0] == pytest.approx(acc[lowest].mean(), abs=1e-12)
    assert ys[-1] > 0.8 > 0.2 > ys[0]
    _, ys_rev = _artist(fig, "curve:top1").get_data()
    assert ys_rev[0] > ys_rev[-1]  # the reversed score is drawn reversed
    with pytest.raises(ValueError, match="steps"):
        F.score_reliability({"margin": u[:10]}, acc)


def test_policy_costs_bars_are_the_costs() -> None:
    rows = [PolicySummary(name, 100, 0.5, 0.5, 1.0, cost, 100.0)
            for name, cost in (("constant:0", 1.0), ("constant:3", 0.8), ("confidence:0.4", 0.9), ("certificate", 0.75))]
    fig = F.policy_costs(rows, builtins=["constant:0", "constant:3", "confidence:0.4"], defaults=["confidence:0.4"],
                         best="constant:3")
    for r in rows:
        assert _artist(fig, f"bar:{r.policy}").get_width() == pytest.approx(r.cost_per_token)
    assert _artist(fig, "best-builtin").get_xdata()[0] == pytest.approx(0.8)
    ax = fig.axes[0]
    at = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    assert sorted(at, key=at.get, reverse=True) == [r.policy for r in rows]  # first row on top
    assert ax.get_title().endswith("(dashed: best built-in)")
    chosen = F.policy_costs(rows, builtins=["constant:0", "constant:3", "confidence:0.4"], best="confidence:0.4",
                            best_label="the built-in chosen on the calibration answers")
    assert _artist(chosen, "best-builtin").get_xdata()[0] == pytest.approx(0.9)
    assert chosen.axes[0].get_title().endswith("(dashed: the built-in chosen on the calibration answers)")
