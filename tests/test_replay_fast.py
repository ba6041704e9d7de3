"""The array replays (companion.speculative.replay_fast) against the reference replay, on random recordings.

Oracle: :func:`replay` with ``fast=False`` drives the policy call by call (start_round / wants_draft /
observe / submit / end_round), as the decoder does; the array replay of every built-in must return
the same rounds, tokens and forwards, leave a policy object in the same state, and raise the same
error where the reference raises. The oracle's array programme must give the reference's costs and
choices bit for bit. Recordings are drawn by hypothesis: texts with and without an end-of-sequence
token (also inside the text), chains cut by ``max_drafts``, ``q(1)`` on and off the thresholds.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from companion.speculative import CostModel, DraftStep, RecordedChains, oracle_plan, parse_policy, replay
from companion.speculative.compare import builtin_policies
from companion.speculative.oracle import oracle_result, oracle_results
from companion.speculative.replay import _dp, grid_builtins
from companion.speculative.replay_fast import oracle_dp_many
from companion.speculative.policies import Confidence, Constant, Heuristic
from companion.speculative.replay_fast import is_builtin

BUILTINS = sorted(set(grid_builtins()) | set(builtin_policies()) | {
    "heuristic:1", "heuristic:3,0.5", "heuristic:2,0.3", "confidence:0.5,3", "confidence:0", "confidence:1,2",
    "constant:1", "constant:40"})
Q1 = st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 0.35, 0.999])


@st.composite
def recordings(draw) -> RecordedChains:
    """A text of ids 0..3 (0: end of sequence, at the end when it ended, anywhere when ``eos`` says so)
    and per position a chain that agrees with the text for a drawn ``L_s`` drafts, then goes its own way."""
    budget = draw(st.integers(1, 24))
    max_drafts = draw(st.one_of(st.none(), st.integers(0, 6)))
    inner_eos = draw(st.booleans())      # the end-of-sequence id may also sit inside the text
    ended = budget > 1 and draw(st.booleans())
    n = draw(st.integers(1, budget - 1)) if ended else budget
    lo = 0 if inner_eos else 1
    text = [draw(st.integers(lo, 3)) for _ in range(n)]
    if ended:
        text[-1] = 0
    # with inner_eos a text need not stop at its first end-of-sequence token (no decoder records that,
    # but the replays must still agree on it)
    eos = frozenset({0}) if (ended or inner_eos) else frozenset()
    chains = []
    for s in range(n):
        cap = budget - s - 1
        length = cap if max_drafts is None else min(cap, max_drafts)
        length = draw(st.integers(0, length)) if draw(st.integers(0, 9)) == 0 else length
        L = draw(st.integers(0, min(length, n - s)))
        tokens = list(text[s:s + L])
        while len(tokens) < length:
            tokens.append(7 if len(tokens) == L else draw(st.integers(0, 3)))
        if eos:
            cut = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            tokens = tokens[:cut]
        chains.append(tuple(DraftStep(t, q1, q1 / 2, 0.1) for t, q1 in
                            zip(tokens, draw(st.lists(Q1, min_size=len(tokens), max_size=len(tokens))))))
    return RecordedChains(tuple(text), tuple(chains), (0.0,) * n, budget, max_drafts, eos, ended)


def outcome(chains: RecordedChains, policy, fast: bool):
    """The replay's every reported field, or the error it raised."""
    try:
        r = replay(chains, policy, fast=fast)
    except ValueError as err:
        return ("error", str(err))
    return (r.tokens.tolist(), r.accepted, r.submitted, r.drafted, r.draft_tokens, r.target_forwards,
            r.drafter_forwards, r.ended_by_eos, r.policy, r.criterion, r.extra)


def state(policy) -> dict:
    return {k: v for k, v in vars(policy).items()}


