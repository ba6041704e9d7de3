"""One home for the colours and line styles of the book's figures.

Every chapter draws the same things: the six criteria, greedy trees of a few widths, accepted
and rejected tokens, and certificates that may be ``+inf`` (the criterion rejects nothing). A
reader learns a colour once and it keeps its meaning on every page, so both figure modules
(:mod:`companion.figures.theory` for chapters 1-6, :mod:`companion.figures.experiments` for
chapters 7-8) take their colours and styles from here:

* a criterion is coloured by its kind (``greedy``, ``additive``, ``multiplicative``, ``topm``,
  ``topk-delta``, ``typical``), whatever its parameters: :func:`criterion_color`;
* a greedy tree of width ``m`` has one colour, :func:`tree_color`; width 1 *is* strict greedy
  and shares its colour; tree colours avoid the criteria's, so a tree is never mistaken for a
  criterion; trees are drawn dashed where they share an axis with criteria (:func:`series_style`);
* ``+inf`` certificates are drawn in a labelled grey band at the top (or right) edge of a log
  axis, with ``+inf`` written on the axis: :func:`inf_band`;
* every figure is :data:`FIG_WIDTH` wide (:func:`new_figure`) and takes its font sizes from here
  (:func:`set_sizes` for ticks and axis labels), because the book stretches each figure to its
  text column: drawn at this width, no text reads under :data:`MIN_DISPLAY_PT` on the page.
"""
from __future__ import annotations

import math

from matplotlib.figure import Figure

from companion.certify.criteria import parse_criterion

__all__ = [
    "CRITERION_COLORS",
    "TREE_COLORS",
    "ACCEPT",
    "REJECT",
    "NOT_CERTIFIED",
    "EXAMPLE_COLORS",
    "DISPLAY_WIDTH_IN",
    "MIN_DISPLAY_PT",
    "FIG_WIDTH",
    "PHONE_WIDTH_IN",
    "PHONE_MIN_PT",
    "PHONE_FIG_WIDTH",
    "PHONE_FIGCLASS",
    "PHONE_DESKTOP_PX",
    "TICK_SIZE",
    "LABEL_SIZE",
    "LEGEND_SIZE",
    "TITLE_SIZE",
    "INF_LABEL",
    "criterion_color",
    "tree_color",
    "series_color",
    "series_style",
    "series_label",
    "inf_band",
    "new_figure",
    "set_sizes",
    "displayed_scale",
]

CRITERION_COLORS: dict[str, str] = {
    "greedy": "#222222",
    "additive": "#1f77b4",
    "multiplicative": "#ff7f0e",
    "topm": "#2ca02c",
    "topk-delta": "#9467bd",
    "typical": "#d62728",
}
"""Colour of each criterion kind."""

TREE_COLORS: dict[int, str] = {
    1: CRITERION_COLORS["greedy"],  # the width-1 tree is strict greedy
    2: "#8c564b",
    3: "#bcbd22",
    4: "#17becf",
    5: "#e377c2",
    6: "#7b4173",
    7: "#637939",
    8: "#393b79",
}
"""Colour of the greedy tree of each width ``m = 1..8``; none but ``m = 1`` is a criterion's."""

_TREE_FALLBACK = "#555555"

ACCEPT, REJECT = "#4c9a2a", "#c44e52"
"""Accepted and rejected tokens (or steps)."""

NOT_CERTIFIED = "#e69f00"
"""Steps accepted by a criterion but not certified by the KL."""

EXAMPLE_COLORS: tuple[str, ...] = ("#01665e", "#c51b7d", "#8a6d0b")
"""Individual examples and parameter values that are neither criteria nor trees (chapter 2's two
divergences, chapter 3's top-two masses, chapter 6's worst-case paths): none is a criterion's or
a tree's colour."""

DISPLAY_WIDTH_IN = 672 / 96
"""Width (inches, at 96 CSS px per inch) at which the book shows every figure: the staged page
sets each figure to ``width: 100%`` of the text column, 672 px at a 1280 px window (measured in
Chromium). A figure saved ``w`` inches wide is scaled by ``DISPLAY_WIDTH_IN / w`` on the page."""

MIN_DISPLAY_PT = 9.0
"""Smallest text (points) a reader may be shown, at the displayed size."""

FIG_WIDTH = 6.6
"""Width (inches) of every figure: a little under the column, so that with the saved figure's
tight margins a font is shown at about 1.04 times its size and none of the sizes below reads
under :data:`MIN_DISPLAY_PT`. Panels go at most two to a row; wider layouts stack vertically."""

PHONE_WIDTH_IN = 342 / 96
"""Width (inches, at 96 CSS px per inch) at which a figure is shown on a phone 390 px wide (measured
in Chromium on the built book: 342 px, inside the page's margins and the figure's own): a figure
saved ``w`` inches wide is scaled by ``PHONE_WIDTH_IN / w`` there."""

PHONE_MIN_PT = 7.5
"""Smallest text (points, 10 CSS px) a figure drawn for a phone shows at :data:`PHONE_WIDTH_IN`."""

