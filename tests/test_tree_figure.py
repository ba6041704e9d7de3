"""The draft-trees figure: every node drawn once, the kept path filled, no two edges crossing."""
from __future__ import annotations

import pytest

from companion.figures.trees import draft_trees, tree_layout
from companion.speculative.tree.model import full_tree
from companion.speculative.tree.shape import DraftTree


def _tree(paths) -> DraftTree:
    tree, at = DraftTree(), {}
    for p in sorted(paths, key=len):
        at[p] = tree.add(at[p[:-1]] if len(p) > 1 else -1, 100 * len(p) + p[-1], p[-1], 0.0)
    return tree


def test_layout_keeps_subtrees_apart() -> None:
    """Each node's leaves occupy a contiguous band of rows, ordered by rank: edges cannot cross."""
    tree = _tree(full_tree((3, 2, 2)))
    pos = tree_layout(tree)
    assert [x for x, _ in pos] == [float(d) for d in tree.depths]
    for i in range(len(tree)):
        kids = [j for j, p in enumerate(tree.parents) if p == i]
        ys = [pos[j][1] for j in sorted(kids, key=lambda j: tree.ranks[j])]
        assert ys == sorted(ys) and len(set(ys)) == len(ys), (i, ys)
        if kids:
            assert min(ys) <= pos[i][1] <= max(ys)
    leaves = sorted(y for i, (_, y) in enumerate(pos) if i not in set(tree.parents))
    assert leaves == [float(k) for k in range(len(leaves))]


def test_every_node_is_drawn_and_the_kept_path_is_filled() -> None:
    tree = _tree(full_tree((2, 2)))
    kept = [0, 2]
    fig = draft_trees([("static:2,2", tree, kept), ("other", _tree(full_tree((1,))), [])], lambda t: f"t{t}")
    gids = [a.get_gid() for ax in fig.axes for a in ax.lines if a.get_gid()]
    assert sorted(g for g in gids if g.startswith("kept:static")) == ["kept:static:2,2:0", "kept:static:2,2:2"]
    assert len([g for g in gids if g.startswith(("kept:static", "node:static"))]) == len(tree)
    assert [g for g in gids if g.startswith(("kept:other", "node:other"))] == ["node:other:0"]


def test_no_panels_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one"):
        draft_trees([], str)
