"""The engine against a brute-force constrained optimiser (scipy SLSQP over softmax-parameterised
q, several restarts), on 200 random targets per case with V <= 8: every criterion, both
divergences, and greedy trees of width 1..3."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from companion import certificate, tree_certificate
from companion.oracle import brute_force_certificate, brute_force_tree_certificate
from companion.targets import random_targets

N_TARGETS = 200
RTOL = 1e-6
# SLSQP's stopping rule works on the objective's absolute change (ftol 1e-15), so near-tie
# certificates of order 1e-9 and below are compared on an absolute scale.
ATOL = 1e-10

CRITERIA = [
    "greedy",
    "additive:0.1",
    "additive:0.3",
    "multiplicative:0.5",
    "multiplicative:0.1",
    "topm:2",
    "topm:3",
    "topk-delta:2,0.2",
    "topk-delta:3,0.6",
    "typical:0.09,0.3",
    "typical:0.3,0.9",
]


def _targets(divergence: str, seed: int) -> list[np.ndarray]:
    # Reverse KL(q||p) is infinite wherever p = 0 < q: give the oracle strictly positive targets.
    return random_targets(N_TARGETS, seed=seed, v_min=4, floor=1e-6 if divergence == "reverse" else 0.0)


def _agree(ours: float, oracle: float) -> bool:
    if math.isinf(ours) or math.isinf(oracle):
        return ours == oracle
    return abs(ours - oracle) <= ATOL + RTOL * abs(oracle)


@pytest.mark.slow
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
@pytest.mark.parametrize("spec", CRITERIA)
def test_certificate_matches_oracle(spec: str, divergence: str) -> None:
    targets = _targets(divergence, seed=zlib.crc32(f"{spec}/{divergence}".encode()))
    batch_ok = []
    finite = 0
    for p in targets:
        ours = float(certificate(torch.tensor(p), spec, divergence))
        oracle = brute_force_certificate(p, spec, divergence, restarts=2)
        finite += math.isfinite(oracle)
        if not _agree(ours, oracle):
            batch_ok.append((p.tolist(), ours, oracle))
    assert not batch_ok, f"{len(batch_ok)} disagreements, first: {batch_ok[0]}"
    # The case must exercise real certificates, not only empty rejection regions.
    assert finite >= N_TARGETS // 4


@pytest.mark.slow
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_tree_certificate_matches_oracle(m: int, divergence: str) -> None:
    targets = [p for p in _targets(divergence, seed=100 + m) if len(p) > m]
    assert len(targets) >= N_TARGETS * 0.8
    bad = []
    for p in targets:
        ours = float(tree_certificate(torch.tensor(p), m, divergence))
        oracle = brute_force_tree_certificate(p, m, divergence, restarts=2)
        if not _agree(ours, oracle):
            bad.append((p.tolist(), ours, oracle))
    assert not bad, f"{len(bad)} disagreements, first: {bad[0]}"


def test_batched_equals_rowwise() -> None:
    """One batched call over many rows and leading dims equals row-by-row calls."""
    targets = random_targets(24, seed=7, v_min=6, v_max=6)
    batch = torch.tensor(np.stack(targets)).reshape(4, 6, 6)
    for spec in CRITERIA:
        for div in ("forward", "reverse"):
            together = certificate(batch, spec, div)
            assert together.shape == (4, 6)
            one_by_one = torch.stack([certificate(torch.tensor(p), spec, div) for p in targets]).reshape(4, 6)
            torch.testing.assert_close(together, one_by_one, rtol=0, atol=0, equal_nan=True)
