"""The draft-trees chapter's figure: the trees that tree policies drafted in one real round, the kept path marked.

:func:`draft_trees` returns a pyplot-free :class:`matplotlib.figure.Figure`, one panel per policy: a node per
drafted token, placed at its depth (x) and in the order of the tree's leaves (y), joined to its parent; the
nodes the target kept (the longest path that matches its greedy tokens) are filled, the others hollow. Every
node is drawn with a ``gid`` (``"node:<policy>:<index>"``, ``"kept:<policy>:<index>"`` on the kept path) so tests
can read the trees back. Like every figure of the book it is
:data:`~companion.figures.palette.FIG_WIDTH` wide and takes its font sizes from
:mod:`companion.figures.palette`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from matplotlib.figure import Figure

from companion.figures.palette import LABEL_SIZE, LEGEND_SIZE, TITLE_SIZE, new_figure, set_sizes
from companion.speculative.tree.shape import DraftTree

__all__ = ["FIGURE_NAMES", "draft_trees", "tree_layout"]

FIGURE_NAMES: dict[str, str] = {"draft_trees": "tree_rounds"}
"""Stable ``save_figure`` names, keyed by function name."""

KEPT_COLOR = "#2a7f62"
"""The kept path (accepted drafts)."""

OTHER_COLOR = "#8c8c8c"
"""Drafted nodes the target did not keep."""

ROW_HEIGHT = 0.34
"""Height (inches) per leaf of the tallest panel."""


def tree_layout(tree: DraftTree) -> list[tuple[float, float]]:
    """``(x, y)`` of every node: ``x`` its depth, ``y`` its leaves' mean position when the leaves are numbered
    depth-first (children in the drafter's rank order), so that no two edges cross."""
    kids: dict[int, list[int]] = {}
    for i, parent in enumerate(tree.parents):
        kids.setdefault(parent, []).append(i)
    for v in kids.values():
        v.sort(key=lambda j: (tree.ranks[j], j))
    y: dict[int, float] = {}
    counter = [0]

    def visit(i: int) -> float:
        children = kids.get(i, [])
        if not children:
            y[i] = float(counter[0])
            counter[0] += 1
        else:
            ys = [visit(j) for j in children]
            y[i] = sum(ys) / len(ys)
        return y[i]

    for root_child in kids.get(-1, []):
        visit(root_child)
    return [(float(tree.depths[i]), y[i]) for i in range(len(tree))]


def _leaves(tree: DraftTree) -> int:
    parents = set(tree.parents)
    return sum(1 for i in range(len(tree)) if i not in parents)


def draft_trees(panels: Sequence[tuple[str, DraftTree, Sequence[int]]], label: Callable[[int], str]) -> Figure:
    """One panel per ``(policy, tree, kept nodes)``: the tree as :func:`tree_layout` places it, each node
    labelled ``label(token)``, the kept nodes filled in :data:`KEPT_COLOR`."""
    if not panels:
        raise ValueError("draft_trees needs at least one (policy, tree, kept nodes) panel")
    tallest = max(max(_leaves(t), 1) for _, t, _ in panels)
    fig = new_figure(height=max(1.6, ROW_HEIGHT * tallest + 0.7))
    # each panel as wide as its tree is deep (a label needs about one depth step of room)
    depths = [max((d for d in t.depths), default=1) + 1.1 for _, t, _ in panels]
    axes = fig.subplots(1, len(panels), squeeze=False, gridspec_kw={"width_ratios": depths})[0]
    for ax, (policy, tree, kept) in zip(axes, panels):
        kept_set = set(kept)
        pos = tree_layout(tree)
        ax.plot([0], [(_leaves(tree) - 1) / 2 if len(tree) else 0], "s", color="black", ms=5, gid=f"root:{policy}")
        for i, (x, yv) in enumerate(pos):
            parent = tree.parents[i]
            px, py = (0.0, (_leaves(tree) - 1) / 2) if parent < 0 else pos[parent]
            on_path = i in kept_set and (parent < 0 or parent in kept_set)
            ax.plot([px, x], [py, yv], color=KEPT_COLOR if on_path else OTHER_COLOR, lw=1.6 if on_path else 0.8,
                    zorder=1)
            kept_here = i in kept_set
            ax.plot([x], [yv], "o", ms=5, mfc=KEPT_COLOR if kept_here else "white",
                    mec=KEPT_COLOR if kept_here else OTHER_COLOR, zorder=2,
                    gid=f"{'kept' if kept_here else 'node'}:{policy}:{i}")
            # above the node, centred: a chain's labels then sit one depth apart instead of running into
            # the next node
            ax.annotate(label(tree.tokens[i]), (x, yv), xytext=(0, 4), textcoords="offset points", va="bottom",
                        ha="center", fontsize=LEGEND_SIZE, color="black" if kept_here else "#555555")
        ax.set_title(f"{policy}\n{len(tree)} nodes, {len(kept_set)} kept", fontsize=TITLE_SIZE)
        ax.set_xlim(-0.5, max((p[0] for p in pos), default=1) + 0.6)
        ax.set_ylim(max((p[1] for p in pos), default=0) + 0.5, -0.9)   # room above the top row's labels
        ax.set_yticks([])
        ax.set_xticks(range(0, int(max((p[0] for p in pos), default=1)) + 1))
        ax.set_xlabel("depth", fontsize=LABEL_SIZE)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
    return set_sizes(fig)
