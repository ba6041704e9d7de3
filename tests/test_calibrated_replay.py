"""The calibrated rule replayed on many recordings at once (companion.speculative.calibrated_replay and
calibrated_plan) against the reference replay, which drives a policy object call by call.

Oracle: for each policy, ``for ch in warm_on: replay(ch, warm)`` then ``replay(ch, warm.fresh())``
on every evaluated recording, as the comparison does. The batched replay must make the same rounds
(tokens, drafts made, submitted and accepted, draft tokens, end) for every row, or decline (return
``None``) exactly where a reference replay raises. Recordings are random: texts with and without an
end-of-sequence token, chains cut by ``max_drafts``, scores and KLs from flat to confident, ties;
policies over every score, both calibrations and knobs that move each branch (exploration, few
bins, a first draft cheaper than plain decoding, drafting that never pays).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from companion.speculative import CostModel, DraftStep, RecordedChains, parse_policy, replay
from companion.speculative.calibrated_plan import optimal_rates
from companion.speculative.calibrated_replay import replay_warmed, replayable
from companion.speculative.compare import CALIBRATED
from companion.speculative.policies import greedy_rho

SPECS = list(CALIBRATED) + [
    "top1:cal=kl", "margin:cal=kl",
    "certificate:kmax=4,explore=2", "top1:bins=4,n0=1.5,prior=0.3", "margin:explore=0,kmax=6",
    "certificate:c=0,v1=0.3,dv=0", "top1:c=3", "certificate:cal=kl,n0=0.5,prior=1,kmax=3",
    "margin:c=0.01,v1=1,dv=0,bins=32", "certificate:dv=0.3,prior=0",
]


def random_recording(rng: np.random.Generator, cut: bool = True) -> RecordedChains:
    """A text of ids 1..4 (0: end of sequence) and per position a chain agreeing with it for a random
    ``L_s`` drafts; ``q(1)``, ``q(2)``, the certificate and the KLs drawn from flat to confident.
    ``cut``: chains may be cut short (by ``max_drafts`` or at random), where long drafts raise."""
    budget = int(rng.integers(2, 40))
    ended = rng.random() < 0.3
    n = int(rng.integers(1, budget)) if ended else budget
    text = rng.integers(1, 5, n).tolist()
    if ended:
        text[-1] = 0
    eos = frozenset({0}) if ended or rng.random() < 0.3 else frozenset()
    max_drafts = None if not cut or rng.random() < 0.7 else int(rng.integers(1, 8))
    chains = []
    for s in range(n):
        cap = budget - s - 1
        length = cap if max_drafts is None else min(cap, max_drafts)
        if cut and rng.random() < 0.1:
            length = int(rng.integers(0, length + 1))
        agree = int(rng.integers(0, min(length, n - s) + 1)) if rng.random() < 0.5 else min(length, n - s)
        tokens = list(text[s:s + agree])
        while len(tokens) < length:
            tokens.append(7 if len(tokens) == agree else int(rng.integers(0, 5)))
        if eos:
            end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
            tokens = tokens[:end]
        steps = []
        for t in tokens:
            q1 = float(rng.choice([rng.random() ** 0.3, 0.5, 1.0, rng.random()]))
            q2 = float(rng.random() * min(q1, 1.0 - q1))
            rho = greedy_rho(q1, q2) if rng.random() < 0.8 else float(rng.choice([math.inf, 0.0, rng.exponential()]))
            steps.append(DraftStep(t, q1, q2, rho))
        chains.append(tuple(steps))
    kl = tuple(float(x) for x in np.where(rng.random(n) < 0.2, 0.0, rng.exponential(0.4, n)))
    return RecordedChains(tuple(text), tuple(chains), kl, budget, max_drafts, eos, ended)


def rounds(r) -> tuple:
    return (r.tokens.tolist(), r.accepted, r.submitted, r.drafted, r.draft_tokens, r.target_forwards,
            r.drafter_forwards, r.ended_by_eos, r.policy, r.criterion, r.extra)


def reference(spec: str, warm_on: list[RecordedChains], evals: list[RecordedChains]) -> list[tuple] | None:
    """The comparison's protocol call by call; ``None`` where a replay raises."""
    warm = parse_policy(spec)
    try:
        for ch in warm_on:
            replay(ch, warm)
        return [rounds(replay(ch, warm.fresh())) for ch in evals]
    except ValueError:
        return None


@pytest.mark.parametrize("seed", range(12))
def test_batched_replay_is_the_reference_replay(seed):
    """Every third seed cuts chains short, where some replays raise: those rows make the batched replay
    decline, and without them it agrees on the rest."""
    rng = np.random.default_rng(seed)
    recs = [random_recording(rng, cut=seed % 3 == 0) for _ in range(9)]
    evals, calib = recs[:6], recs[6:]
    warm_on = [calib if i % 3 else calib[:1] if i % 2 else [] for i in range(len(SPECS))]
    want = [reference(spec, w, evals) for spec, w in zip(SPECS, warm_on)]
    keep = [i for i, w in enumerate(want) if w is not None]
    if len(keep) < len(SPECS):
        assert replay_warmed([parse_policy(spec) for spec in SPECS], warm_on, evals) is None
    if not keep:
        return
    got = replay_warmed([parse_policy(SPECS[i]) for i in keep], [warm_on[i] for i in keep], evals)
    assert got is not None
    for i, g in zip(keep, got):
        assert [rounds(r) for r in g] == want[i], SPECS[i]


