"""Figures of the six theory chapters (one function per figure, each returning the Figure).

Every function computes what it draws with the certificate engine (``companion``) and draws it
on a pyplot-free :class:`matplotlib.figure.Figure`, so nothing is shown or kept open behind the
caller's back: a notebook displays the returned figure and passes it to
:func:`companion.figures.save_figure` under the stable name listed in :data:`FIGURE_NAMES`.
Artists that carry data a test may want to read back have a ``gid`` (e.g. ``"cert:greedy"``).

The target families the figures draw on live in :mod:`companion.certify.targets`, so that a chapter
computes its quoted numbers on exactly the targets it draws.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import Tensor

from companion.certify.bounds import additive_floor, margin_only_bound, multiplicative_floor, tree_quadratic_constant
from companion.certify.certificates import certificate, kl_divergence, per_token_cost, tree_certificate, witness
from companion.certify.criteria import (
    PAPER_CRITERIA,
    AdditiveRelaxed,
    MultiplicativeRelaxed,
    StrictGreedy,
    Typical,
    parse_criterion,
)
from companion.figures.palette import (
    ACCEPT,
    EXAMPLE_COLORS,
    LEGEND_SIZE,
    NOT_CERTIFIED,
    REJECT,
    TITLE_SIZE,
    criterion_color,
    inf_band,
    new_figure,
    set_sizes,
    tree_color,
)
from companion.certify.stochastic import acceptance_probability, pinsker_lower_bound
from companion.certify.targets import geometric_tail_target, geometric_tail_tie, two_top_target

__all__ = [
    "FIGURE_NAMES",
    "criterion_color",
    "criteria_level_sets",
    "exact_certificate_witness",
    "strict_greedy_margin",
    "relaxed_criteria_certificates",
    "tree_margin",
    "stochastic_contrast",
]

FIGURE_NAMES: dict[str, str] = {
    "criteria_level_sets": "theory_criteria_level_sets",
    "exact_certificate_witness": "theory_exact_certificate_witness",
    "strict_greedy_margin": "theory_strict_greedy_margin",
    "relaxed_criteria_certificates": "theory_relaxed_criteria_certificates",
    "tree_margin": "theory_tree_margin",
    "stochastic_contrast": "theory_stochastic_contrast",
}
"""Stable file names (``save_figure`` names) of the theory figures, keyed by function name."""

_ACCEPT, _REJECT = ACCEPT, REJECT


# -- target families ------------------------------------------------------------------------


# -- chapter 1 ------------------------------------------------------------------------------


def criteria_level_sets(p: Tensor, criteria: Sequence[str] = PAPER_CRITERIA, *, ncols: int = 2) -> Figure:
    """One panel per criterion: the sorted target, its threshold ``tau(p)`` and rejection region.

    Bars are the sorted probabilities (log scale), green where accepted and red where rejected;
    the dashed line is ``tau(p)``; the outlined bar is the boundary token ``y*`` (the most likely
    rejected token, whose cost is the certificate).
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    p = torch.as_tensor(p, dtype=torch.float64)
    if p.dim() != 1:
        raise ValueError("p must be one distribution (1-d)")
    ps = torch.sort(p / p.sum(), descending=True).values
    ranks = np.arange(1, ps.numel() + 1)
    nrows = math.ceil(len(criteria) / ncols)
    fig = new_figure(2.4 * nrows + 0.7)
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax, spec in zip(axes, criteria):
        c = parse_criterion(spec)
        tau = float(c.threshold(ps))
        rejected = c.rejection_mask(ps).numpy()
        colors = np.where(rejected, _REJECT, _ACCEPT)
        bars = ax.bar(ranks, ps.numpy(), color=colors, width=0.8)
        for patch in bars:
            patch.set_gid(f"bars:{c}")
        if rejected.any():
            y_star = int(np.argmax(rejected))  # sorted: first rejected is the most likely one
            bars[y_star].set_edgecolor("black")
            bars[y_star].set_linewidth(1.6)
        line = ax.axhline(tau, color="black", ls="--", lw=1)
        line.set_gid(f"tau:{c}")
        rel = ">" if c.strict else "\u2265"
        ax.set_title(f"{c}\naccept iff $p_y$ {rel} \u03c4 = {tau:.3g}", fontsize=TITLE_SIZE)
        ax.set_yscale("log")
        ax.set_xticks(ranks[:: max(1, len(ranks) // 6)])
        ax.set_xlabel("rank of token under p")
    for ax in axes[len(criteria):]:
        ax.set_visible(False)
    for ax in axes[::ncols]:
        ax.set_ylabel("$p_y$ (log scale)")
    handles = [
        Patch(facecolor=_ACCEPT, label="accepted: $p_y$ \u2265 \u03c4 (> \u03c4 for typical)"),
        Patch(facecolor=_REJECT, label="rejected: R(p), a lower level set"),
        Patch(facecolor=_REJECT, edgecolor="black", lw=1.6, label="y*: most likely rejected token"),
        Line2D([], [], color="black", ls="--", lw=1, label="threshold \u03c4(p)"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=LEGEND_SIZE, frameon=False)
    return set_sizes(fig)


# -- chapter 2 ------------------------------------------------------------------------------


def exact_certificate_witness(p: Tensor, criterion: str = "topm:2") -> Figure:
    """(a) ``p`` and the minimisers ``q*`` (forward and reverse) for one criterion; (b) the
    per-token cost ``C(p, y)`` of every token, with the rejection region shaded and
    ``rho* = C(p, y*)`` marked. Tokens are in decreasing order of ``p``."""
    c = parse_criterion(criterion)
    p = torch.as_tensor(p, dtype=torch.float64)
    ps = torch.sort(p / p.sum(), descending=True).values
    v = ps.numel()
    x = np.arange(1, v + 1)
    rejected = c.rejection_mask(ps).numpy()
    fig = new_figure(6.6)
    ax_q, ax_c = fig.subplots(2, 1)
    w = 0.27
    ax_q.bar(x - w, ps.numpy(), width=w, color="0.6", label="target $p$")
    # Forward and reverse are two divergences, not criteria: two colours used for nothing else.
    styles = {"forward": (EXAMPLE_COLORS[0], "KL(p||q)"), "reverse": (EXAMPLE_COLORS[1], "KL(q||p)")}
    for shift, div in zip((0.0, w), ("forward", "reverse")):
        q = witness(ps, c, div)
        rho = float(certificate(ps, c, div))
        color, name = styles[div]
        b = ax_q.bar(x + shift, q.numpy(), width=w, color=color, label=f"$q^*$, {name}: \u03c1* = {rho:.4f} nats")
        for patch in b:
            patch.set_gid(f"witness:{div}")
    ax_q.set_xlabel("rank of token under p")
    ax_q.set_ylabel("probability")
    ax_q.set_xticks(x)
    ax_q.set_title(f"(a) minimisers for {c}: flat on the pool", fontsize=TITLE_SIZE)
    ax_q.legend(fontsize=LEGEND_SIZE, frameon=False)
    ids = torch.arange(v)
    for div in ("forward", "reverse"):
        color, name = styles[div]
        cost = per_token_cost(ps.expand(v, v), ids, div).numpy()
        (ln,) = ax_c.plot(x, cost, "o-", color=color, label=f"C(p, y), {name}")
        ln.set_gid(f"cost:{div}")
    if rejected.any():
        first = int(np.argmax(rejected)) + 1
        ax_c.axvspan(first - 0.5, v + 0.5, color=_REJECT, alpha=0.12, lw=0, label="rejection region R(p)")
        for div in ("forward", "reverse"):
            rho = float(certificate(ps, c, div))
            ax_c.plot([first], [rho], marker="*", ms=14, color=styles[div][0], mec="black", ls="none")
        # The label sits inside the axes, above and left of the star, clear of the legend and curves.
        ann = ax_c.annotate("\u03c1* = C(p, y*)", (first, float(certificate(ps, c, "forward"))),
                            xytext=(0.06, 0.42), textcoords="axes fraction", fontsize=LEGEND_SIZE,
                            ha="left", va="bottom", arrowprops={"arrowstyle": "->", "lw": 0.8})
        ann.set_gid("rho-label")
    ax_c.set_xlabel("proposed token y (rank under p)")
    ax_c.set_ylabel("cost C(p, y)  (nats)")
    ax_c.set_xticks(x)
    ax_c.set_title("(b) per-token cost: non-increasing in $p_y$", fontsize=TITLE_SIZE)
    ax_c.legend(fontsize=LEGEND_SIZE, frameon=False, loc="upper left")
    return set_sizes(fig)


# -- chapter 3 ------------------------------------------------------------------------------


def strict_greedy_margin(
    s_values: Sequence[float] = (0.25, 0.5, 1.0), *, n_grid: int = 200, vocab: int = 4096
) -> Figure:
    """(a) Strict greedy forward certificate against the margin ``Delta = p(1) - p(2)`` at fixed
    ``s = p(1) + p(2)``, on targets :func:`two_top_target` (the rest spread evenly), with the band
    ``Delta^2/(2s) <= rho* <= Delta^2/s`` shaded and the ceiling ``log 2``; (b) the ratio
    ``rho* / (Delta^2/(2s))`` against ``Delta/s``: every ``s`` falls on one curve from 1 to
    ``2 log 2``."""
    fig = new_figure(6.6)
    ax_a, ax_b = fig.subplots(2, 1)
    # s is a parameter of the target, neither a criterion nor a tree: the example colours.
    colors = [EXAMPLE_COLORS[i % len(EXAMPLE_COLORS)] for i in range(len(s_values))]
    n = len(s_values)
    for i, (color, s) in enumerate(zip(colors, s_values)):
        # Keep the runner-up above the evenly spread rest, p2 >= (1 - s)/(V - 2), with room for
        # rounding (at equality the last grid point could land a hair below the rest).
        p2_min = max((1 - s) / (vocab - 2) * (1 + 1e-9), 1e-3 * s)
        # Delta > 0: at an exact tie both top tokens are accepted and the certificate jumps
        # (chapter 1's tie convention), so the grid starts just above it.
        delta = torch.linspace(0.0, s - 2 * p2_min, n_grid + 1, dtype=torch.float64)[1:]
        p = two_top_target((s + delta) / 2, (s - delta) / 2, vocab)
        rho = certificate(p, StrictGreedy())
        lower, upper = delta**2 / (2 * s), delta**2 / s
        d = delta.numpy()
        ax_a.fill_between(d, lower.numpy(), upper.numpy(), color=color, alpha=0.15, lw=0)
        (ln,) = ax_a.plot(d, rho.numpy(), color=color, lw=2, label=f"s = {s:g}")
        ln.set_gid(f"cert:s={s:g}")
        u = delta / s
        # The curves coincide: draw the first widest so that every one stays visible.
        (ln2,) = ax_b.plot(u.numpy(), (rho / lower).numpy(), color=color, lw=2 + 2.5 * (n - 1 - i),
                           label=f"s = {s:g}", solid_capstyle="butt")
        ln2.set_gid(f"ratio:s={s:g}")
    ax_a.axhline(math.log(2), color="0.3", ls=":", lw=1)
    # at 30 % of the width: clear of the legend (upper left) and of the widest band (right)
    ax_a.text(0.3, math.log(2), "ceiling log 2", va="bottom", fontsize=LEGEND_SIZE, color="0.3",
              transform=ax_a.get_yaxis_transform())
    ax_a.set_xlabel("margin \u0394 = p(1) \u2212 p(2)")
    ax_a.set_ylabel("\u03c1*  (nats, forward KL)")
    ax_a.set_title("(a) certificate; band: \u0394\u00b2/(2s) \u2264 \u03c1* \u2264 \u0394\u00b2/s", fontsize=TITLE_SIZE)
    ax_a.legend(fontsize=LEGEND_SIZE, frameon=False, loc="upper left")
    ax_b.axhline(1.0, color="0.3", ls="--", lw=1)
    ax_b.axhline(2 * math.log(2), color="0.3", ls=":", lw=1)
    ax_b.axhline(2.0, color="0.6", ls="-.", lw=1)
    ax_b.text(0.02, 2 * math.log(2), "2 log 2 (sharp)", va="bottom", fontsize=LEGEND_SIZE, color="0.3")
    ax_b.text(0.02, 2.0, "2 (upper bound \u0394\u00b2/s)", va="bottom", fontsize=LEGEND_SIZE, color="0.4")
    ax_b.set_ylim(0.9, 2.15)
    ax_b.set_xlabel("relative margin u = \u0394 / s")
    ax_b.set_ylabel("\u03c1* / (\u0394\u00b2 / 2s)")
    ax_b.set_title("(b) one curve for every s: 2 \u03c6\u2081(u)/u\u00b2", fontsize=TITLE_SIZE)
    ax_b.legend(fontsize=LEGEND_SIZE, frameon=False, loc="upper left", bbox_to_anchor=(0.0, 0.85))
    return set_sizes(fig)


# -- chapter 4 ------------------------------------------------------------------------------


def relaxed_criteria_certificates(
    criteria: Sequence[str] = PAPER_CRITERIA,
    *,
    vocab: int = 32,
    ratio: float = 0.7,
    n_grid: int = 300,
    budget: float | None = 0.02,
) -> Figure:
    """Forward certificates of each criterion along :func:`geometric_tail_target` (top-1 ``p1``,
    geometric tail), against ``p1``: (a) the certificates (log scale) with their floors (additive
    and multiplicative dashed, typical's multiplicative-``delta`` floor dotted; each in the
    legend), ``+inf`` (nothing rejected) drawn in a labelled band at the top, and a KL
    ``budget`` (a step is certified where the curve lies above it); (b) each certificate divided
    by strict greedy's, against the top-2 margin (log-log): the enlargement grows without bound
    as the margin closes."""
    from matplotlib.lines import Line2D

    tie = geometric_tail_tie(vocab, ratio)
    p1 = tie + (1 - tie) * torch.linspace(0, 1, n_grid + 2, dtype=torch.float64)[1:-1]
    p = geometric_tail_target(p1, vocab, ratio)
    gamma = (p[:, 0] - p[:, 1]).numpy()
    greedy = certificate(p, StrictGreedy())
    fig = new_figure(8.4)
    ax_a, ax_b = fig.subplots(2, 1)
    x = p1.numpy()
    finite_max = 0.0
    certs = {}
    for spec in criteria:
        c = parse_criterion(spec)
        rho = certificate(p, c)
        certs[str(c)] = rho
        fin = torch.isfinite(rho)
        finite_max = max(finite_max, float(rho[fin].max()) if bool(fin.any()) else 0.0)
    top = 4.0 * finite_max
    any_inf = False
    handles, floor_handles = [], []
    for spec in criteria:
        c = parse_criterion(spec)
        rho = certs[str(c)]
        color = criterion_color(str(c))
        any_inf = any_inf or not bool(torch.isfinite(rho).all())
        shown = torch.where(torch.isfinite(rho), rho, torch.full_like(rho, top)).numpy()
        lw = 2.4 if isinstance(c, StrictGreedy) else 1.6
        (ln,) = ax_a.plot(x, shown, color=color, lw=lw, label=str(c))
        ln.set_gid(f"cert:{c}")
        handles.append(ln)
        ratio_c = (rho / greedy).numpy()
        if not isinstance(c, StrictGreedy):
            (ln2,) = ax_b.plot(gamma, np.where(np.isfinite(ratio_c), ratio_c, np.nan), color=color, lw=1.6, label=str(c))
            ln2.set_gid(f"ratio:{c}")
        floor = None
        if isinstance(c, AdditiveRelaxed):
            floor = ax_a.axhline(float(additive_floor(c.delta)), color=color, ls="--", lw=1.1,
                                 label=f"floor of {c}")
        elif isinstance(c, MultiplicativeRelaxed):
            (floor,) = ax_a.plot(x, multiplicative_floor(c.alpha, p1).numpy(), color=color, ls="--", lw=1.1,
                                 label=f"floor of {c}")
        elif isinstance(c, Typical):
            (floor,) = ax_a.plot(x, multiplicative_floor(min(c.delta, 1.0), p1).numpy(), color=color, ls=":", lw=1.3,
                                 label=f"floor of {c} (multiplicative, \u03b1 = \u03b4)")
        if floor is not None:
            floor.set_gid(f"floor:{c}")
            floor_handles.append(floor)
    handles += floor_handles
    if budget is not None:
        ln = ax_a.axhline(budget, color="0.45", lw=4, alpha=0.25)
        ln.set_gid("budget")
        ax_a.text(x[-1], budget, f"KL budget \u03b5 = {budget:g}", ha="right", va="bottom",
                  fontsize=LEGEND_SIZE, color="0.3")
        handles.append(Line2D([], [], color="0.45", lw=4, alpha=0.25, label=f"KL budget \u03b5 = {budget:g} nats"))
    ax_a.set_yscale("log")
    ax_a.set_ylim(bottom=1e-5)
    if any_inf:
        inf_band(ax_a, top)
    else:
        ax_a.set_ylim(top=top)
    ax_a.set_xlabel("target top-1 probability p(1)")
    ax_a.set_ylabel("\u03c1*  (nats, forward KL)")
    ax_a.set_title(f"(a) certificates and floors (geometric tail, V = {vocab}, ratio {ratio:g})", fontsize=TITLE_SIZE)
    # Ten entries would cover the curves inside a panel: they go under both panels (same colours).
    fig.legend(handles=handles, fontsize=LEGEND_SIZE, frameon=False, loc="outside lower center", ncols=2)
    ax_b.set_xscale("log")
    ax_b.set_yscale("log")
    ax_b.axhline(1.0, color="0.3", lw=1)
    ax_b.set_xlabel("top-2 margin \u03b3 = p(1) \u2212 p(2)")
    ax_b.set_ylabel("\u03c1*(criterion) / \u03c1*(greedy)")
    ax_b.set_title("(b) enlargement over strict greedy (finite \u03c1* only)", fontsize=TITLE_SIZE)
    return set_sizes(fig)


# -- chapter 5 ------------------------------------------------------------------------------


def tree_margin(
    widths: Sequence[int] = (1, 2, 4, 8),
    *,
    random_targets: Tensor | None = None,
    n_grid: int = 400,
) -> Figure:
    """(a) The margin-only tree certificate ``phi_m(gamma)`` (solid) against the quadratic
    ``(m+1) gamma^2/4`` (dashed; given second-hand by a public reading note of the paper, named in
    chapter 5) and the ceilings ``log(m+1)`` (dotted); (b) ``phi_m(gamma)/gamma^2`` with the constants ``(m+1)/4`` (dashed) and the sharp
    global constant ``c_m`` (dots at its minimiser); (c) exact tree certificates of
    ``random_targets`` against their top-2 margin, above their envelope ``phi_m`` (only when
    targets are given). Each width has its colour from :func:`companion.figures.palette.tree_color`,
    the same as in chapters 7 and 8."""
    from matplotlib.lines import Line2D

    panels = 3 if random_targets is not None else 2
    fig = new_figure(2.6 * panels + 0.2)
    axes = fig.subplots(panels, 1)
    g = torch.linspace(0, 1, n_grid + 1, dtype=torch.float64)
    gpos = g[1:]
    width_handles = []
    for m in widths:
        color = tree_color(m)
        phi = margin_only_bound(g, m)
        (ln,) = axes[0].plot(g.numpy(), phi.numpy(), color=color, lw=2, label=f"m = {m}")
        ln.set_gid(f"phi:{m}")
        width_handles.append(ln)
        (ln,) = axes[0].plot(g.numpy(), ((m + 1) * g**2 / 4).numpy(), color=color, lw=1, ls="--")
        ln.set_gid(f"secondary:{m}")
        axes[0].axhline(math.log(m + 1), color=color, lw=0.8, ls=":")
        ratio = margin_only_bound(gpos, m) / gpos**2
        (ln,) = axes[1].plot(gpos.numpy(), ratio.numpy(), color=color, lw=2, label=f"m = {m}")
        ln.set_gid(f"ratio:{m}")
        axes[1].axhline((m + 1) / 4, color=color, lw=1, ls="--")
        if m >= 2:
            axes[1].plot([(m - 1) / m], [tree_quadratic_constant(m)], "o", color=color, ms=5)
    key = "0.3"
    style_a = [Line2D([], [], color=key, lw=2, label="\u03c6\u2098(\u03b3)"),
               Line2D([], [], color=key, lw=1, ls="--", label="(m+1)\u03b3\u00b2/4"),
               Line2D([], [], color=key, lw=0.8, ls=":", label="log(m+1)")]
    style_b = [Line2D([], [], color=key, lw=2, label="\u03c6\u2098(\u03b3)/\u03b3\u00b2"),
               Line2D([], [], color=key, lw=1, ls="--", label="(m+1)/4"),
               Line2D([], [], color=key, ls="none", marker="o", ms=5, label="sharp c\u2098 (minimum)")]
    axes[0].set_xlabel("top-2 margin \u03b3")
    axes[0].set_ylabel("nats (forward KL)")
    axes[0].set_title("(a) margin-only certificate \u03c6\u2098(\u03b3)", fontsize=TITLE_SIZE)
    # Legends right of the panels: inside they would cover the ceilings, which span the panel.
    right = {"fontsize": LEGEND_SIZE, "frameon": False, "loc": "center left", "bbox_to_anchor": (1.01, 0.5)}
    axes[0].legend(handles=width_handles + style_a, **right)
    axes[1].set_xlabel("top-2 margin \u03b3")
    axes[1].set_ylabel("\u03c6\u2098(\u03b3) / \u03b3\u00b2  (nats)")
    axes[1].set_title("(b) quadratic constants", fontsize=TITLE_SIZE)
    axes[1].legend(handles=width_handles + style_b, **right)
    if random_targets is not None:
        p = torch.as_tensor(random_targets, dtype=torch.float64)
        top2 = torch.topk(p, 2, dim=-1).values
        gam = (top2[:, 0] - top2[:, 1]) / p.sum(-1)
        for m in widths:
            color = tree_color(m)
            rho = tree_certificate(p, m)
            sc = axes[2].scatter(gam.numpy(), rho.numpy(), s=5, color=color, alpha=0.35, lw=0)
            sc.set_gid(f"scatter:{m}")
            gg = torch.logspace(-3, 0, 200, dtype=torch.float64)
            axes[2].plot(gg.numpy(), margin_only_bound(gg, m).numpy(), color=color, lw=1.5)
        axes[2].set_xscale("log")
        axes[2].set_yscale("log")
        axes[2].set_xlabel("top-2 margin \u03b3")
        axes[2].set_ylabel("exact tree certificate (nats)")
        axes[2].set_title("(c) random targets sit above \u03c6\u2098(\u03b3)", fontsize=TITLE_SIZE)
        axes[2].legend(handles=[Line2D([], [], color=key, ls="none", marker="o", ms=3, alpha=0.5, label="random target"),
                                Line2D([], [], color=key, lw=1.5, label="\u03c6\u2098(\u03b3)")],
                       **right)
    return set_sizes(fig)


# -- chapter 6 ------------------------------------------------------------------------------


def stochastic_contrast(
    p: Tensor,
    q: Tensor,
    path_targets: Tensor,
    *,
    criterion: str = "greedy",
    n_steps: int = 241,
    max_t: float = 2.0,
) -> Figure:
    """(a) Random target/draft pairs: ``KL(p||q)`` against speculative sampling's expected
    acceptance ``1 - TV``, with Pinsker's ``1 - sqrt(KL/2)``; colour marks what the greedy check
    does on the same pair (certified by ``KL < rho*``, accepted but not certified, rejected).
    (b) Worst-case paths ``q_t ∝ p^(1-t) (q*)^t`` from each of ``path_targets`` through its
    witness ``q*`` (reached at ``t = 1``, where ``KL = rho*``): ``1 - TV`` (solid), Pinsker (thin),
    and whether the greedy check accepts ``argmax q_t`` (dashed steps, 0 or 1).

    "Accepts" is the decoders' verdict on the drafter's greedy token
    (:meth:`~companion.certify.criteria.Criterion.decoder_accepts`: ``argmax``, the first index wins on
    exact ties); ``rho*`` is the worst-case certificate, so a certified pair is always accepted."""
    from matplotlib.lines import Line2D

    c = parse_criterion(criterion)
    p = torch.as_tensor(p, dtype=torch.float64)
    q = torch.as_tensor(q, dtype=torch.float64)
    kl = kl_divergence(p, q)
    acc = acceptance_probability(p, q)
    rho = certificate(p, c)
    # the decoders' verdict on the drafter's greedy token (argmax: on exact ties the first index wins)
    accepted = c.decoder_accepts(p, torch.argmax(q, dim=-1))
    certified = kl < rho
    fig = new_figure(7.0)
    ax_a, ax_b = fig.subplots(2, 1)
    groups = (
        ("certified", certified, _ACCEPT, f"{c}: certified (KL < \u03c1*)"),
        ("accepted", accepted & ~certified, NOT_CERTIFIED, f"{c}: accepted, not certified"),
        ("rejected", ~accepted, _REJECT, f"{c}: rejected"),
    )
    for gid, mask, color, label in groups:
        sc = ax_a.scatter(kl[mask].numpy(), acc[mask].numpy(), s=7, color=color, alpha=0.6, lw=0, label=label)
        sc.set_gid(f"pairs:{gid}")
    k = torch.logspace(-5, 1, 300, dtype=torch.float64)
    (ln,) = ax_a.plot(k.numpy(), pinsker_lower_bound(k).numpy(), color="black", lw=1.2, label="Pinsker 1 \u2212 \u221a(KL/2)")
    ln.set_gid("pinsker")
    ax_a.set_xscale("log")
    ax_a.set_xlabel("KL(p||q)  (nats)")
    ax_a.set_ylabel("P(accept) = 1 \u2212 TV")
    ax_a.set_title("(a) random pairs: an expectation that degrades smoothly", fontsize=TITLE_SIZE)
    ax_a.legend(fontsize=LEGEND_SIZE, frameon=False, loc="lower left", markerscale=2)
    # t = 1 exactly is the witness (a tie); the grid steps over it.
    t = torch.linspace(0, max_t, n_steps, dtype=torch.float64)[1:]
    t = t[(t - 1).abs() > 1e-9]
    path_targets = torch.as_tensor(path_targets, dtype=torch.float64)
    handles = []
    for idx, color in zip(range(path_targets.shape[0]), EXAMPLE_COLORS):
        pt = path_targets[idx] / path_targets[idx].sum()
        qstar = witness(pt, c)
        logq = (1 - t[:, None]) * torch.log(pt) + t[:, None] * torch.log(qstar)
        qs = torch.softmax(logq, dim=-1)
        pp = pt.expand_as(qs)
        kl_t = kl_divergence(pp, qs)
        acc_t = acceptance_probability(pp, qs)
        ok = c.decoder_accepts(pp, torch.argmax(qs, dim=-1)).to(torch.float64)
        top2 = torch.topk(pt, 2).values
        (ln,) = ax_b.plot(kl_t.numpy(), acc_t.numpy(), color=color, lw=2)
        ln.set_gid(f"path:{idx}")
        ax_b.plot(kl_t.numpy(), pinsker_lower_bound(kl_t).numpy(), color=color, lw=0.8)
        (st,) = ax_b.step(kl_t.numpy(), ok.numpy(), where="post", color=color, lw=1.2, ls="--")
        st.set_gid(f"greedy:{idx}")
        ax_b.axvline(float(certificate(pt, c)), color=color, ls=":", lw=1.2)
        handles.append(Line2D([], [], color=color, lw=2, label=f"target {idx + 1} (margin {float(top2[0] - top2[1]):.2g})"))
    key = "0.3"
    handles += [Line2D([], [], color=key, lw=2, label="speculative sampling 1 \u2212 TV"),
                Line2D([], [], color=key, lw=0.8, label="Pinsker bound"),
                Line2D([], [], color=key, lw=1.2, ls="--", label=f"{c} accepts (0 or 1)"),
                Line2D([], [], color=key, lw=1.2, ls=":", label="\u03c1* of the target")]
    ax_b.set_xscale("log")
    ax_b.set_xlabel("KL(p||q) along the path through the witness q* (nats)")
    ax_b.set_ylabel("acceptance (probability)")
    ax_b.set_title(f"(b) worst case: {c} is certain up to \u03c1*, then fails", fontsize=TITLE_SIZE)
    ax_b.legend(handles=handles, fontsize=LEGEND_SIZE, frameon=False, loc="lower left")
    return set_sizes(fig)
