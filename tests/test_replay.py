"""Recorded chains, replayed policies and the oracle limit.

Oracles: live decoding (:func:`generate`) round for round for the replay; the drafter's own
greedy decoding (``drafter.generate``) for every recorded chain; enumeration of every way to
cut a text into rounds for the dynamic programme; and live decoding under a scripted policy that
follows the oracle's plan, which must reach the oracle's cost.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from companion.speculative import (
    CALIBRATED,
    ChainsTooShort,
    ORACLE,
    CostModel,
    DraftStep,
    GridRow,
    Policy,
    RecordedChains,
    RoundOutcome,
    generate,
    modelled_cost,
    oracle_cost,
    oracle_plan,
    oracle_result,
    parse_policy,
    record_chains,
    fits,
    record_many,
    replay,
    replay_comparison,
    replay_grid,
    submit_replay_grid,
)

from tests.pair_prompts import chat_prompts, code_prompts

N_NEW = 24
LOSSLESS = ["constant:0", "constant:1", "constant:4", "constant:8", "heuristic", "heuristic:5", "heuristic:20,0.4",
            "heuristic:5,0.4", "confidence:0.4", "confidence:0.7,6", "confidence:0.2"]


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    from companion.models.loading import load_pair
    target, drafter, tok = load_pair("default")
    # source code first (long texts, cut at N_NEW), then a chat request (its answer ends with EOS)
    texts = code_prompts(3) + chat_prompts(1)
    ids = [tok(t, return_tensors="pt", add_special_tokens=False).input_ids for t in texts]
    recs = [record_chains(target, drafter, x, max_new_tokens=N_NEW) for x in ids]
    return target, drafter, ids, recs


def same_rounds(live, rep) -> str:
    """'' when the two runs agree in every field generate reports, else what differs."""
    diffs = [name for name, a, b in (
        ("tokens", live.tokens.tolist(), rep.tokens.tolist()), ("accepted", live.accepted, rep.accepted),
        ("submitted", live.submitted, rep.submitted), ("drafted", live.drafted, rep.drafted),
        ("draft_tokens", live.draft_tokens, rep.draft_tokens),
        ("forwards", (live.target_forwards, live.drafter_forwards), (rep.target_forwards, rep.drafter_forwards)),
        ("ended_by_eos", live.ended_by_eos, rep.ended_by_eos), ("policy", live.policy, rep.policy)) if a != b]
    return ", ".join(f"{d}: live {getattr(live, d, None)} vs replay {getattr(rep, d, None)}" for d in diffs)


# -- the recording ---------------------------------------------------------------------------------
def test_recorded_text_and_chains_are_the_models_greedy_decodings(pair):
    target, drafter, ids, recs = pair
    assert any(r.ended_by_eos for r in recs) and any(not r.ended_by_eos for r in recs), \
        f"the prompts should cover both endings: {[len(r.tokens) for r in recs]}"
    with torch.inference_mode():
        for x, rec in zip(ids, recs):
            ref = target.generate(x, do_sample=False, max_new_tokens=N_NEW)[0, x.shape[1]:].tolist()
            assert list(rec.tokens) == ref, (rec.tokens, ref)
            assert rec.disagreements == (), f"teacher-forced target disagrees with its greedy text at {rec.disagreements}"
            for s in range(0, len(rec.tokens), 3):
                ctx = torch.cat([x, torch.tensor([rec.tokens[:s]], dtype=torch.long)], 1)
                want = rec.cap(s)
                chain = [d.token for d in rec.chains[s]]
                if want == 0:
                    assert chain == []
                    continue
                greedy = drafter.generate(ctx, attention_mask=torch.ones_like(ctx), do_sample=False,
                                          max_new_tokens=want, min_new_tokens=want, eos_token_id=None,
                                          pad_token_id=0)[0, ctx.shape[1]:].tolist()
                eos = drafter.generation_config.eos_token_id
                eos = set(eos if isinstance(eos, list) else [] if eos is None else [eos]) | set(rec.eos_token_ids)
                cut = next((i + 1 for i, t in enumerate(greedy) if t in eos), len(greedy))
                assert chain == greedy[:cut], f"position {s}: chain {chain} vs drafter's greedy {greedy[:cut]}"
                L = next((i for i, (d, t) in enumerate(zip(chain, rec.tokens[s:])) if d != t),
                         min(len(chain), len(rec.tokens) - s))
                assert rec.matched[s] == L, (s, rec.matched[s], L)
                # what the policies read is the drafter's distribution at that draft
                for d in rec.chains[s][:2]:
                    assert 0 <= d.q2 <= d.q1 <= 1 and d.rho >= 0


def test_max_drafts_cuts_the_chains_and_replay_refuses_to_guess(pair):
    target, drafter, ids, recs = pair
    short = record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, max_drafts=3)
    full = recs[0]
    assert short.tokens == full.tokens
    for s, (a, b) in enumerate(zip(short.chains, full.chains)):
        assert a == b[:3], f"position {s}"
    assert short.matched == tuple(min(m, len(c)) for m, c in zip(full.matched, short.chains))
    for spec in ("constant:3", "confidence:0.5,3"):
        assert not same_rounds(replay(full, spec), replay(short, spec)), spec
    with pytest.raises(ValueError, match="max_drafts = 3"):
        replay(short, "constant:4")


def test_capped_recording_fits_every_replay_and_equals_the_uncapped_one(pair):
    """The chapter's recording (record_many with max_drafts and enough=fits) against the uncapped one (the
    old path, every chain to the answer's end): the same text, KLs and verdicts, every chain a prefix of
    the uncapped chain, equal DraftStep for DraftStep (bit for bit: the capped extension runs the first
    forwards of the uncapped one, same batches, same cache), and every policy asked about replays to the
    same rounds. A prompt whose chains a policy outgrows is recorded again with twice the cap, or to the end."""
    target, drafter, ids, recs = pair
    texts = [list(r.tokens) for r in recs]

    def check(policies, cap, want_caps):
        asked = []
        capped = record_many(target, drafter, ids, max_new_tokens=N_NEW, max_drafts=cap, texts=texts,
                             enough=lambda ch: asked.append(ch.max_drafts) or fits(ch, policies))
        assert {c.max_drafts for c in capped} == want_caps, [c.max_drafts for c in capped]
        for i, (c, full) in enumerate(zip(capped, recs)):
            assert (c.tokens, c.kl, c.disagreements, c.ended_by_eos) == (full.tokens, full.kl, full.disagreements,
                                                                       full.ended_by_eos)
            for s, (a, b) in enumerate(zip(c.chains, full.chains)):
                assert a == b[:len(a)] and len(a) == min(len(b), c.max_drafts or len(b)), f"prompt {i}, position {s}"
            for spec in policies:
                assert not same_rounds(replay(full, spec), replay(c, spec)), f"prompt {i}, {spec}"
        return asked

    # chains of 3 are too short for 6 drafts: every prompt recorded again at 6, where both fit
    asked = check(["constant:4", "confidence:0.4,6"], 3, {6})
    assert asked.count(3) == len(ids) and asked.count(6) == len(ids), asked
    # transformers' heuristic starts at 20 drafts: past half the budget of 24 the chains go to the end (the
    # chat answer ends after a few tokens, where 6 drafts already reach its end)
    check(["constant:2", "heuristic"], 3, {6, None})
    # a cap that fits is kept, and nothing is recorded twice
    asked = check(["constant:2", "confidence:0.5,3"], 3, {3})
    assert asked == [3] * len(ids)
    short = record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, max_drafts=3)
    assert fits(short, ["constant:3"]) and not fits(short, ["constant:3", "constant:4"])
    with pytest.raises(ChainsTooShort, match="max_drafts = 3"):
        replay(short, "constant:4")


def test_a_given_text_records_what_decoding_it_records(pair):
    """record_chains(text=...) skips the one-token decoding and records the same chains, KLs and
    verdicts; inspect sees both models' teacher-forced rows, whose target argmax is the text."""
    target, drafter, ids, recs = pair
    for x, rec in zip(ids, recs):
        seen = {}
        given = record_chains(target, drafter, x, max_new_tokens=N_NEW, text=list(rec.tokens),
                              inspect=lambda p, q: seen.update(p=p, q=q))
        assert given == rec
        assert seen["p"].shape == seen["q"].shape == (len(rec.tokens), target.get_output_embeddings().weight.shape[0])
        assert seen["p"].argmax(-1).tolist() == list(rec.tokens)
        again = record_chains(target, drafter, x, max_new_tokens=N_NEW, text=torch.tensor(rec.tokens))
        assert again == rec


