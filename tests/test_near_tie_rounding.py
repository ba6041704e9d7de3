"""Near ties of 1-4 ulps in every dtype: certificates never above the exact value of the input as given.

At a gap of a few ulps of the logits (or probabilities) the pooled cost is a difference of nearly
equal float64 values, each carrying its own rounding from the normalisation; the engine lowers
the cost by what that rounding can do (``value_err`` of :func:`companion.certify.pooling.pooled_cost`).
The oracle normalises the input in mpmath at this module's ``MP_DPS``: strict greedy and the
width-1 tree pool the top two, ``KL`` forward ``sum p_i log(p_i / L)``, reverse
``-log(1 - (sqrt p1 - sqrt p2)^2)``; ``topm:1`` is strict greedy.
"""
from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch

import companion as cp

MP_DPS = 60  # digits of this module's mpmath oracle (set per test by conftest.py)
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
V = 97


def exact_top2(x: torch.Tensor, from_logits: bool) -> tuple:
    v = x.double().numpy()
    if from_logits:
        top = mp.mpf(float(v.max()))
        w = [mp.exp(mp.mpf(float(t)) - top) for t in v]
    else:
        w = [mp.mpf(float(t)) for t in v]
    total = mp.fsum(w)
    p = sorted((t / total for t in w), reverse=True)
    return p[0], p[1]


def exact_greedy(p1, p2, div: str):
    if p1 == p2:
        return mp.mpf(0)
    if div == "forward":
        level = (p1 + p2) / 2
        return p1 * mp.log(p1 / level) + p2 * mp.log(p2 / level)
    return -mp.log1p(-((mp.sqrt(p1) - mp.sqrt(p2)) ** 2))


def near_tie_rows(dtype: torch.dtype, from_logits: bool, seed: int) -> torch.Tensor:
    """Rows whose top two are 1, 2, 3, 4 ulps (of ``dtype``) apart, at several scales."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for scale in (0.3, 1.0, 3.0, 7.5, 20.0):
        for k in (1, 2, 3, 4):
            z = torch.randn(V, generator=g, dtype=torch.float64) - 4.0
            if from_logits:
                top = torch.tensor(scale, dtype=dtype)
            else:  # the body carries the rest of the mass, so that the row sums to about 1
                top = torch.tensor(scale / 60.0, dtype=dtype)
                z = torch.softmax(z, -1) * (1 - 2 * float(top))
            second = top
            for _ in range(k):
                second = torch.nextafter(second, torch.tensor(-float("inf"), dtype=dtype)) if dtype in (
                    torch.float32, torch.float64) else (second.float() - (torch.finfo(dtype).eps * 0.5)
                                                        * 2.0 ** torch.floor(torch.log2(second.float().abs()))).to(dtype)
            if not from_logits:
                z[3] = z[50] = 0.0
                z = z * (1 - float(top) - float(second)) / float(z.sum())
            row = z.to(dtype)
            row[3], row[50] = top, second
            rows.append(row)
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("from_logits", [True, False])
def test_near_ties_never_above_the_exact_value(dtype: torch.dtype, from_logits: bool) -> None:
    x = near_tie_rows(dtype, from_logits, seed=len(str(dtype)) + from_logits)
    if not from_logits:
        assert bool((x.double().sum(-1) > 0).all())
    ours = cp.certificates(x, ["greedy", "topm:1"], ("forward", "reverse"), tree_widths=[1, 2],
                           from_logits=from_logits, logits_dtype="exact")
    positive = 0
    for i in range(x.shape[0]):
        p1, p2 = exact_top2(x[i], from_logits)
        for div in ("forward", "reverse"):
            want = exact_greedy(p1, p2, div)
            for key in (("greedy", div), ("topm:1", div), ("tree:1", div)):
                got = float(ours[key][i])
                assert got <= want, (dtype, from_logits, i, key, got, float(want))
                positive += got > 0
            # tree:2 pools the top with its two runners-up at most: never above pooling with the second alone
            assert float(ours[("tree:2", div)][i]) >= 0
    assert positive > 0
