"""The expected accepted length of a draft tree: the sum over nodes (sympy) equals the factored forms, and the
library's numbers are their values."""
from __future__ import annotations

import random

import pytest
import sympy as sp

from companion.speculative.tree.model import expected_accepted, full_tree, spine_tree
from companion.symbolic.certificates import identical
from companion.symbolic.draft_trees import accepted_by_nodes, full_tree_factored, rank_symbols, spine_factored

SHAPES = [(1,), (2,), (1, 1, 1), (2, 2, 1), (3, 2, 1), (2, 2, 2), (3, 3, 3), (4, 3, 2, 2), (2, 1, 3)]


@pytest.mark.parametrize("widths", SHAPES, ids=str)
def test_factored_forms_equal_the_sum_over_nodes(widths: tuple[int, ...]) -> None:
    pi = rank_symbols(len(widths), max(widths))
    assert identical(accepted_by_nodes(full_tree(widths), pi), full_tree_factored(widths, pi))
    assert identical(accepted_by_nodes(spine_tree(widths), pi), spine_factored(widths, pi))


def test_a_wrong_form_is_told_apart() -> None:
    """The identity check can fail: the spine's form is not the full tree's once a depth is wider than 1."""
    pi = rank_symbols(2, 2)
    assert not identical(full_tree_factored((2, 2), pi), spine_factored((2, 2), pi))


@pytest.mark.parametrize("widths", SHAPES, ids=str)
def test_library_values_are_the_formulas(widths: tuple[int, ...]) -> None:
    rng = random.Random(len(widths) * 10 + sum(widths))
    width = max(widths) + 1
    law = []
    for _ in widths:
        w = [rng.random() for _ in range(width)]
        law.append([x / sum(w) for x in w])
    pi = rank_symbols(len(widths), width)
    values = {pi[d][r]: law[d][r] for d in range(len(widths)) for r in range(width)}
    for paths, form in ((full_tree(widths), full_tree_factored(widths, pi)),
                        (spine_tree(widths), spine_factored(widths, pi))):
        assert expected_accepted(paths, law) == pytest.approx(float(form.subs(values)), rel=1e-12)
