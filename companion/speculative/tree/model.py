"""The expected accepted length of a draft tree, and the best tree of ``N`` nodes.

A tree as the model sees it is a set ``T`` of *rank paths*: node ``v`` at depth ``d`` is the sequence
``(r_1, ..., r_d)`` of the ranks of its tokens in the drafter's distributions along its path (rank 1: the
drafter's argmax); ``T`` is closed under prefixes (a node's parent is in the tree). Under greedy verification
the target's text continues the context with tokens whose drafter ranks, teacher-forced along the text, are
``R_1, R_2, ...``; the root's child of rank ``R_1`` carries the text's token, its child of rank ``R_2`` the
next, and so on. The greedy walk therefore accepts

    ``A = max { d : (R_1, ..., R_d) in T }``  (0 when ``(R_1)`` is not),

and because ``T`` is prefix-closed, ``A = sum_{d >= 1} 1[(R_1..R_d) in T] = sum_{v in T} 1[(R_1..R_{|v|}) = v]``.
Taking expectations,

    ``E[A] = sum_{v in T} P(R_1 = v_1, ..., R_|v| = v_|v|)``,                                      (1)

the sum over the tree's nodes of the probability that the text passes through them. With the ranks of
different depths independent and ``pi_d(r) = P(R_d = r)``, (1) is ``sum_v prod_j pi_j(v_j)``
(:func:`expected_accepted`); for the full tree of widths ``w_1, w_2, ...`` it factors into
``sum_d prod_{j <= d} F_j(w_j)`` with ``F_j`` the cumulative rank law, and for a spine of widths ``w_d``
(only the rank-1 child expanded) into ``sum_d (prod_{j < d} pi_j(1)) F_d(w_d)``. The round emits ``A + 1``
tokens (the target's own token follows the path).

The best tree of ``N`` nodes for a rank law (:func:`best_tree`): every term of (1) is the probability of a
prefix, which never exceeds its parent's, so the ``N`` most likely prefixes (ties to the shorter, then the
smaller ranks) are closed under prefixes and maximise (1) among all trees of ``N`` nodes: an oracle that
bounds what any fixed shape can reach on that law. A shape that adapts per round (the dynamic and certified
trees) can do better than the best fixed shape; what bounds every shape is the clairvoyant tree that knows
the round's ranks, the path ``(R_1..R_N)`` itself, accepting ``N`` (:func:`clairvoyant_accepted`).
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

RankPath = tuple[int, ...]


def check_rank_paths(paths: Iterable[Sequence[int]]) -> list[RankPath]:
    """The paths as tuples, checked: ranks >= 1, no duplicates, closed under prefixes."""
    out = [tuple(int(r) for r in p) for p in paths]
    seen = set(out)
    if len(seen) != len(out):
        raise ValueError("a tree lists a rank path twice")
    for p in out:
        if not p or any(r < 1 for r in p):
            raise ValueError(f"rank path {p} must be non-empty with ranks >= 1")
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"rank path {p} is in the tree without its parent {p[:-1]}")
    return out


def expected_accepted(paths: Iterable[Sequence[int]], rank_probs: Sequence[Sequence[float]]) -> float:
    """``E[A] = sum_{v in T} prod_j pi_j(v_j)`` for independent per-depth ranks (equation (1) of the module
    docstring): ``rank_probs[d - 1][r - 1] = P(R_d = r)``; ranks past a depth's table have probability 0, and a
    node deeper than the tables contributes 0."""
    total = 0.0
    for p in check_rank_paths(paths):
        prob = 1.0
        for d, r in enumerate(p):
            row = rank_probs[d] if d < len(rank_probs) else ()
            prob *= row[r - 1] if r - 1 < len(row) else 0.0
        total += prob
    return total


def expected_accepted_joint(paths: Iterable[Sequence[int]], prefix_prob: Callable[[RankPath], float]) -> float:
    """Equation (1) with any joint rank law: ``sum_{v in T} prefix_prob(v)``."""
    return sum(prefix_prob(p) for p in check_rank_paths(paths))


def full_tree(widths: Sequence[int]) -> list[RankPath]:
    """The rank paths of the full tree of widths ``w_1, w_2, ...`` (every node expanded)."""
    out: list[RankPath] = []
    layer: list[RankPath] = [()]
    for w in widths:
        layer = [p + (r,) for p in layer for r in range(1, w + 1)]
        out.extend(layer)
    return out


def spine_tree(widths: Sequence[int]) -> list[RankPath]:
    """The rank paths of the spine of widths ``w_d``: ``(1, .., 1, r)`` for ``r <= w_d`` at depth ``d``."""
    return [(1,) * d + (r,) for d, w in enumerate(widths) for r in range(1, w + 1)]


def expanded_widths(paths: Iterable[Sequence[int]]) -> list[int]:
    """Per depth ``d = 1, 2, ...``: how many nodes of depth ``d`` have a child, i.e. the nodes the drafter's forward
    at that depth is fed (the root's forward, over the context, comes before them)."""
    ps = check_rank_paths(paths)
    parents = {p[:-1] for p in ps if len(p) > 1}
    deep = max((len(p) for p in parents), default=0)
    return [sum(1 for p in parents if len(p) == d) for d in range(1, deep + 1)]


def empirical_prefix_law(rank_rows: Iterable[Sequence[int]]) -> dict[RankPath, float]:
    """The joint law of the rank prefixes over recorded rounds: ``rank_rows`` one rank sequence per round start
    (e.g. the text's teacher-forced ranks from each position); returns ``P(prefix = v)`` for every prefix seen."""
    counts: dict[RankPath, int] = {}
    n = 0
    for row in rank_rows:
        n += 1
        for d in range(1, len(row) + 1):
            key = tuple(int(r) for r in row[:d])
            counts[key] = counts.get(key, 0) + 1
    return {k: v / n for k, v in counts.items()} if n else {}


def best_tree(law: Mapping[RankPath, float], nodes: int, max_depth: int | None = None,
              max_width: int | None = None) -> tuple[list[RankPath], float]:
    """The tree of at most ``nodes`` nodes maximising equation (1) under the prefix law ``law`` (a prefix missing
    from it has probability 0), and its ``E[A]``: the ``nodes`` most likely prefixes (at most ``max_depth`` deep,
    ranks at most ``max_width``), ties to the shorter and then the smaller ranks. Zero-probability prefixes are
    left out (they add nothing)."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 0:
        raise ValueError(f"nodes must be an integer >= 0, got {nodes!r}")
    ok = [(p, w) for p, w in law.items() if w > 0 and (max_depth is None or len(p) <= max_depth)
          and (max_width is None or max(p) <= max_width)]
    top = heapq.nsmallest(nodes, ok, key=lambda pw: (-pw[1], len(pw[0]), pw[0]))
    paths = [p for p, _ in top]
    # prefix closure holds for exact laws; with max_width/max_depth filters it still does (a prefix passes both)
    check_rank_paths(sorted(paths, key=len))
    return paths, math.fsum(w for _, w in top)


def clairvoyant_accepted(rank_row: Sequence[int], nodes: int, vocab_rank_cap: int | None = None) -> int:
    """What a tree of ``nodes`` nodes that knows the round's ranks accepts: the text's own path, ``nodes`` deep
    (shorter when the row is; ``vocab_rank_cap``: a rank above it marks a token the drafter cannot propose)."""
    a = 0
    for r in rank_row[:nodes]:
        if vocab_rank_cap is not None and r > vocab_rank_cap:
            break
        a += 1
    return a
