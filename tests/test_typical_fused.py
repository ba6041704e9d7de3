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
from companion.certify.criteria import parse_criterion
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


def _decided_at_rounding_scale(logits: torch.Tensor, spec: str) -> torch.Tensor:
    """Rows whose typical threshold (from float64) lies within 1e-9 relative of one of their top 64
    probabilities."""
    s64 = summarize(logits.double(), from_logits=True, k=64, with_entropy=True)
    tau = parse_criterion(spec).threshold_from_summary(s64, "level-set")
    return ((s64.values - tau.unsqueeze(1)).abs() <= 1e-9 * tau.unsqueeze(1)).any(1)


@pytest.mark.parametrize("kind", ["lm", "peaked", "masked"])
def test_typical_certificates_from_logits_are_sound_against_the_float64_ones(kind: str) -> None:
    """float32 logits: the certificates (fused entropy, float32 tail) are never above those of the same
    logits in float64 (exact to ~1e-12), and below them by no more than their rounding bounds (the
    entropy's interval and the normaliser's, a few 1e-6 absolute on these flat rows)."""
    logits = _logits(kind, 24, 20_000, 5)
    fused = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True)
    exact = certificates(logits.double(), SPECS, ("forward", "reverse"), from_logits=True)
    for key in fused:
        f, e = fused[key], exact[key]
        finite = torch.isfinite(e)
        assert bool((torch.isinf(f) == torch.isinf(e)).all()), key
        assert bool((f[finite] <= e[finite] * (1 + 1e-12) + 1e-15).all()), (key, (f - e)[finite].max())
        # far from the threshold the guards only round the cost down; a row whose threshold lies within
        # rounding of one of its top probabilities (a decision float32 cannot settle) may drop further
        close = _decided_at_rounding_scale(logits, key[0])
        far = finite & ~close
        assert bool(((e - f)[far] <= 2e-3 * e[far] + 5e-5).all()), (key, (e - f)[far].max())
    # the summary carrying the float64 oracle's entropy (error 0 on top of the fused one's bound):
    # the same guards at most, so never below the fused certificates
    s = summarize(logits, from_logits=True, k=64, with_entropy=True)
    p64 = torch.softmax(logits.double(), -1)
    oracle = replace(s, entropy=-torch.xlogy(p64, p64).sum(-1), entropy_err=torch.zeros_like(s.entropy))
    slow = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True, summary=oracle)
    for key in fused:
        assert bool((slow[key] >= fused[key]).all()), key