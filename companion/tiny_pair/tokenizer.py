"""Byte-level BPE tokenizer for the embedded pair, trained with the ``tokenizers`` library.

Byte-level means every string round-trips (no unknown token), as with Qwen3's tokenizer. The
trained tokenizer is wrapped in a ``PreTrainedTokenizerFast`` so ``AutoTokenizer.from_pretrained``
loads it like any hub tokenizer.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"  # same spelling as Qwen3's document separator
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS: tuple[str, ...] = (EOS_TOKEN, PAD_TOKEN)


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``.

    Special tokens get ids 0 and 1; the 256 byte symbols follow, then merges in training order.
    """
    tok = Tokenizer(models.BPE())
    # GPT-2 style split regex: whitespace runs (indentation) stay separate from words.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a raw ``tokenizers.Tokenizer`` with the eos/pad conventions used by the pair."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,  # source code: never rewrite " ," etc. on decode
        model_max_length=1 << 30,
    )
    return fast
