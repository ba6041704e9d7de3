"""Criteria: spec strings, thresholds against NumPy, acceptance semantics, bad input."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import (
    AdditiveRelaxed,
    Mars,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    parse_criteria,
    parse_criterion,
)
from companion.certify.oracle import rejected_tokens

CANONICAL = ["greedy", "additive:0.3", "multiplicative:0.1", "topm:4", "topk-delta:10,0.6", "typical:0.09,0.3",
             "additive:0", "multiplicative:1", "additive:1e-05", "mars:0.87", "mars:1"]


@pytest.mark.parametrize("spec", CANONICAL)
def test_spec_round_trip(spec: str) -> None:
    c = parse_criterion(spec)
    assert str(c) == spec
    assert parse_criterion(str(c)) == c


def test_spec_objects() -> None:
    assert parse_criterion("greedy") == StrictGreedy()
    assert parse_criterion("additive:0.3") == AdditiveRelaxed(0.3)
    assert parse_criterion("multiplicative:0.1") == MultiplicativeRelaxed(0.1)
    assert parse_criterion("topm:4") == TopM(4)
    assert parse_criterion("topk-delta:10,0.6") == TopKDelta(10, 0.6)
    assert parse_criterion("typical") == Typical(0.09, 0.3)
    assert parse_criterion("mars:0.9") == Mars(0.9) and parse_criterion("mars") == Mars(0.87)
    assert parse_criteria("greedy;topm:2") == [StrictGreedy(), TopM(2)]


@given(
    kind=st.sampled_from(["additive", "multiplicative", "topm", "topk-delta", "typical", "mars"]),
    x=st.floats(min_value=1e-6, max_value=1.0, allow_nan=False),
    y=st.floats(min_value=1e-6, max_value=5.0, allow_nan=False),
    n=st.integers(min_value=1, max_value=1000),
)
@settings(max_examples=200, deadline=None)
def test_round_trip_property(kind: str, x: float, y: float, n: int) -> None:
    c = {"additive": lambda: AdditiveRelaxed(y), "multiplicative": lambda: MultiplicativeRelaxed(x),
         "topm": lambda: TopM(n), "topk-delta": lambda: TopKDelta(n, y), "typical": lambda: Typical(x, y),
         "mars": lambda: Mars(x)}[kind]()
    assert parse_criterion(str(c)) == c
    assert str(parse_criterion(str(c))) == str(c)


@pytest.mark.parametrize("bad", ["", "Greedy", "greedy:1", "additive", "additive:-0.1", "additive:x",
                                 "multiplicative:0", "multiplicative:1.5", "topm:0", "topm:2.5",
                                 "topk-delta:10", "topk-delta:0,0.5", "typical:0.09", "typical:0,0.3",
                                 "typical:2,0.3", "additive:nan", "additive:inf", " greedy", "mars:0", "mars:1.5",
                                 "mars:", "mars:0.5,1"])
def test_malformed_specs(bad: str) -> None:
    with pytest.raises(ValueError, match="criterion spec|must be"):
        parse_criterion(bad)


def test_parameter_ranges() -> None:
    for make in (lambda: AdditiveRelaxed(-1), lambda: MultiplicativeRelaxed(0), lambda: MultiplicativeRelaxed(1.01),
                 lambda: TopM(0), lambda: TopM(True), lambda: TopKDelta(0, 0.1), lambda: Typical(0, 0.3),
                 lambda: Typical(0.1, 0), lambda: AdditiveRelaxed(float("nan")), lambda: Mars(0), lambda: Mars(1.01),
                 lambda: Mars(float("inf"))):
        with pytest.raises(ValueError):
            make()


@pytest.mark.parametrize("spec", ["greedy", "additive:0.2", "multiplicative:0.3", "topm:3", "topk-delta:3,0.25",
                                  "typical:0.2,0.5", "typical:0.09,0.3"])
def test_rejection_region_matches_numpy(spec: str) -> None:
    rng = np.random.default_rng(3)
    c = parse_criterion(spec)
    for _ in range(100):
        p = rng.dirichlet(np.full(7, rng.choice([0.1, 1.0, 5.0])))
        mask = c.rejection_mask(torch.tensor(p)).numpy()
        assert set(np.nonzero(mask)[0]) == set(rejected_tokens(p, c))
        for tok in range(7):
            assert bool(c.accepts(torch.tensor(p), tok)) == (not mask[tok])


def test_ties_and_strictness() -> None:
    p = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    # every maximiser of p is accepted by strict greedy
    assert StrictGreedy().accepts(p, 0) and StrictGreedy().accepts(p, 1)
    assert not StrictGreedy().accepts(p, 2)
    # typical is strict: a token exactly at the threshold is rejected
    t = Typical(eps=0.2, delta=1.0)  # tau = min(0.2, e^{-H}) = 0.2 here (H > log 5)
    assert math.isclose(float(t.threshold(p)), 0.2)
    assert not t.accepts(p, 2)
    # additive relaxation accepts exactly at the boundary
    a = AdditiveRelaxed(0.2)
    assert a.accepts(p, 2)


def test_threshold_values() -> None:
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    h = -(p * p.log()).sum()
    assert torch.allclose(TopKDelta(2, 0.1).threshold(p), torch.tensor([0.4], dtype=torch.float64))
    assert torch.allclose(TopKDelta(2, 0.4).threshold(p), torch.tensor([0.3], dtype=torch.float64))
    assert torch.allclose(TopM(3).threshold(p), torch.tensor([0.15], dtype=torch.float64))
    assert torch.allclose(MultiplicativeRelaxed(0.5).threshold(p), torch.tensor([0.25], dtype=torch.float64))
    assert torch.allclose(Typical(0.9, 0.3).threshold(p), 0.3 * torch.exp(-h).reshape(1))


def test_threshold_from_logits_equals_probabilities() -> None:
    logits = torch.randn(5, 50, dtype=torch.float64) * 2
    p = torch.softmax(logits, -1)
    for spec in CANONICAL[:6]:
        c = parse_criterion(spec)
        torch.testing.assert_close(c.threshold(logits, from_logits=True), c.threshold(p))


def test_top_m_needs_m_below_vocab() -> None:
    with pytest.raises(ValueError, match="m < V"):
        TopM(4).threshold(torch.full((4,), 0.25))
    with pytest.raises(ValueError, match="k <= V"):
        TopKDelta(5, 0.1).threshold(torch.full((4,), 0.25))


# -- tie conventions and the decoders' verdict ---------------------------------------------------------

TIE_SPECS = ["greedy", "additive:0", "additive:0.25", "multiplicative:1", "multiplicative:0.5", "topm:1", "topm:2",
             "topm:3", "topk-delta:2,0.25", "topk-delta:4,0", "typical:0.09,0.3", "typical:0.5,2"]


@given(ints=st.lists(st.integers(1, 6), min_size=4, max_size=9), spec=st.sampled_from(TIE_SPECS),
       from_logits=st.booleans())
@settings(max_examples=300, deadline=None)
def test_worst_within_decoder_within_level_set(ints, spec, from_logits) -> None:
    """Entries on a small dyadic grid (ties and tokens exactly at thresholds everywhere): the worst
    case accepts a subset of what the first-index decoder accepts, which accepts a subset of the
    rule as written; the decoder's greedy is torch.argmax and its top-m the stable sort's top m."""
    c = parse_criterion(spec)
    try:
        c.check_vocab(len(ints))
    except ValueError:
        return
    x = torch.tensor(ints, dtype=torch.float64)
    p = x / 8 if from_logits else x / x.sum()
    ids = torch.arange(len(ints))
    worst = ~c.rejection_mask(p, from_logits=from_logits, ties="worst")
    level = ~c.rejection_mask(p, from_logits=from_logits)
    decoder = torch.stack([c.decoder_accepts(p, int(y), from_logits=from_logits) for y in ids])
    assert bool((worst <= decoder).all()) and bool((decoder <= level).all()), (ints, spec, worst, decoder, level)
    order = torch.sort(p, descending=True, stable=True).indices.tolist()
    limit = c.index_rank_limit()
    if limit is not None:
        for y in ids.tolist():
            assert bool(decoder[y]) == (bool(level[y]) and y in order[:limit])
    if isinstance(c, StrictGreedy):
        assert decoder.tolist() == [y == int(torch.argmax(p)) for y in ids.tolist()]
    # the worst case accepts a token only when every tie-break of the decoders would
    s = sorted(p.tolist(), reverse=True)
    if limit is not None:
        unique_boundary = limit >= len(s) or s[limit - 1] > s[limit]
        if unique_boundary and not isinstance(c, (AdditiveRelaxed, MultiplicativeRelaxed, TopKDelta)):
            assert torch.equal(worst, decoder)


def test_order_statistic_and_ties_checks() -> None:
    from companion.certify.criteria import check_ties, index_rank, order_statistic
    from companion.certify.summary import summarize

    p = torch.tensor([[0.25, 0.5, 0.25]], dtype=torch.float64)
    s = summarize(p, k=3)
    assert order_statistic(s, 1).tolist() == [0.5] and order_statistic(s, 3).tolist() == [0.25]
    assert math.isinf(float(order_statistic(s, 4))) and float(order_statistic(s, 4)) < 0
    with pytest.raises(ValueError, match="not in a summary"):
        order_statistic(summarize(p, k=1), 2)
    assert index_rank(p, torch.tensor([0])).tolist() == [2] and index_rank(p, torch.tensor([2])).tolist() == [3]
    assert check_ties("worst") == "worst" and check_ties("level-set") == "level-set"
    with pytest.raises(ValueError, match="ties must be"):
        check_ties("first")
    # top_needed grows by the one order statistic the worst case reads
    assert StrictGreedy().top_needed("worst") == 2 and TopM(3).top_needed("worst") == 4
    assert TopKDelta(1, 0.1).top_needed("worst") == 2 and Typical().top_needed("worst") == 1