def test_record_many_in_two_threads_records_what_one_records(pair):
    """record_many in two threads: the recordings of one-by-one record_chains, in the prompts' order,
    each prompt's inspect rows under its own index (the threads finish in any order); a decoded
    prompt (texts None) beside given texts; bad thread counts and text lists refused in one line."""
    target, drafter, ids, recs = pair
    texts = [list(r.tokens) for r in recs]
    texts[1] = None   # decoded, not given
    seen: dict[int, tuple] = {}
    got = record_many(target, drafter, ids, max_new_tokens=N_NEW, texts=texts, threads=2,
                      inspect=lambda i, p, q: seen.__setitem__(i, (p.argmax(-1).tolist(), q.shape)))
    assert got == recs
    assert sorted(seen) == list(range(len(ids)))
    for i, rec in enumerate(recs):
        assert seen[i][0] == list(rec.tokens), i
        assert seen[i][1][0] == len(rec.tokens), i
    assert record_many(target, drafter, ids[:2], max_new_tokens=N_NEW, threads=1) == recs[:2]
    assert record_many(target, drafter, [], max_new_tokens=N_NEW, threads=2) == []
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            record_many(target, drafter, ids, max_new_tokens=N_NEW, threads=bad)
    with pytest.raises(ValueError, match="texts has 1 entries for 4 prompts"):
        record_many(target, drafter, ids, max_new_tokens=N_NEW, texts=[None])


