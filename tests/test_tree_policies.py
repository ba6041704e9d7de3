"""Tree policies (specs, shapes, the certified sizing rule) and bad input to the tree decoder, in one line each."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.speculative.tree import (
    Certified,
    DraftTree,
    Dynamic,
    Expansion,
    Static,
    TreeOutcome,
    generate_tree,
    is_tree_spec,
    parse_tree_policy,
)
from companion.speculative.tree.model import full_tree, spine_tree


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    from companion.models.loading import load_pair

    target, drafter, tok = load_pair("default")
    return target, drafter, tok("def f(x):\n    return", return_tensors="pt").input_ids


def _grow(pol, probs_by_depth):
    """Drive a policy without a model: every expanded node gets the same top probabilities."""
    pol.start_round(20)
    tree = DraftTree()
    k = pol.max_width
    probs = torch.tensor(probs_by_depth[:k], dtype=torch.float64)
    expanded = [Expansion(-1, probs, torch.arange(k))]
    depth = 0
    while expanded:
        new = [tree.add(expanded[i].node, r, r, (tree.logq[expanded[i].node] if expanded[i].node >= 0 else 0.0)
                        + float(np.log(float(probs[r - 1])))) for i, r in pol.grow(tree, depth, expanded)]
        depth += 1
        if not new:
            break
        expanded = [Expansion(j, probs, torch.arange(k)) for j in pol.expand(tree, new)]
    sub, _ = tree.subtree(pol.verify_nodes(tree))
    return sub


@pytest.mark.parametrize("widths", [(2, 2, 2), (3, 1), (1, 1, 1, 1)])
def test_static_shapes(widths):
    full = _grow(parse_tree_policy("static:" + ",".join(map(str, widths))), [0.5, 0.3, 0.2])
    assert sorted(full.rank_paths()) == sorted(full_tree(widths))
    spine = _grow(parse_tree_policy("spine:" + ",".join(map(str, widths))), [0.5, 0.3, 0.2])
    assert sorted(spine.rank_paths()) == sorted(spine_tree(widths))


def test_dynamic_keeps_the_most_likely_paths():
    pol = Dynamic(nodes=6, depth=3, top_k=2)
    tree = _grow(pol, [0.7, 0.3])
    assert len(tree) == 6
    # path probabilities 0.7, 0.49, 0.343, 0.3, 0.21, 0.21 (ties to the shallower, then the earlier)
    got = sorted(tree.rank_paths())
    assert got == sorted([(1,), (1, 1), (1, 1, 1), (2,), (1, 2), (2, 1)])
    closed = set(got)
    assert all(len(p) == 1 or p[:-1] in closed for p in got)


def test_certified_widths_follow_the_calibration():
    pol = Certified(nmax=8, dmax=1, wmax=4, dv=0.02)
    for _ in range(40):   # scores below 0.5: the top 1 holds the target's token 30 % of the time, the top 2: 95 %
        pol.cal.add(0.1, False)
        pol.cal.add(0.2, True)
    for _ in range(40):
        pol.cal.add(0.6, True)
    pol.cal._table = None
    pol.start_round(5)
    e = Expansion(-1, torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64), torch.arange(4),
                  scores=np.array([0.1, 0.6, 0.7, 0.8]))
    adds = pol.grow(DraftTree(), 0, [e])
    assert adds == [(0, 1), (0, 2)]
    # a confident drafter (every score high): one child
    pol.start_round(5)
    e = Expansion(-1, torch.tensor([0.97, 0.01, 0.01, 0.01], dtype=torch.float64), torch.arange(4),
                  scores=np.array([0.6, 0.7, 0.8, 0.9]))
    assert pol.grow(DraftTree(), 0, [e]) == [(0, 1)]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4), min_size=1, max_size=12),
       st.integers(1, 6), st.integers(1, 4))
def test_certified_stays_within_its_budget(scores, nmax, wmax):
    pol = Certified(nmax=nmax, dmax=6, wmax=wmax, dv=0.0, c=0.0)
    pol.start_round(10)
    tree = DraftTree()
    probs = torch.full((4,), 0.25, dtype=torch.float64)
    expanded = [Expansion(-1, probs, torch.arange(4), scores=np.sort(scores[0]))]
    depth = 0
    while expanded:
        new = [tree.add(expanded[i].node, 100 * depth + r, r, 0.0) for i, r in pol.grow(tree, depth, expanded)]
        depth += 1
        if not new:
            break
        feed = pol.expand(tree, new)
        assert all(tree.ranks[j] == 1 for j in feed) and len(feed) <= 1
        expanded = [Expansion(j, probs, torch.arange(4), scores=np.sort(scores[depth % len(scores)])) for j in feed]
    assert len(tree) <= nmax and tree.depth <= 6
    assert all(tree.width(d) <= wmax for d in range(1, tree.depth + 1))
    pol.end_round(TreeOutcome(tree, (), (1,), depth))


def test_specs():
    assert str(parse_tree_policy("static:2, 2")) == "static:2,2"
    assert str(parse_tree_policy("dynamic:16")) == "dynamic:16,6,4"
    assert str(parse_tree_policy("certified:nmax=12")) == "certified:nmax=12"
    assert parse_tree_policy("certified", c=0.5).c == 0.5
    assert is_tree_spec("spine:1") and not is_tree_spec("constant:3")
    assert Static((2, 3)).max_nodes == 8 and Static((2, 3), spine=True).max_nodes == 5


@pytest.mark.parametrize("spec, message", [
    ("static:", "comma-separated integers"),
    ("static:2,0", "width >= 1"),
    ("dynamic:0", "nodes must be an integer >= 1"),
    ("dynamic:4,2,2,2", r"dynamic:N\[,D\[,K\]\]"),
    ("certified:nmax=0", "nmax must be an integer >= 1"),
    ("certified:foo=1", "not a knob=value pair"),
    ("certified:c=x", "c must be a number"),
    ("tree:3", "malformed tree policy spec"),
])
def test_bad_specs_get_one_line(spec, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_tree_policy(spec)
    assert "\n" not in str(err.value)


def test_bad_input_to_the_decoder(pair):
    target, drafter, x = pair
    vocab = target.get_output_embeddings().weight.shape[0]
    with pytest.raises(ValueError, match="use widths below the vocabulary size"):
        generate_tree(target, drafter, x, policy=f"static:{vocab}", max_new_tokens=4)
    with pytest.raises(ValueError, match="exceed the models' context"):
        generate_tree(target, drafter, x, policy="dynamic:64", max_new_tokens=target.config.max_position_embeddings)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer"):
        generate_tree(target, drafter, x, policy="static:2", max_new_tokens=-1)


class _NoMask(torch.nn.Module):
    """A causal LM that drops the attention mask and positions it is given (as a model without 4D-mask support)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.generation_config = inner.generation_config

    @property
    def device(self):
        return self.inner.device

    @property
    def dtype(self):
        return self.inner.dtype

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True,
                logits_to_keep=0):
        return self.inner(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache)


