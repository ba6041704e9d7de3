"""The request families together: their prompts rebuilt in the chat template of the model that answers.

The committed prompt files of the request families (:mod:`companion.prompts.chat_requests` and
:mod:`companion.prompts.stdlib_requests`) are templated with SmolLM2's tokenizer; a harvest of
another model (:mod:`companion.harvest.plan`) rebuilds them here in that model's own template.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from companion.prompts import stdlib_requests
from companion.prompts.chat_requests import SOURCE_PREFIX, chat_requests, templated
from companion.prompts.sets import Prompt


def retemplated(prompts: Sequence[Prompt], tokenizer: Any) -> list[Prompt]:
    """``prompts`` in the chat template of ``tokenizer``: the model that answers sees its own template.

    The committed prompt files of the request families (:mod:`companion.prompts.chat_requests` and
    :mod:`companion.prompts.stdlib_requests`) are templated with SmolLM2's tokenizer (its template adds
    SmolLM2's default system turn, naming SmolLM). A prompt of either family (``source`` starting
    with its prefix) is rebuilt from its request's text with :func:`templated`, keeping its id,
    source and position; other prompts are returned as they are. With the tokenizer the files
    were made with, every prompt comes back unchanged.
    """
    families = {SOURCE_PREFIX: lambda: {r.request_id: r.text for r in chat_requests()},
                stdlib_requests.SOURCE_PREFIX: lambda: {r.request_id: r.text for r in stdlib_requests.stdlib_requests()}}
    texts: dict[str, dict[str, str]] = {}
    out: list[Prompt] = []
    for p in prompts:
        family = p.source.split(":", 1)[0] if ":" in p.source else None
        if family not in families:
            out.append(p)
            continue
        if family not in texts:
            texts[family] = families[family]()
        request = texts[family].get(p.prompt_id)
        if request is None:
            raise ValueError(f"prompt {p.prompt_id} names no request of the {family} family")
        text = templated(tokenizer, request)
        out.append(Prompt(p.prompt_id, text, len(tokenizer(text, add_special_tokens=False)["input_ids"]), p.source,
                          p.line))
    return out
