"""Figures of the experiment chapters (7: the paper's evaluation; 8: a real drafter).

Each function takes harvested :class:`companion.analysis.traces.Traces`, computes what it draws with
:mod:`companion.analysis.traces` (so a figure shows exactly the numbers the chapter quotes) and
returns a pyplot-free :class:`matplotlib.figure.Figure`. A notebook displays it and passes it to
:func:`companion.figures.save_figure` under the stable name in :data:`FIGURE_NAMES`. Artists
carrying data have a ``gid`` (``"cdf:greedy"``, ``"frac:tree:4:eps=0.1"``...) so tests can
read the plotted values back.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from companion import analysis as A
from companion.harvest.schema import column as column_name
from companion.figures.palette import (
    ACCEPT,
    INF_LABEL,
    LEGEND_SIZE,
    REJECT,
    TITLE_SIZE,
    criterion_color,
    inf_band,
    new_figure,
    series_label,
    series_style,
    set_sizes,
)
from companion.figures.palette import series_color as _palette_series_color

__all__ = [
    "FIGURE_NAMES",
    "certificate_cdf",
    "certificate_vs_margin",
    "run_length_vs_budget",
    "drafter_acceptance",
    "tightness_by_margin",
    "kl_vs_certificate",
    "tree_coverage",
    "round_lengths",
    "series_color",
]

FIGURE_NAMES: dict[str, str] = {
    "certificate_cdf": "exp_certificate_cdf",
    "certificate_vs_margin": "exp_certificate_vs_margin",
    "run_length_vs_budget": "exp_run_length_vs_budget",
    "drafter_acceptance": "exp_drafter_acceptance",
    "tightness_by_margin": "exp_tightness_by_margin",
    "kl_vs_certificate": "exp_kl_vs_certificate",
    "tree_coverage": "exp_tree_coverage",
    "round_lengths": "exp_round_lengths",
}
"""Stable ``save_figure`` names of the experiment figures, keyed by function name."""

_ACCEPT, _REJECT = ACCEPT, REJECT
_FLOOR = 1e-8  # smallest value drawn on a log axis (certificates and KL can be 0 on exact ties)
_VACUOUS_HATCH = "xx"
_VACUOUS_LABEL = "of which \u03c1* = +\u221e (vacuous: rejects nothing)"


def series_color(label: str) -> str:
    """Colour of a criterion spec (as in the theory chapters) or of ``"tree:m"`` (as in chapter 5).

    Both come from :mod:`companion.figures.palette`, the one table of the book's colours.
    """
    return _palette_series_color(label)


def _series(traces: A.Traces, criteria: Sequence[str] | None, tree_widths: Sequence[int],
            divergence: str) -> dict[str, np.ndarray]:
    out = {c: traces.cert(c, divergence) for c in (traces.criteria if criteria is None else criteria)}
    for m in tree_widths:
        out[f"tree:{m}"] = traces.tree_cert(m, divergence)
    return out


def _style(label: str) -> dict:
    return series_style(label)


def _pretty(label: str) -> str:
    return series_label(label)


def _vacuous_patch():
    from matplotlib.patches import Patch

    return Patch(facecolor="white", edgecolor="0.3", hatch=_VACUOUS_HATCH, label=_VACUOUS_LABEL)


def distinct_labels(values: np.ndarray, min_digits: int = 2, max_digits: int = 8) -> list[str]:
    """``values`` with the fewest significant digits (at least ``min_digits``) that tell every pair
    of distinct values apart: margin-bin centres crowd near 1 (0.9991, 0.9996, ...), where two
    digits would print "1, 1, 1"."""
    values = np.asarray(values, dtype=float)
    for digits in range(min_digits, max_digits + 1):
        labels = [f"{v:.{digits}g}" for v in values]
        if len(set(labels)) == len(set(values.tolist())):
            return labels
    return [f"{v:.{max_digits}g}" for v in values]


def _margin_ticks(ax, x: np.ndarray, centers: np.ndarray, rotation: float = 30) -> None:
    # Set after set_sizes: these labels keep their own size, the smallest the book allows, so
    # eight of them fit under a half-width panel.
    ax.set_xticks(x, distinct_labels(centers), rotation=rotation, ha="right", rotation_mode="anchor",
                  fontsize=LEGEND_SIZE)


def ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF ``F(x_(i)) = i / N`` at the sorted finite values (``+inf`` values keep ``F < 1``)."""
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    finite = np.isfinite(v)
    return v[finite], (np.arange(1, n + 1, dtype=np.float64) / n)[finite]


