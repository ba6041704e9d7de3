"""Chapter 7's size axis: one figure per family of statistics, value against non-embedding parameters.

Measured runs are filled markers with their 95 % bootstrap intervals over prompts, joined by a
line in size order; the values reported second-hand for the paper's two targets are hollow
markers with no interval, labelled with the model's name. Each artist carries a ``gid``
(``"measured:<label>"`` or ``"reported:<label>"``) so that tests can read the plotted values back.
"""
from __future__ import annotations

from collections.abc import Sequence

from matplotlib.figure import Figure

from companion.analysis import size_axis as S
from companion.figures.palette import LEGEND_SIZE, TITLE_SIZE, new_figure, set_sizes

#: Stable ``save_figure`` names, one per family.
FIGURE_NAMES: dict[str, str] = {family: "exp_size_" + family.replace("'s", "").replace(" ", "_").replace("-", "")
                                for family in S.FAMILIES}
_COLORS = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9")
_MARKERS = ("o", "s", "^", "D", "v", "P")


def size_figure(points: Sequence[S.SizePoint], family: str, *, reported: bool = True) -> Figure:
    """The statistics of ``family`` (:data:`companion.analysis.size_axis.FAMILIES`) against size, on a log axis."""
    if family not in S.FAMILIES:
        raise ValueError(f"unknown family {family!r}: expected one of {', '.join(S.FAMILIES)}")
    stats = [s for s in S.STATISTICS if s.family == family]
    fig = new_figure(3.4 + 0.25 * len(stats))
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
            ln.set_gid(f"reported:{stat.label}")
    for p in ordered:
        ax.annotate(p.name.replace("-Instruct", ""), (p.non_embedding_parameters, 0), xycoords=("data", "axes fraction"),
                    xytext=(0, 3), textcoords="offset points", ha="center", fontsize=LEGEND_SIZE - 1, color="#444444")
    if reported:
        for name, size in S.REPORTED_MODELS:
            ax.axvline(size, color="#999999", lw=0.8, ls=":")
            ax.annotate(f"{name}\n(reported)", (size, 1), xycoords=("data", "axes fraction"), xytext=(0, -3),
                        textcoords="offset points", ha="center", va="top", fontsize=LEGEND_SIZE - 1, color="#666666")
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + 0.18 * (hi - lo))  # headroom for the reported models' labels at the top
    ax.set_xscale("log")
    ax.set_xlim(min(xs + [s for _, s in S.REPORTED_MODELS]) / 1.8, max(xs + [s for _, s in S.REPORTED_MODELS]) * 1.8)
    ax.set_xlabel("non-embedding parameters (log scale)")
    ax.set_ylabel("nats" if "certificate" in family or family == "relaxed criteria" else "probability")
    ax.set_title(f"{family}: measured (filled, 95 % interval over prompts); reported (hollow)", fontsize=TITLE_SIZE)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_SIZE, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return set_sizes(fig)
