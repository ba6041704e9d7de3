"""Acceptance criteria as lower level sets of the target distribution.

Every criterion accepts a proposed token ``y`` iff ``p_y >= tau(p)`` (typical acceptance: iff
``p_y > tau(p)``, strict, as Medusa implements it), where the threshold ``tau`` depends on the
target ``p`` alone. The rejection region is the lower level set ``R(p) = {y : p_y < tau(p)}``.

====================  ==============================  ==========================================
spec                  class                           ``tau(p)``
====================  ==============================  ==========================================
``greedy``            :class:`StrictGreedy`           ``p(1)``
``additive:D``        :class:`AdditiveRelaxed`        ``p(1) - D``
``multiplicative:A``  :class:`MultiplicativeRelaxed`  ``A * p(1)``
``topm:M``            :class:`TopM`                   ``p(M)``
``topk-delta:K,D``    :class:`TopKDelta`              ``max(p(K), p(1) - D)``
``typical:E,D``       :class:`Typical`                ``min(E, D * exp(-H(p)))`` (strict)
====================  ==============================  ==========================================

``p(i)`` is the i-th largest probability; ``H`` is the entropy in nats. Ties follow from the
rule itself (the level-set convention, used by every part of the library): strict greedy
accepts every maximiser of ``p``, top-m every token tied with ``p(m)``, and a greedy tree
succeeds when the drafter's top ``m`` holds any maximiser. The spec string is the
one form used everywhere (CLI, papermill parameters, file names, trace columns):
``parse_criterion(str(c)) == c`` for every criterion ``c``, and ``str(parse_criterion(s)) == s``
for every canonical spec ``s`` (numbers written as Python's shortest round-trip ``repr``).
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from companion.summary import TopSummary, normalized_probabilities, summarize
from companion.validation import check_token, finite_positive


def _num(x: float) -> str:
    """Shortest string that parses back to the same float; integers without a trailing .0."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


@dataclass(frozen=True)
class Criterion(ABC):
    """An acceptance rule ``accept y iff p_y >= tau(p)`` (``>`` when ``strict``)."""

    strict: ClassVar[bool] = False
    needs_entropy: ClassVar[bool] = False

    @abstractmethod
    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        """``tau`` for every row of a summary, float64 ``[N]``."""

    def top_needed(self) -> int:
        """How many of the largest probabilities ``threshold_from_summary`` reads."""
        return 1

    def check_vocab(self, vocab: int) -> None:
        """Raise ``ValueError`` when the criterion makes no sense for a vocabulary of size ``vocab``."""

    # -- public, tensor-level API ------------------------------------------------------------
    def _summary(self, p: Tensor, from_logits: bool) -> TopSummary:
        self.check_vocab(p.shape[-1])
        return summarize(
            p, from_logits=from_logits, k=self.top_needed(), with_entropy=self.needs_entropy
        )

    def threshold(self, p: Tensor, *, from_logits: bool = False) -> Tensor:
        """``tau(p)`` as float64 with shape ``p.shape[:-1]`` (on the normalised distribution)."""
        s = self._summary(p, from_logits)
        return self.threshold_from_summary(s).reshape(s.lead_shape)

    def accept_from(self, prob: Tensor, tau: Tensor) -> Tensor:
        """The comparison itself: ``prob >= tau`` (or ``>`` for strict criteria)."""
        return prob > tau if self.strict else prob >= tau

    def accepts(self, p: Tensor, token: Tensor | int, *, from_logits: bool = False) -> Tensor:
        """Whether ``token`` (an id, or ids of shape ``p.shape[:-1]``) is accepted; bool tensor."""
        tau = self.threshold(p, from_logits=from_logits)
        tok = check_token(token, p.shape[:-1], p.shape[-1], p.device)
        probs = normalized_probabilities(p, from_logits=from_logits)
        prob = probs.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        return self.accept_from(prob, tau)

    def rejection_mask(self, p: Tensor, *, from_logits: bool = False) -> Tensor:
        """Boolean ``[..., V]`` mask of the rejection region ``R(p)``."""
        tau = self.threshold(p, from_logits=from_logits)
        probs = normalized_probabilities(p, from_logits=from_logits)
        return ~self.accept_from(probs, tau.unsqueeze(-1))


@dataclass(frozen=True)
class StrictGreedy(Criterion):
    """Accept only a target argmax: ``tau = p(1)``."""

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        return s.values[:, 0]

    def __str__(self) -> str:
        return "greedy"


@dataclass(frozen=True)
class AdditiveRelaxed(Criterion):
    """Accept within ``delta`` of the top probability: ``tau = p(1) - delta``, ``delta >= 0``."""

    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", finite_positive("additive delta", self.delta, allow_zero=True))

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        return s.values[:, 0] - self.delta

    def __str__(self) -> str:
        return f"additive:{_num(self.delta)}"


@dataclass(frozen=True)
class MultiplicativeRelaxed(Criterion):
    """Accept within a factor ``alpha`` of the top: ``tau = alpha * p(1)``, ``0 < alpha <= 1``.

    Equivalently the log-probability margin to the top is at most ``log(1/alpha)``.
    """

    alpha: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "alpha", finite_positive("multiplicative alpha", self.alpha, upper=1.0))

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        return self.alpha * s.values[:, 0]

    def __str__(self) -> str:
        return f"multiplicative:{_num(self.alpha)}"


