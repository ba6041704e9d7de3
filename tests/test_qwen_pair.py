"""The book's main pair, Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct, as setup.sh
converts it: the models and tokenizer are Qwen's, the conversion equals transformers' own GGUF load
cast to bfloat16, the harvest equals generate, and transformers' assisted generation follows the
harvest's rounds up to near ties. CI fetches and converts the pair once (scripts/setup.sh)."""
from __future__ import annotations

import logging

import os

import pytest
import torch

from companion.models.loading import load_pair, load_tokenizer, vocabulary_sha256
from companion.models.weights import converted_dir, ensure_converted, source
from companion.models.weights.convert import cache_is_current

TARGET, DRAFTER = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _converted(name: str):
    """The converted folder; in CI it must be there (setup.sh made it), elsewhere the test is skipped."""
    folder = converted_dir(source(name))
    if not cache_is_current(folder, source(name)):
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not converted in the cache: scripts/setup.sh should have fetched it")
        pytest.skip(f"{name} is not converted here: run `companion fetch-weights` (setup.sh does)")
    return folder


@pytest.fixture(scope="module")
def pair():
    _converted(TARGET), _converted(DRAFTER)
    return load_pair("qwen2.5-coder", device="cpu")


def test_the_models_are_qwens_and_load_in_bfloat16(pair) -> None:
    target, drafter, tok = pair
    assert target.dtype == drafter.dtype == torch.bfloat16, "the registry's dtype on a CPU with bf16"
    t, d = target.config, drafter.config
    assert (t.model_type, t.num_hidden_layers, t.hidden_size, t.vocab_size) == ("qwen2", 28, 1536, 151936)
    assert (d.model_type, d.num_hidden_layers, d.hidden_size, d.vocab_size) == ("qwen2", 24, 896, 151936)
    assert sum(p.numel() for p in target.parameters()) == 1_777_088_000
    # Answers end at <|im_end|> (and <|endoftext|>), pad with <|endoftext|>; encoding adds no token.
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert target.generation_config.eos_token_id == [151645, 151643]
    assert tok("def f(x): return x").input_ids == tok("def f(x): return x", add_special_tokens=False).input_ids
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_the_two_tokenizers_are_one_and_another_vocabulary_is_refused() -> None:
    a, b = load_tokenizer(_converted(TARGET)), load_tokenizer(_converted(DRAFTER))
    assert vocabulary_sha256(a) == vocabulary_sha256(b) and len(a) == len(b) == 151936
    smol = ensure_converted("smollm2-135m-instruct", progress=False)
    with pytest.raises(ValueError, match="tokenizers differ") as err:
        load_pair("qwen2.5-coder", smol, device="cpu")
    assert "\n" not in str(err.value)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_the_regex_warning_of_transformers_is_a_misfire_that_the_loader_silences() -> None:
    """transformers 4.57.3+ warns of 'an incorrect regex pattern' for any local folder whose config names its
    version; the pattern is Qwen2's own, so the loader says so (fix_mistral_regex=False) and encodes the same."""
    from transformers import AutoTokenizer

    folder = _converted(TARGET)
    seen = _Records()
    hf_logger = logging.getLogger("transformers")  # it does not propagate to the root logger
    hf_logger.addHandler(seen)
    try:
        plain = AutoTokenizer.from_pretrained(folder)
        assert any("incorrect regex pattern" in m for m in seen.messages), "the misfire this test documents"
        seen.messages.clear()
        ours = load_tokenizer(folder)
        assert not [m for m in seen.messages if "regex" in m], seen.messages
    finally:
        hf_logger.removeHandler(seen)
    sample = "Speculative decoding: don't   re-run 12,345 tokens!\n\tdef f(): return 'ä' + \"😀\""
    assert ours(sample).input_ids == plain(sample).input_ids


@pytest.mark.slow
def test_the_conversion_equals_transformers_gguf_load_cast_to_bfloat16(tmp_path) -> None:
    """The 0.5B (the same code converts the 1.5B): every tensor, then the logits of one forward."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from companion.models.weights.fetch import fetch_gguf

    folder = _converted(DRAFTER)
    gguf = fetch_gguf(source(DRAFTER), tmp_path, progress=False)
    # transformers' own GGUF load in bfloat16 (dequantised to float32, then cast as it loads). Not
    # `.to(torch.bfloat16)` after a float32 load: that also casts the rotary inverse frequencies,
    # which transformers keeps in float32, and so changes the logits of every position past the first.
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16).eval()
    gguf.unlink()
    ours = load_file(folder / "model.safetensors")
    theirs = reference.state_dict()
    assert set(ours) == set(theirs)
    differing = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not differing, f"{len(differing)} tensors differ, first {differing[:3]}"
    model = load_pair(str(folder), False, device="cpu", dtype="bfloat16")[0]
    ids = torch.tensor([[151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)


def test_the_harvest_is_generate_and_assisted_generation_follows_its_rounds(pair, tmp_path) -> None:
    """One prompt's 12 greedy steps equal generate's; assisted generation (constant k = 4) parts from the
    harvest's rounds only at near ties of bfloat16 (companion.harvest.ties)."""
    from companion.harvest import load_traces
    from companion.harvest.core import harvest
    from companion.prompts.sets import load_prompts
    from companion.speculative.harvest_rounds import compare_runs, harvest_rows_by_prompt
    from companion.speculative.hf import hf_assisted_generate

    target, drafter, tok = pair
    from companion.prompts.families import retemplated

    prompts = [p.text for p in retemplated(load_prompts("chat-requests")[:2], tok)]
    n = 12
    harvest(target, drafter, tok, prompts, tmp_path / "h", n_steps=n, batch_size=1, progress=False, order="given")
    table = load_traces(tmp_path / "h")
    rows = harvest_rows_by_prompt(table, range(len(prompts)))
    runs = []
    for i, text in enumerate(prompts):
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        out = target.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
        got = out[0, enc.input_ids.shape[1]:].tolist()
        assert got == rows[i]["token"].tolist()[: len(got)], f"prompt {i}: the harvest's tokens are not generate's"
        r = hf_assisted_generate(target, drafter, enc.input_ids[0], policy="constant:4", max_new_tokens=n)
        runs.append((r.tokens.tolist(), r.accepted))
    res = compare_runs(rows, runs, k=4, n=n, dtype="bfloat16")
    assert res.unexplained == 0, res.details


def test_the_chat_requests_reach_qwen_in_its_own_template() -> None:
    """The committed prompt file holds SmolLM2's template; the harvest plan rebuilds each request in the
    answering model's template (Qwen's system turn), keeping ids and order; SmolLM2's comes back unchanged."""
    from companion.prompts.families import retemplated
    from companion.harvest.plan import plan_harvest
    from companion.prompts.sets import load_prompts

    prompts = load_prompts("chat-requests")[:6]
    qwen = load_tokenizer(_converted(TARGET))
    ours = retemplated(prompts, qwen)
    assert [p.prompt_id for p in ours] == [p.prompt_id for p in prompts]
    assert all(p.text.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.") for p in ours)
    assert all("SmolLM" not in p.text and p.n_tokens >= 64 for p in ours)
    smol = load_tokenizer(ensure_converted("smollm2-135m-instruct", progress=False))
    assert retemplated(prompts, smol) == prompts
    assert plan_harvest("qwen2.5-coder", n_prompts=6).prompts == load_prompts("chat-and-stdlib")[:6], \
        "the plan names them (the two families in turn); loading templates them"
