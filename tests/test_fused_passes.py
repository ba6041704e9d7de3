"""The fast passes over the vocabulary give what the plain ones give.

* the entropy summed in the tail pass (``summarize_partial``) equals ``entropy_of_rows``;
* ``certificates`` with typical acceptance on probability rows (entropy only where the top ``K``
  do not settle the threshold, summed in the tail pass) equals the same certificates from a
  summary that holds every row's exact entropy;
* the arithmetic deepest-rejected pass equals the ``torch.where`` one, at exact ties with the
  bound, zeros, subnormals, both dtypes and both comparisons.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.certify.certificates import _deepest_rejected, _deepest_rejected_probs, certificates
from companion.certify.summary import entropy_of_rows, summarize, summarize_partial


def _rows(kind: str, n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "flat":
        logits = 3.0 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    else:  # peaked rows with a few exact ties in float32
        logits = 2.0 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
        logits[:, 0] += 12.0
        logits[::3, 1] = logits[::3, 0]
    return torch.softmax(logits, -1).float()


@pytest.mark.parametrize("kind", ["flat", "peaked"])
def test_entropy_in_the_tail_pass_equals_the_separate_pass(kind: str) -> None:
    p = _rows(kind, 12, 5000, 0)
    want = torch.zeros(12, dtype=torch.bool)
    want[::2] = True
    s, partial = summarize_partial(p, k=64, entropy_rows=lambda top: want)
    full = entropy_of_rows(p, s.norm, False)
    assert torch.equal(partial[want], full[want]), (partial[want] - full[want]).abs().max()
    assert torch.isnan(partial[~want]).all()
    s_all, _ = summarize_partial(p, k=64, with_entropy=True)
    assert torch.equal(s_all.entropy, full)


@pytest.mark.parametrize("kind", ["flat", "peaked"])
@pytest.mark.parametrize("spec", ["typical:0.09,0.3", "typical:0.3,0.9", "typical:1,1", "typical:0.05,1.5"])
def test_typical_certificates_match_the_full_entropy_path(kind: str, spec: str) -> None:
    p = _rows(kind, 24, 20000, 1)
    fast = certificates(p, [spec], ("forward", "reverse"))
    reference = summarize(p, k=64, with_entropy=True)
    slow = certificates(p, [spec], ("forward", "reverse"), summary=reference)
    for key in fast:
        assert torch.equal(fast[key], slow[key]), (key, (fast[key] - slow[key]).abs().max())


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), strict=st.booleans(), f64=st.booleans(), ties=st.integers(0, 5))
def test_arithmetic_deepest_rejected_equals_the_masked_one(seed: int, strict: bool, f64: bool, ties: int) -> None:
    g = torch.Generator().manual_seed(seed)
    dtype = torch.float64 if f64 else torch.float32
    flat = torch.rand(7, 3000, generator=g, dtype=torch.float64).pow(6).to(dtype)
    flat[:, :5] = 0.0
    flat[:, 5:8] = torch.finfo(dtype).tiny / 4  # subnormals
    sums = flat.to(torch.float64).sum(1)
    # thresholds at an existing value of the row (an exact tie with the bound) or between values
    pick = flat[:, 100 + ties].to(torch.float64) / sums
    tau = torch.where(torch.arange(7) % 2 == 0, pick, pick * 1.37)
    tau[6] = 0.0  # nothing below: "none"
    idx = torch.tensor([0, 2, 3, 4, 5, 6])
    ref = _deepest_rejected(flat.index_select(0, idx), sums[idx], tau[idx], strict, False)
    got = _deepest_rejected_probs(flat, idx, sums[idx], tau[idx], strict)
    assert torch.equal(ref, got), (ref, got)
    every = torch.arange(7)
    assert torch.equal(_deepest_rejected(flat, sums, tau, strict, False),
                       _deepest_rejected_probs(flat, every, sums, tau, strict))


@pytest.mark.parametrize("f64", [False, True])
@pytest.mark.parametrize("strict", [False, True])
def test_integer_deepest_rejected_reads_negative_zero_as_zero(f64: bool, strict: bool) -> None:
    """-0.0 passes the validation (it is not < 0) and is a probability 0: rejected by any positive bound."""
    dtype = torch.float64 if f64 else torch.float32
    flat = torch.zeros(3, 500, dtype=dtype)
    flat[:, :4] = 0.25
    flat[0, 10:20] = -0.0  # only zeros (some negative) below the bound
    flat[1, :] = -0.0
    flat[1, :4] = 0.25
    flat[2, 7] = torch.finfo(dtype).tiny  # the deepest rejected is this one
    sums = flat.to(torch.float64).sum(1)
    tau = torch.full((3,), 0.1, dtype=torch.float64)
    every = torch.arange(3)
    got = _deepest_rejected_probs(flat, every, sums, tau, strict)
    ref = _deepest_rejected(flat, sums, tau, strict, False)
    assert torch.equal(got, ref), (got, ref)
    assert got[0, 0] == 0 and got[1, 0] == 0 and got[2, 0] == torch.finfo(dtype).tiny
    sub = torch.tensor([1, 2])
    assert torch.equal(_deepest_rejected_probs(flat, sub, sums[sub], tau[sub], strict), ref[sub])