def test_record_many_passes_a_thread_s_failure_on(pair):
    """A prompt that fails in a worker thread raises its own error in the caller, and the prompts
    queued behind it are not started."""
    target, drafter, ids, recs = pair
    started = []

    def look(i, p, q):
        started.append(i)
        if i == 0:
            raise RuntimeError("inspect failed on prompt 0")

    many = ids[:1] * 40
    with pytest.raises(RuntimeError, match="inspect failed on prompt 0"):
        record_many(target, drafter, many, max_new_tokens=N_NEW, inspect=look, threads=2)
    assert len(started) < len(many), started


def test_a_given_text_that_is_not_greedy_is_flagged_and_bad_texts_are_refused(pair):
    target, drafter, ids, recs = pair
    rec = recs[0]
    assert not rec.ended_by_eos
    wrong = list(rec.tokens)
    wrong[5] = (wrong[5] + 1) % 50   # another ordinary token: the target did not pick it
    flagged = record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, text=wrong)
    assert 5 in flagged.disagreements, flagged.disagreements
    eos = int(target.generation_config.eos_token_id if isinstance(target.generation_config.eos_token_id, int)
              else target.generation_config.eos_token_id[0])
    cases = {
        "more than max_new_tokens": list(rec.tokens) + [1],
        "before its end": [eos] + list(rec.tokens[1:]),
        "does not end with an end-of-sequence token": list(rec.tokens[:-1]),
        "outside the vocabulary": list(rec.tokens[:-1]) + [10**9],
        "text must be token ids": "hello",
        "text must be integer token ids": torch.zeros(N_NEW),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=message) as err:
            record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, text=bad)
        assert "\n" not in str(err.value)


