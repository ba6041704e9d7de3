"""Byte-level BPE tokenizer for the embedded pair, trained with the ``tokenizers`` library.

Byte-level means every string round-trips (no unknown token), as with Qwen3's tokenizer. The
trained tokenizer is wrapped in a ``PreTrainedTokenizerFast`` so ``AutoTokenizer.from_pretrained``
loads it like any hub tokenizer.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

DOC_SEPARATOR = "<|endoftext|>"  # same spelling as Qwen3's document separator
PAD_TOKEN = "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # chat turns, as in Qwen3
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EOS_TOKEN = IM_END  # the end of an assistant answer, as in Qwen3's chat models
SPECIAL_TOKENS: tuple[str, ...] = (DOC_SEPARATOR, PAD_TOKEN, IM_START, IM_END, THINK_OPEN, THINK_CLOSE)

#: Qwen3-style chat template. The model has no thinking mode: the assistant's turn always opens with an
#: empty ``<think>`` block, which is what Qwen3's template writes under ``enable_thinking=False``.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``.

    Special tokens get ids 0..5 (:data:`SPECIAL_TOKENS`); the 256 byte symbols follow, then merges
    in training order. Runs of newlines are split off before the GPT-2 style split, so a prompt that
    ends with ``"\\n\\n"`` is tokenized as a prefix of the same text followed by its answer.
    """
    tok = Tokenizer(models.BPE())
    # GPT-2 style split regex: whitespace runs (indentation) stay separate from words.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
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
        additional_special_tokens=[IM_START, THINK_OPEN, THINK_CLOSE, DOC_SEPARATOR],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
