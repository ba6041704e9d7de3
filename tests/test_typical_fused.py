"""Typical acceptance's entropy, fused into the pass that already reads the row.

From logits the summary pass exponentiates ``x = exp(l - l(1))`` anyway; the entropy is one more
product per token there, ``H = log S - sum x (l - l(1)) / S`` with ``S = sum x``. These tests hold it
against an independent oracle (``-sum p log p`` of the float64 softmax, ``torch.xlogy``), on
LM-like, peaked, masked (``-inf``) and tied bfloat16 rows, and check that the certificates built on
it are the ones a summary carrying the oracle's entropy gives.
"""
from __future__ import annotations

import math
from dataclasses import replace

import mpmath

import pytest
import torch

from companion.certify.certificates import certificates
from companion.certify.summary import entropy_of_rows, summarize

SPECS = ["typical:0.09,0.3", "typical:0.3,0.9", "typical:1,1", "typical:0.05,1.5"]


def _oracle_entropy(logits: torch.Tensor) -> torch.Tensor:
    """``-sum p log p`` at 40 digits (mpmath), from the exact values of the logits as given."""
    out = []
    with mpmath.workdps(40):
        for row in logits.to(torch.float64).tolist():
            finite = [mpmath.mpf(v) for v in row if v != -math.inf]
            top = max(finite)
            z = mpmath.fsum(mpmath.exp(v - top) for v in finite)
            logs = [(v - top) - mpmath.log(z) for v in finite]
            out.append(float(-mpmath.fsum(mpmath.exp(lp) * lp for lp in logs)))
    return torch.tensor(out, dtype=torch.float64)


def _logits(kind: str, n: int, vocab: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    if kind == "peaked":  # top-1 gaps from a few nats to ~60 (p(1) from ~0.5 to 1 - 1e-20)
        logits[:, 0] = logits.amax(1) + torch.linspace(2.0, 60.0, n, dtype=torch.float64) + torch.log(
            torch.tensor(float(vocab), dtype=torch.float64))
    elif kind == "masked":  # a third of the vocabulary masked, one row masked but for three tokens
        logits[:, ::3] = -torch.inf
        logits[0, 3:] = -torch.inf
    elif kind == "shifted":  # large raw logits: the shift by l(1) keeps the digits
        logits = logits + 40.0
    return logits.to(dtype)


@pytest.mark.parametrize("kind", ["lm", "peaked", "masked", "shifted"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fused_entropy_matches_the_float64_oracle(kind: str, dtype: torch.dtype) -> None:
    logits = _logits(kind, 6, 3000, 3, dtype)
    got = summarize(logits, from_logits=True, k=64, with_entropy=True).entropy
    want = _oracle_entropy(logits)
    # float32 per-token sums (float32/bfloat16 rows): ~1e-7 relative; float64 rows: ~1e-15
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    torch.testing.assert_close(got, want, rtol=rtol, atol=0)
    assert bool((got >= 0).all())
    # entropy_of_rows (the pass certificates use on summaries handed in) gives the same numbers
    s = summarize(logits, from_logits=True, k=64)
    again = entropy_of_rows(logits, s.norm, True)
    torch.testing.assert_close(again, want, rtol=rtol, atol=0)


def test_fused_entropy_on_a_large_vocabulary_of_tied_bfloat16() -> None:
    """151,936 tokens in bfloat16: exact ties everywhere (bfloat16 has 8 bits of mantissa)."""
    g = torch.Generator().manual_seed(7)
    logits = (3.0 * torch.randn(1, 151_936, generator=g)).to(torch.bfloat16)
    logits[0, :2] = 40.0  # a tied, peaked top (H ~ log 2)
    got = summarize(logits, from_logits=True, k=64, with_entropy=True).entropy
    torch.testing.assert_close(got, _oracle_entropy(logits), rtol=2e-6, atol=0)


@pytest.mark.parametrize("kind", ["lm", "peaked", "masked"])
def test_typical_certificates_from_logits_use_the_exact_entropy(kind: str) -> None:
    """The certificates with the fused entropy are those of a summary carrying the oracle's entropy
    (the thresholds differ by ~1e-7 relative, far from every token of these random rows)."""
    logits = _logits(kind, 24, 20_000, 5)
    fused = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True)
    s = summarize(logits, from_logits=True, k=64)
    p64 = torch.softmax(logits.double(), -1)
    oracle = replace(s, entropy=-torch.xlogy(p64, p64).sum(-1))  # float64 (good to ~1e-13 absolute)
    slow = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True, summary=oracle)
    for key in fused:
        torch.testing.assert_close(fused[key], slow[key], rtol=1e-12, atol=0)
    # and those of the same rows given as float64 probabilities: the same accepted sets, the costs
    # within the float32 sum of the tail beyond the top K (~1e-7 relative, reverse costs)
    probs = certificates(torch.softmax(logits.double(), -1), SPECS, ("forward", "reverse"))
    for key in fused:
        torch.testing.assert_close(fused[key], probs[key], rtol=1e-6, atol=1e-15)
