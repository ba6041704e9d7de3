"""Tree rounds replayed from a recording against the live decoder, and the model's E[A] against the replays.

Oracle: the live tree decoder on the closed-world pair (float32), round for round: accepted lengths, verified
nodes and drafter forward widths (the first round's prefill excepted, which the replay prices as one token).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from companion.speculative.tree import generate_tree
from companion.speculative.tree.costs import TreeCostModel
from companion.speculative.tree.model import empirical_prefix_law, expected_accepted_joint, full_tree
from companion.speculative.tree.replay import RecordedTreeText, record_tree_text, replay_ranks, replay_tree
from tests.pair_prompts import code_prompts

N_NEW = 16
DYNAMIC = "dynamic:8,4,3"
POLICIES = ["spine:1,1,1", "static:2,2", "spine:3,2,1", DYNAMIC, "certified:nmax=8,dmax=4"]


@pytest.fixture(scope="module")
def recorded():
    torch.set_num_threads(1)
    from companion.models.loading import load_pair

    target, drafter, tok = load_pair("default")
    ids = [tok(t, return_tensors="pt").input_ids for t in code_prompts(2)]
    recs = [record_tree_text(target, drafter, x, max_new_tokens=N_NEW, width=4, depth=4, trees=[DYNAMIC]) for x in ids]
    return target, drafter, ids, recs


@pytest.mark.parametrize("policy", POLICIES)
def test_replay_makes_the_live_rounds(recorded, policy):
    target, drafter, ids, recs = recorded
    for x, rec in zip(ids, recs):
        live = generate_tree(target, drafter, x, policy=policy, max_new_tokens=N_NEW, eos_token_id=[])
        assert live.tokens.tolist() == list(rec.tokens)
        rep = replay_tree(rec, policy)
        assert list(rep.accepted) == live.accepted
        assert list(rep.nodes) == live.submitted
        assert [tuple(w) for w in live.widths][1:] == list(rep.widths)[1:]


def test_ranks_decide_static_rounds(recorded):
    """A full tree accepts the deepest prefix of the text's teacher-forced ranks it holds."""
    _, _, _, recs = recorded
    rec = recs[0]
    rep = replay_tree(rec, "static:2,2")
    s = 0
    tree = set(full_tree([2, 2]))
    for a in rep.accepted:
        cap = min(2, rec.cap(s))
        want = 0
        while want < cap and s + want < len(rec.ranks) and tuple(rec.ranks[s:s + want + 1]) in tree:
            want += 1
        assert a == want
        s += a + 1


def test_expected_accepted_from_every_position(recorded):
    """Equation (1) over the law of the rank sequences from every text position is the mean accepted length of
    rounds started at every position."""
    _, _, _, recs = recorded
    rec = recs[1]
    rows = [rec.ranks[s:s + 2] for s in range(len(rec.ranks) - 2)]
    law = empirical_prefix_law(rows)
    tree = set(full_tree([2, 2]))
    mean = 0.0
    for row in rows:
        a = 0
        while a < 2 and tuple(row[: a + 1]) in tree:
            a += 1
        mean += a / len(rows)
    assert expected_accepted_joint(full_tree([2, 2]), lambda p: law.get(p, 0.0)) == pytest.approx(mean, rel=1e-12)


def test_replays_are_priced(recorded):
    _, _, _, recs = recorded
    costs = TreeCostModel(verify=(1.0, 1.02, 1.04), draft=(0.0, 0.3, 0.32))
    for policy in POLICIES:
        rep = replay_tree(recs[0], policy)
        x = rep.speedup(costs)
        tokens = sum(a + 1 for a in rep.accepted)
        assert tokens == len(recs[0].tokens)
        assert 0.2 < x < 1 + max(rep.accepted)


def test_what_a_replay_needs_is_named(recorded):
    _, _, _, recs = recorded
    with pytest.raises(ValueError, match="record its trees first"):
        replay_tree(recs[0], "dynamic:6,3,2")
    with pytest.raises(ValueError, match="spine-shaped trees only"):
        replay_tree(recs[0], "spine:2,2,2,2,2,2")   # deeper than the recorded chains
    with pytest.raises(ValueError, match="the recording kept 4"):
        replay_tree(recs[0], "static:5")


@given(st.lists(st.sampled_from([1, 1, 1, 2, 3, 5]), min_size=1, max_size=40),
       st.sampled_from([(2, 2, 1), (1, 1, 1), (3, 2, 1, 1), (2,), (4, 1)]))
def test_replay_from_ranks_alone_is_the_static_replay(ranks: list[int], widths: tuple[int, ...]) -> None:
    """A fixed tree replayed from the ranks alone (no tokens, no recording) gives the rounds, nodes and drafter
    forwards the recording's replay gives."""
    n, w = len(ranks), 4
    rec = RecordedTreeText(tokens=tuple(range(n)), ranks=tuple(min(r, w + 1) for r in ranks), width=w,
                           max_new_tokens=n)
    a = replay_tree(rec, "static:" + ",".join(map(str, widths)))
    b = replay_ranks(ranks, full_tree(widths))
    assert (a.accepted, a.nodes, a.widths) == (b.accepted, b.nodes, b.widths)
