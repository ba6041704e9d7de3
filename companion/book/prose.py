"""Verdicts as data, for the claims beside the book's hand-written prose.

The outcome of a cost ratio (:func:`outcome`: cheaper, dearer, not resolved, identical) and a
percentage that never prints "-0%". The chapters state their verdicts in hand-written prose,
each checked beside it by :class:`companion.book.claims.Claims`; nothing here writes a sentence.
``tests/test_book_prose.py`` checks every branch.

A cost ratio is anything with ``point``, ``lo`` and ``hi`` (the point estimate and the 95 %
paired-bootstrap interval of ``cost(certificate policy) / cost(other)``).
"""
from __future__ import annotations

from typing import Protocol


class Ratio(Protocol):
    point: float
    lo: float
    hi: float


SAME, CHEAPER, DEARER, UNRESOLVED = "same", "cheaper", "dearer", "unresolved"


def percent(x: float, digits: int = 0) -> str:
    """``x`` as a percentage with ``digits`` decimals, a value that rounds to zero without a sign ("0%", not "-0%")."""
    text = f"{x:.{digits}%}"
    return text[1:] if text.startswith("-") and not any(d in text for d in "123456789") else text


def outcome(est: Ratio) -> str:
    """``same``: the ratio is exactly 1 in every resample (the two cost the same on every prompt);
    ``cheaper`` / ``dearer``: the whole interval is below / above 1; else ``unresolved``."""
    if est.lo == est.point == est.hi == 1.0:
        return SAME
    if est.hi < 1.0:
        return CHEAPER
    if est.lo > 1.0:
        return DEARER
    return UNRESOLVED