def test_a_model_that_ignores_the_mask_is_refused_or_falls_back(pair):
    target, drafter, x = pair
    bad = _NoMask(target)
    with pytest.raises(ValueError, match="ignores the 4D tree attention mask") as err:
        generate_tree(bad, drafter, x, policy="static:2,2", max_new_tokens=4)
    assert "\n" not in str(err.value) and "fallback" in str(err.value)
    r = generate_tree(bad, drafter, x, policy="static:2,2", max_new_tokens=6, fallback="constant:2")
    with torch.inference_mode():
        ref = target.generate(x, do_sample=False, max_new_tokens=6)[0, x.shape[1]:]
    assert torch.equal(r.tokens, ref) and r.policy == "constant:2"


def test_a_flash_attention_model_is_refused(pair, monkeypatch):
    target, drafter, x = pair
    from companion.speculative.tree import verify

    monkeypatch.setattr(verify, "_SUPPORTED", type(verify._SUPPORTED)())
    monkeypatch.setattr(target.config, "_attn_implementation", "flash_attention_2", raising=False)
    with pytest.raises(ValueError, match="'flash_attention_2' attention kernel, which ignores a custom 4D mask"):
        generate_tree(target, drafter, x, policy="static:2", max_new_tokens=4)


def test_policies_split_keeps_every_name_importable():
    from companion.speculative import policies

    for name in ("Calibrated", "Constant", "Confidence", "Heuristic", "DraftStep", "RoundOutcome", "Policy",
                 "parse_policy", "POLICY_FORMS", "bellman", "optimal_rate", "pava", "SURVIVAL_GRID", "_expectation",
                 "greedy_rho", "check_knob", "knob_rule", "unit_score", "kl_scale_score", "_CAL_DEFAULTS"):
        assert hasattr(policies, name), name
    here = Path(policies.__file__).parent
    for module in ("policies.py", "policy_base.py", "survival.py", "calibrated.py", "tree/decoder.py",
                   "tree/policies.py", "tree/replay.py"):
        assert len((here / module).read_text().splitlines()) <= 800, module
