"""The drafting policy interface and transformers' three built-in schedules (``constant``, ``confidence``,
``heuristic``); their specs and the exact behaviour they reproduce are described in
:mod:`companion.speculative.policies`, which parses them."""
from __future__ import annotations

import copy
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

DEFAULT_NUM_ASSISTANT_TOKENS = 20
"""transformers 4.57's ``GenerationConfig.num_assistant_tokens`` default."""
DEFAULT_CONFIDENCE_THRESHOLD = 0.4
"""transformers 4.57's ``GenerationConfig.assistant_confidence_threshold`` default."""


@dataclass(frozen=True)
class DraftStep:
    """What the decoder tells a policy about one drafter call.

    ``q1`` and ``q2`` are the drafter's two largest probabilities (the drafted token has ``q1``:
    drafting is greedy), ``rho`` the drafter-side certificate of the verification criterion
    (``nan`` unless the policy asked for it).
    """

    token: int
    q1: float
    q2: float
    rho: float = math.nan


@dataclass(frozen=True)
class RoundOutcome:
    """The verification result of one round, as the decoder reports it to the policy.

    ``drafted`` drafter calls were made, ``submitted`` drafts verified, ``accepted`` of them
    accepted (a prefix). ``kl`` holds ``KL(p || q)`` at the verified positions
    ``1 .. min(accepted + 1, submitted)`` when the policy asked for it, else is empty.
    """

    drafted: int
    submitted: int
    accepted: int
    kl: tuple[float, ...] = ()

    @property
    def verified(self) -> int:
        """Positions where both ``p`` and ``q`` are known on the true prefix."""
        return min(self.accepted + 1, self.submitted)


class Policy(ABC):
    """A drafting policy. The decoder calls, every round:

    ``start_round(cap)``; then, while ``wants_draft(n)`` (``n`` drafts so far, ``n < cap``), one
    drafter call followed by ``observe(step)``; then ``submit(n)`` (how many drafts to verify);
    and after verification ``end_round(outcome)``.
    """

    needs_certificate: ClassVar[bool] = False
    needs_kl: ClassVar[bool] = False

    def start_round(self, cap: int) -> None:
        """A new round may draft at most ``cap`` tokens (the length budget)."""
        self._cap = cap

    @abstractmethod
    def wants_draft(self, n_drafted: int) -> bool:
        """Whether to make another drafter call after ``n_drafted`` this round."""

    def observe(self, step: DraftStep) -> None:
        """The drafter's distribution at the token just drafted."""

    def submit(self, n_drafted: int) -> int:
        """How many of the ``n_drafted`` drafts to verify (a prefix); all by default."""
        return n_drafted

    def end_round(self, outcome: RoundOutcome) -> None:
        """Feedback after verification."""

    def fresh(self) -> Policy:
        """An independent copy (same knobs and current state)."""
        return copy.deepcopy(self)


@dataclass
class Constant(Policy):
    """Draft ``k`` tokens every round (within the length budget)."""

    k: int

    def wants_draft(self, n_drafted: int) -> bool:
        return n_drafted < min(self.k, self._cap)

    def __str__(self) -> str:
        return f"constant:{self.k}"


@dataclass
class Confidence(Policy):
    """Draft up to ``k`` tokens; stop after a draft with drafter probability ``q1 < threshold``."""

    threshold: float
    k: int = DEFAULT_NUM_ASSISTANT_TOKENS
    _stop: bool = field(default=False, repr=False)

    def start_round(self, cap: int) -> None:
        super().start_round(cap)
        self._stop = False

    def wants_draft(self, n_drafted: int) -> bool:
        return not self._stop and n_drafted < min(self.k, self._cap)

    def observe(self, step: DraftStep) -> None:
        if step.q1 < self.threshold:
            self._stop = True

    def __str__(self) -> str:
        return f"confidence:{_num(self.threshold)}" + ("" if self.k == DEFAULT_NUM_ASSISTANT_TOKENS else f",{self.k}")


@dataclass
class Heuristic(Policy):
    """transformers' ``heuristic`` schedule: ``K += 2`` after a fully accepted round, else ``K = max(1, K - 1)``.

    ``K`` starts at ``k0`` and is a float truncated by ``int``; ``threshold > 0`` adds the
    confidence stop of :class:`Confidence`.
    """

    k0: int = DEFAULT_NUM_ASSISTANT_TOKENS
    threshold: float = 0.0
    k: float = field(default=math.nan, repr=False)
    _stop: bool = field(default=False, repr=False)

    def __post_init__(self) -> None:
        if math.isnan(self.k):
            self.k = float(self.k0)

    def start_round(self, cap: int) -> None:
        super().start_round(cap)
        self._stop = False

    def wants_draft(self, n_drafted: int) -> bool:
        return not self._stop and n_drafted < min(int(self.k), self._cap)

    def observe(self, step: DraftStep) -> None:
        if step.q1 < self.threshold:
            self._stop = True

    def end_round(self, outcome: RoundOutcome) -> None:
        if outcome.accepted == outcome.submitted:
            self.k += 2.0
        else:
            self.k = max(1.0, self.k - 1.0)

    def __str__(self) -> str:
        return f"heuristic:{self.k0}" + (f",{_num(self.threshold)}" if self.threshold > 0 else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))
