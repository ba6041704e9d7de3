"""The closed-world pair's special tokens and chat template (its committed ``tokenizer/`` holds both).

The tokenizer itself, a byte-level BPE of 4,096 tokens, was trained once by the retired
``companion retrain`` (see :mod:`companion.models.tiny_pair`) and is frozen in the committed assets;
these constants are how the chat corpus writes its turns.
"""
from __future__ import annotations

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
