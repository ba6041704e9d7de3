"""The pooling kernel shared by the target and the drafter side, against 50-digit arithmetic.

The reverse pooled cost with weights ``w`` is ``-log(T_A + G_w)``, ``G_w = prod_A (p_i / w_i)^w_i``;
mpmath evaluates it directly at 50 digits (where the float64 kernel has to avoid cancellation),
including near ties of relative gap down to 1e-12 and peaked rows.
"""
from __future__ import annotations

import mpmath
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.certify.pooling import pooled_cost, reverse_tilt

MP_DPS = 60  # digits of this module's mpmath oracle and exact_oracle's (set per test by conftest.py)


def _exact(p: list[mpmath.mpf], pool: list[bool], w: list[mpmath.mpf]) -> mpmath.mpf:
    """``-log(T_A + G_w)`` in 50-digit arithmetic."""
    outside = sum(x for x, a in zip(p, pool) if not a)
    log_g = sum(wi * mpmath.log(x / wi) for x, a, wi in zip(p, pool, w) if a)
    return -mpmath.log(outside + mpmath.e ** log_g)


def _row(draw_gap: float, size: int, peak: float, seed: int) -> list[mpmath.mpf]:
    """A distribution whose first ``size`` entries are within ``draw_gap`` (relative) of each other."""
    rng = torch.Generator().manual_seed(seed)
    base = mpmath.mpf(peak)
    head = [base * (1 + mpmath.mpf(draw_gap) * float(torch.rand(1, generator=rng))) for _ in range(size)]
    rest = [mpmath.mpf(float(torch.rand(1, generator=rng))) for _ in range(5)]
    scale = (1 - sum(head)) / sum(rest)
    return head + [x * scale for x in rest]


@settings(max_examples=60, deadline=None)
@given(gap=st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3, 0.3]), size=st.integers(2, 4),
       peak=st.sampled_from([0.05, 0.2, 0.24]), alpha=st.floats(0.05, 1.0), seed=st.integers(0, 10_000))
def test_weighted_reverse_cost_matches_50_digit_arithmetic(gap: float, size: int, peak: float, alpha: float,
                                                           seed: int) -> None:
    p = _row(gap, size, peak, seed)
    pool = [True] * size + [False] * 5
    # Weights proportional to (alpha, 1, 1, ...): the multiplicative relaxation's shape.
    raw = [mpmath.mpf(alpha)] + [mpmath.mpf(1)] * (size - 1) + [mpmath.mpf(1)] * 5
    total = sum(r for r, a in zip(raw, pool) if a)
    w = [r / total if a else mpmath.mpf(1) for r, a in zip(raw, pool)]
    exact = _exact(p, pool, w)
    vals = torch.tensor([[float(x) for x in p]], dtype=torch.float64)
    mask = torch.tensor([pool])
    weights = torch.tensor([[float(x) for x in w]], dtype=torch.float64)
    outside = torch.tensor([float(sum(x for x, a in zip(p, pool) if not a))], dtype=torch.float64)
    got = float(pooled_cost(vals, torch.log(vals), mask, outside, "reverse", weights)[0])
    # The float64 inputs carry their own rounding (1e-16 each), and so does x_i = p_i / w_i: at a
    # near tie that moves the cost by ~1e-16 sqrt(cost) (the floor of exact-tie scale, as on the
    # target side); otherwise the kernel is good to ~1e-12 relative and never rounds above.
    floats = [mpmath.mpf(float(x)) for x in p]
    exact_of_inputs = _exact([x / sum(floats) for x in floats], pool, w)  # the kernel assumes sum p = 1
    floor = 1e-16 * float(mpmath.sqrt(exact_of_inputs))
    tol = 1e-12 * float(exact_of_inputs) + floor
    assert abs(got - float(exact_of_inputs)) <= tol, (got, float(exact_of_inputs), float(exact), gap, size)
    assert got <= float(exact_of_inputs) * (1 + 2e-15) + floor, ("the kernel must not round above the exact cost",
                                                                   got, float(exact_of_inputs))


