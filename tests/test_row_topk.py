"""The two-stage top-k of the certificate engine (companion.certify.summary.row_topk) against torch.topk."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.certify.summary import row_topk

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _check(x: torch.Tensor, k: int) -> None:
    values, idx = row_topk(x, k)
    ref = torch.topk(x, k, dim=-1)
    # the same values, in the same (descending) order; NaN where torch.topk has NaN
    torch.testing.assert_close(values, ref.values, rtol=0, atol=0, equal_nan=True)
    # the indices point at those values, each once
    torch.testing.assert_close(torch.gather(x, 1, idx), values, rtol=0, atol=0, equal_nan=True)
    assert bool((idx.sort(-1).values.diff(dim=-1) > 0).all()), "an index comes back twice"
    assert bool(((idx >= 0) & (idx < x.shape[-1])).all())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.sampled_from([16_384, 16_447, 40_000, 151_936, 151_937]),
       k=st.sampled_from([1, 2, 5, 64, 65]), dtype=st.sampled_from(DTYPES),
       kind=st.sampled_from(["normal", "ties", "top ties", "peaked", "masked"]))
def test_row_topk_is_torch_topk(seed, vocab, k, dtype, kind) -> None:
    g = torch.Generator().manual_seed(seed)
    x = 3.0 * torch.randn(3, vocab, generator=g, dtype=torch.float64)
    if kind == "ties":           # a few hundred distinct values: ties everywhere, the k-th included
        x = x.mul(20).round()
    elif kind == "top ties":     # hundreds of values tied at the top, spread over many blocks
        where = torch.randint(vocab, (300,), generator=g)
        x[:, where] = x.max() + 1
    elif kind == "peaked":
        x[:, int(torch.randint(vocab, (1,), generator=g))] += 120.0
    elif kind == "masked":       # most of the row -inf (a mask), ties among the -inf included
        x[:, torch.rand(vocab, generator=g) < 0.999] = -torch.inf
    _check(x.to(dtype), k)


def test_row_topk_in_the_last_partial_block_and_with_nan() -> None:
    x = torch.randn(2, 16_447)
    x[0, -1] = 50.0                      # the maximum among the V mod 64 values after the last block
    x[1, -5:] = 40.0                     # ties there
    _check(x, 64)
    x[1, 123] = torch.nan                # NaN counts as the largest, as in torch.topk
    _check(x, 3)


def test_row_topk_falls_back_where_two_stages_do_not_pay() -> None:
    x = torch.randn(4, 1000)
    _check(x, 64)                        # V < 4 k B: plain torch.topk
    _check(torch.randn(151_936, 4).t(), 2)  # rows not contiguous: plain torch.topk
