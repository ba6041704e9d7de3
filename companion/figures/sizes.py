"""Chapter 7's size axis: one figure per family of statistics, value against non-embedding parameters.

Measured runs are filled markers with their 95 % bootstrap intervals over prompts, joined by a
line in size order; the values reported second-hand for the paper's two targets are hollow
markers with no interval, labelled with the model's name. Each artist carries a ``gid``
(``"measured:<label>"`` or ``"second-hand:<label>"``) so that tests can read the plotted values back.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from companion.analysis import size_axis as S
from companion.figures.palette import LEGEND_SIZE, PHONE_FIG_WIDTH, TITLE_SIZE, new_figure, set_sizes

#: Stable ``save_figure`` names, one per family.
FIGURE_NAMES: dict[str, str] = {family: "exp_size_" + family.replace("'s", "").replace(" ", "_").replace("-", "")
                                for family in S.FAMILIES}
_COLORS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
_MARKERS = ("o", "s", "^", "D", "v", "P")


def _two_lines(name: str) -> str:
    """A model's name on two lines, its size on the second: ``Qwen2.5-Coder-1.5B-Instruct`` -> ``Qwen2.5-Coder\n1.5B``."""
    short = name.replace("-Instruct", "")
    head, sep, size = short.rpartition("-")
    return f"{head}\n{size}" if sep and size[:1].isdigit() else short


def size_figure(points: Sequence[S.SizePoint], family: str, *, reported: bool = True) -> Figure:
    """The statistics of ``family`` (:data:`companion.analysis.size_axis.FAMILIES`) against size, on a log axis.

    Drawn for a phone (``companion.figures.palette.PHONE_FIG_WIDTH``): one panel, the legend below
    it in one column, each measured model named under its marker on two lines, each of the paper's
    targets over its dotted line; the chapter shows it with the ``figclass``
    ``companion.figures.palette.PHONE_FIGCLASS``.
    """
    if family not in S.FAMILIES:
        raise ValueError(f"unknown family {family!r}: expected one of {', '.join(S.FAMILIES)}")
    stats = [s for s in S.STATISTICS if s.family == family]
    fig = new_figure(3.9 + 0.3 * len(stats), width=PHONE_FIG_WIDTH)
    ax = fig.subplots()
    ordered = sorted(points, key=lambda p: p.non_embedding_parameters)
    xs = [p.non_embedding_parameters for p in ordered]
    for i, stat in enumerate(stats):
        color, marker = _COLORS[i % len(_COLORS)], _MARKERS[i % len(_MARKERS)]
        est = [p.estimates[stat.key] for p in ordered]
        ys = [e.value for e in est]
        yerr = [[max(e.value - e.low, 0.0) for e in est], [max(e.high - e.value, 0.0) for e in est]]
        bars = ax.errorbar(xs, ys, yerr=yerr, color=color, marker=marker, lw=1.2, capsize=3, label=stat.label)
        bars.lines[0].set_gid(f"measured:{stat.label}")
        if reported and stat.key in S.REPORTED:
            rx = [size for (_, size), v in zip(S.REPORTED_MODELS, S.REPORTED[stat.key]) if v is not None]
            ry = [v for v in S.REPORTED[stat.key] if v is not None]
            (ln,) = ax.plot(rx, ry, ls="none", marker=marker, mfc="white", mec=color, mew=1.5, ms=7)
            ln.set_gid(f"second-hand:{stat.label}")
    # neighbours' names are staggered (every other one a row further in), as models close in size
    # would otherwise print their names over each other on a phone-wide axis
    for i, p in enumerate(ordered):
        ax.annotate(_two_lines(p.name), (p.non_embedding_parameters, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, 3 + (2.2 * LEGEND_SIZE if i % 2 else 0)), textcoords="offset points", ha="center",
                    va="bottom", fontsize=LEGEND_SIZE, color="#444444", linespacing=1.0)
    if reported:
        for i, (name, size) in enumerate(S.REPORTED_MODELS):
            ax.axvline(size, color="#999999", lw=0.8, ls=":")
            ax.annotate(name, (size, 1), xycoords=("data", "axes fraction"), xytext=(0, -3 - (1.3 * LEGEND_SIZE if i % 2 else 0)),
                        textcoords="offset points", ha="center", va="top", fontsize=LEGEND_SIZE, color="#666666")
    lo, hi = ax.get_ylim()
    ticks = [t for t in ax.get_yticks() if lo <= t <= hi]   # the data's range only: no tick in the names' room
    # room for the names: the measured models' under the data, the paper's targets' over it
    ax.set_ylim(lo - 0.42 * (hi - lo), hi + 0.25 * (hi - lo))
    ax.set_yticks(ticks)
    ax.set_xscale("log")
    ax.set_xlim(min(xs + [s for _, s in S.REPORTED_MODELS]) / 2.2, max(xs + [s for _, s in S.REPORTED_MODELS]) * 2.2)
    ax.set_xlabel("non-embedding parameters (log scale)")
    ax.set_ylabel("nats" if "certificate" in family or family == "relaxed criteria" else "probability")
    ax.set_title(f"{family}\nfilled: measured, 95 % interval; hollow: second-hand", fontsize=TITLE_SIZE)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=1, frameon=False)
    return set_sizes(fig)
