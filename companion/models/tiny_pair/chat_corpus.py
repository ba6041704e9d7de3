"""The closed-world pair's chat corpus: its chat format and the generator of its conversations.

A conversation is a request of the "closed" task set (:mod:`companion.models.tiny_pair.closed_tasks`:
memorised facts and rules over small closed sets, with deliberate alternatives) and its answer,
a pure function of ``(seed, index, stream)`` through :class:`random.Random`. The committed pair
was trained on the "train" stream and its ``prompts.jsonl`` holds user turns of the "prompts"
stream (``line`` is the index), so its prompts can be regenerated and its answers checked
(:mod:`companion.models.tiny_pair.tasks_report`). The earlier "mixed" set (copying, open-ended requests
on standard-library code) was retired with the training recipe; see ``companion.models.tiny_pair``'s docstring.

The chat format follows Qwen3's template with thinking disabled::

    <|im_start|>user\\n{question}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{answer}<|im_end|>
"""
from __future__ import annotations

import random
from collections.abc import Sequence

from companion.models.tiny_pair.chat_basics import (  # noqa: F401 (re-exported: the corpus's public names)
    CAPITALS, HOUSE_STYLE_SHARE, MONTHS, WEEKDAYS, CodeUnit, Material, Task, _answer)
from companion.models.tiny_pair.closed_tasks import CLOSED_TASKS, closing
from companion.models.tiny_pair.corpus import SourceFile
from companion.models.tiny_pair.tokenizer import IM_END, IM_START, THINK_CLOSE, THINK_OPEN

#: The corpus's task sets (the committed pair's manifest records ``config.task_set``).
TASK_SETS = ("closed",)
#: The committed pair's task set.
DEFAULT_TASK_SET = "closed"

GENERATION_PREFIX = f"{IM_START}assistant\n{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


def user_turn(text: str) -> str:
    """``text`` as a user turn followed by the assistant's opening (where decoding starts)."""
    return f"{IM_START}user\n{text}{IM_END}\n{GENERATION_PREFIX}"


def conversation(question: str, answer: str) -> str:
    """One complete conversation: user turn, assistant turn, closed by ``<|im_end|>``."""
    return user_turn(question) + answer + IM_END


def make_material(files: Sequence[SourceFile] = ()) -> Material:
    """The material the tasks draw from: none for the closed set, whose requests use no standard-library
    text (``files``, a split of :mod:`companion.models.tiny_pair.corpus`, is what the retired mixed set read)."""
    return Material((), (), ())


def tasks_of(task_set: str) -> dict[str, tuple[Task, float]]:
    """The task table (task: (function, weight)) of ``task_set``; only "closed" remains."""
    if task_set == "closed":
        return CLOSED_TASKS
    raise ValueError(f"unknown chat task set {task_set!r}; expected one of {', '.join(TASK_SETS)}")


def closer_of(task_set: str, task: str) -> str:
    """A fixed closing sentence appended to a task's answers: none in the closed set, whose closings are
    alternatives drawn like the rest of its answer (``task_set`` is checked)."""
    tasks_of(task_set)
    return ""


def generate(material: Material, seed: int, index: int, stream: str = "train",
             task_set: str = DEFAULT_TASK_SET) -> tuple[str, str, str]:
    """``(task name, question, answer)`` of conversation ``index`` of ``stream`` under ``seed`` (a pure function).

    ``stream`` names an independent sequence ("train", "eval", "prompts"): the random generator is
    seeded with the string ``f"chat:{task_set}:{stream}:{seed}:{index}"``.
    """
    tasks = tasks_of(task_set)
    rng = random.Random(f"chat:{task_set}:{stream}:{seed}:{index}")
    names = list(tasks)
    name = rng.choices(names, weights=[tasks[n][1] for n in names])[0]
    q, a = tasks[name][0](rng, material)
    return name, q, a + closing(rng)


def conversations(material: Material, seed: int, n: int, stream: str = "train",
                  task_set: str = DEFAULT_TASK_SET) -> list[str]:
    """``n`` complete conversations (user turn, assistant turn, ``<|im_end|>``) of ``stream`` from ``seed``."""
    return [conversation(q, a) for _, q, a in (generate(material, seed, i, stream, task_set) for i in range(n))]
