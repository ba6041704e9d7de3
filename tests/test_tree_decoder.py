"""The tree speculative decoder on the closed-world pair.

Oracles: the target's own greedy decoding (``target.generate(do_sample=False)``), token for token in float32 on
every prompt; an independent slow reference that re-derives every round with plain forwards (no tree mask, no
cache): each expanded node's children are the drafter's top tokens after the node's path, and the kept path and
the next token are the longest root-to-leaf prefix matching the target's greedy tokens, each path verified on its
own; the chain decoder (a spine of width 1 is a chain); in bfloat16, every parting from the greedy text sits at a
near tie, named with its gap in ulps.
"""
from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from companion.certify.precision import TIE_ULPS
from companion.speculative import generate
from companion.speculative.tree import DraftTree, bf16_parting, generate_tree, keep_slots, tree_attention
from companion.speculative.tree.decoder import _top
from tests.pair_prompts import code_prompts

N_NEW = 20
POLICIES = ["spine:1,1,1", "static:2,2,2", "spine:3,2,2,1", "dynamic:10,4,3", "certified:nmax=8,dmax=4"]


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    from companion.models.loading import load_pair

    target, drafter, tok = load_pair("default")
    ids = [tok(t, return_tensors="pt").input_ids for t in code_prompts(3)]
    with torch.inference_mode():
        refs = [target.generate(x, do_sample=False, max_new_tokens=N_NEW)[0, x.shape[1]:] for x in ids]
    return target, drafter, ids, refs


def test_the_pair_is_float32(pair):
    target, drafter, _, _ = pair
    assert target.dtype == drafter.dtype == torch.float32


@pytest.mark.parametrize("policy", POLICIES)
def test_output_is_the_targets_greedy_text(pair, policy):
    target, drafter, ids, refs = pair
    for x, ref in zip(ids, refs):
        r = generate_tree(target, drafter, x, policy=policy, max_new_tokens=N_NEW)
        assert torch.equal(r.tokens, ref), f"{policy}: {r.tokens.tolist()} != {ref.tolist()}"
        assert r.lossless and r.target_forwards == r.rounds == len(r.trees)
        if not r.ended_by_eos:
            assert len(r.tokens) == sum(r.accepted) + r.rounds
        pos = 0
        for tree, path, a, k in zip(r.trees, r.paths, r.accepted, r.submitted):
            assert len(path) == a and len(tree) == k
            assert [tree.tokens[i] for i in path] == r.tokens[pos:pos + a].tolist()
            pos += a + 1


