"""Near ties: steps whose greedy token can differ between the kernel paths of one decoder.

A decoder computes the same logits along several kernel paths: a one-token decode step, a
``k+1``-token verification forward, one forward over a whole prefix. In float32 they agree to a
few units in the last place; in bfloat16, whose significand has 8 bits, they can choose different
greedy tokens where the two largest logits are nearly equal. A certificate promises acceptance
under every path a decoder may take, so the certificates of bfloat16 and float16 logits (and of
float32 copies declared as such, ``logits_dtype="bfloat16"``) count such a step as a tie, the
worst case: strict greedy's certificate is 0 there
(:func:`companion.certify.summary.summarize_partial`). The harvest's certificate columns keep the
paper's convention, exact ties only (:class:`companion.harvest.stats.StepStatistics`), and the
band is then applied where a chapter asks how many steps it touches.

**The band.** A logit ``z`` that a model returns in a floating dtype with ``b`` explicit
significand bits is the rounding of a float32 accumulation; the spacing of that dtype at ``z``
is ``ulp(z) = 2^(floor(log2 |z|) - b)`` (``b = 7`` for bfloat16, 10 for float16, 23 for float32).
Two paths that compute the same real value each round it to within ``ulp/2``, so the final
rounding alone can reverse the order of two logits only when their gap is at most one ulp of
the larger. The hidden state the output head reads is rounded at every layer too, in each
path's own order, which moves the logits further; we allow a second ulp for it. A step is a
*near tie* when ``z(1) - z(2) <= TIE_ULPS * ulp(z(1))``, ``TIE_ULPS = 2``. That second ulp is an
allowance, not a theorem: chapter 8 checks it on every step where the harvest and transformers'
assisted generation chose differently, and says so if any lies outside the band.
"""
from __future__ import annotations

import numpy as np

# One definition of the band for the whole engine: the certificates apply it (certify.precision).
from companion.certify.precision import SIGNIFICAND_BITS, TIE_ULPS, tie_band, ulp

__all__ = ["SIGNIFICAND_BITS", "TIE_ULPS", "near_ties", "tie_band", "ulp"]


def near_ties(z1: np.ndarray, gap: np.ndarray, dtype: str, ulps: float = TIE_ULPS) -> np.ndarray:
    """Steps whose top-2 logit gap is within :func:`tie_band` (exact ties included)."""
    return np.asarray(gap, dtype=np.float64) <= tie_band(z1, dtype, ulps)
