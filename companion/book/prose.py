"""Verdicts the book's pages print, computed from the numbers they summarise.

The outcome of a cost ratio as data (:func:`outcome`: cheaper, dearer, not resolved, identical)
and the few phrases chapter 8 still glues, with one branch per outcome, so that a page reads right
whatever the data. The decode-time chapters state their verdicts in hand-written prose, each
checked beside it by :class:`companion.book.claims.Claims`. ``tests/test_book_prose.py`` checks
every branch.

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


def at_ceiling(run: float, ceiling: float, digits: int = 2) -> bool:
    """Whether a mean certified run equals the every-step-certified ceiling to the ``digits``
    decimals the page prints (so that the page must say the run is the ceiling)."""
    return round(run, digits) == round(ceiling, digits)


def low_margin_tightness(greedy: float, relaxed: dict[str, float], overall_greedy: float) -> str:
    """Chapter 8's summary of tightness (certified / accepted) in the lowest-margin bin: whether
    the relaxed criteria and trees explain more of the drafter's acceptances there than strict
    greedy does, from the numbers themselves. ``relaxed``: label -> tightness in that bin;
    ``overall_greedy``: strict greedy's tightness over every step."""
    part = ("They explain only part of this drafter's acceptances" if overall_greedy < 1 else
            "Here they explain every one of the drafter's acceptances under strict greedy")
    shares = ", ".join(f"{v:.1%} of {k}'s" for k, v in relaxed.items())
    above = [k for k, v in relaxed.items() if v > greedy]
    if len(above) == len(relaxed):
        return (f"{part}. In the lowest-margin bin, where strict greedy's certificate vanishes with the margin, "
                f"the relaxed criteria's certificates explain more: {shares}, against {greedy:.1%} of strict greedy's")
    if not above:
        return (f"{part}. In the lowest-margin bin the relaxed criteria's certificates explain no more than strict "
                f"greedy's on this pair: {shares}, against {greedy:.1%} of strict greedy's")
    return (f"{part}. In the lowest-margin bin some relaxed criteria explain more than strict greedy and some do not: "
            f"{shares}, against {greedy:.1%} of strict greedy's")


def margin_trend(lo: float, hi: float, label: str) -> str:
    """Whether ``label``'s tightness is higher in the highest-margin bin than in the lowest, as
    the numbers say (equal to the printed digit: no change)."""
    if round(hi, 3) > round(lo, 3):
        return f"{label}'s certificate explains more of the acceptances at large margins than at small ones ({hi:.1%} against {lo:.1%})"
    if round(hi, 3) < round(lo, 3):
        return (f"{label}'s certificate explains fewer of the acceptances at large margins than at small ones on this pair "
                f"({hi:.1%} against {lo:.1%})")
    return f"{label}'s certificate explains the same share of the acceptances at large and small margins ({hi:.1%})"