# -- chapter 7 ----------------------------------------------------------------------------------


def certificate_cdf(traces: A.Traces, criteria: Sequence[str] | None = None, tree_widths: Sequence[int] = (2, 4, 8),
                    divergence: str = "forward") -> Figure:
    """(a) Empirical CDF of ``rho*_c`` over all steps for each criterion; (b) tree certificates vs ``log(m+1)``.

    A curve that stops below 1 has that share of steps at ``+inf`` (the criterion rejects
    nothing); the legend gives the share.
    """
    fig = new_figure(7.0)
    ax_c, ax_t = fig.subplots(2, 1, sharex=True)
    series = _series(traces, criteria, tree_widths, divergence)
    if tree_widths:  # strict greedy is the width-1 tree: the reference in panel (b), listed first
        series = {**{k: v for k, v in series.items() if not k.startswith("tree:")},
                  "tree:1": traces.tree_cert(1, divergence),
                  **{k: v for k, v in series.items() if k.startswith("tree:")}}
    lo = _FLOOR
    for label, values in series.items():
        x, y = ecdf(values)
        ax = ax_t if label.startswith("tree:") else ax_c
        name = "tree m=1 (= greedy)" if label == "tree:1" else _pretty(label)
        inf_share = float(np.mean(np.isinf(values))) if len(values) else 0.0
        if inf_share > 0:  # the curve stops below 1: say where the rest of the steps are
            name += f" ({inf_share:.0%} of steps at +\u221e)"
        (ln,) = ax.step(np.maximum(x, lo), y, where="post", label=name, **_style(label))
        ln.set_gid(f"cdf:{label}")
    for m in tree_widths:
        vl = ax_t.axvline(math.log(m + 1), color=series_color(f"tree:{m}"), lw=0.8, ls=":")
        vl.set_gid(f"ceiling:{m}")
    div = "p||q" if divergence == "forward" else "q||p"
    for ax, title in ((ax_c, "(a) criteria"), (ax_t, "(b) greedy trees; dotted: ceilings log(m+1)")):
        ax.set_xscale("log")
        ax.set_title(title, fontsize=TITLE_SIZE)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=LEGEND_SIZE, loc="upper left")
        ax.set_ylabel("share of steps with $\\rho^* \\leq$ x")
    ax_t.set_xlabel(f"certificate $\\rho^*$ (nats, KL({div}))")
    return set_sizes(fig)


