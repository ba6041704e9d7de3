"""companion.speculative.batched_numpy against numpy's own functions, row by row: the same bits.

The batched replay of the calibrated rule decides as the policy object does only if these give
exactly numpy's results, so every comparison here is ``==`` on float64, over rows of every length
the rule meets (1 .. 128 entries), values over several orders of magnitude, ties and grid points.
"""
from __future__ import annotations

import numpy as np
import pytest

from companion.speculative.batched_numpy import interp_unit_grid, row_sums, sorted_quantiles
from companion.speculative.policies import SURVIVAL_GRID


@pytest.mark.parametrize("seed", range(5))
def test_row_sums_are_numpy_s_pairwise_sums(seed):
    rng = np.random.default_rng(seed)
    rows = 400
    n = rng.integers(0, 129, rows)
    n[:130] = np.arange(130) % 129
    width = int(n.max())
    a = rng.random((rows, width)) * 10.0 ** rng.uniform(-8, 4, (rows, width))
    a[rng.random((rows, width)) < 0.1] = 0.0
    a[np.arange(width)[None, :] >= n[:, None]] = 0.0
    got = row_sums(a, n)
    want = np.array([a[r, :n[r]].sum() for r in range(rows)])
    assert np.array_equal(got, want)
    # the sum along the last axis of a 2-D array is the rows' own sums (what the policy computes)
    block = a[:65, :17].copy()
    assert np.array_equal(block.sum(1), row_sums(block, np.full(65, 17)))


def test_row_sums_refuse_rows_numpy_would_split():
    with pytest.raises(ValueError, match="at most 128"):
        row_sums(np.zeros((1, 129)), np.array([129]))


@pytest.mark.parametrize("seed", range(5))
def test_interpolation_on_the_survival_grid_is_np_interp(seed):
    rng = np.random.default_rng(seed)
    rows = 200
    fp = np.maximum(np.cumsum(rng.normal(size=(rows, 65)), axis=1) * rng.uniform(0, 3, (rows, 1)), 0.0)
    x = rng.random((rows, 40)) ** rng.uniform(0.2, 3, (rows, 1))
    x[:, :5] = rng.integers(0, 65, (rows, 5)) / 64        # on the grid points, 1.0 included
    x[:, 5] = 1.0
    x[:, 6] = 0.0
    x[:, 7] = (rng.integers(0, 65, rows) / 64) * (rng.integers(0, 65, rows) / 64)   # S * v as the rule meets them
    got = interp_unit_grid(x, fp)
    want = np.array([np.interp(x[r], SURVIVAL_GRID, fp[r]) for r in range(rows)])
    assert np.array_equal(got, want)


@pytest.mark.parametrize("seed", range(5))
def test_sorted_quantiles_are_np_quantile(seed):
    rng = np.random.default_rng(seed)
    rows = 300
    n = rng.integers(1, 700, rows)
    width = int(n.max())
    data = np.full((rows, width), np.inf)
    for r in range(rows):
        values = rng.random(n[r]) ** 3
        if r % 3 == 0:
            values = np.round(values * 8) / 8          # many ties
        data[r, :n[r]] = values
    srt = np.sort(data, axis=1)
    for nb in (2, 3, 7, 16, 31):
        q = np.linspace(0, 1, nb + 1)[1:-1]
        got = sorted_quantiles(srt, n, np.broadcast_to(q, (rows, q.size)))
        want = np.array([np.quantile(data[r, :n[r]], q) for r in range(rows)])
        assert np.array_equal(got, want), nb
