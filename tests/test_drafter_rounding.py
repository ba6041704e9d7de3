"""Drafter-side certificates on rows the drafter returns in float32, bfloat16 or float16: never above the exact value.

The oracle: the library's own witness (the cheapest rejected target it found), nudged 2 float64 ulps
into the rejection region, then normalised and judged in mpmath against the exact drafter ``q`` (the
row's own values, softmaxed or normalised exactly). A nudged witness the exact rule rejects is a
rejected target, so the exact certificate is at most its ``KL(p || q)``, and so must the printed one be.
"""
from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
import torch

from companion.drafter.certificates import drafter_certificate, drafter_witness

MP_DPS = 40  # digits of this module's mpmath oracle (set per test by conftest.py)
V = 97
CRITERIA = ["greedy", "topm:2", "topm:4", "tree:1", "tree:2", "tree:4", "multiplicative:0.5", "additive:0.1",
            "topk-delta:2,0.1", "typical:0.09,0.3", "typical:0.3,0.09", "typical:0.9,1", "typical:1,1"]
INPUTS = [(torch.float32, True), (torch.bfloat16, True), (torch.float16, True), (torch.float32, False)]


def drafter_rows(dtype: torch.dtype, from_logits: bool, seed: int, n: int = 12, vocab: int = V) -> torch.Tensor:
    """LM-like drafter rows in ``dtype``: flat, peaked (top 6-24 nats above the runner-up) and near ties
    (runner-up 1-4 ulps of ``dtype`` below the top); logits, or their softmax taken in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        row = (1.0 + 3.0 * torch.rand(1, generator=g, dtype=torch.float64)) * torch.randn(vocab, generator=g,
                                                                                          dtype=torch.float64)
        kind = i % 3
        top = int(row.argmax())
        if kind == 1:
            row[top] += 6.0 + 18.0 * float(torch.rand(1, generator=g))
        row = row.to(dtype)
        if kind == 2:
            second = int(torch.topk(row.double(), 2).indices[1])
            below = row[top].clone()
            for _ in range(1 + i % 4):
                below = torch.nextafter(below, torch.tensor(-math.inf, dtype=dtype))
            row[second] = below
        out.append(row if from_logits else torch.softmax(row.float(), 0).to(dtype))
    return torch.stack(out)


def exact_q(row: torch.Tensor, from_logits: bool) -> list:
    """The drafter's exact distribution: the row's own values, softmaxed or normalised in mpmath."""
    x = [mp.mpf(float(v)) for v in row.double()]
    if from_logits:
        top = max(x)
        w = [mp.exp(v - top) for v in x]
    else:
        w = x
    total = mp.fsum(w)
    return [v / total for v in w]


def _down(x: float, ulps: int = 2) -> float:
    for _ in range(ulps):
        x = float(np.nextafter(x, -np.inf))
    return x


def _up(x: float, ulps: int = 2) -> float:
    for _ in range(ulps):
        x = float(np.nextafter(x, np.inf))
    return x


def nudged(witness: np.ndarray, q: list, spec: str) -> tuple[list, int]:
    """The witness moved 2 ulps into rejection, normalised in mpmath, and the token it is judged on: the draft
    ``d`` (the maximiser of ``q`` the witness gives least) lowered, or for ``tree:M`` the competitor outside
    ``q``'s top ``M`` that the witness lifts raised."""
    w = witness.copy()
    qmax = max(q)
    if spec.startswith("tree:"):
        m = int(spec.split(":")[1])
        order = sorted(range(len(q)), key=lambda i: (-q[i], i))
        outside = [i for i in range(len(q)) if sum(1 for j in range(len(q)) if j != i and q[j] >= q[i]) >= m]
        tok = max(outside, key=lambda i: (w[i], -order.index(i)))
        w[tok] = _up(w[tok])
    else:
        tok = min((i for i in range(len(q)) if q[i] == qmax), key=lambda i: w[i])
        w[tok] = _down(w[tok])
    x = [mp.mpf(float(v)) for v in w]
    total = mp.fsum(x)
    return [v / total for v in x], tok


def rejected(p: list, q: list, tok: int, spec: str) -> bool:
    """The exact rule, in mpmath: does ``p`` reject the draft (``tree:M``: is ``p``'s strict argmax ``tok``
    outside some top ``M`` of ``q``)?"""
    name, _, body = spec.partition(":")
    args = [float(a) for a in body.split(",")] if body else []
    others = [p[i] for i in range(len(p)) if i != tok]
    pd = p[tok]
    if name == "greedy":
        return max(others) >= pd
    if name == "topm":
        return sum(1 for v in others if v >= pd) >= int(args[0])
    if name == "tree":
        return pd > max(others)  # tok was chosen outside q's top M
    if name == "multiplicative":
        return pd < mp.mpf(args[0]) * max(p)
    if name == "additive":
        return max(p) - pd > mp.mpf(args[0])
    if name == "topk-delta":
        return sum(1 for v in others if v >= pd) >= int(args[0]) or max(p) - pd > mp.mpf(args[1])
    if name == "typical":
        h = -mp.fsum(v * mp.log(v) for v in p if v > 0)
        return pd <= min(mp.mpf(args[0]), mp.mpf(args[1]) * mp.exp(-h))
    raise AssertionError(spec)


def kl(p: list, q: list):
    return mp.fsum(a * mp.log(a / b) for a, b in zip(p, q) if a > 0)


@pytest.mark.parametrize("dtype,from_logits", INPUTS, ids=lambda x: str(x).replace("torch.", ""))
def test_never_above_a_rejected_target(dtype: torch.dtype, from_logits: bool) -> None:
    rows = drafter_rows(dtype, from_logits, seed=7)
    judged = above = 0
    worst = []
    for spec in CRITERIA:
        cert = drafter_certificate(rows, spec, from_logits=from_logits)
        wit = drafter_witness(rows, spec, from_logits=from_logits)
        for i in range(rows.shape[0]):
            if not math.isfinite(float(cert[i])) or torch.isnan(wit[i]).any():
                continue
            q = exact_q(rows[i], from_logits)
            p, tok = nudged(wit[i].numpy(), q, spec)
            if not rejected(p, q, tok, spec):
                continue
            judged += 1
            exact = kl(p, q)
            if mp.mpf(float(cert[i])) > exact:
                above += 1
                worst.append((spec, i, float(cert[i]), float(exact)))
    assert above == 0, f"{above} certificates above a rejected target's KL (spec, row, cert, KL): {worst[:6]}"
    # not vacuous: most nudged witnesses are rejected and judged
    total = len(CRITERIA) * rows.shape[0]
    assert judged >= 0.8 * total, f"only {judged} of {total} nudged witnesses were judged"


def test_typical_lowering_is_within_the_rows_error() -> None:
    """The lowering costs no more than the row's own error bound: float32 certificates within 1e-5 nats of float64."""
    rows = drafter_rows(torch.float32, True, seed=11)
    lo = drafter_certificate(rows, "typical:0.09,0.3", from_logits=True)
    hi = drafter_certificate(rows.double(), "typical:0.09,0.3", from_logits=True)
    gap = (hi - lo).abs().max().item()
    assert gap < 1e-5, f"float32 and float64 typical certificates differ by {gap:.3g} nats"