def certificate_vs_margin(traces: A.Traces, budgets: Sequence[float] = (0.01, 0.1, 0.5), n_bins: int = 8,
                          criteria: Sequence[str] | None = None, tree_widths: Sequence[int] = (2, 4, 8),
                          divergence: str = "forward") -> Figure:
    """Certificates against the target's top-2 margin, in equal-count margin bins.

    (a) median certificate per bin; a ``+inf`` median (the criterion rejects nothing on most of
    the bin) is drawn in a labelled band at the top; (b..) the share of each bin's steps
    certified at each KL budget (``rho* > eps``,
    :func:`companion.analysis.traces.certified_fraction_by_bin`). Where a series has ``+inf``
    certificates, the part of that share that is vacuous (``rho* = +inf``: certified because
    nothing is rejected) is hatched under its curve. Panels are laid out two per row.
    """
    margin = traces.column("margin")
    edges = A.margin_bin_edges(margin, n_bins)
    series = _series(traces, criteria, tree_widths, divergence)
    curves = A.certified_fraction_by_bin(margin, series, budgets, edges)
    bins = A.bin_index(margin, edges)
    x = np.arange(curves.n_bins)
    n_panels = 1 + len(budgets)
    ncols = 2 if n_panels in (2, 4) else min(n_panels, 3)
    nrows = math.ceil(n_panels / ncols)
    fig = new_figure(2.7 * nrows + 1.2)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True).ravel()
    ax0 = axes[0]
    medians = {label: A.median_by_bin(v, bins, curves.n_bins) for label, v in series.items()}
    finite_max = max([float(np.nanmax(np.where(np.isfinite(m), m, np.nan))) for m in medians.values()
                      if np.isfinite(m).any()] + [1.0])
    top = finite_max * 4
    any_inf = False
    handles = []
    for label, med in medians.items():
        any_inf = any_inf or bool(np.isinf(med).any())
        (ln,) = ax0.plot(x, np.clip(np.where(np.isinf(med), top, med), _FLOOR, None), marker="o", ms=3.5,
                         label=_pretty(label), **_style(label))
        ln.set_gid(f"median:{label}")
        handles.append(ln)
    ax0.set_yscale("log")
    if any_inf:
        inf_band(ax0, top)
    ax0.set_ylabel("median \u03c1* in bin (nats)")
    ax0.set_title("(a) median certificate", fontsize=TITLE_SIZE)
    vacuous = {label: A.fraction_by_bin(np.isinf(v), bins, curves.n_bins)[0] for label, v in series.items()
               if np.isinf(v).any()}
    for ax, (e, eps) in zip(axes[1:], enumerate(curves.eps)):
        for label, frac in curves.values.items():
            (ln,) = ax.plot(x, frac[e], marker="o", ms=3.5, label=_pretty(label), **_style(label))
            ln.set_gid(f"frac:{label}:eps={eps:g}")
        for label, vac in vacuous.items():
            area = ax.fill_between(x, 0, np.nan_to_num(vac), facecolor="none", hatch=_VACUOUS_HATCH, lw=0,
                                   edgecolor=to_rgba(series_color(label), 0.45))
            area.set_gid(f"vacuous:{label}:eps={eps:g}")
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("share of bin certified")
        ax.set_title(f"({chr(ord('b') + e)}) certified at $\\varepsilon$ = {eps:g} nats", fontsize=TITLE_SIZE)
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    set_sizes(fig)
    for i, ax in enumerate(axes[:n_panels]):
        ax.grid(alpha=0.3)
        if i >= n_panels - ncols:  # bottom panel of each column: ticks and label
            _margin_ticks(ax, x, curves.centers, rotation=45 if ncols > 1 else 30)
            ax.xaxis.set_tick_params(labelbottom=True)
            ax.set_xlabel("target margin $p_{(1)} - p_{(2)}$ (bin median)")
    if vacuous:
        handles.append(_vacuous_patch())
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), fontsize=LEGEND_SIZE,
               frameon=False)
    return fig


def run_length_vs_budget(traces: A.Traces, eps: Sequence[float] = tuple(A.EPS_GRID), criteria: Sequence[str] | None = None,
                         tree_widths: Sequence[int] = (2, 4, 8), divergence: str = "forward") -> Figure:
    """Mean certified run length against the per-step KL budget ``eps`` (log scale), per criterion and tree width."""
    curves = A.run_length_curves(traces, eps, criteria, tree_widths, divergence)
    fig = new_figure(4.8)
    ax = fig.subplots()
    for label, y in curves.items():
        (ln,) = ax.plot(np.asarray(eps), y, label=_pretty(label), **_style(label))
        ln.set_gid(f"runs:{label}")
    # The longest possible mean run: every step certified, each run cut only by its trajectory's end.
    cap = float(A.mean_run_length(traces, np.full(traces.n_rows, np.inf), 0.0))
    cl = ax.axhline(cap, color="grey", lw=0.8, ls=":", label="every step certified")
    cl.set_gid("runs:cap")
    mean_len = float(traces.lengths.mean()) if traces.n_trajectories else 0.0
    ax.set_xscale("log")
    ax.set_xlabel("per-step KL budget $\\varepsilon$ (nats)")
    ax.set_ylabel("mean certified run length (tokens)")
    ax.set_title(f"Tokens guaranteed accepted from a random step\n(trajectories of {mean_len:.1f} steps on average)",
                 fontsize=TITLE_SIZE)
    ax.grid(alpha=0.3, which="both")
    # under the panel, not beside it: beside it would take a third of the width
    fig.legend(handles=ax.get_lines(), fontsize=LEGEND_SIZE, loc="outside lower center", ncols=3, frameon=False)
    return set_sizes(fig)


# -- chapter 8 ----------------------------------------------------------------------------------