# -- replay against live decoding ----------------------------------------------------------------
@pytest.mark.parametrize("policy", LOSSLESS + list(CALIBRATED))
def test_replay_is_live_decoding_round_for_round(pair, policy):
    target, drafter, ids, recs = pair
    for i, (x, rec) in enumerate(zip(ids, recs)):
        live = generate(target, drafter, x, policy=policy, max_new_tokens=N_NEW)
        rep = replay(rec, policy)
        diff = same_rounds(live, rep)
        assert not diff, f"{policy} on prompt {i}: {diff}"
        assert modelled_cost(rep, CostModel(c=0.3, verify=(1.0, 1.4, 1.45))) == pytest.approx(
            modelled_cost(live, CostModel(c=0.3, verify=(1.0, 1.4, 1.45))), rel=1e-15)


def test_array_replay_of_every_builtin_is_the_reference_on_the_recordings(pair):
    """replay's array path (the default for transformers' built-ins) against fast=False, which drives the
    policy call by call, on the pair's recordings and on one cut by max_drafts = 3 (where long drafts raise):
    every grid built-in gives the same rounds or the same error, and a heuristic object is left with the same
    K after each prompt."""
    from companion.speculative.replay import grid_builtins

    target, drafter, ids, recs = pair
    short = record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, max_drafts=3)

    def outcome(rec, spec, fast):
        try:
            r = replay(rec, spec, fast=fast)
        except ValueError as err:
            return str(err)
        return (r.tokens.tolist(), r.accepted, r.submitted, r.drafted, r.draft_tokens, r.target_forwards,
                r.drafter_forwards, r.ended_by_eos, r.policy)

    raised = 0
    for spec in grid_builtins() + LOSSLESS:
        for i, rec in enumerate(recs + [short]):
            want = outcome(rec, spec, False)
            assert outcome(rec, spec, True) == want, f"{spec} on recording {i}"
            raised += isinstance(want, str)
    assert raised > 0, "the max_drafts = 3 recording should make long drafts raise"
    fast, ref = parse_policy("heuristic:5"), parse_policy("heuristic:5")
    for rec in recs:
        assert not same_rounds(replay(rec, fast), replay(rec, ref, fast=False))
        assert fast.k == ref.k


@pytest.mark.parametrize("policy", ["certificate", "top1", "certificate:cal=kl", "heuristic"])
def test_policy_state_carries_over_as_in_live_decoding(pair, policy):
    """A Policy object warmed on other prompts (the comparison's calibration) replays as it decodes."""
    target, drafter, ids, recs = pair
    knobs = {"c": 0.1, "v1": 1.0, "dv": 0.0}
    warm_live = parse_policy(policy, **knobs)
    warm_rep = parse_policy(policy, **knobs)
    for x, rec in zip(ids[1:], recs[1:]):
        a = generate(target, drafter, x, policy=warm_live, max_new_tokens=N_NEW)
        b = replay(rec, warm_rep)
        assert not same_rounds(a, b), f"{policy} while warming: {same_rounds(a, b)}"
    live = generate(target, drafter, ids[0], policy=warm_live.fresh(), max_new_tokens=N_NEW)
    rep = replay(recs[0], warm_rep.fresh())
    assert not same_rounds(live, rep), f"{policy} after warming: {same_rounds(live, rep)}"


def test_replay_with_an_end_of_sequence_inside_the_text(pair):
    target, drafter, ids, recs = pair
    eos = recs[0].tokens[10]
    rec = record_chains(target, drafter, ids[0], max_new_tokens=N_NEW, eos_token_id=eos)
    assert rec.ended_by_eos and rec.tokens == recs[0].tokens[:recs[0].tokens.index(eos) + 1]
    for spec in ("constant:3", "heuristic", "confidence:0.4", "certificate"):
        live = generate(target, drafter, ids[0], policy=spec, max_new_tokens=N_NEW, eos_token_id=eos)
        assert live.ended_by_eos
        assert not same_rounds(live, replay(rec, spec)), spec