@settings(max_examples=40, deadline=None)
@given(size=st.integers(2, 5), seed=st.integers(0, 10_000), log_peak=st.floats(-300.0, -1.0))
def test_equal_weights_given_explicitly_match_the_default(size: int, seed: int, log_peak: float) -> None:
    """Equal weights passed by hand go through the weighted path; the default (the target side's
    path, no division by the weights) must give the same cost, peaked rows included."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, 8, generator=g, dtype=torch.float64) * 3
    logits[0, 0] = 0.0
    logits[0, 1:] += log_peak  # the top token takes all but e^log_peak of the mass
    logs = logits - torch.logsumexp(logits, 1, keepdim=True)
    vals = torch.exp(logs)
    mask = torch.zeros(1, 8, dtype=torch.bool)
    mask[0, :size] = True
    outside = vals[0, size:].sum().reshape(1)
    equal = torch.where(mask, torch.full_like(vals, 1.0 / size), torch.zeros_like(vals))
    a = pooled_cost(vals, logs, mask, outside, "reverse")
    b = pooled_cost(vals, logs, mask, outside, "reverse", equal)
    assert torch.allclose(a, b, rtol=1e-12, atol=0), (float(a), float(b))


def test_reverse_tilt_is_the_minimiser_it_prices() -> None:
    """``q*`` from :func:`reverse_tilt` is normalised, keeps ``q_i / w_i`` constant on the pool, and
    ``KL(q* || p)`` equals the pooled cost."""
    p = torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False, False]])
    w = torch.tensor([[0.25, 0.75, 1.0, 1.0, 1.0]], dtype=torch.float64)
    outside = p[0, 2:].sum().reshape(1)
    cost = pooled_cost(p, torch.log(p), mask, outside, "reverse", w)
    q = reverse_tilt(p, torch.log(p), mask, cost, w)
    assert abs(float(q.sum()) - 1) < 1e-14, float(q.sum())
    assert abs(float(q[0, 0] / 0.25 - q[0, 1] / 0.75)) < 1e-14, q
    kl = float((q * (torch.log(q) - torch.log(p))).sum())
    assert abs(kl - float(cost)) < 1e-13, (kl, float(cost))


def test_rounded_down_on_dyadic_rows_every_branch() -> None:
    """Certificates stay at or below the exact value of their float64 inputs, the reverse
    large-excess branch (-log(T_A + G_w)) included: 150 random dyadic rows (exact in float64),
    greedy and topm:2 in both directions, against 60-digit enumeration (tests.exact_oracle).
    Before that branch was rounded down, 23 of 2,961 such reverse cases lay above exact."""
    import random

    from companion import certificates
    from tests.exact_oracle import exact_certificate

    rng = random.Random(7)
    by_v: dict[int, list[list[int]]] = {}
    while sum(len(r) for r in by_v.values()) < 150:
        v, total = rng.randint(3, 6), 2 ** rng.randint(4, 10)
        cuts = sorted(rng.randint(1, total - 1) for _ in range(v - 1))
        w = [b - a for a, b in zip([0] + cuts, cuts + [total])]
        if min(w) > 0:
            by_v.setdefault(v, []).append(w)
    checked = peaked = 0
    for rows in by_v.values():
        p = torch.tensor(rows, dtype=torch.float64)
        p = p / p.sum(-1, keepdim=True)  # a power of two: exact
        peaked += int((p.amax(-1) > 0.75).sum())
        certs = certificates(p, ["greedy", "topm:2"], ["forward", "reverse"])
        for (spec, div), got_all in certs.items():
            for w, got in zip(rows, got_all.tolist()):
                exact = exact_certificate(w, spec, div)
                if exact == mpmath.inf:
                    assert got == float("inf"), (w, spec, div, got)
                    continue
                checked += 1
                assert mpmath.mpf(got) <= exact + mpmath.mpf(1e-50), f"{spec} {div} on {w}: {got!r} above the exact {exact}"
                # rounded down by 8e-15 relative, evaluated to ~1e-15: within 2e-14 of exact; 1e-50
                # absolute is the oracle's own (60 digits: a tied top gives 1e-51, not 0)
                assert float(exact - mpmath.mpf(got)) <= 2e-14 * float(exact) + 1e-50, (w, spec, div, got, exact)
    assert checked > 500 and peaked > 5, (checked, peaked)