def drafter_acceptance(traces: A.Traces, criteria: Sequence[str] | None = None) -> Figure:
    """Per criterion: share of steps where the drafter's token is accepted, certified (forward), certified (reverse).

    The part of a certified bar that is vacuous (``rho* = +inf``: the criterion rejects nothing,
    so any draft is "certified") is washed out and cross-hatched, the same share on both bars: it
    is read from the forward certificate, which is ``+inf`` exactly when the rejection region is
    empty (the reverse one is also ``+inf`` when every rejected token has ``p = 0``, and a drafter
    on such a token is rejected, so that is not vacuous).
    """
    from matplotlib.patches import Patch

    rows = A.acceptance_table(traces, criteria)
    fig = new_figure(4.6)
    ax = fig.subplots()
    x = np.arange(len(rows))
    width = 0.27
    kinds = (("accepted", "accepted", 1.0, None), ("certified_fwd", "certified, KL(p||q) < $\\rho^*$", 0.75, "//"),
             ("certified_rev", "certified, KL(q||p) < $\\rho^*_{rev}$", 0.5, ".."))
    handles = []
    for i, (attr, label, alpha, hatch) in enumerate(kinds):
        heights = [getattr(r, attr) for r in rows]
        bars = ax.bar(x + (i - 1) * width, heights, width, alpha=alpha, hatch=hatch,
                      color=[criterion_color(r.criterion) for r in rows], edgecolor="black", lw=0.5)
        for r, patch in zip(rows, bars):
            patch.set_gid(f"{attr}:{r.criterion}")
        handles.append(Patch(facecolor="0.35", alpha=alpha, hatch=hatch, edgecolor="black", lw=0.5, label=label))
    vacuous = [float(np.mean(np.isinf(traces.cert(r.criterion, "forward")))) for r in rows]
    if any(v > 0 for v in vacuous):
        for i, attr in ((1, "certified_fwd"), (2, "certified_rev")):
            over = ax.bar(x + (i - 1) * width, vacuous, width, facecolor=(1, 1, 1, 0.6), edgecolor="black",
                          hatch=_VACUOUS_HATCH, lw=0.5)
            for r, patch in zip(rows, over):
                patch.set_gid(f"vacuous_{attr.split('_')[1]}:{r.criterion}")
        handles.append(_vacuous_patch())
    # Specs like "typical:0.09,0.3" break after the colon: two short lines, horizontal, never clipped.
    set_sizes(fig)
    # "multiplicative:" is the widest label: at the smallest size the book allows it fits its slot.
    ax.set_xticks(x, [r.criterion.replace(":", ":\n", 1) for r in rows], fontsize=LEGEND_SIZE)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("share of steps")
    fig.suptitle("The drafter's greedy token: accepted vs certified", fontsize=TITLE_SIZE)
    ax.grid(alpha=0.3, axis="y")
    # above the bars, where it covers none of them
    ax.legend(handles=handles, fontsize=LEGEND_SIZE, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncols=2,
              frameon=False)
    return fig


def tightness_by_margin(traces: A.Traces, n_bins: int = 8, criteria: Sequence[str] | None = None,
                        divergence: str = "forward") -> Figure:
    """(a) share of accepted steps that are certified, per margin bin; (b) actual acceptance per margin bin.

    In (a), where a criterion has ``+inf`` certificates, the vacuous part of its tightness (accepted
    steps with ``rho* = +inf``) is hatched under its curve.
    """
    margin = traces.column("margin")
    edges = A.margin_bin_edges(margin, n_bins)
    tight = A.tightness_by_bin(traces, edges, criteria, divergence)
    bins = A.bin_index(margin, edges)
    fig = new_figure(7.0)
    ax_t, ax_a = fig.subplots(2, 1, sharex=True)
    x = np.arange(tight.n_bins)
    handles = []
    any_vacuous = False
    for c in (traces.criteria if criteria is None else criteria):
        (ln,) = ax_t.plot(x, tight.values[c], marker="o", ms=3.5, label=c, **_style(c))
        ln.set_gid(f"tight:{c}")
        handles.append(ln)
        acc_flags = traces.column(column_name("accepted", c))
        acc, _ = A.fraction_by_bin(acc_flags, bins, tight.n_bins)
        (ln2,) = ax_a.plot(x, acc, marker="o", ms=3.5, label=c, **_style(c))
        ln2.set_gid(f"accept:{c}")
        rho = traces.cert(c, divergence)
        if np.isinf(rho).any():
            any_vacuous = True
            vac, _ = A.fraction_by_bin(np.isinf(rho), bins, tight.n_bins, where=acc_flags)
            area = ax_t.fill_between(x, 0, np.nan_to_num(vac), facecolor="none", hatch=_VACUOUS_HATCH, lw=0,
                                     edgecolor=to_rgba(series_color(c), 0.45))
            area.set_gid(f"vacuous:{c}")
    ax_t.set_ylabel("certified / accepted")
    ax_t.set_title("(a) tightness: share of acceptances the certificate explains", fontsize=TITLE_SIZE)
    ax_a.set_ylabel("share of bin accepted")
    ax_a.set_title("(b) actual acceptance of the drafter's token", fontsize=TITLE_SIZE)
    set_sizes(fig)
    for ax in (ax_t, ax_a):
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    _margin_ticks(ax_a, x, tight.centers)  # shared x: the bottom panel carries the ticks
    ax_a.set_xlabel("target margin $p_{(1)} - p_{(2)}$ (bin median; equal-count bins)")
    if any_vacuous:
        handles.append(_vacuous_patch())
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), fontsize=LEGEND_SIZE,
               frameon=False)
    return fig