# -- the oracle ------------------------------------------------------------------------------------
def random_chains(rng: np.random.Generator, n_max: int, kmax: int) -> RecordedChains:
    """A text of small ids (0 is the end-of-sequence token) and chains whose first L_s drafts match it."""
    budget = int(rng.integers(1, n_max + 1))
    ended = bool(rng.integers(0, 2)) and budget > 1
    n = int(rng.integers(1, budget)) if ended else budget
    text = [int(t) for t in rng.integers(1, 4, size=n)]
    if ended:
        text[-1] = 0
    chains = []
    for s in range(n):
        length = min(budget - s - 1, kmax)
        L = int(rng.integers(0, min(length, n - s) + 1))
        chain = list(text[s:s + L])
        if not (chain and chain[-1] == 0):
            while len(chain) < length:
                chain.append(7 if len(chain) == L else int(rng.integers(1, 4)))
        chains.append(tuple(DraftStep(t, 0.5, 0.25, 0.1) for t in chain))
    return RecordedChains(tuple(text), tuple(chains), (0.0,) * n, budget, None, frozenset({0}), ended)


def brute_force(rec: RecordedChains, costs: CostModel) -> float:
    """Least total cost over every way to cut the text into rounds, each round priced at its cheapest draft count."""
    n = len(rec.tokens)
    best = math.inf
    for cuts in itertools.product((False, True), repeat=n - 1):
        starts = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [n]
        total = 0.0
        for s, nxt in zip(starts, starts[1:]):
            # k submitted drafts emit the min(k, L_s) accepted ones and the target's token, unless the accepted
            # drafts end the text (then the text's end-of-sequence token was the last accepted draft)
            fits = [costs.verify_cost(k) + costs.c * k for k in range(len(rec.chains[s]) + 1)
                    if min(s + min(k, rec.matched[s]) + 1, n) == nxt]
            if not fits:
                total = math.inf
                break
            total += min(fits)
        best = min(best, total)
    return best / n


@pytest.mark.parametrize("seed", range(40))
def test_oracle_is_the_least_cost_over_every_way_to_cut_the_text(seed):
    rng = np.random.default_rng(seed)
    rec = random_chains(rng, n_max=11, kmax=int(rng.integers(1, 6)))
    # affine V as measured, and an arbitrary non-monotone table (submitting past L_s can then pay)
    verify = (1.0,) + tuple(float(v) for v in rng.uniform(0.8, 2.0, size=6)) if seed % 2 else \
        (1.0,) + tuple(1.0 + float(rng.uniform(0, 0.5)) + 0.05 * k for k in range(6))
    costs = CostModel(c=float(rng.uniform(0.0, 1.0)), verify=verify)
    want = brute_force(rec, costs)
    got = oracle_cost(rec, costs)
    assert got == pytest.approx(want, rel=1e-12), f"seed {seed}: dynamic programme {got} vs enumeration {want}"
    plan_rounds = oracle_result(rec, costs)
    assert modelled_cost(plan_rounds, costs) == pytest.approx(got, rel=1e-12)
    assert plan_rounds.tokens.tolist() == list(rec.tokens)


class Scripted(Policy):
    """Draft and submit ``plan[r]`` tokens in round ``r``: a policy that knows the future."""

    def __init__(self, plan: list[int]) -> None:
        self.plan, self.round = list(plan), 0

    def wants_draft(self, n_drafted: int) -> bool:
        return n_drafted < self.plan[self.round]

    def end_round(self, outcome: RoundOutcome) -> None:
        self.round += 1

    def __str__(self) -> str:
        return "scripted"


@pytest.mark.parametrize("costs", [CostModel(c=0.05, verify=(1.0,)), CostModel(c=0.36, verify=(1.0, 1.4, 1.45)),
                                   CostModel(c=0.2, verify=(1.0, 1.02, 1.04))], ids=["gpu", "cpu", "gentle"])
def test_live_decoding_reaches_the_oracle_and_no_policy_beats_it(pair, costs):
    target, drafter, ids, recs = pair
    for i, (x, rec) in enumerate(zip(ids, recs)):
        limit = oracle_cost(rec, costs)
        plan = oracle_plan(rec, costs)
        live = generate(target, drafter, x, policy=Scripted(plan), max_new_tokens=N_NEW)
        assert live.submitted == plan and live.accepted == [min(k, rec.matched[s]) for k, s in
                                                             zip(plan, np.cumsum([0] + [a + 1 for a in live.accepted])[:-1])]
        assert modelled_cost(live, costs) == pytest.approx(limit, rel=1e-12), f"prompt {i}"
        for spec in LOSSLESS + ["certificate", "top1"]:
            cost = modelled_cost(replay(rec, spec), costs)
            assert cost >= limit - 1e-12, f"{spec} on prompt {i} costs {cost} below the oracle's {limit}"


