"""The tree model: expected accepted length (sympy, enumeration), the best tree (brute force), the cost model.

Oracles: the accepted length of every joint outcome of the ranks enumerated and weighted symbolically (sympy);
every prefix-closed tree of ``N`` nodes enumerated for the best tree; direct sums for the cost model.
"""
from __future__ import annotations

import itertools
import math

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.speculative.tree.costs import TreeCostModel, TreeCostSamples
from companion.speculative.tree.model import (
    best_tree,
    check_rank_paths,
    clairvoyant_accepted,
    empirical_prefix_law,
    expected_accepted,
    expected_accepted_joint,
    full_tree,
    spine_tree,
)


def _accepted(tree: set[tuple[int, ...]], ranks: tuple[int, ...]) -> int:
    """The greedy walk on rank paths: the deepest prefix of the text's ranks in the tree."""
    a = 0
    while a < len(ranks) and ranks[: a + 1] in tree:
        a += 1
    return a


@pytest.mark.parametrize("paths", [full_tree([2, 2]), spine_tree([3, 2, 1]), [(1,), (2,), (1, 1), (2, 1), (2, 2)]])
def test_expected_accepted_length_symbolically(paths):
    """E[A] = sum over nodes of prod pi_d(r_d), against the expectation of A over every joint outcome of
    independent per-depth ranks (K ranks per depth plus an 'outside' rank), in exact symbolic arithmetic."""
    depth = max(len(p) for p in paths)
    k = 3
    pi = [[sp.Symbol(f"p{d}_{r}", positive=True) for r in range(1, k + 2)] for d in range(depth)]
    tree = set(paths)
    enumerated = sp.Integer(0)
    for ranks in itertools.product(range(1, k + 2), repeat=depth):
        weight = sp.Mul(*[pi[d][r - 1] for d, r in enumerate(ranks)])
        enumerated += weight * _accepted(tree, ranks)
    formula = sp.Add(*[sp.Mul(*[pi[d][r - 1] for d, r in enumerate(p)]) for p in paths])
    # the ranks of each depth sum to one: substitute the 'outside' rank's probability
    norm = {pi[d][k]: 1 - sum(pi[d][:k]) for d in range(depth)}
    assert sp.expand(enumerated.subs(norm) - formula.subs(norm)) == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0.01, 1.0), min_size=4, max_size=4), min_size=3, max_size=3),
       st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_closed_forms_of_full_trees_and_spines(raw, widths):
    probs = [[x / sum(row) for x in row] for row in raw]
    cdf = [list(itertools.accumulate(row)) for row in probs]
    full = expected_accepted(full_tree(widths), probs)
    assert math.isclose(full, sum(math.prod(cdf[j][widths[j] - 1] for j in range(d + 1)) for d in range(len(widths))),
                        rel_tol=1e-12)
    spine = expected_accepted(spine_tree(widths), probs)
    assert math.isclose(spine, sum(math.prod(probs[j][0] for j in range(d)) * cdf[d][widths[d] - 1]
                                   for d in range(len(widths))), rel_tol=1e-12)


def _prefix_closed_trees(candidates: list[tuple[int, ...]], n: int):
    for combo in itertools.combinations(candidates, n):
        s = set(combo)
        if all(len(p) == 1 or p[:-1] in s for p in combo):
            yield combo


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(1, 3), min_size=3, max_size=3), min_size=1, max_size=12), st.integers(1, 5))
def test_best_tree_is_the_brute_force_optimum(rows, n):
    """Ranks 1..3 drawn, trees of width <= 2 searched (rank 3: a token the tree does not hold)."""
    law = empirical_prefix_law(rows)
    paths, value = best_tree(law, n, max_width=2)
    candidates = [p for p in itertools.chain.from_iterable(itertools.product(range(1, 3), repeat=d) for d in (1, 2, 3))]
    brute = max(sum(law.get(p, 0.0) for p in t) for t in _prefix_closed_trees(candidates, n))
    assert math.isclose(value, brute, rel_tol=1e-12, abs_tol=1e-12)
    assert len(paths) <= n
    check_rank_paths(sorted(paths, key=len))
    # the law's E[A] of the chosen tree is its value, and equals the mean accepted length over the rows
    assert math.isclose(expected_accepted_joint(paths, lambda p: law.get(p, 0.0)), value, rel_tol=1e-12)
    tree = set(paths)
    assert math.isclose(value, sum(_accepted(tree, tuple(r)) for r in rows) / len(rows), rel_tol=1e-12)
    assert all(max(p) <= 2 for p in paths)


def test_clairvoyant_bound():
    assert clairvoyant_accepted([3, 9, 1, 2], 3) == 3
    assert clairvoyant_accepted([3, 9, 1, 2], 3, vocab_rank_cap=4) == 1
    assert clairvoyant_accepted([1], 5) == 1


def test_rank_paths_are_checked():
    with pytest.raises(ValueError, match="without its parent"):
        check_rank_paths([(1, 1)])
    with pytest.raises(ValueError, match="twice"):
        check_rank_paths([(1,), (1,)])
    with pytest.raises(ValueError, match="ranks >= 1"):
        check_rank_paths([(0,)])


def test_tree_cost_model():
    costs = TreeCostModel(verify=(1.0, 1.1, 1.2), draft=(0.0, 0.3, 0.4))
    assert costs.c == 0.3
    assert math.isclose(costs.verify_cost(5), 1.2 + 0.1 * 3)
    assert math.isclose(costs.round_cost(2, [1, 2]), 1.2 + 0.3 + 0.4)
    # two rounds: 3 and 1 tokens at costs 1.9 and 1.0
    assert math.isclose(costs.speedup([2, 0], [2, 0], [[1, 2], []]), 4 / 2.9)
    with pytest.raises(ValueError, match="verify table"):
        TreeCostModel(verify=(2.0, 1.0), draft=(0.0, 0.3))


def test_cost_samples_model_interpolates_medians():
    s = TreeCostSamples(one_s=(1.0, 1.0, 1.0), tree_s={2: (1.2, 1.2, 1.4), 4: (1.6, 1.6, 1.6)},
                        draft_s={1: (0.3, 0.3, 0.3)}, context=8)
    m = s.model()
    assert m.verify == pytest.approx((1.0, 1.1, 1.2, 1.4, 1.6))
    assert m.draft == pytest.approx((0.0, 0.3))
    assert s.spread("verify", 2) == pytest.approx((1.2, 1.2, 1.4))


def test_measure_tree_costs_runs_on_the_pair(one_torch_thread):
    import torch

    from companion.models.loading import load_pair
    from companion.speculative.tree.costs import measure_tree_costs

    target, drafter, _ = load_pair("default")
    s = measure_tree_costs(target, drafter, context=16, sizes=(1, 4), widths=(1, 2), repeats=2)
    m = s.model()
    assert len(m.verify) == 5 and len(m.draft) == 3 and all(v > 0 for v in m.verify)
    assert set(s.to_json()) == {"context", "threads", "one_s", "tree_s", "draft_s"}
    assert torch.get_num_threads() >= 1


def test_expanded_widths():
    from companion.speculative.tree.model import expanded_widths

    assert expanded_widths(full_tree([2, 2, 2])) == [2, 4]
    assert expanded_widths(spine_tree([3, 2, 1])) == [1, 1]
    assert expanded_widths([(1,), (2,)]) == []
