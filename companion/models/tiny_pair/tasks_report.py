"""Is an answer right? Every answer the closed task set could have written to a request, and the check.

The pair's prompts are user turns of the generator's "prompts" stream (``source = "chat:<task>"``,
``line`` the index). Regenerating request ``line`` and enumerating every alternative its task
offers (wordings, closings, open choices of content) gives the set of valid answers, so only what
the request fixes decides: an answer is right when, stripped of surrounding white space, it is one
of them. The committed pair's manifest reports its target right on all of its 64 regime prompts
(``figures``); tests/test_closed_tasks.py checks that claim on the committed weights.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from companion.models.tiny_pair import chat_basics as basics
from companion.models.tiny_pair import chat_corpus as chat_mod
from companion.models.tiny_pair.chat_corpus import DEFAULT_TASK_SET


def valid_answers(material: chat_mod.Material, seed: int, line: int, stream: str = "prompts",
                  task_set: str = DEFAULT_TASK_SET) -> tuple[str, set[str]]:
    """``(task, answers)``: every answer the generator could write to request ``line`` of ``stream``.

    The task is rerun with the same random stream; each wording or content choice (``_answer``) is
    replaced by a placeholder of its own after drawing the same random numbers, so the content is the
    generator's own; then every placeholder is replaced by each of its options, the last choice first
    (a choice's options may contain the placeholders of earlier choices, never of later ones).
    """
    options: list[tuple[str, tuple[str, ...]]] = []
    original = basics._answer

    def recording(rng: random.Random, house: str, *others: str, weights=None) -> str:
        original(rng, house, *others, weights=weights)  # the same draws, so everything after it is the same
        placeholder = chr(0xE000 + len(options))  # private-use characters: never in a generated text
        options.append((placeholder, (house, *others)))
        return placeholder

    basics._answer = recording
    try:
        task, _, answer = chat_mod.generate(material, seed, line, stream, task_set)
    finally:
        basics._answer = original
    bases = {answer}
    for placeholder, opts in reversed(options):
        bases = {b.replace(placeholder, o) for b in bases for o in opts}
    return task, {b.strip() for b in bases}


def answer_is_right(task: str, answer: str, valid: set[str], task_set: str = DEFAULT_TASK_SET) -> bool:
    """The greedy answer (white space stripped) is one of the task's valid answers (``task_set`` is checked)."""
    chat_mod.tasks_of(task_set)
    return answer.strip() in valid


def request_of(templated: str) -> str:
    """The user's words of a templated prompt (between the user header and the end of the turn)."""
    head = f"{chat_mod.IM_START}user\n"
    body = templated[len(head):] if templated.startswith(head) else templated
    return body.split(chat_mod.IM_END, 1)[0]


def greedy_answer(target: Any, tokenizer: Any, prompt_text: str, max_steps: int,
                  eos: Sequence[int]) -> tuple[list[int], torch.Tensor]:
    """``(tokens, logits)``: the target's greedy answer to ``prompt_text`` (at most ``max_steps`` tokens, up to and
    including its first token in ``eos``) and, teacher-forced in one forward, its float64 logits at each of them."""
    ids = tokenizer(prompt_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    n = ids.shape[1]
    with torch.no_grad():
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_steps, do_sample=False,
                              eos_token_id=list(eos), pad_token_id=tokenizer.pad_token_id)
        gen = seq[0, n:].tolist()
        hits = [i for i, t in enumerate(gen) if t in eos]
        gen = gen[: hits[0] + 1] if hits else gen
        logits = target(input_ids=seq[:, : n + len(gen)]).logits[0, n - 1:-1].double()
    return gen, logits
