"""Near ties: steps whose greedy token can differ between the kernel paths of one decoder.

A decoder computes the same logits along several kernel paths: a one-token decode step, a
``k+1``-token verification forward, one forward over a whole prefix. In float32 they agree to a
few units in the last place; in bfloat16, whose significand has 8 bits, they can choose different
greedy tokens where the two largest logits are nearly equal. A certificate promises acceptance
under every path a decoder may take, so the certificates of bfloat16 and float16 logits (and of
float32 copies declared as such, ``logits_dtype="bfloat16"``) count such a step as a tie, the
worst case: strict greedy's certificate is 0 there
(:func:`companion.certify.summary.summarize_partial`). The harvest stores both conventions: the
paper's, exact ties only (``cert_*``), and the kernel-path one (``path_cert_*``)
(:class:`companion.harvest.stats.StepStatistics`).

**The band.** A logit ``z`` that a model returns in a floating dtype with ``b`` explicit
significand bits is the rounding of a float32 accumulation; the spacing of that dtype at ``z``
is ``ulp(z) = 2^(floor(log2 |z|) - b)`` (``b = 7`` for bfloat16, 10 for float16, 23 for float32).
Two paths that compute the same real value each round it to within ``ulp/2``, so the final
rounding alone can reverse the order of two logits only when their gap is at most one ulp of
the larger. The hidden state the output head reads is rounded at every layer too, in each
path's own order, which moves the logits further, so the band cannot be derived from the last
rounding alone: it is measured. :mod:`companion.harvest.kernel_paths` reads the default pair's
answers along four kernel paths (batch-1 decode, verification forwards, one forward over the
whole text, a left-padded batch; ``benchmarks/measure_kernel_paths.py``, the committed record
checked by ``tests/test_kernel_paths.py``, shown in chapter 12). On its 2,716 bfloat16 steps every
flip lay at a top-2 gap of at most 2 ulps, and the gap between the same two tokens moved by up
to 3 ulps between two paths, so a flip at a gap of 3 ulps cannot be ruled out. A step is a
*near tie* when ``z(1) - z(2) <= TIE_ULPS * ulp(z(1))``, ``TIE_ULPS = 4``: one ulp of margin over
the widest move measured, two over the widest flip. It is an allowance sized on one pair and one
CPU, not a theorem; chapter 8 checks it again on every step where the harvest and transformers'
assisted generation chose differently.
"""
from __future__ import annotations

import numpy as np

# One definition of the band for the whole engine: the certificates apply it (certify.precision).
from companion.certify.precision import SIGNIFICAND_BITS, TIE_ULPS, tie_band, ulp

__all__ = ["SIGNIFICAND_BITS", "TIE_ULPS", "near_ties", "tie_band", "ulp"]


def near_ties(z1: np.ndarray, gap: np.ndarray, dtype: str, ulps: float = TIE_ULPS) -> np.ndarray:
    """Steps whose top-2 logit gap is within :func:`tie_band` (exact ties included)."""
    return np.asarray(gap, dtype=np.float64) <= tie_band(z1, dtype, ulps)