def test_recorded_chains_refuse_inconsistent_data():
    step = DraftStep(1, 0.5, 0.2, 0.1)
    with pytest.raises(ValueError, match="one chain and one KL per text position"):
        RecordedChains((1, 2), ((step,),), (0.0, 0.0), 2)
    with pytest.raises(ValueError, match="drafts at most 0"):
        RecordedChains((1,), ((step,),), (0.0,), 1)
    with pytest.raises(ValueError, match="without an end-of-sequence token"):
        RecordedChains((1,), ((),), (0.0,), 3)


# -- the comparison from recordings and the cost-model grid ------------------------------------------
def test_replayed_comparison_is_the_live_comparison(pair):
    from companion.speculative import compare_policies

    target, drafter, ids, _ = pair
    evals, calib = ids[:2], ids[2:3]
    costs = CostModel(c=0.3, verify=(1.0,) + tuple(1.2 + 0.05 * (k - 1) for k in range(1, 41)))
    builtins = ["constant:0", "constant:2", "confidence:0.4", "heuristic"]
    live = compare_policies(target, drafter, evals, calib, max_new_tokens=12, builtins=builtins, costs=costs)
    recs = [record_chains(target, drafter, x, max_new_tokens=12) for x in ids[:3]]
    rep = replay_comparison(recs[:2], recs[2:], costs, builtins=builtins)
    assert rep.lossless, rep.lossless_failures
    assert [p for p in rep.policies if p != ORACLE] == live.policies
    for name in live.policies:
        for i, (a, b) in enumerate(zip(live.results[name], rep.results[name])):
            assert not same_rounds(a, b), f"{name} on prompt {i}: {same_rounds(a, b)}"
        assert rep.summary(name).cost_per_token == pytest.approx(live.summary(name).cost_per_token, rel=1e-12)
        assert rep.summary(name).cost_per_token >= rep.summary(ORACLE).cost_per_token - 1e-12


def test_grid_rows_price_every_policy_against_the_oracle(pair):
    _, _, _, recs = pair
    grid = [("flat", CostModel(c=0.05, verify=(1.0,))), ("cpu", CostModel(c=0.36, verify=(1.0, 1.4, 1.45)))]
    builtins = ["constant:0", "constant:2", "constant:5", "confidence:0.4", "heuristic"]
    rows = replay_grid(recs[:3], recs[3:], grid, builtins=builtins, calibrated=["certificate", "top1"], n_boot=200)
    assert [(r.shape, r.c) for r in rows] == [("flat", 0.05), ("cpu", 0.36)]
    for row, (_, costs) in zip(rows, grid):
        cmp = replay_comparison(recs[:3], recs[3:], costs, builtins=builtins, calibrated=["certificate", "top1"],
                                cold=False)
        tokens = sum(len(r.tokens) for r in cmp.results["constant:0"])
        # not an iterative oracle: the same float64 programme and sums in another order, so 1e-12 is a
        # reassociation tolerance (a few hundred terms), not a solver's
        limit = sum(oracle_cost(ch, costs) * len(ch.tokens) for ch in recs[:3]) / tokens
        assert row.oracle_cost == pytest.approx(limit, rel=1e-12)
        for p, cost in row.costs.items():
            assert cost == pytest.approx(cmp.summary(p).cost_per_token, rel=1e-12)
            assert row.to_oracle[p] == pytest.approx(cost / limit, rel=1e-12) and row.to_oracle[p] >= 1 - 1e-12, p
        consts = ["constant:0", "constant:2", "constant:5"]
        assert row.best_constant == min(consts, key=lambda p: row.costs[p])
        assert row.best_policy == min(row.costs, key=row.costs.get)
        assert row.gap_closed[row.best_constant] == 0.0 and row.gap_closed[row.best_policy] >= 0.0
        want = (row.costs[row.best_constant] - row.costs["top1"]) / (row.costs[row.best_constant] - limit)
        assert row.gap_closed["top1"] == pytest.approx(want, rel=1e-12)
        assert row.cert_vs_constant.point == pytest.approx(row.costs["certificate"] / row.costs[row.best_constant])
        assert row.cert_vs_oracle.lo <= row.cert_vs_oracle.point <= row.cert_vs_oracle.hi


