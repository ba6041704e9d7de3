"""A Llama whose output head scores only a shortlist of the vocabulary: the shape of SmolLM2's drafter.

A drafter's forward must cost a small fraction of its target's. With SmolLM2's vocabulary of
49,152 tokens and width 576, a full output head alone is 28.3M multiply-adds a token, a fifth
of the whole target. The head here scores only the first ``shortlist_size`` ids, tied to the
input embedding, and gives every other id one shared logit ``r`` (a learned scalar):

    logit_i = e_i . h   for i < N,        logit_i = r   for N <= i < V,

so the model still returns a logit for every id (``[..., V]``, what speculative decoders and
``transformers``' ``assistant_model`` compare id by id), and its distribution has full support:
``q_i = exp(r) / Z > 0`` for the ids past the shortlist, which keeps KL(p || q) finite. The
first ids of a byte-level BPE vocabulary are its earliest merges, mostly frequent tokens (the
idea of FR-Spec's frequency-ranked draft vocabulary, Zhao et al. 2025, arXiv:2502.14856, with
the id order standing in for the frequency ranking): in SmolLM2-135M-Instruct's greedy answers
to 500 of this project's chat requests, ids below 8,192 are 89.3 % of the answer tokens (measured
on the full profile's harvest; chapter 8 reports the share on its own run). An id past the shortlist is never the
argmax unless ``r`` beats every shortlisted logit, in which case the first of them wins, as
``argmax`` picks the first index.

Importing this module registers the config under ``model_type = "shortlist_llama"`` with
``transformers``' Auto classes, so ``AutoModelForCausalLM.from_pretrained`` loads such a folder
(:mod:`companion.models.loading` imports it).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, LlamaModel, LlamaPreTrainedModel

MODEL_TYPE = "shortlist_llama"
#: The state-dict key of the input embedding, which a drafter may share with its target and not store.
SHARED_EMBEDDING_KEY = "model.embed_tokens.weight"


def logit_count(model: Any) -> int:
    """How many logits a causal LM returns per position: its output head's ``out_features`` (a ``Linear``'s
    rows, or the vocabulary of a :class:`ShortlistHead`), else its weight's rows."""
    head = model.get_output_embeddings()
    rows = getattr(head, "out_features", None)
    return int(rows) if isinstance(rows, int) else int(head.weight.shape[0])


class ShortlistLlamaConfig(LlamaConfig):
    """``LlamaConfig`` plus ``shortlist_size``: how many of the first ids the output head scores."""

    model_type = MODEL_TYPE

    def __init__(self, shortlist_size: int = 8192, **kwargs: Any) -> None:
        kwargs["tie_word_embeddings"] = False  # the head reads the embedding itself (ShortlistHead)
        super().__init__(**kwargs)
        if isinstance(shortlist_size, bool) or not isinstance(shortlist_size, int) \
                or not 1 <= shortlist_size <= self.vocab_size:
            raise ValueError(f"shortlist_size must be a whole number in [1, vocab_size = {self.vocab_size}], "
                             f"got {shortlist_size!r}")
        self.shortlist_size = shortlist_size


class ShortlistHead(nn.Module):
    """Logits ``[..., V]``: the input embedding's first ``n`` rows dotted with ``h``, and ``rest_logit`` for the others."""

    def __init__(self, embedding: nn.Embedding, n: int, vocab_size: int) -> None:
        super().__init__()
        # A plain attribute, not a submodule: the embedding's weight belongs to the model's
        # embed_tokens alone (one tensor in the state dict, moved and cast with the model).
        object.__setattr__(self, "_embedding", embedding)
        self.n, self.vocab_size = n, vocab_size
        self.out_features = vocab_size  # logits per position, as a Linear head names it
        self.rest_logit = nn.Parameter(torch.zeros(()))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        scored = F.linear(hidden, self._embedding.weight[: self.n])
        rest = self.rest_logit.to(scored.dtype).expand(*scored.shape[:-1], self.vocab_size - self.n)
        return torch.cat([scored, rest], dim=-1)


class ShortlistLlamaForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` with a :class:`ShortlistHead` in place of its full output projection."""

    config_class = ShortlistLlamaConfig
    _tied_weights_keys: list[str] = []

    def __init__(self, config: ShortlistLlamaConfig) -> None:
        # LlamaForCausalLM.__init__ would allocate and initialise a full V x d head (28M parameters
        # for SmolLM2) only for it to be replaced; the same three steps with the shortlist head instead.
        LlamaPreTrainedModel.__init__(self, config)
        self.model = LlamaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = ShortlistHead(self.model.embed_tokens, config.shortlist_size, config.vocab_size)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, ShortlistHead):
            with torch.no_grad():
                module.rest_logit.zero_()
            return
        super()._init_weights(module)

    def own_parameters(self) -> int:
        """Parameters other than the input embedding (which a drafter may share with its target)."""
        emb = self.model.embed_tokens.weight
        return sum(p.numel() for p in self.parameters() if p is not emb)


AutoConfig.register(MODEL_TYPE, ShortlistLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(ShortlistLlamaConfig, ShortlistLlamaForCausalLM, exist_ok=True)