def test_every_builtin_spec_takes_the_array_path():
    for spec in BUILTINS:
        assert is_builtin(parse_policy(spec)), spec
    for spec in ("certificate", "top1", "margin", "certificate:cal=kl"):
        assert not is_builtin(parse_policy(spec)), spec


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rec=recordings())
def test_array_replay_is_the_reference_replay_for_every_builtin(rec):
    for spec in BUILTINS:
        assert outcome(rec, spec, True) == outcome(rec, spec, False), spec


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(recordings(), min_size=1, max_size=4), spec=st.sampled_from(
    ["heuristic", "heuristic:5", "heuristic:2,0.4", "confidence:0.4", "constant:3"]))
def test_a_policy_object_carries_the_same_state_through_both_replays(recs, spec):
    """A policy object replayed over several recordings in turn (the heuristic's K carries over):
    the same results and the same state after each, whether a replay ends or raises."""
    fast, ref = parse_policy(spec), parse_policy(spec)
    for rec in recs:
        assert outcome(rec, fast, True) == outcome(rec, ref, False), spec
        assert state(fast) == state(ref), (spec, state(fast), state(ref))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rec=recordings(), c=st.sampled_from([0.0, 0.02, 0.05, 0.3, 1.0]),
       verify=st.sampled_from([(1.0,), (1.0, 1.4, 1.45), (1.0, 0.9, 1.7, 1.2),
                               (1.0,) + tuple(1.0 + 0.02 * k for k in range(1, 41))]))
def test_array_oracle_is_the_reference_programme_bit_for_bit(rec, c, verify):
    costs = CostModel(c=c, verify=verify)
    best, choice = _dp(rec, costs, fast=True)
    ref_best, ref_choice = _dp(rec, costs, fast=False)
    assert choice == ref_choice
    assert best == ref_best and all(type(x) is float for x in best)
    assert oracle_plan(rec, costs) == oracle_plan(rec, costs, fast=False)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(recordings(), min_size=1, max_size=5), c=st.sampled_from([0.0, 0.05, 0.3, 1.0]),
       verify=st.sampled_from([(1.0,), (1.0, 1.4, 1.45), (1.0, 0.9, 1.7, 1.2)]))
def test_the_oracle_of_many_recordings_at_once_is_each_one_s(recs, c, verify):
    """oracle_dp_many runs every recording's programme together: each one's costs and choices bit for bit,
    and oracle_results the results oracle_result gives one by one."""
    costs = CostModel(c=c, verify=verify)
    assert oracle_dp_many(recs, costs) == [_dp(rec, costs, fast=False) for rec in recs]
    for rec, got in zip(recs, oracle_results(recs, costs)):
        want = oracle_result(rec, costs, fast=False)
        assert (got.tokens.tolist(), got.accepted, got.submitted, got.drafted, got.draft_tokens, got.target_forwards,
                got.drafter_forwards, got.ended_by_eos, got.policy, got.extra) == \
               (want.tokens.tolist(), want.accepted, want.submitted, want.drafted, want.draft_tokens,
                want.target_forwards, want.drafter_forwards, want.ended_by_eos, want.policy, want.extra)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(recordings(), min_size=1, max_size=5), spec=st.sampled_from(["constant:2", "heuristic", "confidence:0.4"]),
       c=st.sampled_from([0.0, 0.05, 0.3]), verify=st.sampled_from([(1.0,), (1.0, 1.4, 1.45), (1.0, 0.9, 1.7, 1.2)]))
def test_prompt_costs_are_modelled_cost_times_tokens_bit_for_bit(recs, spec, c, verify):
    from companion.speculative import modelled_cost
    from companion.speculative.grid import prompt_costs

    costs = CostModel(c=c, verify=verify)
    runs = []
    for rec in recs:
        try:
            runs.append(replay(rec, spec))
        except ValueError:
            pass
    want = [modelled_cost(r, costs) * len(r.tokens) for r in runs]
    got = prompt_costs(runs, costs).tolist()
    assert [("nan" if math.isnan(x) else x) for x in got] == [("nan" if math.isnan(x) else x) for x in want]


