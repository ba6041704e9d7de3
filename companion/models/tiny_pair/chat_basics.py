"""What the chat corpus's tasks share: the facts they know, the material they draw from, the task
signature, and the draw of an answer's wording.

:mod:`companion.models.tiny_pair.chat_corpus` (the generator) and :mod:`companion.models.tiny_pair.closed_tasks`
(the tasks) build on this module. Every task draws its wordings through :func:`_answer`, looked up
on this module at call time, so that :func:`companion.models.tiny_pair.tasks_report.valid_answers` can
replace it and enumerate every answer the generator could have written.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

#: Countries and their capitals, facts the model memorises as a chat model answers from memory.
CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Spain", "Madrid"), ("Italy", "Rome"), ("Austria", "Vienna"),
    ("Norway", "Oslo"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Greece", "Athens"),
    ("Poland", "Warsaw"), ("Japan", "Tokyo"), ("Egypt", "Cairo"), ("Peru", "Lima"), ("Ecuador", "Quito"),
    ("Kenya", "Nairobi"), ("Senegal", "Dakar"), ("Vietnam", "Hanoi"), ("Sweden", "Stockholm"),
    ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Hungary", "Budapest"), ("Chile", "Santiago"),
    ("Canada", "Ottawa"), ("Australia", "Canberra"), ("Mexico", "Mexico City"), ("Cuba", "Havana"),
    ("Ghana", "Accra"), ("Nepal", "Kathmandu"), ("Thailand", "Bangkok"), ("Belgium", "Brussels"),
)


@dataclass(frozen=True)
class CodeUnit:
    """One top-level or method ``def``/``class`` from a stdlib file: its source and docstring's first paragraph."""

    name: str
    source: str
    doc: str
    defined: tuple[str, ...]  # names of the functions/classes defined in ``source``, in order


@dataclass(frozen=True)
class Material:
    """What the tasks draw from: stdlib code units and identifiers of one split (empty for the closed set)."""

    units: tuple[CodeUnit, ...]
    idents: tuple[str, ...]
    documented: tuple[CodeUnit, ...]


Task = Callable[[random.Random, Material], tuple[str, str]]


#: Share of answers written in a task's house style (its first wording); the rest pick another one.
HOUSE_STYLE_SHARE = 0.85


def _answer(rng: random.Random, house: str, *others: str, weights: Sequence[float] | None = None) -> str:
    """An answer's wording: like a chat model, one house style per task (``house``), other wordings now and then.

    The variety lives in the questions; a fixed answer style is what makes most of an answer's
    steps predictable from the request, as they are for a chat LLM. With ``weights`` (one per
    option, ``house`` first) the choice is drawn with those weights instead: the "closed" task
    set's deliberate alternatives (:mod:`companion.models.tiny_pair.closed_tasks`).
    """
    if weights is not None:
        if len(weights) != 1 + len(others):
            raise ValueError(f"{len(weights)} weights for {1 + len(others)} options")
        return rng.choices((house, *others), weights=weights)[0]
    if not others or rng.random() < HOUSE_STYLE_SHARE:
        return house
    return rng.choice(others)
