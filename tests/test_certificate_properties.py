"""Properties of the certificates: tightness (witnesses), soundness (hypothesis), monotonicity,
closed forms, ceilings and margin bounds."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from companion import (
    certificate,
    certificates,
    kl_divergence,
    parse_criterion,
    per_token_cost,
    tree_certificate,
    tree_witness,
    witness,
)
from companion.certify.bounds import (
    additive_floor,
    greedy_margin_bounds,
    margin_only_bound,
    margin_only_leading_term,
    multiplicative_floor,
    pair_cost,
    tree_ceiling,
    tree_delta_bound,
    two_point_bound,
)
from companion.certify.certificates import exact_top_tie
from companion.certify.targets import random_targets

SPECS = ["greedy", "additive:0.1", "additive:0.3", "multiplicative:0.5", "multiplicative:0.1", "topm:2",
         "topm:3", "topk-delta:2,0.2", "topk-delta:3,0.6", "typical:0.09,0.3", "typical:0.3,0.9"]
DIVS = ["forward", "reverse"]


def _t(p: np.ndarray) -> torch.Tensor:
    return torch.tensor(p, dtype=torch.float64)


def distributions(min_v: int = 4, max_v: int = 12):
    """Hypothesis strategy: positive vectors normalised to a distribution; ties are likely
    because entries are drawn from a small grid half of the time."""
    return st.integers(min_v, max_v).flatmap(
        lambda v: st.one_of(
            arrays(np.float64, v, elements=st.floats(0.01, 1.0)),
            arrays(np.float64, v, elements=st.sampled_from([0.05, 0.1, 0.2, 0.4, 0.8])),
        )
    ).map(lambda a: a / a.sum())


# -- tightness: witnesses ----------------------------------------------------------------------

@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("spec", SPECS)
def test_witness_attains_certificate_and_is_rejected(spec: str, div: str) -> None:
    c = parse_criterion(spec)
    checked = 0
    for p in random_targets(60, seed=11, v_min=5, v_max=9, floor=1e-6):
        pt = _t(p)
        rho = float(certificate(pt, c, div))
        q = witness(pt, c, div)
        if math.isinf(rho):
            assert torch.isnan(q).all()
            continue
        checked += 1
        assert torch.all(q >= 0) and math.isclose(float(q.sum()), 1.0, rel_tol=1e-12)
        assert math.isclose(float(kl_divergence(pt, q, div)), rho, rel_tol=1e-9, abs_tol=1e-15)
        # some maximiser of q* is rejected (worst case over p's tie-breaks): worst-case
        # tie-breaking in the drafter picks it
        top = q >= q.max() * (1 - 1e-12)
        rejected = c.rejection_mask(pt, ties="worst")
        assert bool((top & rejected).any())
        # the level-set witness is rejected by the level-set rule
        q_level = witness(pt, c, div, ties="level-set")
        if not torch.isnan(q_level).all():
            top = q_level >= q_level.max() * (1 - 1e-12)
            assert bool((top & c.rejection_mask(pt)).any())
    assert checked >= 20


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_tree_witness_attains_and_fails(m: int, div: str) -> None:
    ties = 0
    for p in random_targets(40, seed=5, v_min=6, v_max=9, floor=1e-6):
        pt = _t(p)
        maxim = pt == pt.max()
        ties += int(maxim.sum()) > 1
        # worst case (default): for some maximiser g of p (the decoder's token under some
        # tie-break), m other tokens tie with or beat g under q*
        rho = float(tree_certificate(pt, m, div))
        q = tree_witness(pt, m, div)
        assert math.isclose(float(kl_divergence(pt, q, div)), rho, rel_tol=1e-9, abs_tol=1e-15)
        beaten = [int((q >= q[g] * (1 - 1e-12)).sum()) - 1 for g in torch.nonzero(maxim).flatten()]
        assert max(beaten) >= m
        # level-set: m non-maximisers of p tie with or beat every maximiser of p under q*: the
        # drafter's top m (ties broken against us) holds no maximiser of p
        rho = float(tree_certificate(pt, m, div, ties="level-set"))
        q = tree_witness(pt, m, div, ties="level-set")
        if math.isinf(rho):
            assert torch.isnan(q).all()
            continue
        assert math.isclose(float(kl_divergence(pt, q, div)), rho, rel_tol=1e-9, abs_tol=1e-15)
        best = q[maxim].max()
        assert int(((q >= best * (1 - 1e-12)) & ~maxim).sum()) >= m
    assert ties >= 5


# -- soundness ---------------------------------------------------------------------------------

@given(p=distributions(), lam=st.floats(1e-6, 1.0), noise=st.integers(0, 2**31 - 1),
       spec=st.sampled_from(SPECS), div=st.sampled_from(DIVS))
@settings(max_examples=300, deadline=None)
def test_below_certificate_every_maximiser_is_accepted(p, lam, noise, spec, div) -> None:
    """Any q with D(p, q) < rho*(p) has every maximiser accepted. Candidates: mixtures of the
    witness with p (strictly inside the certified ball by convexity) and random perturbations."""
    c = parse_criterion(spec)
    assume(len(p) > 3)
    pt = _t(p)
    rho = float(certificate(pt, c, div))
    accepted = ~c.rejection_mask(pt, ties="worst")
    rng = np.random.default_rng(noise)
    candidates = []
    if math.isfinite(rho):
        candidates.append((1 - lam) * witness(pt, c, div) + lam * pt)
    logits = torch.log(pt) + torch.tensor(rng.normal(scale=lam, size=len(p)))
    candidates.append(torch.softmax(logits, 0))
    for q in candidates:
        d = float(kl_divergence(pt, q, div))
        # Below float64 resolution (certificates of ~1e-33 between near-equal entries) the
        # comparison says nothing: require a margin above rounding.
        if d < rho * (1 - 1e-9) - 1e-13:
            maximisers = q >= q.max()
            assert bool(accepted[maximisers].all()), (p, q, d, rho)


# -- monotonicity and closed forms ----------------------------------------------------------------

@given(p=distributions(3, 10), div=st.sampled_from(DIVS))
@settings(max_examples=200, deadline=None)
def test_per_token_cost_non_increasing_in_probability(p, div) -> None:
    pt = _t(p)
    costs = torch.stack([per_token_cost(pt, y, div) for y in range(len(p))])
    order = torch.argsort(pt, descending=True)
    c_sorted = costs[order]
    assert torch.all(c_sorted[1:] >= c_sorted[:-1] - 1e-12)
    # equal probabilities, equal costs
    for i in range(len(p)):
        for j in range(len(p)):
            if p[i] == p[j]:
                assert math.isclose(float(costs[i]), float(costs[j]), rel_tol=1e-12, abs_tol=1e-15)


def test_certificate_is_cost_of_boundary_token() -> None:
    """rho* = min over rejected y of C(p, y) (monotonicity makes it the boundary token)."""
    for p in random_targets(50, seed=2, v_min=5, v_max=8, floor=1e-6):
        pt = _t(p)
        for spec in SPECS:
            c = parse_criterion(spec)
            for ties in ("worst", "level-set"):
                rej = torch.nonzero(c.rejection_mask(pt, ties=ties)).flatten()
                for div in DIVS:
                    rho = float(certificate(pt, c, div, ties=ties))
                    if rej.numel() == 0:
                        assert math.isinf(rho)
                        continue
                    best = min(float(per_token_cost(pt, int(y), div)) for y in rej)
                    assert math.isclose(rho, best, rel_tol=1e-12, abs_tol=1e-16)


def test_strict_greedy_closed_forms() -> None:
    for p in random_targets(200, seed=9, v_min=3, v_max=8):
        s = np.sort(p)[::-1]
        if s[0] == s[1]:
            continue
        a, b = s[0], s[1]
        tot = a + b
        x = a / tot
        h = -(x * math.log(x) + (1 - x) * math.log(1 - x))
        fwd = tot * (math.log(2) - h)
        rev = -math.log(1 - (math.sqrt(a) - math.sqrt(b)) ** 2)
        assert math.isclose(float(certificate(_t(p), "greedy", "forward")), fwd, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(float(certificate(_t(p), "greedy", "reverse")), rev, rel_tol=1e-9, abs_tol=1e-15)
        assert math.isclose(float(tree_certificate(_t(p), 1, "forward")), fwd, rel_tol=1e-9, abs_tol=1e-15)


def test_exact_top_tie_both_conventions() -> None:
    """At p = [0.4, 0.4, 0.2]. Worst case (default): the decoder's token is one of the two
    maximisers, the other one is rejected and already ties with it, so strict greedy and the
    width-1 tree certify nothing; width 2 fails once the 0.2 token also reaches the decoder's
    token. Level-set: both maximisers are accepted, and a tree succeeds when the drafter's top
    m holds either of them."""
    p = _t(np.array([0.4, 0.4, 0.2]))
    assert exact_top_tie(p) and not exact_top_tie(_t(np.array([0.5, 0.3, 0.2])))
    for div in DIVS:
        assert float(certificate(p, "greedy", div)) == 0.0 == float(tree_certificate(p, 1, div))
        assert torch.equal(witness(p, "greedy", div), p) and torch.equal(tree_witness(p, 1, div), p)
        assert math.isclose(float(tree_certificate(p, 2, div)), float(pair_cost(0.4, 0.2, div)), rel_tol=1e-12)
        # level-set: width 1, the 0.2 token must beat both maximisers, exactly strict greedy's failure
        level = float(certificate(p, "greedy", div, ties="level-set"))
        assert float(tree_certificate(p, 1, div, ties="level-set")) == level > 0
        assert math.isclose(level, float(per_token_cost(p, 2, div)), rel_tol=1e-12)
        # width 2: only one non-maximiser exists, so the top 2 always holds a maximiser
        assert math.isinf(float(tree_certificate(p, 2, div, ties="level-set")))
        assert torch.isnan(tree_witness(p, 2, div, ties="level-set")).all()
    # forward closed form: pool {0.4, 0.4, 0.2} at 1/3
    want = 0.8 * math.log(0.4 * 3) + 0.2 * math.log(0.2 * 3)
    assert math.isclose(float(tree_certificate(p, 1, ties="level-set")), want, rel_tol=1e-12)


def test_api_accepts_one_divergence_and_refuses_scalars() -> None:
    p = _t(np.array([0.5, 0.3, 0.2]))
    one = certificates(p, "greedy", "forward")
    assert list(one) == [("greedy", "forward")]
    assert float(one[("greedy", "forward")]) == float(certificate(p, "greedy", "forward"))
    assert list(certificates(p, "greedy", "reverse", tree_widths=2)) == [("greedy", "reverse"), ("tree:2", "reverse")]
    with pytest.raises(ValueError, match="divergence must be one of"):
        certificates(p, "greedy", ["forwards"])
    scalar = torch.tensor(0.5, dtype=torch.float64)
    for call in (lambda: witness(scalar, "greedy"), lambda: tree_witness(scalar, 1), lambda: certificate(scalar, "topm:2"),
                 lambda: certificates(scalar, "greedy", tree_widths=[1]), lambda: tree_certificate(scalar, 1),
                 lambda: per_token_cost(scalar, 0)):
        with pytest.raises(ValueError, match="got a scalar"):
            call()


# -- ceilings and limits --------------------------------------------------------------------------

@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_ceilings_approached(m: int) -> None:
    v = 50
    prev = 0.0
    for eps in [1e-1, 1e-2, 1e-3, 1e-5, 1e-8]:
        p = torch.full((v,), eps / (v - 1), dtype=torch.float64)
        p[0] = 1 - eps
        rho = float(tree_certificate(p, m))
        assert rho < tree_ceiling(m)
        assert rho >= prev
        prev = rho
    assert tree_ceiling(m) - prev < 1e-6
    if m == 1:
        assert abs(float(certificate(p, "greedy")) - math.log(2)) < 1e-6


def test_one_hot_target() -> None:
    p = torch.zeros(10, dtype=torch.float64)
    p[3] = 1
    assert math.isclose(float(certificate(p, "greedy")), math.log(2), rel_tol=1e-12)
    assert math.isinf(float(certificate(p, "greedy", "reverse")))
    assert math.isclose(float(tree_certificate(p, 4)), math.log(5), rel_tol=1e-12)


# -- margin bounds ----------------------------------------------------------------------------------

def test_margin_bounds_hold() -> None:
    for p in random_targets(300, seed=21, v_min=4, v_max=10):
        pt = _t(p)
        rho = float(certificate(pt, "greedy"))
        lo, hi = (float(x) for x in greedy_margin_bounds(pt))
        s = np.sort(p)[::-1]
        if math.isinf(rho):
            continue
        assert lo <= rho * (1 + 1e-12) and rho <= hi * (1 + 1e-12) + 1e-300
        gamma = s[0] - s[1]
        assert float(margin_only_bound(gamma)) <= rho * (1 + 1e-9) + 1e-15
        assert float(margin_only_leading_term(gamma)) <= float(margin_only_bound(gamma)) + 1e-15
        for spec in SPECS:
            for div in DIVS:
                r = float(certificate(pt, spec, div))
                assert float(two_point_bound(pt, spec, div)) <= r * (1 + 1e-9) + 1e-15
        r_add = float(certificate(pt, "additive:0.3"))
        if math.isfinite(r_add):
            assert float(additive_floor(0.3)) <= r_add
        r_mul = float(certificate(pt, "multiplicative:0.1"))
        assert float(multiplicative_floor(0.1, s[0])) <= r_mul
        for m in (1, 2):
            if m < len(p):
                rt = float(tree_certificate(pt, m))
                assert float(tree_delta_bound(pt, m)) <= rt * (1 + 1e-9) + 1e-15
                gamma_tie = s[0] - s[1]
                assert float(margin_only_bound(gamma_tie, m)) <= rt * (1 + 1e-9) + 1e-15


@pytest.mark.parametrize("s_total", [0.3, 0.6, 1.0])
def test_margin_bounds_approached_as_margin_vanishes(s_total: float) -> None:
    """rho* / (Delta^2 / (2s)) -> 1 as Delta -> 0."""
    ratios = []
    for delta in [1e-1, 1e-2, 1e-3, 1e-4, 1e-6]:
        a, b = (s_total + delta * s_total) / 2, (s_total - delta * s_total) / 2
        rest = 1 - s_total
        p = torch.tensor([a, b] + [rest / 20] * 20 if rest > 0 else [a, b], dtype=torch.float64)
        assert rest / 20 < b  # the runner-up stays the boundary token
        rho = float(certificate(p, "greedy"))
        lo, _ = greedy_margin_bounds(p)
        ratios.append(rho / float(lo))
    assert abs(ratios[-1] - 1) < 1e-6
    assert all(r1 >= r2 - 1e-12 for r1, r2 in zip(ratios, ratios[1:]))


@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_margin_only_bound_is_attained(m: int) -> None:
    """All mass on g and m competitors at p(1) - gamma attains phi_m(gamma) for gamma > 0, and
    (worst case over tie-breaks) gamma = 0 attains 0."""
    for gamma in [1e-6, 1e-3, 0.1, 0.5, 0.9]:
        p1 = (1 + m * gamma) / (m + 1)
        p = torch.tensor([p1] + [p1 - gamma] * m + [0.0], dtype=torch.float64)
        assert math.isclose(float(tree_certificate(p, m)), float(margin_only_bound(gamma, m)),
                            rel_tol=1e-9, abs_tol=1e-15)
    # gamma = 0: the competitors are maximisers themselves. Worst case: one of them may be the
    # decoder's token, the others already beat it, so the bound 0 is attained; level-set: only
    # approached (the one non-maximiser must rise above all m + 1 maximisers).
    tied = torch.tensor([1 / (m + 1)] * (m + 1) + [0.0], dtype=torch.float64)
    assert float(tree_certificate(tied, m)) == float(margin_only_bound(0.0, m)) == 0.0
    assert float(tree_certificate(tied, m, ties="level-set")) > 0.0


def test_pair_cost_reverse_closed_form() -> None:
    assert math.isclose(float(pair_cost(0.5, 0.3, "reverse")), -math.log(1 - (math.sqrt(0.5) - math.sqrt(0.3)) ** 2))


def test_shared_certificates_equal_single_calls() -> None:
    p = _t(np.stack(random_targets(30, seed=4, v_min=9, v_max=9)))
    out = certificates(p, SPECS, DIVS, tree_widths=[1, 2, 4])
    for spec in SPECS:
        for div in DIVS:
            torch.testing.assert_close(out[(spec, div)], certificate(p, spec, div), rtol=0, atol=0)
    for m in [1, 2, 4]:
        torch.testing.assert_close(out[(f"tree:{m}", "forward")], tree_certificate(p, m), rtol=0, atol=0)


def test_leading_term_is_a_bound_only_for_m1() -> None:
    g = torch.linspace(1e-3, 0.999, 200, dtype=torch.float64)
    assert torch.all(margin_only_bound(g, 1) >= margin_only_leading_term(g, 1))
    # for m >= 2 the cubic term is negative: phi_m < m gamma^2 / 2 at small gamma
    assert bool((margin_only_bound(g[:20], 4) < margin_only_leading_term(g[:20], 4)).all())


def test_two_point_bound_accurate_at_near_ties() -> None:
    """pair_cost must not lose digits near a tie: for strict greedy it equals rho* exactly."""
    for gap in [1e-3, 1e-6, 1e-9]:
        p = torch.tensor([0.45 + gap, 0.45, 0.1 - gap], dtype=torch.float64)
        assert math.isclose(float(two_point_bound(p, "greedy")), float(certificate(p, "greedy")), rel_tol=1e-12)


def test_precomputed_summary_gives_the_same_certificates() -> None:
    from companion.certify.summary import summarize

    logits = torch.randn(5, 300, dtype=torch.float32) * 3
    s = summarize(logits, from_logits=True, k=64, with_entropy=True)
    direct = certificates(logits, SPECS, DIVS, tree_widths=[1, 4], from_logits=True)
    reused = certificates(logits, SPECS, DIVS, tree_widths=[1, 4], from_logits=True, summary=s)
    for key, value in direct.items():
        torch.testing.assert_close(reused[key], value, rtol=0, atol=0)
    with pytest.raises(ValueError, match="summary does not fit"):
        certificates(logits, SPECS, summary=summarize(logits, from_logits=True, k=8))
