"""Certified run lengths against a direct loop; the stochastic contrast against NumPy and Pinsker."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import kl_divergence
from companion.certify.runs import certified_run_lengths, mean_certified_run_length
from companion.certify.stochastic import acceptance_probability, pinsker_lower_bound, total_variation


def _runs_by_loop(c: np.ndarray, eps: float) -> np.ndarray:
    out = np.zeros(len(c), dtype=np.int64)
    for t in range(len(c)):
        n = 0
        while t + n < len(c) and c[t + n] > eps:
            n += 1
        out[t] = n
    return out


@given(st.lists(st.one_of(st.floats(0, 2), st.just(float("inf"))), min_size=1, max_size=40),
       st.floats(0, 1.5))
@settings(max_examples=300, deadline=None)
def test_run_lengths_match_loop(certs: list[float], eps: float) -> None:
    c = np.array(certs)
    got = certified_run_lengths(torch.tensor(c), eps).numpy()
    np.testing.assert_array_equal(got, _runs_by_loop(c, eps))


def test_run_lengths_batched_and_many_budgets() -> None:
    rng = np.random.default_rng(0)
    c = rng.exponential(0.2, size=(3, 5, 30))
    eps = torch.tensor([0.0, 0.05, 0.2, 1.0])
    runs = certified_run_lengths(torch.tensor(c), eps)
    assert runs.shape == (4, 3, 5, 30)
    for e_i, e in enumerate(eps.tolist()):
        for a in range(3):
            for b in range(5):
                np.testing.assert_array_equal(runs[e_i, a, b].numpy(), _runs_by_loop(c[a, b], e))
    means = mean_certified_run_length(torch.tensor(c), eps)
    assert means.shape == (4,)
    assert torch.all(means[:-1] >= means[1:])  # a larger budget certifies less
    np.testing.assert_allclose(means[1].item(), runs[1].double().mean().item())


def test_nan_steps_break_runs_and_bad_eps() -> None:
    c = torch.tensor([1.0, float("nan"), 1.0, 1.0])
    assert certified_run_lengths(c, 0.5).tolist() == [1, 0, 2, 1]
    with pytest.raises(ValueError):
        certified_run_lengths(c, -1.0)


def test_tv_and_pinsker() -> None:
    rng = np.random.default_rng(1)
    for _ in range(200):
        v = rng.integers(2, 30)
        p, q = rng.dirichlet(np.ones(v) * 0.5), rng.dirichlet(np.ones(v) * 0.5)
        p, q = (p + 1e-12) / (1 + v * 1e-12), (q + 1e-12) / (1 + v * 1e-12)
        tp, tq = torch.tensor(p), torch.tensor(q)
        tv = float(total_variation(tp, tq))
        assert abs(tv - 0.5 * np.abs(p - q).sum()) < 1e-12
        assert abs(float(acceptance_probability(tp, tq)) - np.minimum(p, q).sum()) < 1e-12
        for direction in ("forward", "reverse"):
            kl = float(kl_divergence(tp, tq, direction))
            assert float(pinsker_lower_bound(kl)) <= 1 - tv + 1e-12


def test_kl_from_logits_and_support() -> None:
    logits_p, logits_q = torch.randn(4, 10, dtype=torch.float64), torch.randn(4, 10, dtype=torch.float64)
    p, q = torch.softmax(logits_p, -1), torch.softmax(logits_q, -1)
    want = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(kl_divergence(logits_p, logits_q, from_logits=True), want)
    torch.testing.assert_close(kl_divergence(p, q, "reverse"), (q * (q.log() - p.log())).sum(-1))
    a = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    b = torch.tensor([0.5, 0.0, 0.5], dtype=torch.float64)
    assert torch.isinf(kl_divergence(a, b))


def test_run_lengths_counts_true_runs_and_refuses_non_bool() -> None:
    from companion.certify.runs import run_lengths

    flags = torch.tensor([[True, True, False, True], [False, True, True, True]])
    assert run_lengths(flags).tolist() == [[2, 1, 0, 1], [0, 3, 2, 1]]
    with pytest.raises(ValueError, match="bool"):
        run_lengths(torch.tensor([1.0, 0.0]))