def _same_rows(a: list[GridRow], b: list[GridRow]) -> bool:
    """Rows equal field for field, a nan gap (no gap to close) equal to a nan gap."""
    def key(r: GridRow):
        return {**r.__dict__, "gap_closed": {p: ("nan" if math.isnan(x) else x) for p, x in r.gap_closed.items()}}
    return [key(r) for r in a] == [key(r) for r in b]


def test_the_fast_grid_is_the_reference_grid_field_for_field(pair):
    """replay_grid's array paths (the built-ins, the oracle, every calibrated rule of the chapter on every
    recording at once) against fast=False, which drives every policy call by call: the same rows field for
    field on the pair's recordings, under cost models where the rules draft much, little and never; and the
    comparison with its cold row the same rounds."""
    _, _, _, recs = pair
    gentle = (1.0,) + tuple(1.0 + 0.02 * k for k in range(1, 41))
    grid = [("flat", CostModel(c=0.02, verify=(1.0,))), ("gentle", CostModel(c=0.2, verify=gentle)),
            ("cpu", CostModel(c=0.36, verify=(1.0, 1.4, 1.45))), ("cpu", CostModel(c=1.0, verify=(1.0, 1.4, 1.45)))]
    builtins = ["constant:0", "constant:2", "confidence:0.4", "heuristic"]
    fast = replay_grid(recs[:3], recs[3:], grid, builtins=builtins, n_boot=200)
    assert _same_rows(fast, replay_grid(recs[:3], recs[3:], grid, builtins=builtins, n_boot=200, fast=False))
    for _, costs in grid[:2]:
        a = replay_comparison(recs[:3], recs[3:], costs, builtins=builtins)
        b = replay_comparison(recs[:3], recs[3:], costs, builtins=builtins, fast=False)
        assert a.policies == b.policies
        for name in b.policies:
            for i, (x, y) in enumerate(zip(a.results[name], b.results[name])):
                assert not same_rounds(x, y), f"{name} on prompt {i}: {same_rounds(x, y)}"
            # every field, tokens per second (nan: a replay has no clock) included
            assert repr(a.summary(name)) == repr(b.summary(name)), name


def test_grid_in_worker_processes_and_in_the_background_gives_the_same_rows(pair, monkeypatch, capsys):
    """replay_grid(processes=2) and submit_replay_grid give the rows computed here, in the grid's
    order; workers that cannot start are said in one line and the rows computed here; bad
    process counts are refused before any work."""
    _, _, _, recs = pair
    grid = [("flat", CostModel(c=c, verify=(1.0,))) for c in (0.02, 0.05, 0.2)] + \
           [("cpu", CostModel(c=0.36, verify=(1.0, 1.4, 1.45)))]
    kw = dict(builtins=["constant:0", "constant:2", "confidence:0.4"], calibrated=["certificate"], n_boot=100)
    here = replay_grid(recs[:3], recs[3:], grid, **kw)
    assert _same_rows(replay_grid(recs[:3], recs[3:], grid, processes=2, **kw), here)
    job = submit_replay_grid(recs[:3], recs[3:], grid, processes=1, **kw)
    rows, seconds = job.result(timeout=300)
    assert _same_rows(rows, here) and seconds > 0
    rows, _ = submit_replay_grid(recs[:3], recs[3:], grid, processes=0, **kw).result(timeout=300)
    assert _same_rows(rows, here)

    import concurrent.futures

    def cannot_start(*args, **kwargs):
        raise OSError("no processes left")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", cannot_start)
    capsys.readouterr()
    assert _same_rows(replay_grid(recs[:3], recs[3:], grid, processes=2, **kw), here)
    said = capsys.readouterr().out.strip().splitlines()
    assert said == ["replay_grid: the worker processes failed (OSError: no processes left); replaying here instead"]
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="processes must be an integer >= 0"):
            replay_grid(recs[:3], recs[3:], grid, processes=bad, **kw)
        with pytest.raises(ValueError, match="processes must be an integer >= 0"):
            submit_replay_grid(recs[:3], recs[3:], grid, processes=bad, **kw)


