"""The engine against a brute-force constrained optimiser (scipy SLSQP over softmax-parameterised
q, several restarts), on 200 random targets per case with V <= 8 (every third with an exact tie):
every criterion, both divergences, greedy trees of width 1..3, both tie conventions (the default
worst case over tie-breaks against :mod:`tests.tie_oracle`, ``ties="level-set"`` against
:mod:`companion.certify.oracle`)."""
from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch

from companion import certificate, tree_certificate
from companion.certify.oracle import brute_force_tree_certificate, rejected_tokens
from companion.certify.targets import random_targets
from tests.conftest import sweep_size
from tests.tie_oracle import worst_certificate, worst_rejected_tokens, worst_tree_certificate

N_TARGETS = sweep_size(200)   # random targets per case (100 unless COMPANION_FULL_SWEEPS=1)
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
    """Both tie conventions against their brute-force oracles (one SLSQP solve per token, shared):
    ``ties="level-set"`` against :func:`brute_force_certificate`'s rejection region, the default
    (worst case) against the tokens rejected under the most unfavourable small perturbation. Off
    ties the two regions coincide and the default is the level-set certificate bit for bit."""
    targets = _targets(divergence, seed=zlib.crc32(f"{spec}/{divergence}".encode()))
    batch_ok = []
    finite = 0
    for p in targets:
        worst = float(certificate(torch.tensor(p), spec, divergence))
        level = float(certificate(torch.tensor(p), spec, divergence, ties="level-set"))
        oracle_worst, oracle_level = worst_certificate(p, spec, divergence, restarts=2)
        finite += math.isfinite(oracle_level)
        if set(worst_rejected_tokens(p, spec).tolist()) == set(rejected_tokens(p, spec).tolist()):
            assert worst == level or (math.isnan(worst) and math.isnan(level)), (p.tolist(), worst, level)
        if not (_agree(level, oracle_level) and _agree(worst, oracle_worst)):
            batch_ok.append((p.tolist(), (worst, oracle_worst), (level, oracle_level)))
    assert not batch_ok, f"{len(batch_ok)} disagreements, first (p, (worst, oracle), (level-set, oracle)): {batch_ok[0]}"
    # The case must exercise real certificates, not only empty rejection regions.
    assert finite >= N_TARGETS // 4


def test_oracle_cases_include_ties() -> None:
    """random_targets puts an exact tie into every third target: the worst-case oracle of the
    rank criteria must see them (otherwise the comparison above tests nothing at ties)."""
    for spec in ("greedy", "topm:2", "topk-delta:2,0.2"):
        targets = _targets("forward", seed=zlib.crc32(f"{spec}/forward".encode()))
        differ = sum(set(worst_rejected_tokens(p, spec).tolist()) != set(rejected_tokens(p, spec).tolist())
                     for p in targets)
        assert differ >= 10, (spec, differ)


@pytest.mark.slow
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
@pytest.mark.parametrize("m", [1, 2, 3])
def test_tree_certificate_matches_oracle(m: int, divergence: str) -> None:
    """Level-set trees against :func:`brute_force_tree_certificate` (a maximiser in the top m),
    worst-case trees (the default) against the enumeration over the decoder's maximiser g and the
    m tokens other than g that beat it; on rows with a unique maximiser the two are the same."""
    targets = [p for p in _targets(divergence, seed=100 + m) if len(p) > m]
    assert len(targets) >= N_TARGETS * 0.8
    bad = []
    tied = 0
    for p in targets:
        level = float(tree_certificate(torch.tensor(p), m, divergence, ties="level-set"))
        worst = float(tree_certificate(torch.tensor(p), m, divergence))
        oracle_level = brute_force_tree_certificate(p, m, divergence, restarts=2)
        if int((p == p.max()).sum()) > 1:
            tied += 1
            oracle_worst = worst_tree_certificate(p, m, divergence, restarts=2)
        else:
            assert worst == level, (p.tolist(), worst, level)
            oracle_worst = oracle_level
        if not (_agree(level, oracle_level) and _agree(worst, oracle_worst)):
            bad.append((p.tolist(), (worst, oracle_worst), (level, oracle_level)))
    assert not bad, f"{len(bad)} disagreements, first (p, (worst, oracle), (level-set, oracle)): {bad[0]}"
    assert tied >= N_TARGETS // 10   # ties occur: every third target has one (20 of 200 at least)


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