PHONE_FIG_WIDTH = 3.8
"""Width (inches) of a figure drawn for a phone (:data:`PHONE_FIGCLASS`): one panel, its legend
below, so that at :data:`PHONE_WIDTH_IN` no font of the sizes below reads under :data:`PHONE_MIN_PT`."""

PHONE_FIGCLASS = "companion-phone"
"""The ``figclass`` a chapter gives a figure drawn for a phone: the book's stylesheet shows it at
most :data:`PHONE_DESKTOP_PX` wide on a wide screen, where the column would blow it up."""

PHONE_DESKTOP_PX = 480
"""Largest width (CSS px) of a phone figure on a wide screen (``book/_ext/static/companion.css``)."""

TICK_SIZE = 10
LABEL_SIZE = 10
LEGEND_SIZE = 9
TITLE_SIZE = 10
"""Font sizes (points at the figure's own size). Nothing is drawn under ``LEGEND_SIZE``; the
decode-time figures write bar values at ``TICK_SIZE - 1``."""

INF_LABEL = "+\u221e (rejects nothing)"
"""How the ``+inf`` band is labelled."""


def criterion_color(spec: str) -> str:
    """A fixed colour per criterion kind (``greedy``, ``additive``, ...), shared by all figures."""
    return CRITERION_COLORS[str(parse_criterion(spec)).split(":")[0]]


def tree_color(m: int) -> str:
    """The colour of the width-``m`` greedy tree (``m = 1..8``; wider trees share a dark grey)."""
    if isinstance(m, bool) or int(m) != m or m < 1:
        raise ValueError(f"tree width must be a positive integer, got {m!r}")
    return TREE_COLORS.get(int(m), _TREE_FALLBACK)


def series_color(label: str) -> str:
    """Colour of a criterion spec (``"typical:0.09,0.3"``) or of a tree (``"tree:m"``)."""
    if label.startswith("tree:"):
        return tree_color(int(label.split(":", 1)[1]))
    return criterion_color(label)


def series_style(label: str) -> dict:
    """Line keywords for a criterion (solid) or a tree (``"tree:m"``, dashed) on a shared axis."""
    return {"color": series_color(label), "ls": "--" if label.startswith("tree:") else "-", "lw": 1.6}


def series_label(label: str) -> str:
    """Legend text of a series: the criterion spec itself, or ``"tree m=4"`` for ``"tree:4"``."""
    return f"tree m={label.split(':', 1)[1]}" if label.startswith("tree:") else label


def inf_band(ax, at: float, *, axis: str = "y", label: str = INF_LABEL, gid: str = "inf-band"):
    """Mark ``+inf`` on a log ``axis`` of ``ax``: values drawn at ``at`` sit in a grey band
    ``[at / 1.8, at * 1.8]`` labelled ``label`` inside it (at the right end, or the top end for
    ``axis="x"``), and the axis gets a ``+inf`` tick there.

    The axis limit on that side is set to the band's edge; call after drawing the data, and
    do not change that limit afterwards. Returns the band (its ``gid`` is ``gid``).
    """
    lo, hi = at / 1.8, at * 1.8
    if axis == "y":
        band = ax.axhspan(lo, hi, color="0.85", lw=0, zorder=0)
        ax.set_ylim(top=hi)
        ax.text(0.98, at, label, transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=LEGEND_SIZE, color="0.2", zorder=5)
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t < lo]
        ax.set_yticks(ticks + [at], [_log_tick(t) for t in ticks] + ["+\u221e"])
    elif axis == "x":
        band = ax.axvspan(lo, hi, color="0.85", lw=0, zorder=0)
        ax.set_xlim(right=hi)
        ax.text(at, 0.98, label, transform=ax.get_xaxis_transform(), ha="center", va="top",
                rotation=90, fontsize=LEGEND_SIZE, color="0.2", zorder=5)
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t < lo]
        ax.set_xticks(ticks + [at], [_log_tick(t) for t in ticks] + ["+\u221e"])
    else:
        raise ValueError(f"axis must be 'x' or 'y', got {axis!r}")
    band.set_gid(gid)
    return band


def _log_tick(t: float) -> str:
    """``$10^{k}$`` for a power of ten, else the number."""
    k = math.log10(t) if t > 0 else math.nan
    return f"$10^{{{round(k)}}}$" if math.isfinite(k) and abs(k - round(k)) < 1e-9 else f"{t:g}"


def new_figure(height: float, width: float = FIG_WIDTH) -> Figure:
    """A pyplot-free, constrained-layout figure ``width`` x ``height`` inches (the book's width
    by default)."""
    return Figure(figsize=(width, height), layout="constrained")


def set_sizes(fig: Figure) -> Figure:
    """Give every axis of ``fig`` the book's tick and label sizes (texts placed by the figure code
    set their own from the constants above). Returns ``fig``."""
    for ax in fig.axes:
        ax.tick_params(which="both", labelsize=TICK_SIZE)
        ax.xaxis.label.set_fontsize(LABEL_SIZE)
        ax.yaxis.label.set_fontsize(LABEL_SIZE)
    return fig


def displayed_scale(saved_width_in: float) -> float:
    """How much the book scales a figure saved ``saved_width_in`` inches wide (fonts included)."""
    return DISPLAY_WIDTH_IN / saved_width_in
