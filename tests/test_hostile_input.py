"""Hostile input to the library's public functions: one clear line naming the argument, never a
traceback from deep inside and never a silently wrong answer (issue 21).

Each table row is ``(id, call, exception type, text the message must contain)``; every refusal
must also be a single line. The rows after the tables check what is accepted instead of refused:
a duplicate token of equal value, a single tree width or divergence, the warning for
probabilities passed as logits.
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch

from companion import certificates, certified
from companion.drafter_side import drafter_certificate
from companion.server_logprobs import certificates_from_logprobs
from companion.validation import warn_if_probabilities

LOG = math.log
STEP = [{"token": "a", "logprob": LOG(0.4)}, {"token": "b", "logprob": LOG(0.3)}, {"token": "c", "logprob": LOG(0.1)}]
LP = torch.log(torch.tensor([[0.5, 0.2, 0.1], [0.6, 0.3, 0.05]], dtype=torch.float64))
META = "is on the meta device"


def _probs(rows: int = 3, vocab: int = 10) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, vocab, dtype=torch.float64, generator=torch.Generator().manual_seed(0)), -1)


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _refused(call: Callable[[], Any], error: type[Exception], text: str) -> None:
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert text in message, message
    assert "\n" not in message, message


# -------------------------------------------------------------------------------------------------
# certificates_from_logprobs

LOGPROB_CASES = [
    ("duplicate-token-different-values",
     lambda: certificates_from_logprobs([STEP + [{"token": "a", "logprob": LOG(0.05)}]], "greedy"), ValueError,
     "step 0: token 'a' is listed twice with different logprobs"),
    ("duplicate-token-second-step",
     lambda: certificates_from_logprobs([STEP, [{"token": 7, "logprob": -1.0}, {"token": 7, "logprob": -2.0}]],
                                        "greedy"), ValueError, "step 1: token 7 is listed twice"),
    ("top-k-float", lambda: certificates_from_logprobs([STEP], "greedy", top_k=1.5), ValueError,
     "top_k must be a positive integer, got 1.5"),
    ("top-k-zero", lambda: certificates_from_logprobs([STEP], "greedy", top_k=0), ValueError,
     "top_k must be a positive integer, got 0"),
    ("top-k-zero-tensor", lambda: certificates_from_logprobs(LP, "greedy", top_k=0), ValueError,
     "top_k must be a positive integer, got 0"),
    ("top-k-bool", lambda: certificates_from_logprobs(LP, "greedy", top_k=True), ValueError,
     "top_k must be a positive integer, got True"),
    ("empty-step-not-first", lambda: certificates_from_logprobs([STEP, STEP, []], "greedy"), ValueError,
     "step 2 has no logprobs"),
    ("tail-mass-string", lambda: certificates_from_logprobs([STEP], "greedy", tail_mass="0.1"), ValueError,
     "tail_mass must be a number, a sequence of numbers or a tensor, got '0.1'"),
    ("tail-mass-meta", lambda: certificates_from_logprobs(LP, "greedy", tail_mass=torch.zeros(2, device="meta")),
     ValueError, "tail_mass " + META),
    ("logprobs-meta", lambda: certificates_from_logprobs(LP.to("meta"), "greedy"), ValueError, "logprobs " + META),
    ("divergence-misspelt-string", lambda: certificates_from_logprobs(LP, "greedy", "forwards"), ValueError,
     "divergence must be one of ('forward', 'reverse'), got 'forwards'"),
    ("tree-widths-string", lambda: certificates_from_logprobs(LP, tree_widths="2"), ValueError,
     "tree_widths must be an integer or a list of integers, got '2'"),
    ("tree-widths-zero", lambda: certificates_from_logprobs(LP, tree_widths=0), ValueError, "tree width m"),
    ("logprob-text", lambda: certificates_from_logprobs([[{"token": "a", "logprob": "-0.1"}]], "greedy"), ValueError,
     "step 0, entry 0: expected a logprob (a number), got '-0.1'"),
]


@pytest.mark.parametrize("call, error, text", [c[1:] for c in LOGPROB_CASES], ids=[c[0] for c in LOGPROB_CASES])
def test_certificates_from_logprobs_refuses(call, error, text) -> None:
    _refused(call, error, text)


def test_a_duplicate_of_equal_value_is_counted_once() -> None:
    """vLLM appends the sampled token to the top k even when it is among them: the copy is dropped."""
    again = STEP + [dict(STEP[0])]
    got = certificates_from_logprobs([again], ["greedy", "additive:0.2"], tree_widths=[1])
    want = certificates_from_logprobs([STEP], ["greedy", "additive:0.2"], tree_widths=[1])
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key].value, want[key].value) and torch.equal(got[key].exact, want[key].exact), key
    # the issue's case: counting the copy would give the certificate of two tied tokens: 0 under the
    # worst case over tie-breaks (the default), 0.1203 under the level-set rule
    issue = [{"token": "a", "logprob": LOG(0.4)}, {"token": "a", "logprob": LOG(0.4)}, {"token": "b", "logprob": LOG(0.1)}]
    for ties, tied_value in (("worst", 0.0), ("level-set", 0.1203)):
        once = certificates_from_logprobs([issue], "greedy", ties=ties)[("greedy", "forward")]
        tied = certificates_from_logprobs([[LOG(0.4), LOG(0.4), LOG(0.1)]], "greedy", ties=ties)[("greedy", "forward")]
        assert float(tied.value) == pytest.approx(tied_value, abs=1e-4)
        single = certificates_from_logprobs([[LOG(0.4), LOG(0.1)]], "greedy", ties=ties)[("greedy", "forward")]
        assert float(once.value) == pytest.approx(float(single.value), rel=1e-12)
        assert abs(float(once.value) - tied_value) > 0.01


def test_one_tree_width_and_one_divergence_are_accepted() -> None:
    one = certificates_from_logprobs(LP, "greedy", "forward", tree_widths=2)
    listed = certificates_from_logprobs(LP, "greedy", ["forward"], tree_widths=[2])
    assert sorted(one) == sorted(listed) == [("greedy", "forward"), ("tree:2", "forward")]
    for key in listed:
        assert torch.equal(one[key].value, listed[key].value)


# -------------------------------------------------------------------------------------------------
# certified, certificates, drafter_certificate: meta tensors, and probabilities passed as logits

TENSOR_CASES = [
    ("certified-meta", lambda: certified(_probs().to("meta"), _probs().to("meta"), "greedy"), ValueError, "p " + META),
    ("certified-meta-logits", lambda: certified(_probs().to("meta"), _probs().to("meta"), "greedy", from_logits=True),
     ValueError, "target logits " + META),
    ("certificates-meta", lambda: certificates(_probs().to("meta"), ["greedy"]), ValueError, META),
    ("drafter-certificate-meta", lambda: drafter_certificate(_probs().to("meta"), "greedy"), ValueError, META),
    ("certified-list", lambda: certified(_probs().tolist(), _probs(), "greedy"), TypeError,
     "p must be a torch.Tensor, got list"),
]


@pytest.mark.parametrize("call, error, text", [c[1:] for c in TENSOR_CASES], ids=[c[0] for c in TENSOR_CASES])
def test_tensor_functions_refuse(call, error, text) -> None:
    _refused(call, error, text)


def test_probabilities_passed_as_logits_warn_once_per_call() -> None:
    p = _probs()
    with pytest.warns(UserWarning, match="look like probabilities, not logits") as caught:
        certified(p, p, "greedy", from_logits=True)
    assert len([w for w in caught if "look like probabilities" in str(w.message)]) == 1
    assert caught[0].filename == __file__  # points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        certified(torch.log(p), torch.log(p), "greedy", from_logits=True)  # real logits: silent
        certified(p, p, "greedy")                                           # probabilities as such: silent


@pytest.mark.parametrize("rows, warned", [
    (torch.tensor([[0.2, 0.8], [0.5, 0.5]]), True),
    (torch.tensor([[0.2, 0.7], [0.5, 0.5]]), False),    # a row summing to 0.9
    (torch.tensor([[-0.1, 1.1], [0.5, 0.5]]), False),   # sums to 1, yet outside [0, 1]
])
def test_the_probability_heuristic(rows, warned) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert warn_if_probabilities(rows) is warned
    assert len(caught) == int(warned)


# -------------------------------------------------------------------------------------------------
# speculative.generate


@pytest.fixture(scope="module")
def toy() -> tuple[Any, Any, Any]:
    from companion.harvest.toy import toy_pair

    return toy_pair(vocab=512, hidden=32, layers=1)


def _generate(toy, **overrides: Any) -> Any:
    from companion.speculative import generate

    target, drafter, _ = toy
    args: dict[str, Any] = dict(target=target, drafter=drafter, input_ids=[17, 121], policy="constant:2",
                                max_new_tokens=3)
    args.update(overrides)
    return generate(args.pop("target"), args.pop("drafter"), args.pop("input_ids"), **args)


def _meta_model(toy) -> Any:
    from companion.harvest.toy import toy_pair

    return toy_pair(vocab=512, hidden=32, layers=1)[0].to("meta")


GENERATE_CASES = [
    ("float-ids-tensor", dict(input_ids=torch.tensor([[17.9, 121.6]])), "input_ids must be integer token ids, got "
                                                                         "dtype torch.float32"),
    ("float-ids-list", dict(input_ids=[17.9, 121.6]), "input_ids must be integer token ids, got 17.9"),
    ("bool-ids", dict(input_ids=torch.tensor([True, False])), "input_ids must be integer token ids, got dtype "
                                                              "torch.bool"),
    ("text-ids", dict(input_ids="def f():"), "input_ids must be token ids (a tensor or a list of integers), got str"),
    ("id-equal-to-vocab", dict(input_ids=[17, 512]), "input_ids[1] = 512 is not a token id of the models: ids must "
                                                     "lie in [0, 512)"),
    ("id-negative", dict(input_ids=torch.tensor([-1, 5])), "input_ids[0] = -1 is not a token id"),
    ("ids-meta", dict(input_ids=torch.tensor([[1, 2]], device="meta")), "input_ids " + META),
    ("drafter-none", dict(drafter=None), "drafter must be a causal language model (transformers' "
                                         "AutoModelForCausalLM), got NoneType"),
    ("target-tokenizer", "tokenizer-as-target", "target must be a causal language model (transformers' "
                                                "AutoModelForCausalLM), got PreTrainedTokenizerFast"),
    ("target-meta", "meta-target", "target is on the meta device"),
    ("eos-digits-string", dict(eos_token_id="445"), "eos_token_id must be an integer id or a list of ids, got the "
                                                    "string '445'"),
    ("eos-token-string", "eos-token-string", "got the string '<|endoftext|>'; pass tokenizer.eos_token_id, not "
                                             "tokenizer.eos_token"),
    ("eos-float", dict(eos_token_id=3.0), "eos_token_id must be integer token ids, got 3.0"),
    ("eos-float-in-list", dict(eos_token_id=[0, 2.5]), "eos_token_id must be integer token ids, got 2.5"),
]


@pytest.mark.parametrize("overrides, text", [c[1:] for c in GENERATE_CASES], ids=[c[0] for c in GENERATE_CASES])
def test_generate_refuses(toy, overrides, text) -> None:
    if overrides == "tokenizer-as-target":
        overrides = dict(target=toy[2])
    elif overrides == "meta-target":
        overrides = dict(target=_meta_model(toy))
    elif overrides == "eos-token-string":
        overrides = dict(eos_token_id=toy[2].eos_token)
    _refused(lambda: _generate(toy, **overrides), ValueError, text)


def test_generate_still_takes_integer_ids_of_any_kind(toy) -> None:
    import numpy as np

    plain = _generate(toy).tokens
    assert torch.equal(_generate(toy, input_ids=torch.tensor([[17, 121]])).tokens, plain)
    assert torch.equal(_generate(toy, input_ids=np.array([17, 121])).tokens, plain)
    assert torch.equal(_generate(toy, eos_token_id=torch.tensor([0])).tokens, _generate(toy, eos_token_id=[0]).tokens)


def test_hf_assisted_generate_checks_ids_too(toy) -> None:
    from companion.speculative.hf import hf_assisted_generate

    target, drafter, _ = toy
    _refused(lambda: hf_assisted_generate(target, drafter, [1, 600], policy="constant:2", max_new_tokens=2),
             ValueError, "input_ids[1] = 600 is not a token id")


# -------------------------------------------------------------------------------------------------
# load_pair, --set overrides


def test_a_mistyped_preset_fails_at_once_offline(monkeypatch) -> None:
    from companion.models import WeightsUnavailableError, load_pair

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # even with the hub allowed, a bare name is never sent there
    start = time.perf_counter()
    _refused(lambda: load_pair("defualt"), WeightsUnavailableError,
             "Could not load the tokenizer 'defualt': it is not a preset (default), not a local folder, and not in "
             "the local Hugging Face cache; a name without '/' is not looked up on the hub (hub ids look like "
             "org/name, e.g. Qwen/Qwen3-1.7B). Did you mean the preset 'default'?")
    assert time.perf_counter() - start < 10


@pytest.mark.parametrize("name, bare", [("defualt", True), ("gpt2", True), ("Qwen/Qwen3-1.7B", False),
                                         ("./models/target", False), ("/abs/target", False)])
def test_only_org_slash_name_goes_to_the_hub(name, bare) -> None:
    from companion.models import is_bare_name

    assert is_bare_name(name) is bare


OVERRIDE_CASES = [
    ("unknown", {"nosuch": "1"}, "nosuch=1: unknown config key 'nosuch'; known: seed, vocab_size"),
    ("not-an-integer", {"target_stage.steps": "abc"}, "target_stage.steps=abc: expected an integer (now 2000), "
                                                      "got 'abc'"),
    ("not-a-boolean", {"answer_only_loss": "maybe"}, "answer_only_loss=maybe: expected true or false, got 'maybe'"),
]


@pytest.mark.parametrize("overrides, text", [c[1:] for c in OVERRIDE_CASES], ids=[c[0] for c in OVERRIDE_CASES])
def test_config_overrides_refuse(overrides, text) -> None:
    from companion.tiny_pair.config import ConfigOverrideError, apply_overrides, default_config

    _refused(lambda: apply_overrides(default_config(), overrides), ConfigOverrideError, text)
    assert issubclass(ConfigOverrideError, KeyError) and issubclass(ConfigOverrideError, ValueError)
