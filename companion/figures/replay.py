"""The decode-time chapter's cost-model grid: every policy's cost over the oracle's, per shape of V, against c.

:func:`oracle_ratios` returns a pyplot-free :class:`matplotlib.figure.Figure`; every drawn series
has a ``gid`` (``"line:flat:certificate"``, ``"band:flat:certificate"``) so tests can read the
values back. Like every figure of the book it is :data:`~companion.figures.palette.FIG_WIDTH`
wide (:func:`~companion.figures.palette.new_figure`) and takes its font sizes from
:mod:`companion.figures.palette` (:func:`~companion.figures.palette.set_sizes`), so that no text
reads under 9 pt when the book shows it at its text column.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure

from companion.figures.decode_time import SCORE_COLORS
from companion.figures.palette import LABEL_SIZE, LEGEND_SIZE, TITLE_SIZE, new_figure, set_sizes
from companion.speculative.replay import GridRow

__all__ = ["FIGURE_NAMES", "SERIES", "oracle_ratios"]

FIGURE_NAMES: dict[str, str] = {"oracle_ratios": "dec_oracle_ratios"}
"""Stable ``save_figure`` names, keyed by function name."""

ORACLE_COLOR = "#c44e52"
"""The oracle's line (cost over the oracle's = 1)."""

PANEL_HEIGHT = 2.55
"""Height (inches) of one row of panels."""

SERIES: dict[str, dict[str, object]] = {
    "best constant": {"color": "#9a9a9a", "ls": "-", "marker": "s"},
    "transformers default": {"color": "#555555", "ls": "--", "marker": "v"},
    "certificate": {"color": SCORE_COLORS["certificate"], "ls": "-", "marker": "o"},
    "top1": {"color": SCORE_COLORS["top1"], "ls": "-", "marker": "^"},
    "margin": {"color": SCORE_COLORS["margin"], "ls": "-", "marker": "D"},
    "cheapest policy": {"color": "#000000", "ls": ":", "marker": "x"},
}
"""The series drawn and their styles; the score colours are those of :mod:`companion.figures.decode_time`."""


def _value(row: GridRow, series: str) -> float:
    if series == "best constant":
        return row.to_oracle[row.best_constant]
    if series == "transformers default":
        return row.to_oracle[row.default]
    if series == "cheapest policy":
        return row.to_oracle[row.best_policy]
    return row.to_oracle[series]


def oracle_ratios(rows: Sequence[GridRow], labels: Mapping[str, str]) -> Figure:
    """Cost per token over the oracle's against the drafter's cost ``c`` (log axis), one panel per shape of ``V``.

    ``rows``: :class:`GridRow` objects (one per cost model); ``labels[shape]``: the panel's title.
    Drawn per panel: the best constant schedule (re-selected per cost model), ``transformers``'
    default, the calibrated rule driven by the certificate (with its 95 % paired-bootstrap band),
    by ``q(1)`` and by the margin, and the cheapest policy replayed; the oracle is the line at 1.
    Panels go two to a row; the fourth cell holds the legend.
    """
    shapes = list(dict.fromkeys(r.shape for r in rows))
    if not shapes:
        raise ValueError("no grid rows to draw")
    ncols = 2
    nrows = (len(shapes) + 1 + ncols - 1) // ncols  # one cell more for the legend
    fig = new_figure(PANEL_HEIGHT * nrows + 0.2)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True)
    handles = []
    for idx, shape in enumerate(shapes):
        ax = axes[idx // ncols][idx % ncols]
        sub = sorted((r for r in rows if r.shape == shape), key=lambda r: r.c)
        cs = np.array([r.c for r in sub])
        lo = np.array([r.cert_vs_oracle.lo for r in sub])
        hi = np.array([r.cert_vs_oracle.hi for r in sub])
        band = ax.fill_between(cs, lo, hi, color=SERIES["certificate"]["color"], alpha=0.18, lw=0)
        band.set_gid(f"band:{shape}:certificate")
        for name, style in SERIES.items():
            (line,) = ax.plot(cs, [_value(r, name) for r in sub], ms=4.5, lw=1.5, label=name,
                              gid=f"line:{shape}:{name}", **style)
            if idx == 0:
                handles.append(line)
        ax.axhline(1.0, color=ORACLE_COLOR, lw=1.2, gid=f"oracle:{shape}")
        ax.set_xscale("log")
        ax.set_title(labels.get(shape, shape), fontsize=TITLE_SIZE)
        ax.grid(alpha=0.3, which="both")
        if idx % ncols == 0:
            ax.set_ylabel("cost / oracle's cost", fontsize=LABEL_SIZE)
        if idx // ncols == nrows - 1 or idx + ncols >= len(shapes):
            ax.set_xlabel("drafter forward cost c", fontsize=LABEL_SIZE)
            ax.xaxis.set_tick_params(labelbottom=True)
        ax.set_xticks(cs, [f"{c:g}" for c in cs])
        ax.minorticks_off()
    legend_ax = axes[len(shapes) // ncols][len(shapes) % ncols]
    legend_ax.axis("off")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    extra = [Line2D([], [], color=ORACLE_COLOR, lw=1.2, label="oracle (= 1)"),
             Patch(color=SERIES["certificate"]["color"], alpha=0.18, label="certificate, 95 % interval")]
    legend_ax.legend(handles=handles + extra, loc="center", fontsize=LEGEND_SIZE, frameon=False)
    for k in range(len(shapes) + 1, nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    return set_sizes(fig)
