"""Verdicts the book's pages print, computed from the numbers they summarise.

Every function here turns measured numbers into words, with one branch per outcome (cheaper,
dearer, not resolved, identical; within reach or not), so that a page reads right whatever the
data: a null result is stated as a null result, an interval that reaches past a threshold is
said to, and two comparisons with the same outcome are said once. The chapters glue these
strings; ``tests/test_book_prose.py`` checks every branch and ``tests/test_glued_verdicts.py``
recomputes the glued strings of an executed chapter from its glued numbers.

A cost ratio is anything with ``point``, ``lo`` and ``hi`` (the point estimate and the 95 %
paired-bootstrap interval of ``cost(certificate policy) / cost(other)``).
"""
from __future__ import annotations

from collections.abc import Sequence
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


def _join(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def ratio_phrase(est: Ratio, other: str) -> str:
    """One comparison, to follow "the certificate policy is": how it compares with ``other``."""
    pct = abs(est.point - 1.0)
    kind = outcome(est)
    if kind == SAME:
        return (f"exactly as dear as {other} on these prompts: the ratio is 1 in every resample, "
                "so the two cost the same on every prompt")
    # whole percents, but one decimal under 10 % so that a resolved 0.3 % never reads "about 0%"
    size = f"{pct:.1%}" if pct < 0.095 else f"{pct:.0%}"
    if kind == CHEAPER:
        return f"about {size} cheaper than {other}, with the whole interval below 1"
    if kind == DEARER:
        return f"about {size} dearer than {other}, with the whole interval above 1"
    if pct < 0.0005:  # "below 1 by 0.0%" would read as a contradiction: give the ratio itself
        where = "exactly 1" if est.point == 1.0 else f"{est.point:.4f}, within 0.05% of 1,"
        return f"not resolved from {other} on these prompts: the ratio is {where} and its interval contains 1"
    side = "below" if est.point < 1 else "above"
    return f"not resolved from {other} on these prompts: the ratio is {side} 1 by {pct:.1%} but its interval contains 1"


def _size(est: Ratio) -> str:
    """How far the ratio is from 1, as :func:`ratio_phrase` writes it."""
    pct = abs(est.point - 1.0)
    return f"{pct:.1%}" if pct < 0.095 else f"{pct:.0%}"


def _merged_phrase(kind: str, items: Sequence[tuple[Ratio, str]]) -> str:
    """Several comparisons of one outcome (not ``same``) in one clause, numbers in the order named."""
    names = _join([other for _, other in items])
    sizes = _join([_size(est) for est, _ in items])
    if kind == CHEAPER:
        return f"about {sizes} cheaper than {names} respectively, with each whole interval below 1"
    if kind == DEARER:
        return f"about {sizes} dearer than {names} respectively, with each whole interval above 1"
    # each ratio as a number with its side of 1 (a bare "below 1 by 0.6% and 1.0002" reads as two distances)
    where = _join(["exactly 1" if est.point == 1.0 else
                   f"{est.point:.4f} (within 0.05% of 1)" if abs(est.point - 1.0) < 0.0005 else
                   f"{est.point:.3f} ({'below' if est.point < 1 else 'above'} 1 by {abs(est.point - 1.0):.1%})"
                   for est, _ in items])
    return f"not resolved from {names} on these prompts: the ratios are {where} respectively, and each interval contains 1"


def comparisons_phrase(comparisons: Sequence[tuple[Ratio, str]]) -> str:
    """Several comparisons, to follow "the certificate policy is": those with the same outcome
    ``same`` are said together, once ("exactly as dear as A and B ... so they cost the same on
    every prompt"); every other comparison keeps its own numbers."""
    same = [other for est, other in comparisons if outcome(est) == SAME]
    parts = []
    if same:
        who = "the two" if len(same) == 1 else "all of them"
        parts.append(f"exactly as dear as {_join(same)} on these prompts: the ratio is 1 in every resample, "
                     f"so {who} cost the same on every prompt")
    # comparisons of one outcome are said in one clause, each with its own number, so that no
    # clause is repeated ("the ratio is below 1 by 2.8% ...; and ... below 1 by 2.6% ...")
    by_kind: dict[str, list[tuple[Ratio, str]]] = {}
    for est, other in comparisons:
        if outcome(est) != SAME:
            by_kind.setdefault(outcome(est), []).append((est, other))
    for kind, items in by_kind.items():
        parts.append(ratio_phrase(*items[0]) if len(items) == 1 else _merged_phrase(kind, items))
    if len(parts) == 2 and ":" in parts[0]:
        # "... so the two cost the same on every prompt and not resolved from ..." read as one clause
        return parts[0] + "; and it is " + parts[1]
    return _join(parts) if len(parts) <= 2 else "; ".join(parts[:-1]) + "; and " + parts[-1]


def score_added(vs_top1: Ratio, vs_margin: Ratio) -> str:
    """What driving the calibrated rule by the certificate, rather than by ``q(1)`` or the plain
    margin, bought on the measured pair: a sentence that starts "On the pair measured here"."""
    kinds = {outcome(vs_top1), outcome(vs_margin)}
    detail = comparisons_phrase([(vs_top1, "the rule driven by q(1) alone"),
                                 (vs_margin, "the rule driven by the plain margin")])
    if kinds <= {SAME, UNRESOLVED}:
        return ("On the pair measured here the certificate's form, as a score, added nothing measurable over "
                "q(1) or the plain margin: the certificate-driven rule is " + detail + ".")
    if kinds == {CHEAPER}:
        return "On the pair measured here the certificate's form, as a score, paid: the certificate-driven rule is " + detail + "."
    if CHEAPER not in kinds:
        return "On the pair measured here the certificate's form, as a score, cost more than it bought: the certificate-driven rule is " + detail + "."
    return "On the pair measured here the certificate's form, as a score, had mixed effects: the certificate-driven rule is " + detail + "."


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
