"""Figures of the decode-time chapter: what the drafter's own scores predict, and what each policy costs.

Each function returns a pyplot-free :class:`matplotlib.figure.Figure`; artists carrying data
have a ``gid`` (``"bar:certificate"``, ``"curve:top1"``) so tests can read the values back.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from companion.figures.palette import LABEL_SIZE, LEGEND_SIZE, TICK_SIZE, TITLE_SIZE
from companion.speculative.compare import PolicySummary

__all__ = ["FIGURE_NAMES", "SCORE_COLORS", "policy_costs", "score_reliability"]

FIGURE_NAMES: dict[str, str] = {
    "score_reliability": "dec_score_reliability",
    "policy_costs": "dec_policy_costs",
}
"""Stable ``save_figure`` names of the decode-time figures, keyed by function name."""

SCORE_COLORS: dict[str, str] = {"certificate": "#0072b2", "top1": "#e69f00", "margin": "#009e73"}
_BUILTIN = "#9a9a9a"
_DEFAULT = "#555555"


def score_reliability(scores: Mapping[str, np.ndarray], accepted: np.ndarray, n_bins: int = 10) -> Figure:
    """Acceptance frequency of the drafter's greedy token against each score, in score-quantile bins.

    ``scores[name]`` is one number per step (``certificate``: ``1 - exp(-rho~(q))``, ``top1``:
    ``q(1)``, ``margin``: ``q(1) - q(2)``), ``accepted`` the step's outcome under strict greedy.
    Steps are ranked by each score and cut into ``n_bins`` equal-count bins; a point is a bin's
    acceptance share at its quantile. A score whose low bins hold the rejections and whose high
    bins accept every time separates the steps that survive from those that do not.
    """
    accepted = np.asarray(accepted, dtype=bool)
    fig = Figure(figsize=(6.4, 3.6), layout="constrained")
    ax = fig.add_subplot()
    for name, s in scores.items():
        s = np.asarray(s, dtype=float)
        if s.shape != accepted.shape:
            raise ValueError(f"score {name!r} has {s.size} steps, accepted has {accepted.size}")
        # rank the steps by score (ties broken by position) and cut them into equal-count bins, so
        # every score spans the same axis and the curves compare how well each one sorts the steps
        order = np.argsort(s, kind="stable")
        bins = np.array_split(order, n_bins)
        xs = np.array([(i + 0.5) / n_bins for i, b in enumerate(bins) if len(b)])
        ys = np.array([accepted[b].mean() for b in bins if len(b)])
        ax.plot(xs, ys, "o-", color=SCORE_COLORS.get(name, "#333333"), label=name, gid=f"curve:{name}", ms=4)
    ax.set_xlabel("steps ranked by the score of q (quantile bin)", fontsize=LABEL_SIZE)
    ax.set_ylabel("share accepted by strict greedy", fontsize=LABEL_SIZE)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlim(0, 1)
    ax.tick_params(labelsize=TICK_SIZE)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_SIZE, loc="lower right")
    ax.set_title("How well each score predicts that a draft survives", fontsize=TITLE_SIZE)
    return fig


def policy_costs(summaries: Sequence[PolicySummary], *, builtins: Sequence[str], defaults: Sequence[str] = (),
                 best: str | None = None, best_label: str = "best built-in") -> Figure:
    """Modelled cost per generated token of each policy (horizontal bars; lower is better).

    Built-in schedules are grey (transformers' defaults darker), the calibrated rules coloured by
    the score that drives them; a dashed line marks the built-in ``best``, named in the title by ``best_label``.
    """
    rows = list(summaries)
    fig = Figure(figsize=(6.4, 0.26 * len(rows) + 1.2), layout="constrained")
    ax = fig.add_subplot()
    ys = np.arange(len(rows))[::-1]
    for y, r in zip(ys, rows):
        if r.policy in builtins:
            color = _DEFAULT if r.policy in defaults else _BUILTIN
        else:
            color = SCORE_COLORS.get(r.policy.split(" ")[0], "#56b4e9")
        ax.barh(y, r.cost_per_token, color=color, height=0.7, gid=f"bar:{r.policy}")
        ax.text(r.cost_per_token, y, f" {r.cost_per_token:.3f}", va="center", fontsize=TICK_SIZE - 1)
    if best is not None:
        best_cost = next(r.cost_per_token for r in rows if r.policy == best)
        ax.axvline(best_cost, color="#333333", ls="--", lw=1, gid="best-builtin")
    ax.set_yticks(ys, [r.policy for r in rows], fontsize=TICK_SIZE)
    lo = min(r.cost_per_token for r in rows)
    hi = max(r.cost_per_token for r in rows)
    ax.set_xlim(max(0.0, lo - 0.15 * (hi - lo) - 0.02), hi + 0.22 * (hi - lo) + 0.02)
    ax.set_xlabel("modelled cost per token (single-token target forwards)", fontsize=LABEL_SIZE)
    ax.tick_params(axis="x", labelsize=TICK_SIZE)
    ax.set_title(f"Cost per generated token by drafting policy (dashed: {best_label})", fontsize=TITLE_SIZE)
    return fig
