"""The drafter's model class (companion.models.shortlist_llama): its head, its loading, its use as transformers' assistant."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from companion.models.shortlist_llama import SHARED_EMBEDDING_KEY, ShortlistLlamaConfig, ShortlistLlamaForCausalLM

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = dict(vocab_size=60, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8, eos_token_id=0, pad_token_id=1, bos_token_id=None)


def drafter(n: int = 20, rest: float = 0.3, seed: int = 0) -> ShortlistLlamaForCausalLM:
    torch.manual_seed(seed)
    m = ShortlistLlamaForCausalLM(ShortlistLlamaConfig(shortlist_size=n, **SHAPE)).eval()
    with torch.no_grad():
        m.lm_head.rest_logit.fill_(rest)
    return m


def test_logits_are_the_embedding_on_the_shortlist_and_one_logit_past_it() -> None:
    m = drafter(n=20, rest=0.3)
    ids = torch.tensor([[3, 7, 11, 2]])
    with torch.no_grad():
        h = m.model(ids).last_hidden_state
        got = m(ids).logits
    assert got.shape == (1, 4, 60)
    assert torch.allclose(got[..., :20], h @ m.model.embed_tokens.weight[:20].T, atol=1e-6, rtol=0)
    assert torch.equal(got[..., 20:], torch.full((1, 4, 40), 0.3))
    # One embedding tensor in the state dict: the head holds no copy of it.
    assert [k for k in m.state_dict() if "embed" in k] == [SHARED_EMBEDDING_KEY]
    assert "lm_head.rest_logit" in m.state_dict() and m.own_parameters() == \
        sum(p.numel() for p in m.parameters()) - 60 * 16
    # The decoders read the vocabulary off the head: every id, not the shortlist.
    from companion.models.shortlist_llama import logit_count

    assert logit_count(m) == 60


def test_an_id_past_the_shortlist_wins_only_by_outscoring_it_and_the_first_such_id_then() -> None:
    m = drafter(n=20, rest=1e4)
    with torch.no_grad():
        assert int(m(torch.tensor([[5]])).logits[0, -1].argmax()) == 20
    low = drafter(n=20, rest=-1e4)
    with torch.no_grad():
        assert int(low(torch.tensor([[5]])).logits[0, -1].argmax()) < 20


def test_it_saves_and_loads_through_the_auto_classes_in_any_dtype(tmp_path) -> None:
    m = drafter()
    m.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.tensor([[3, 7, 11]])
    assert type(back) is ShortlistLlamaForCausalLM and back.config.shortlist_size == 20
    with torch.no_grad():
        assert torch.equal(back(ids).logits, m(ids).logits)
    half = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        out = half(ids).logits
    assert out.dtype == torch.bfloat16 and half.lm_head._embedding is half.model.embed_tokens


def test_transformers_assisted_generation_takes_it_as_assistant_and_keeps_the_targets_greedy_text() -> None:
    torch.manual_seed(1)
    target = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True)).eval()
    with torch.no_grad():
        target.model.embed_tokens.weight.mul_(30)
    ids = torch.tensor([[3, 7, 11, 2]])
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=1, eos_token_id=None)
    with torch.no_grad():
        plain = target.generate(ids, **kw)
        assisted = target.generate(ids, assistant_model=drafter(rest=-5.0), **kw)
    assert torch.equal(plain, assisted)


@pytest.mark.parametrize("n", [0, 61, True, 2.5])
def test_a_shortlist_outside_the_vocabulary_is_refused(n) -> None:
    with pytest.raises(ValueError, match=r"shortlist_size must be a whole number in \[1, vocab_size = 60\]"):
        ShortlistLlamaConfig(shortlist_size=n, **SHAPE)
