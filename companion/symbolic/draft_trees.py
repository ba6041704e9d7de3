"""Symbolic derivations (sympy) of a draft tree's expected accepted length, for ``companion.speculative.tree.model``.

Under greedy verification a tree of rank paths ``T`` (closed under prefixes) keeps the text's path as deep as
the text's ranks ``(R_1, .., R_d)`` stay in ``T``, so ``A = sum_{v in T} 1[(R_1..R_|v|) = v]`` and
``E[A] = sum_{v in T} P(prefix = v)``. With the ranks of different depths independent,
``P(prefix = v) = prod_j pi_j(v_j)``. Each function builds one side of an identity with symbols
``pi_{d,r} = P(R_d = r)``: :func:`accepted_by_nodes` sums over the tree's nodes, :func:`full_tree_factored`
and :func:`spine_factored` are the factored forms the module docstring of
``companion.speculative.tree.model`` states; ``tests/test_symbolic_trees.py`` checks that they agree and
that the library's numbers are their values.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import sympy as sp

__all__ = ["accepted_by_nodes", "full_tree_factored", "rank_symbols", "spine_factored"]


def rank_symbols(depth: int, width: int) -> list[list[sp.Symbol]]:
    """``pi[d][r - 1] = P(R_{d+1} = r)`` for ``d < depth``, ``r <= width``: positive symbols ``pi_{d,r}``."""
    return [[sp.Symbol(f"pi_{d + 1}{r}", positive=True) for r in range(1, width + 1)] for d in range(depth)]


def accepted_by_nodes(paths: Iterable[Sequence[int]], pi: Sequence[Sequence[sp.Expr]]) -> sp.Expr:
    """``E[A] = sum_{v in T} prod_j pi_j(v_j)``: one term per node of the tree."""
    return sp.Add(*[sp.Mul(*[pi[j][r - 1] for j, r in enumerate(v)]) for v in paths])


def full_tree_factored(widths: Sequence[int], pi: Sequence[Sequence[sp.Expr]]) -> sp.Expr:
    """The full tree of widths ``w_1, w_2, ..``: ``E[A] = sum_d prod_{j <= d} F_j(w_j)``, ``F_j(w) = sum_{r <= w} pi_j(r)``."""
    cdf = [sp.Add(*pi[j][:w]) for j, w in enumerate(widths)]
    return sp.Add(*[sp.Mul(*cdf[:d + 1]) for d in range(len(widths))])


def spine_factored(widths: Sequence[int], pi: Sequence[Sequence[sp.Expr]]) -> sp.Expr:
    """The spine of widths ``w_d`` (only the rank-1 child expanded): ``E[A] = sum_d (prod_{j < d} pi_j(1)) F_d(w_d)``."""
    return sp.Add(*[sp.Mul(*[pi[j][0] for j in range(d)]) * sp.Add(*pi[d][:w]) for d, w in enumerate(widths)])