def test_long_warm_ups_and_many_refreshes():
    """Longer texts: hundreds of refreshes per row, the rate's guess and slope carried from one to the next."""
    rng = np.random.default_rng(99)
    recs = []
    while len(recs) < 8:
        rec = random_recording(rng, cut=False)
        if len(rec.tokens) >= 30:
            recs.append(rec)
    specs = list(CALIBRATED) + ["top1:c=0.02,v1=1,dv=0", "margin:c=0.5,v1=1.4,dv=0.05"]
    got = replay_warmed([parse_policy(s) for s in specs], [recs[4:]] * len(specs), recs[:4])
    assert got is not None
    for spec, g in zip(specs, got):
        assert [rounds(r) for r in g] == reference(spec, recs[4:], recs[:4]), spec


def test_only_fresh_plain_calibrated_policies_are_replayed_at_once():
    rng = np.random.default_rng(3)
    rec = random_recording(rng)
    assert replayable(parse_policy("certificate"))
    assert not replayable(parse_policy("certificate:window=50"))
    assert not replayable(parse_policy("confidence:0.4"))
    used = parse_policy("top1")
    replay(rec, used)
    assert not replayable(used)
    assert replay_warmed([used], [[]], [rec]) is None
    assert replay_warmed([parse_policy("top1")], [[]], []) is None
    # the batched replay leaves the policies it was given as they were
    fresh = parse_policy("margin")
    replay_warmed([fresh], [[rec]], [rec])
    assert replayable(fresh) and fresh.scores == []


@pytest.mark.parametrize("seed", range(3))
def test_the_rate_is_the_bisection_s_for_any_guess(seed):
    """optimal_rates against policies.optimal_rate on random laws, with guesses near and far from the
    root and no guess: the same lower end and tables, bit for bit."""
    from companion.speculative.calibrated_plan import expectation_ops
    from companion.speculative.policies import _expectation, optimal_rate

    rng = np.random.default_rng(seed)
    rows = 60
    kk = np.zeros((rows, 2, 12), dtype=np.intp)
    w = np.zeros((rows, 2, 12))
    n = rng.integers(1, 13, (rows, 2))
    for r in range(rows):
        for c in range(2):
            kk[r, c, :n[r, c]] = np.sort(rng.choice(65, n[r, c], replace=False))
            raw = rng.random(n[r, c])
            w[r, c, :n[r, c]] = raw / raw.sum()
    a, m = expectation_ops(kk, w, n)
    kmax = 7
    c_knob = rng.choice([0.0, 0.05, 0.3, 2.0], rows)
    v1 = rng.choice([0.4, 1.0, 1.5], rows)
    dv = rng.choice([0.0, 0.02], rows)
    steps = np.array([[c_knob[r] + (v1[r] + dv[r] * i) - (1.0 if i == 0 else v1[r] + dv[r] * (i - 1))
                       for i in range(kmax)] for r in range(rows)])
    guess = np.where(rng.random(rows) < 0.2, np.nan, rng.uniform(1, kmax + 1, rows))
    lam, tables, _ = optimal_rates(a, m, steps, guess, np.full(rows, np.nan))
    for r in range(rows):
        laws = [(kk[r, c, :n[r, c]] / 64, w[r, c, :n[r, c]]) for c in range(2)]
        a_ref, m_ref = _expectation(laws[0])
        # a round's first draft: only its S = 1 row is made (the only point of W_0 the rule reads)
        assert a[r, 0, -1] == a_ref[-1] and np.array_equal(m[r, 0, -1], m_ref[-1])
        assert all(np.array_equal(x, y) for x, y in zip(_expectation(laws[1]), (a[r, 1], m[r, 1])))

        def verify(k: int, r: int = r) -> float:
            return 1.0 if k <= 0 else v1[r] + dv[r] * (k - 1)

        want, want_tables = optimal_rate(laws, c_knob[r], verify, kmax, tol=1e-3,
                                         guess=None if np.isnan(guess[r]) else guess[r])
        assert lam[r] == want
        assert tables[r, 0, -1] == want_tables[0][-1]
        assert all(np.array_equal(tables[r, i], want_tables[i]) for i in range(1, kmax + 1))


def test_the_comparison_uses_the_batched_replay_and_agrees_with_call_by_call():
    from companion.speculative.replay import replay_comparison

    rng = np.random.default_rng(5)
    recs = [random_recording(rng, cut=False) for _ in range(5)]
    costs = CostModel(c=0.1, verify=(1.0, 1.3, 1.35))
    fast = replay_comparison(recs[:3], recs[3:], costs, builtins=["constant:0", "constant:2"])
    slow = replay_comparison(recs[:3], recs[3:], costs, builtins=["constant:0", "constant:2"], fast=False)
    assert fast.policies == slow.policies
    for name in fast.policies:
        assert [rounds(r) for r in fast.results[name]] == [rounds(r) for r in slow.results[name]], name
        assert np.array_equal(fast.prompt_costs(name), slow.prompt_costs(name)), name


def test_the_pooled_rates_are_policies_pava_bit_for_bit():
    from companion.speculative.calibrated_plan import _pava
    from companion.speculative.policies import pava

    rng = np.random.default_rng(0)
    for _ in range(2000):
        k = int(rng.integers(1, 20))
        values = (rng.random(k) if rng.random() < 0.5 else np.round(rng.random(k) * 4) / 4).tolist()
        weights = (rng.integers(1, 40, k) + rng.choice([0.0, 4.0, 0.5], k)).tolist()
        assert _pava(values, weights) == pava(values, weights)