def _greedy(model, ids: list[int]) -> list[int]:
    """The model's greedy token after every prefix of ``ids`` (one plain forward, no cache)."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()


@pytest.mark.parametrize("policy", ["static:2,2,2", "dynamic:8,3,3"])
def test_rounds_against_a_slow_reference(pair, policy):
    """Every round re-derived with plain forwards: the children of each expanded node are the drafter's top tokens
    after its path (ranks in order), and the kept path is the longest match over the tree's root-to-leaf paths,
    each verified alone."""
    target, drafter, ids, _ = pair
    x = ids[0][0].tolist()
    r = generate_tree(target, drafter, x, policy=policy, max_new_tokens=10)
    seq = list(x)
    for tree, path in zip(r.trees, r.paths):
        for i in [-1] + list(range(len(tree))):
            kids = tree.children(i)
            if not kids:
                continue
            ctx = seq + [tree.tokens[j] for j in tree.path(i)]
            with torch.inference_mode():
                row = drafter(input_ids=torch.tensor([ctx])).logits[0, -1]
            _, top = _top(row[None].float(), 8)
            # the children are the drafter's top tokens at their ranks (a dynamic tree verifies a prefix of them)
            assert [tree.tokens[j] for j in kids] == [top[0, tree.ranks[j] - 1].item() for j in kids]
            assert [tree.ranks[j] for j in kids] == list(range(1, len(kids) + 1))
        best: list[int] = []
        leaves = [i for i in range(len(tree)) if not tree.children(i)]
        for leaf in leaves:
            nodes = tree.path(leaf)
            toks = [tree.tokens[j] for j in nodes]
            g = _greedy(target, seq + toks)[len(seq) - 1:]
            a = 0
            while a < len(toks) and toks[a] == g[a]:
                a += 1
            if a > len(best):
                best = nodes[:a]
        toks = [tree.tokens[j] for j in best]
        nxt = _greedy(target, seq + toks)[-1]
        assert path == best, (path, best)
        seq += toks + [nxt]
    assert seq[len(x):] == r.tokens.tolist()


def test_a_spine_of_width_one_is_the_chain_decoder(pair):
    target, drafter, ids, _ = pair
    for x in ids[:2]:
        tree = generate_tree(target, drafter, x, policy="spine:1,1,1", max_new_tokens=N_NEW)
        chain = generate(target, drafter, x, policy="constant:3", max_new_tokens=N_NEW)
        assert tree.accepted == chain.accepted and torch.equal(tree.tokens, chain.tokens)
        assert tree.drafted == chain.drafted and tree.submitted == chain.submitted


def test_a_chain_spec_runs_the_chain_decoder(pair):
    target, drafter, ids, refs = pair
    r = generate_tree(target, drafter, ids[0], policy="constant:2", max_new_tokens=N_NEW)
    assert torch.equal(r.tokens, refs[0]) and r.policy == "constant:2" and not hasattr(r, "trees")


def test_end_of_sequence(pair):
    target, drafter, ids, refs = pair
    eos = int(refs[0][8])
    first = refs[0].tolist().index(eos)
    r = generate_tree(target, drafter, ids[0], policy="static:2,2", max_new_tokens=N_NEW, eos_token_id=eos)
    assert r.ended_by_eos and r.tokens.tolist() == refs[0][: first + 1].tolist()
    for tree in r.trees:
        for i in range(len(tree)):
            if tree.tokens[i] == eos:
                assert not tree.children(i), "a drafted end-of-sequence token was expanded"


def test_tree_mask_logits_equal_separate_paths(pair):
    """One forward over a tree equals plain forwards of each of its paths (float32, to 1e-4)."""
    target, _, ids, _ = pair
    x = ids[1][0].tolist()
    tree = DraftTree()
    a = tree.add(-1, 11, 1, 0.0)
    tree.add(a, 12, 1, 0.0)
    tree.add(-1, 13, 2, 0.0)
    tree.add(a, 14, 2, 0.0)
    mask, pos = tree_attention(tree, 0, len(x), range(4), [], torch.float32)
    with torch.inference_mode():
        out = target(input_ids=torch.tensor([x + tree.tokens]), attention_mask=mask, position_ids=pos).logits[0]
        for i in range(4):
            ref = target(input_ids=torch.tensor([x + [tree.tokens[j] for j in tree.path(i)]])).logits[0, -1]
            assert torch.allclose(out[len(x) + i], ref, atol=1e-4), i
    assert pos[0, len(x):].tolist() == [len(x), len(x) + 1, len(x), len(x) + 1]


def test_keep_slots_regathers_and_crops():
    cache = DynamicCache()
    k = torch.arange(2 * 3 * 7 * 4, dtype=torch.float32).reshape(2, 3, 7, 4)
    cache.update(k, -k, 0)
    keep_slots(cache, [0, 1, 4, 6])
    assert torch.equal(cache.layers[0].keys, k[:, :, [0, 1, 4, 6]])
    assert torch.equal(cache.layers[0].values, -k[:, :, [0, 1, 4, 6]])
    keep_slots(cache, [0, 1])
    assert cache.get_seq_length() == 2


def test_bfloat16_parts_only_at_near_ties(pair):
    """In bfloat16 a tree forward and a one-token forward may round differently; every parting from the target's
    greedy text must sit where its top-2 logits are within a few ulps."""
    from companion.models.loading import load_pair

    _, _, ids, _ = pair
    t16, d16, _ = load_pair("default")
    t16, d16 = t16.to(torch.bfloat16), d16.to(torch.bfloat16)
    for x in ids[:2]:
        with torch.inference_mode():
            ref = t16.generate(x, do_sample=False, max_new_tokens=N_NEW)[0, x.shape[1]:].tolist()
        for policy in ("static:2,2,2", "dynamic:10,4,3"):
            r = generate_tree(t16, d16, x, policy=policy, max_new_tokens=N_NEW)
            where = bf16_parting(r.tokens.tolist(), ref, t16, x[0].tolist())
            if where is not None:
                pos, gap = where
                assert gap <= TIE_ULPS, f"{policy} parts at answer token {pos} with a top-2 gap of {gap:.1f} ulps"
