"""Transformers' assisted generation on a target/drafter pair: accepted drafts per round.

The closed-world pair's manifest records this figure (``figures.assisted``: 2.43 of 4 drafts a
round); ``benchmarks/bench_smollm2_drafter.py`` measures it on SmolLM2 and its drafter. The other
figures the retired recipe computed (held-out loss, agreement, the regime of greedy steps) are in
the manifest as built; see :mod:`companion.models.tiny_pair`.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from companion.models.devices import torch_threads  # noqa: F401  (callers import it from here)


def _rounded(x: Any) -> Any:
    """Floats to 5 decimals, inside dicts too (as the manifest records figures)."""
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return sorted(ids)


@torch.no_grad()
def assisted_acceptance(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    num_assistant_tokens: int = 4,
    max_new_tokens: int = 128,
    eos_ids: list[int] | None = None,
) -> dict[str, Any]:
    """Hugging Face assisted generation (greedy) with a constant ``num_assistant_tokens`` drafts per round.

    A round is one target forward pass (counted with a forward hook): it verifies the drafts and adds
    one token of the target's own, so per prompt ``accepted = new_tokens - rounds``. The drafter's
    confidence-based early stop is disabled (``assistant_confidence_threshold = 0``) so every round
    proposes exactly ``num_assistant_tokens`` drafts (fewer only at the length limit). Returns the
    mean accepted drafts per round and the mean new tokens per round, pooled over prompts.
    """
    eos = sorted(set(eos_ids if eos_ids is not None else _eos_ids(target, tokenizer)))
    gc = drafter.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = num_assistant_tokens, "constant"
    gc.assistant_confidence_threshold = 0.0
    calls = [0]
    handle = target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    rounds = new = 0
    try:
        for text in prompts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            calls[0] = 0
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter,
                                  num_assistant_tokens=num_assistant_tokens,
                                  num_assistant_tokens_schedule="constant", do_sample=False,
                                  max_new_tokens=max_new_tokens, eos_token_id=eos,
                                  pad_token_id=tokenizer.pad_token_id)
            rounds += calls[0]
            new += out.shape[1] - ids.shape[1]
    finally:
        handle.remove()
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved
    return _rounded({"num_assistant_tokens": num_assistant_tokens, "n_prompts": len(prompts), "rounds": rounds,
                     "new_tokens": new, "accepted_per_round": (new - rounds) / rounds,
                     "tokens_per_round": new / rounds})
