"""A tree of drafts, and the attention mask and positions that verify it in one forward.

The root of a round's tree is the last emitted token (the context's end, at position ``P - 1``
when the context has ``P`` tokens). Node ``i`` holds a drafted token ``tokens[i]``, its parent
``parents[i]`` (``-1``: the root), its depth ``depths[i]`` (the root's children have depth 1), the
rank ``ranks[i]`` of its token in the drafter's distribution at the parent (1: the drafter's
argmax) and the drafter's path log-probability ``logq[i] = sum of log q`` over the path from the
root. Nodes are appended parent first, so ``parents[i] < i``.

A node at depth ``d`` continues the context as if its path were the next ``d`` tokens, so it sits
at position ``P - 1 + d`` and attends to the whole context and to its ancestors and itself only:
:func:`tree_attention` builds that mask (``0`` where attended, the dtype's most negative finite
number elsewhere: transformers adds a float 4D mask to the attention scores as given) and the
per-node position ids. Each node's keys and values then equal those a plain causal forward of
its path would compute (up to floating-point reassociation), which is what lets the verified
path's cache entries be kept as they are.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class DraftTree:
    """A tree of drafts (see the module docstring); ``add`` appends a node and returns its index."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    logq: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, rank: int, logq: float) -> int:
        """Append a node (``token``, the drafter's ``rank`` of it under ``parent``, its path log-probability
        ``logq``) below ``parent`` (-1: the root); its index."""
        if not -1 <= parent < len(self):
            raise ValueError(f"parent {parent} is not a node of a tree of {len(self)} nodes (or -1, the root)")
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.depths.append(1 if parent < 0 else self.depths[parent] + 1)
        self.ranks.append(int(rank))
        self.logq.append(float(logq))
        return len(self) - 1

    @property
    def depth(self) -> int:
        """The deepest node's depth (0 for an empty tree)."""
        return max(self.depths, default=0)

    def path(self, i: int) -> list[int]:
        """The nodes from the root's child down to node ``i`` (``[]`` for ``i = -1``)."""
        out = []
        while i >= 0:
            out.append(i)
            i = self.parents[i]
        return out[::-1]

    def children(self, i: int) -> list[int]:
        """Node ``i``'s children (``i = -1``: the root's), in the order they were added."""
        return [j for j, p in enumerate(self.parents) if p == i]

    def width(self, depth: int) -> int:
        """How many nodes sit at ``depth``."""
        return sum(1 for d in self.depths if d == depth)

    def rank_paths(self) -> list[tuple[int, ...]]:
        """Per node, the ranks along its path (the tree as a set of rank sequences, the model's view of it)."""
        return [tuple(self.ranks[j] for j in self.path(i)) for i in range(len(self))]

    def subtree(self, keep: Sequence[int]) -> tuple[DraftTree, list[int]]:
        """The tree of the nodes ``keep`` (closed under parents), renumbered in their old order, and the old index of
        each new node."""
        kept = sorted(set(int(i) for i in keep))
        where = {old: new for new, old in enumerate(kept)}
        out = DraftTree()
        for old in kept:
            p = self.parents[old]
            if p >= 0 and p not in where:
                raise ValueError(f"node {old} is kept without its parent {p}: a verified tree must be closed under parents")
            out.add(where[p] if p >= 0 else -1, self.tokens[old], self.ranks[old], self.logq[old])
        return out, kept

    def longest_match(self, greedy_at: Sequence[int]) -> list[int]:
        """The greedy walk: from the root, step to the child whose token is the target's greedy token at the
        current node (``greedy_at[0]`` at the root, ``greedy_at[1 + i]`` at node ``i``) while one exists.
        Children of one parent carry distinct tokens, so the walk is the longest root-to-node path whose every
        token is the target's greedy token after its ancestors. Returns the path's nodes."""
        kids: dict[int, dict[int, int]] = {}
        for i, (p, t) in enumerate(zip(self.parents, self.tokens)):
            kids.setdefault(p, {}).setdefault(t, i)
        out: list[int] = []
        cur = -1
        while True:
            nxt = kids.get(cur, {}).get(int(greedy_at[cur + 1]))
            if nxt is None:
                return out
            out.append(nxt)
            cur = nxt


def ancestor_matrix(tree: DraftTree, rows: Sequence[int], cols: Sequence[int]) -> Tensor:
    """``M[r, c]``: whether node ``cols[c]`` is node ``rows[r]`` or one of its ancestors (bool)."""
    col_at = {j: c for c, j in enumerate(cols)}
    out = torch.zeros(len(rows), len(cols), dtype=torch.bool)
    for r, i in enumerate(rows):
        j = int(i)
        while j >= 0:
            c = col_at.get(j)
            if c is not None:
                out[r, c] = True
            j = tree.parents[j]
    return out


def tree_attention(tree: DraftTree, past: int, chain: int, nodes: Sequence[int], cached_nodes: Sequence[int],
                   dtype: torch.dtype, device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """The 4D attention mask ``[1, 1, chain + n, past + len(cached_nodes) + chain + n]`` and position ids
    ``[1, chain + n]`` of a forward that feeds ``chain`` plain context tokens, then the tree nodes ``nodes``
    (``n`` of them), over a cache of ``past`` context tokens followed by the nodes ``cached_nodes``.

    The ``chain`` tokens end the context (its last one is the root) and attend causally; ``P = past + chain`` is
    the context's length, every node attends to the whole context and to its ancestors and itself (among
    ``cached_nodes`` and ``nodes``), and sits at position ``P - 1 + depth``.
    """
    n = len(nodes)
    m = len(cached_nodes)
    if chain and m:
        raise ValueError("a forward feeds either context tokens then nodes over a context-only cache, or nodes over "
                         "cached nodes; not context tokens after cached nodes")
    ctx = past + chain
    kv = past + m + chain + n
    allowed = torch.zeros(chain + n, kv, dtype=torch.bool)
    # the context tokens: everything cached before them, causal among themselves
    allowed[:chain, :past] = True
    allowed[:chain, past + m:past + m + chain] = torch.ones(chain, chain, dtype=torch.bool).tril()
    allowed[chain:, :past] = True
    allowed[chain:, past + m:past + m + chain] = True
    allowed[chain:, past:past + m] = ancestor_matrix(tree, nodes, cached_nodes)
    allowed[chain:, past + m + chain:] = ancestor_matrix(tree, nodes, nodes)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    pos = list(range(past, ctx)) + [ctx - 1 + tree.depths[i] for i in nodes]
    return (mask[None, None].to(device), torch.tensor([pos], dtype=torch.long, device=device))


def path_logq(tree: DraftTree, i: int) -> float:
    """The drafter's probability of node ``i``'s whole path (``exp logq``)."""
    return math.exp(tree.logq[i])