def kl_vs_certificate(traces: A.Traces, criteria: Sequence[str] | None = None, divergence: str = "forward",
                      max_points: int = 20000, seed: int = 0, ncols: int = 2) -> Figure:
    """One panel per criterion: the drafter's ``KL`` against the target's certificate, step by step.

    Below the diagonal ``KL = rho*`` a step is certified; soundness says no red (rejected)
    point lies there. ``+inf`` certificates are drawn in a grey band at the right edge (tick
    ``+inf``), values under ``1e-8`` at ``1e-8``. At most ``max_points`` steps are drawn (a
    seeded sample).
    """
    from matplotlib.lines import Line2D

    crits = list(traces.criteria if criteria is None else criteria)
    kl = traces.kl(divergence)
    n = len(kl)
    idx = np.arange(n)
    if n > max_points:
        idx = np.sort(np.random.default_rng(seed).choice(n, max_points, replace=False))
    nrows = math.ceil(len(crits) / ncols)
    fig = new_figure(2.5 * nrows + 0.8)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
    rho_all = np.concatenate([traces.cert(c, divergence)[idx] for c in crits]) if crits else np.zeros(0)
    finite = rho_all[np.isfinite(rho_all)]
    kl_drawn = kl[idx]
    right = max(float(finite.max()) if finite.size else 1.0, float(kl_drawn.max()) if n else 1.0) * 3
    any_inf = bool(np.isinf(rho_all).any())
    # Floors: half the smallest positive value on each axis (zeros, e.g. exact ties, are drawn there).
    x_floor = max(_FLOOR, float(finite[finite > 0].min()) / 2) if np.any(finite > 0) else _FLOOR
    y_floor = max(_FLOOR, float(kl_drawn[kl_drawn > 0].min()) / 2) if np.any(kl_drawn > 0) else _FLOOR
    lo = min(x_floor, y_floor)
    for ax, c in zip(axes, crits):
        rho = traces.cert(c, divergence)[idx]
        acc = traces.column(column_name("accepted", c))[idx].astype(bool)
        xs = np.clip(np.where(np.isinf(rho), right, rho), x_floor, None)
        ys = np.clip(kl_drawn, y_floor, None)
        for mask, color, label, gid in ((acc, _ACCEPT, "accepted", "accepted"), (~acc, _REJECT, "rejected", "rejected")):
            sc = ax.scatter(xs[mask], ys[mask], s=4, alpha=0.4, color=color, label=label, lw=0, rasterized=True)
            sc.set_gid(f"scatter:{c}:{gid}")
        diag = right / 1.8 if any_inf else right
        ax.plot([lo, diag], [lo, diag], color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(x_floor / 1.5, right * 1.5)
        ax.set_ylim(y_floor / 1.5, right * 1.5)
        ax.set_title(f"{c}: {float((kl < traces.cert(c, divergence)).mean()):.0%} certified", fontsize=TITLE_SIZE)
        ax.grid(alpha=0.3)
    if any_inf and crits:
        for ax in axes[:len(crits)]:
            inf_band(ax, right, axis="x", label="")
    for ax in axes[len(crits):]:
        ax.set_visible(False)
    kl_name = "KL(p||q)" if divergence == "forward" else "KL(q||p)"
    for ax in axes[::ncols]:
        ax.set_ylabel(f"drafter {kl_name} (nats)")
    for ax in axes[-ncols:]:
        ax.set_xlabel("certificate $\\rho^*(p)$ (nats)")
    if crits:
        handles = [Line2D([], [], ls="none", marker="o", ms=5, color=_ACCEPT, alpha=0.6, label="accepted"),
                   Line2D([], [], ls="none", marker="o", ms=5, color=_REJECT, alpha=0.6, label="rejected"),
                   Line2D([], [], color="black", lw=0.8, label=f"{kl_name} = $\\rho^*$: certified below")]
        if any_inf:
            from matplotlib.patches import Patch

            handles.append(Patch(facecolor="0.85", label=INF_LABEL))
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=LEGEND_SIZE, frameon=False)
    return set_sizes(fig)


