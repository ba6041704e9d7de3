"""The real Qwen3 shapes, for testing the harvest at full vocabulary size without the weights.

:data:`QWEN3_SHAPES` holds the architecture of Qwen3-0.6B, Qwen3-1.7B and Qwen3-4B as their
``config.json`` files on the Hugging Face hub state it (``Qwen/Qwen3-0.6B`` etc.), cross-checked
against the Qwen3 technical report (arXiv:2505.09388, Table 1: layers, query/KV heads, tied
embeddings) and the model cards (total vs non-embedding parameters). Notably **all three tie
their input and output embeddings**: Qwen3-4B has 4.0B parameters of which 3.6B non-embedding,
and 151,936 x 2,560 = 0.39B is exactly one embedding matrix; the first untied size is Qwen3-8B
(8.2B total, 6.95B non-embedding: two matrices of 151,936 x 4,096).

:func:`random_qwen3` builds a randomly initialised ``Qwen3ForCausalLM`` of such a shape, with
fewer layers if asked (the vocabulary, hidden size, heads and MLP width stay the real ones, so
the logits have the real shape and the per-layer cost is the real one).
"""
from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

QWEN3_VOCAB = 151_936

_COMMON: dict[str, Any] = {
    "vocab_size": QWEN3_VOCAB,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 40_960,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "attention_bias": False,
    "tie_word_embeddings": True,
    "bos_token_id": 151_643,
    "eos_token_id": 151_645,
    "initializer_range": 0.02,
}

QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": _COMMON | {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                             "num_attention_heads": 16},
    "Qwen3-1.7B": _COMMON | {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                             "num_attention_heads": 16},
    "Qwen3-4B": _COMMON | {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                           "num_attention_heads": 32},
}
"""``config.json`` fields of the real models (``Qwen/<name>``) that fix the architecture."""


def qwen3_config(name: str, num_hidden_layers: int | None = None, **overrides: Any) -> Qwen3Config:
    """The configuration of ``name`` (a key of :data:`QWEN3_SHAPES`), optionally with fewer layers."""
    if name not in QWEN3_SHAPES:
        raise ValueError(f"unknown Qwen3 shape {name!r}; known: {', '.join(QWEN3_SHAPES)}")
    fields = dict(QWEN3_SHAPES[name])
    if num_hidden_layers is not None:
        if num_hidden_layers < 1:
            raise ValueError("num_hidden_layers must be >= 1")
        fields["num_hidden_layers"] = num_hidden_layers
    fields.update(overrides)
    return Qwen3Config(**fields)


def random_qwen3(name: str, num_hidden_layers: int | None = 2, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                 logit_scale: float = 1.0, **overrides: Any) -> Qwen3ForCausalLM:
    """A random ``Qwen3ForCausalLM`` of the shape ``name`` (eval mode, on the CPU).

    Every weight matrix is drawn uniformly with the standard deviation of the model's own
    initialisation (``initializer_range``; uniform because it is twice as fast as normal draws at
    these sizes, and the shape of the distribution does not matter here) from a generator seeded
    with ``seed``; norms start at 1. With tied embeddings and RMS-normalised final states such a
    model's logits have a standard deviation of about ``0.02 * sqrt(hidden_size)``: nearly flat
    distributions over 151,936 tokens. ``logit_scale`` multiplies the final norm's weight, and so
    every logit, to get the peaked distributions of a trained model (about 10 for the 0.6B shape
    gives a median top-1 probability near 0.5): the benchmark uses it.
    """
    from transformers.modeling_utils import no_init_weights

    config = qwen3_config(name, num_hidden_layers, **overrides)
    with no_init_weights():  # skip the default initialisation: we draw every weight once below
        model = Qwen3ForCausalLM(config)
    g = torch.Generator().manual_seed(seed)
    bound = config.initializer_range * 3 ** 0.5  # uniform(-b, b) has standard deviation b / sqrt(3)
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied embeddings appear once
            if p.dim() >= 2:
                p.uniform_(-bound, bound, generator=g)
            else:
                p.fill_(1.0)  # RMSNorm weights (Qwen3 has no biases)
        model.model.norm.weight.mul_(logit_scale)
    return model.to(dtype).eval()