@dataclass(frozen=True)
class TopM(Criterion):
    """Accept any token at least as likely as the m-th most likely: ``tau = p(m)``, ``1 <= m < V``.

    As in TensorRT-LLM's ``relaxed_topk``; ties at ``p(m)`` are all accepted.
    """

    m: int

    def __post_init__(self) -> None:
        if isinstance(self.m, bool) or not isinstance(self.m, int) or self.m < 1:
            raise ValueError(f"topm m must be an integer >= 1, got {self.m!r}")

    def top_needed(self) -> int:
        return self.m

    def check_vocab(self, vocab: int) -> None:
        if self.m >= vocab:
            raise ValueError(f"topm:{self.m} needs m < V, but the vocabulary has V={vocab} tokens")

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        return s.values[:, self.m - 1]

    def __str__(self) -> str:
        return f"topm:{self.m}"


@dataclass(frozen=True)
class TopKDelta(Criterion):
    """TensorRT-LLM MTP relaxed acceptance: in the target's top-k AND ``p >= p(1) - delta``.

    On probabilities, so ``tau = max(p(k), p(1) - delta)``; ``1 <= k <= V``, ``delta >= 0``.
    """

    k: int
    delta: float

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"topk-delta k must be an integer >= 1, got {self.k!r}")
        object.__setattr__(self, "delta", finite_positive("topk-delta delta", self.delta, allow_zero=True))

    def top_needed(self) -> int:
        return self.k

    def check_vocab(self, vocab: int) -> None:
        if self.k > vocab:
            raise ValueError(f"topk-delta:{self.k},... needs k <= V, but the vocabulary has V={vocab} tokens")

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        return torch.maximum(s.values[:, self.k - 1], s.values[:, 0] - self.delta)

    def __str__(self) -> str:
        return f"topk-delta:{self.k},{_num(self.delta)}"


@dataclass(frozen=True)
class Typical(Criterion):
    """Medusa's typical acceptance: accept iff ``p_y > min(eps, delta * exp(-H(p)))`` (strict).

    ``H`` in nats; Medusa's defaults ``eps = 0.09`` (posterior threshold) and ``delta = 0.3``
    (posterior alpha). Since ``exp(-H) <= p(1)``, a target argmax is always accepted when
    ``delta < 1``.
    """

    eps: float = 0.09
    delta: float = 0.3

    strict: ClassVar[bool] = True
    needs_entropy: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps", finite_positive("typical eps", self.eps, upper=1.0))
        object.__setattr__(self, "delta", finite_positive("typical delta", self.delta))

    def threshold_from_summary(self, s: TopSummary) -> Tensor:
        if s.entropy is None:
            raise ValueError("typical acceptance needs the entropy: summarise with with_entropy=True")
        return torch.clamp(self.delta * torch.exp(-s.entropy), max=self.eps)

    def __str__(self) -> str:
        return f"typical:{_num(self.eps)},{_num(self.delta)}"


_NUM = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"
_INT = r"[0-9]+"
_SPECS: tuple[tuple[re.Pattern[str], type[Criterion], tuple[type, ...]], ...] = (
    (re.compile(r"greedy"), StrictGreedy, ()),
    (re.compile(rf"additive:({_NUM})"), AdditiveRelaxed, (float,)),
    (re.compile(rf"multiplicative:({_NUM})"), MultiplicativeRelaxed, (float,)),
    (re.compile(rf"topm:({_INT})"), TopM, (int,)),
    (re.compile(rf"topk-delta:({_INT}),({_NUM})"), TopKDelta, (int, float)),
    (re.compile(rf"typical:({_NUM}),({_NUM})"), Typical, (float, float)),
    (re.compile(r"typical"), Typical, ()),
)
SPEC_FORMS = (
    "greedy",
    "additive:DELTA",
    "multiplicative:ALPHA",
    "topm:M",
    "topk-delta:K,DELTA",
    "typical:EPS,DELTA (or typical for 0.09,0.3)",
)


def parse_criterion(spec: str | Criterion) -> Criterion:
    """Parse a spec string such as ``"additive:0.3"`` or ``"topk-delta:10,0.6"``.

    A :class:`Criterion` is returned unchanged. Raises ``ValueError`` for malformed specs or
    out-of-range parameters, listing the accepted forms.
    """
    if isinstance(spec, Criterion):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"criterion spec must be a string, got {type(spec).__name__}")
    for pattern, cls, types in _SPECS:
        match = pattern.fullmatch(spec)
        if match:
            args = [t(g) for t, g in zip(types, match.groups())]
            try:
                return cls(*args)
            except ValueError as err:
                raise ValueError(f"criterion spec {spec!r}: {err}") from err
    raise ValueError(f"malformed criterion spec {spec!r}; expected one of: {', '.join(SPEC_FORMS)}")


def parse_criteria(specs: str | Criterion | list | tuple) -> list[Criterion]:
    """Parse one spec, a list of specs, or a ``;``-separated string of specs."""
    if isinstance(specs, (str, Criterion)):
        specs = [s for s in specs.split(";")] if isinstance(specs, str) else [specs]
    return [parse_criterion(s.strip() if isinstance(s, str) else s) for s in specs]


PAPER_CRITERIA: tuple[str, ...] = (
    "greedy",
    "additive:0.3",
    "multiplicative:0.1",
    "typical:0.09,0.3",
    "topk-delta:10,0.6",
    "topm:4",
)
"""The six criteria this companion studies: every chapter draws them in this order and every
experiment computes them. From the paper's evaluation, as secondary summaries of
it describe the setting: strict greedy, additive relaxation (0.3), multiplicative relaxation (0.1),
Medusa-style typical acceptance (0.09, 0.3) and top-m (4). ``topk-delta:10,0.6`` (TensorRT-LLM's
combined rule) is this companion's addition, not one of the criteria the abstract names."""