def tree_coverage(traces: A.Traces, widths: Sequence[int] = tuple(range(1, 9)), divergence: str = "forward") -> Figure:
    """Share of steps whose greedy token is in the drafter's top-``m``: actual vs certified, ``m = 1..8``."""
    cov = A.tree_coverage(traces, widths, divergence)
    fig = new_figure(4.2)
    ax = fig.subplots()
    (l1,) = ax.plot(cov.widths, cov.covered, marker="o", color=_ACCEPT, label="covered (actual)")
    (l2,) = ax.plot(cov.widths, cov.certified, marker="s", color="0.25", ls="--",
                    label="certified: KL < $\\rho^*_{tree}$")
    l1.set_gid("covered")
    l2.set_gid("certified")
    ax.set_xticks(cov.widths)
    ax.set_xlabel("tree width m (drafter's top-m tokens)")
    ax.set_ylabel("share of steps")
    ax.set_ylim(0, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=LEGEND_SIZE, loc="lower right")
    ax.set_title("Greedy trees: the target's token among the drafter's top m", fontsize=TITLE_SIZE)
    return set_sizes(fig)


def round_lengths(traces: A.Traces, draft_lengths: Sequence[int] = tuple(range(1, 17)), criteria: Sequence[str] | None = None,
                  eps: float | None = None, divergence: str = "forward", ncols: int = 2) -> Figure:
    """Mean accepted draft tokens per round vs draft length ``K``: measured, certified, scalar-budget prediction.

    Definitions in :func:`companion.analysis.traces.accepted_length_per_round`; the grey line is ``K``.
    """
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    r = A.accepted_length_per_round(traces, draft_lengths, criteria, eps, divergence)
    crits = list(r.measured)
    nrows = math.ceil(len(crits) / ncols)
    fig = new_figure(2.3 * nrows + 1.0)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True).ravel()
    k = r.draft_lengths
    for ax, c in zip(axes, crits):
        color = criterion_color(c)
        ax.plot(k, k, color="grey", lw=0.6)
        (a,) = ax.plot(k, r.measured[c], color=color, lw=1.8, label="measured")
        (b,) = ax.plot(k, r.certified[c], color=color, lw=1.4, ls="--", label="certified (per-step KL)")
        (d,) = ax.plot(k, r.budget[c], color=color, lw=1.2, ls=":", label=f"budget $\\varepsilon$ = {r.eps:.2g}")
        a.set_gid(f"measured:{c}")
        b.set_gid(f"certified:{c}")
        d.set_gid(f"budget:{c}")
        ax.set_title(c, fontsize=TITLE_SIZE)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, float(k.max()) * 1.05 if k.size else 1.0)  # shared: no panel hides its lines
    for ax in axes[len(crits):]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel("accepted draft tokens / round")
    for ax in axes[-ncols:]:
        ax.set_xlabel("draft length K (tokens)")
    if crits:
        key = "0.3"
        handles = [Line2D([], [], color=key, lw=1.8, label="measured"),
                   Line2D([], [], color=key, lw=1.4, ls="--", label="certified (per-step KL)"),
                   Line2D([], [], color=key, lw=1.2, ls=":", label=f"prediction at budget $\\varepsilon$ = {r.eps:.2g} nats"),
                   Line2D([], [], color="grey", lw=0.6, label="K: every draft token accepted")]
        fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=LEGEND_SIZE, frameon=False)
    return set_sizes(fig)