def test_the_arrays_are_not_part_of_a_recording_s_identity():
    """The cached arrays change neither equality nor the printed form of a recording."""
    step = DraftStep(1, 0.5, 0.25, 0.1)
    a = RecordedChains((1, 1), ((step,), ()), (0.0, 0.0), 2)
    b = RecordedChains((1, 1), ((step,), ()), (0.0, 0.0), 2)
    replay(a, "constant:1")
    assert a._arrays is not None and b._arrays is None
    assert a == b and repr(a) == repr(b) and hash(a) == hash(b)
    assert not math.isnan(a.mean_matched)


@pytest.mark.parametrize("make", [lambda: Constant(2), lambda: Heuristic(), lambda: Confidence(0.4)])
def test_a_subclass_of_a_builtin_goes_through_the_reference(make):
    """A user subclass may change any call: it is driven call by call, and its override is seen."""
    base = type(make())

    class Shy(base):  # type: ignore[misc, valid-type]
        def submit(self, n_drafted: int) -> int:
            return 0

    pol = Shy(**{f: getattr(make(), f) for f in ("k", "threshold", "k0") if hasattr(make(), f)})
    assert not is_builtin(pol)
    step = DraftStep(1, 0.9, 0.05, 0.1)
    rec = RecordedChains((1, 1, 1), ((step, step), (step,), ()), (0.0,) * 3, 3)
    assert replay(rec, pol).submitted == [0, 0, 0]
    assert replay(rec, make()).submitted == replay(rec, make(), fast=False).submitted == [2]


# -- the drafter rows: top entries in float64, the tail in float32 ------------------------------------
@pytest.mark.parametrize("scale", [0.5, 3.0, 20.0])
def test_steps_read_the_float64_softmax_up_to_the_float32_tail(scale):
    """_steps against the decoder's float64 softmax over the whole row (_steps_float64): the same tokens,
    and q(1), q(2), the certificate equal up to the tail's float32 rounding. Bound: each tail term and the
    cascade sum carry a few float32 epsilons (6e-8) relative, and the tail is at most the whole of S, so
    2e-6 relative on q(i) (measured: 1e-7 on flat rows, 1e-8 where q(1) > 0.9); the certificate is a
    smooth function of both, checked at 1e-5."""
    import torch

    from companion.speculative.replay import _steps, _steps_float64

    gen = torch.Generator().manual_seed(int(scale * 10))
    x = torch.randn(64, 151936, generator=gen) * scale
    x[:, 7] += torch.linspace(0.0, 25.0, 64)          # from flat rows to confident ones
    x[3, 11] = x[3].max()                             # an exact tie of the two largest logits
    x[5, :1000] = -math.inf                           # masked entries
    got, tokens = _steps(x)
    want, want_tokens = _steps_float64(x)
    assert torch.equal(tokens, want_tokens) and tokens.tolist() == [s.token for s in got]
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.token == b.token, i
        assert a.q1 == pytest.approx(b.q1, rel=2e-6) and a.q2 == pytest.approx(b.q2, rel=2e-6), (i, a, b)
        assert a.rho == pytest.approx(b.rho, rel=1e-5, abs=1e-12), (i, a, b)
        assert 0.0 <= a.q2 <= a.q1 <= 1.0
    assert got[3].q1 == got[3].q2 and got[3].rho == 0.0 == want[3].rho


def test_steps_on_a_small_vocabulary_are_the_float64_softmax():
    """With fewer entries than the float64 head there is no float32 tail: q(1), q(2) to float64 rounding."""
    import torch

    from companion.speculative.replay import _steps, _steps_float64

    x = torch.tensor([[0.5, 2.0, -1.0], [3.0, 3.0, 0.0], [1.0, -2.0, 0.25]])
    got, _ = _steps(x)
    want, _ = _steps_float64(x)
    for a, b in zip(got, want):
        assert a.token == b.token
        assert a.q1 == pytest.approx(b.q1, rel=1e-15) and a.q2 == pytest.approx(b.q2, rel=1e-15)
