"""Peaked rows whose tail falls below float32's normal range: tree certificates never above the exact value.

With the top logit 87-104 nats above the rest, ``exp(l - l(1))`` lands in float32's subnormals,
where the relative bound on ``exp`` does not hold (the error is absolute, up to a spacing of
``2^-149``); further down it is 0. The engine bounds those terms as a block
(:func:`companion.certify.precision.underflow_error`). The oracle is mpmath over the whole row at
this module's ``MP_DPS`` (rows of a few hundred distinct logits, so that every token is summed
exactly), and the exact tree certificate is the least cost over the pools that keep every
unpooled competitor at or above the level.
"""
from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch

import companion as cp
from companion.harvest.stats import StepStatistics

MP_DPS = 50  # digits of this module's mpmath oracle (set per test by conftest.py)
V = 151_936
GAPS = [60.0, 80.0, 88.0, 92.0, 96.0, 100.0, 105.0, 110.0, 120.0, 150.0, 200.0]
WIDTHS = list(range(1, 9))


def peaked_row(gap: float, seed: int) -> torch.Tensor:
    """A body of 400 distinct logits spread over ``V`` tokens, the top ``gap`` nats above it (float64)."""
    g = torch.Generator().manual_seed(seed)
    levels = 2.5 * torch.randn(400, generator=g, dtype=torch.float64)
    row = levels[torch.randint(0, 400, (V,), generator=g)]
    row[int(torch.randint(0, V, (1,), generator=g))] = levels.max() + gap
    return row


def exact_top(x: np.ndarray, n: int) -> tuple[list, mp.mpf]:
    """The ``n`` largest exact probabilities of logits ``x`` (first index first among ties) and the
    exact mass of the other tokens, every token summed in mpmath."""
    order = np.argsort(-x, kind="stable")
    top = mp.mpf(float(x[order[0]]))
    head = [mp.exp(mp.mpf(float(v)) - top) for v in x[order[:n]]]
    vals, counts = np.unique(x[order[n:]], return_counts=True)
    rest = mp.fsum(int(c) * mp.exp(mp.mpf(float(v)) - top) for v, c in zip(vals, counts))
    total = mp.fsum(head) + rest
    return [v / total for v in head], rest / total


def exact_tree(p: list, rest, m: int, div: str):
    """``min`` over ``j`` of the cost of pooling ``p(1)`` with the ``j`` lowest of ``p(2..m+1)``,
    over the pools whose unpooled competitors stay at or above the level (each a feasible q)."""
    best = mp.inf
    for j in range(1, m + 1):
        pool = [p[0]] + p[m + 1 - j: m + 1]
        above = p[1: m + 1 - j]
        if div == "forward":
            level = mp.fsum(pool) / len(pool)
            cost = mp.fsum(v * mp.log(v / level) for v in pool)
        else:
            level = mp.exp(mp.fsum(mp.log(v) for v in pool) / len(pool))
            cost = -mp.log(rest + mp.fsum(above) + mp.fsum(p[m + 1:]) + len(pool) * level)
        if all(v >= level for v in above):
            best = min(best, cost)
    return best


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_peaked_tree_certificates_never_above_the_exact_value(dtype: torch.dtype) -> None:
    rows = torch.stack([peaked_row(gap, seed=int(gap)) for gap in GAPS]).to(dtype)
    ours = cp.certificates(rows, (), ("forward", "reverse"), tree_widths=WIDTHS, from_logits=True,
                           logits_dtype="exact")
    checked = 0
    for i, gap in enumerate(GAPS):
        p, rest = exact_top(rows[i].double().numpy(), 12)
        for m in WIDTHS:
            for div in ("forward", "reverse"):
                want = exact_tree(p, rest, m, div)
                got = float(ours[(f"tree:{m}", div)][i])
                assert got <= want, (dtype, gap, m, div, got, float(want))
                # not vacuous: close to the exact value while the tail is in the normal range, and
                # at most ~90 nats (-log of the underflow block's bound, 6e-40) beyond it
                assert got >= 0.9 * min(float(want), 85.0), (dtype, gap, m, div, got, float(want))
                checked += 1
    assert checked == len(GAPS) * len(WIDTHS) * 2


def _nudged_drafter(lp: torch.Tensor, m: int) -> torch.Tensor:
    """The reverse tree witness as logits (the pool at the mean of its logits, the rest as ``lp``),
    its pooled competitors raised by one float32 ulp: the target's token leaves the top ``m``."""
    q = cp.tree_witness(lp.unsqueeze(0), m, "reverse", from_logits=True)[0]
    t = int(torch.argmax(lp))
    log_q = torch.log(q)
    pool = torch.nonzero((log_q - log_q[t]).abs() < 1e-9).squeeze(1)
    lq = lp.clone()
    lq[pool] = lp[pool].double().mean().float()
    comp = pool[pool != t]
    lq[comp] = torch.nextafter(lq[comp], torch.full_like(lq[comp], float("inf")))
    return lq


def test_harvest_never_certifies_a_failing_tree_on_peaked_rows() -> None:
    """float32 target and drafter logits 60-200 nats peaked, the drafter just beyond the reverse
    tree:8 witness: the target's token is not in the drafter's top 8, so no column may certify."""
    stats = StepStatistics(["greedy"], [8], vocab=V, top_k=64)
    gaps = [60.0, 92.0, 100.0, 105.0, 110.0, 120.0, 200.0]
    lp = torch.stack([peaked_row(g, seed=7 + int(g)) for g in gaps]).float()
    lq = torch.stack([_nudged_drafter(lp[i], 8) for i in range(len(gaps))])
    cols = stats(lp, lq)
    assert not bool(cols["covered[8]"].any())
    for name in ("tree_certified_rev[8]", "path_tree_certified_rev[8]", "tree_certified_fwd[8]",
                 "path_tree_certified_fwd[8]"):
        assert not bool(cols[name].any()), (name, cols[name].tolist(), cols["tree_cert_rev[8]"].tolist())