def fake_row(shape: str, c: float, *, vs_const=(1.0, 0.9, 1.1), vs_default=(1.0, 0.9, 1.1),
             best=(1.05, 1.0, 1.1), to_oracle=None) -> GridRow:
    from companion.speculative.compare import RatioEstimate as R

    to_oracle = to_oracle or {"constant:3": 1.3, "certificate": 1.2, "confidence:0.4": 1.4, "margin": 1.05}
    best_const = "constant:3"
    best_policy = min(to_oracle, key=to_oracle.get)
    gap = to_oracle[best_const] - 1
    return GridRow(shape=shape, c=c, oracle_cost=0.3, costs={p: 0.3 * x for p, x in to_oracle.items()},
                   to_oracle=to_oracle, best_constant=best_const, best_policy=best_policy, default="confidence:0.4",
                   cert_vs_constant=R(*vs_const), cert_vs_default=R(*vs_default), cert_vs_oracle=R(1.2, 1.1, 1.3),
                   best_vs_oracle=R(*best),
                   gap_closed={p: (to_oracle[best_const] - x) / gap if gap > 0 else math.nan
                               for p, x in to_oracle.items()})


def test_oracle_ratio_figure_draws_the_rows_legibly():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    from companion.figures.replay import oracle_ratios

    rows = [fake_row(shape, c, to_oracle={"constant:3": 1.3 + c, "certificate": 1.2 + c, "confidence:0.4": 1.4,
                                          "top1": 1.25, "margin": 1.1 + c / 2})
            for shape in ("flat", "gentle", "cpu") for c in (0.02, 0.1, 1.0)]
    fig = oracle_ratios(rows, {"flat": "flat", "gentle": "gentle", "cpu": "CPU"})
    lines = {ln.get_gid(): ln for ax in fig.axes for ln in ax.lines}
    for shape in ("flat", "gentle", "cpu"):
        xs, ys = lines[f"line:{shape}:certificate"].get_data()
        assert list(xs) == [0.02, 0.1, 1.0] and np.allclose(ys, [1.22, 1.3, 2.2])
        assert np.allclose(lines[f"line:{shape}:best constant"].get_data()[1], [1.32, 1.4, 2.3])
        assert np.allclose(lines[f"line:{shape}:cheapest policy"].get_data()[1], [1.11, 1.15, 1.25])
        assert np.allclose(lines[f"line:{shape}:transformers default"].get_data()[1], 1.4)
    band = next(c for ax in fig.axes for c in ax.collections if c.get_gid() == "band:cpu:certificate")
    ys = band.get_paths()[0].vertices[:, 1]
    assert ys.min() == pytest.approx(1.1) and ys.max() == pytest.approx(1.3)
    # every text at >= 9 pt when the book stretches the saved figure to its ~688 px column
    import matplotlib as mpl

    FigureCanvasAgg(fig)
    fig.canvas.draw()
    width = fig.get_tightbbox(fig.canvas.get_renderer()).width + 2 * float(mpl.rcParams["savefig.pad_inches"])
    scale = (688 / 96) / width
    small = [(t.get_text(), t.get_fontsize() * scale) for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())
             and t.get_fontsize() * scale < 9]
    assert not small, f"texts under 9 pt at the column width (figure {width:.2f} in wide): {small}"
    with pytest.raises(ValueError, match="no grid rows"):
        oracle_ratios([], {})
