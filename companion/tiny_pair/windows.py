"""Text into token windows: the training stream and the evaluation windows of the pair.

The trainer (``companion.tiny_pair.train``) and ``pair-report`` (``companion.tiny_pair.report``)
both cut text this way, so a report scores exactly the windows its build scored.
"""
from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerFast

from companion.tiny_pair.tokenizer import DOC_SEPARATOR, THINK_CLOSE


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts tokenised and joined into one 1-D stream, each followed by ``<|endoftext|>`` (the document separator)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)
    flat: list[int] = []
    for seq in ids:
        flat.extend(seq)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


def answer_weights(tokenizer: PreTrainedTokenizerFast, texts: list[str], answer_only: bool) -> torch.Tensor:
    """Per-token loss weights aligned with :func:`token_stream` ``(tokenizer, texts)``.

    With ``answer_only``, a token counts (weight 1) when it follows the conversation's ``</think>``
    (the assistant's answer, its ``<|im_end|>`` and the separator after it); the user turn weighs 0,
    because a chat model is trained on its answers, and the user turns here are random lists whose
    prediction would only take capacity from learning to answer. Texts without ``</think>``
    (natural text) weigh 1 throughout.
    """
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    close = tokenizer.convert_tokens_to_ids(THINK_CLOSE)
    flat: list[float] = []
    for seq in ids:
        start = seq.index(close) + 1 if answer_only and close in seq else 0
        flat.extend([0.0] * start + [1.0] * (len(seq) - start + 1))  # + 1: the separator
    return torch.tensor(flat, dtype=torch.float32)


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len`` tokens, shape (n, seq_len); the tail that doesn't fill one is dropped."""
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)
