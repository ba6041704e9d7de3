"""The certified tree policy's fast scores equal the library's drafter-side tree certificates on exact rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from companion.drafter.certificates import drafter_certificates
from companion.speculative.tree.scores import tree_scores


@pytest.mark.parametrize("scale", [0.5, 2.0, 5.0, 12.0])
def test_scores_are_the_certificates(scale: float) -> None:
    g = torch.Generator().manual_seed(int(scale * 10))
    rows = scale * torch.randn(16, 500, generator=g, dtype=torch.float64)
    rows[::4, 7] = rows[::4].max(-1).values + 0.01          # near ties at the top
    rows[1::4, :3] = rows[1::4].max(-1, keepdim=True).values  # exact ties
    rows = rows.float()   # the policy reads float32 logits; both sides see the same values
    rho = drafter_certificates(rows.double(), (), tree_widths=range(1, 5), from_logits=True)
    expected = -np.expm1(-np.stack([rho[f"tree:{m}"].numpy() for m in range(1, 5)], axis=-1))
    np.testing.assert_allclose(tree_scores(rows, 4), expected, rtol=2e-5, atol=1e-9)


def test_one_row_and_a_small_vocabulary() -> None:
    row = torch.tensor([2.0, 1.0, 0.0])
    assert tree_scores(row, 8).shape == (2,)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        tree_scores(torch.tensor([[1.0]]), 4)
