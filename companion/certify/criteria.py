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
``mars:T``            :class:`Mars`                   ``p(2)`` if ``z(1) > 0`` and ``z(2) / z(1) > T``, else ``p(1)``
====================  ==============================  ==========================================

``p(i)`` is the i-th largest probability (ties counted with multiplicity; ``p(i) = -inf`` for
``i > V``); ``H`` is the entropy in nats. ``z(1) >= z(2)`` are the target's two largest *logits*:
MARS (margin-aware verification) is the one criterion here whose threshold is not a function of
``p`` alone (adding a constant to the logits changes ``z(2) / z(1)``), so it needs logits
(``from_logits=True``) and refuses probabilities; for a given row of logits it is still a lower
level set of ``p`` (top-2 or strict greedy, chosen per row by the ratio).

Ties. Real decoders break exact ties by token id: transformers' assisted generation, vLLM and
TensorRT-LLM take the target's token with ``argmax`` (first index wins) and accept a greedy draft
only if it equals that token; top-m takes an id-based ``topk``. The threshold rule read as a level set (the
*level-set* convention, ``ties="level-set"``) accepts every maximiser of ``p`` instead, and so
promises too much at an exact tie::

    p = [0.4, 0.4, 0.2], q = [0.39, 0.41, 0.2]: KL(p || q) = 0.0003 < rho*_level-set = 0.0437,
    yet argmax p = 0 and argmax q = 1: every real decoder rejects the draft.

The default of every certificate is therefore the *worst case over tie-breaks*
(``ties="worst"``): a token counts as accepted only if every fixed tie-break accepts it. Only
the rank conditions depend on a tie-break (which of several tokens tied across the m-th place
``argmax``/``topk`` keeps); a threshold test ``p_y >= tau`` does not. So a token exactly *at* an
additive, multiplicative or top-k-delta threshold is accepted, as the decoders accept it
(``p_y >= tau``, :meth:`Criterion.decoder_accepts`; TensorRT-LLM's MTP relaxed acceptance
kernel, ``mtpRelaxedAcceptanceKernel``, walks the target's top-k and stops at the first
candidate with ``p(1) - delta > p_j``, so it too accepts a candidate exactly at the threshold;
Medusa's typical acceptance is strict, ``>``, and is written so here), and only ties across a
rank boundary count against the token. The worst case accepts ``y`` iff
``p_y > tau_worst(p)`` (strict), with

====================  ==============================================================
spec                  ``tau_worst(p)``
====================  ==============================================================
``greedy``            ``p(2)``: only a unique maximiser is accepted
``additive:D``        ``below(p(1) - D)``: the same tokens as ``p_y >= p(1) - D``
``multiplicative:A``  ``below(A p(1))``: the same tokens as ``p_y >= A p(1)``
``topm:M``            ``p(M+1)``: a token tied at the M-th place may fall outside
``topk-delta:K,D``    ``max(p(K+1), below(p(1) - D))``: the rank part worst case,
                      the threshold part as the decoders compare
``typical:E,D``       ``tau(p)`` (already strict)
``mars:T``            ``p(3)`` where relaxed (top-2's), else ``p(2)`` (strict greedy's)
====================  ==============================================================

``below(t)`` is the largest float64 below ``t`` (``torch.nextafter(t, -inf)``), so that for
every float64 ``x``, ``x > below(t)`` iff ``x >= t``: the comparison stays the decoders' own
``>=`` on the float64 normalised probabilities, exactly, with one strict comparison for every
criterion. (The rule computed in exact arithmetic can differ from this float64 one by one
rounding of ``p(1) - D`` or ``A p(1)``, and a decoder that computes the threshold in another
precision, TensorRT-LLM's float32 for one, can round a tie the other way; the certificates follow
:meth:`Criterion.decoder_accepts`, float64 on the normalised probabilities.) A relaxed
rule with no rank condition (``additive:0``, ``multiplicative:1``) accepts every maximiser, as
the decoders do; strict greedy is ``greedy``. Off ties at the rank boundaries (``p(m) >
p(m+1)``) the two conventions accept the same tokens, so every certificate is unchanged; at a
rank tie the worst-case certificate is the limit of the untied one from the unfavourable side
(strict greedy: 0 on a tied top). Both rejection regions are lower level sets, so the
certificate machinery is the same. :meth:`Criterion.decoder_accepts` is the decoders' own
verdict (first index wins), which a step certified under ``ties="worst"`` always passes.

The spec string is the
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

from companion.certify.summary import TopSummary, normalized_probabilities, summarize
from companion.certify.validation import check_token, finite_positive


def _num(x: float) -> str:
    """Shortest string that parses back to the same float; integers without a trailing .0."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


TIES: tuple[str, ...] = ("worst", "level-set")
"""The tie conventions: ``"worst"`` (the default of every certificate) and ``"level-set"``."""


def check_ties(ties: str) -> str:
    """``ties`` itself if it is one of :data:`TIES`, else ``ValueError``."""
    if not isinstance(ties, str) or ties not in TIES:
        raise ValueError(
            f"ties must be 'worst' (sound for every decoder that breaks ties in a fixed way; the default) or "
            f"'level-set' (every token tied at the threshold accepted; for analysis), got {ties!r}"
        )
    return ties


def below(t: Tensor) -> Tensor:
    """The largest float64 below ``t``, elementwise: for every float64 ``x``, ``x > below(t)`` iff
    ``x >= t``. A worst-case threshold (compared with ``>``) that accepts exactly the tokens a
    decoder's ``p_y >= t`` accepts."""
    return torch.nextafter(t, torch.full_like(t, -torch.inf))


def band_factor(band: Tensor) -> Tensor:
    """``e^b``, nudged up by 1e-12 where ``b > 0``: a gap of exactly ``b`` between two logits (bfloat16
    logits often sit exactly a whole number of ulps apart) is a near tie, whatever the float64 rounding of the
    two probabilities' ratio."""
    return torch.where(band > 0, torch.exp(band) * (1 + 1e-12), torch.ones_like(band))


def additive_guard(s: TopSummary, delta: float, tau: Tensor) -> Tensor:
    """:meth:`AdditiveRelaxed.guard` for threshold ``p(1) - delta`` (``tau``: the unguarded ``tau_worst``)."""
    # The kernel-path band is not applied to an absolute threshold: it bounds how far two logits'
    # difference moves between paths (argmax flips), and as a factor on p(1) and p_y (4 ulps of the
    # top logit, e^0.5 at z(1) = 25 in bfloat16) it would reject every token.
    slack = Criterion._value_slack(s)
    if not isinstance(slack, Tensor):
        return tau
    return below(s.values[:, 0] - delta * torch.exp(-slack))


def order_statistic(s: TopSummary, i: int) -> Tensor:
    """``p(i)``, the ``i``-th largest probability (1-based, ties counted with multiplicity) of every
    row of ``s``; ``-inf`` when ``i > V`` (no such token: nothing lies at or below it)."""
    if i > s.vocab:
        return torch.full_like(s.values[:, 0], -torch.inf)
    if i > s.k:
        raise ValueError(f"p({i}) is not in a summary of the top {s.k}")
    return s.values[:, i - 1]


def index_rank(x: Tensor, token: Tensor) -> Tensor:
    """Rank of ``token`` in each row of ``x`` (logits or probabilities ``[..., V]``, ids ``[...]``)
    when exact ties go to the lowest id (first index wins, as ``torch.argmax``):
    ``1 + #{z : x_z > x_y} + #{z < y : x_z == x_y}``, int64 ``[...]``. ``y`` is ``x``'s first
    maximiser iff its rank is 1, and is in the first-index ``topk(x, m)`` iff its rank is ``<= m``."""
    x_y = x.gather(-1, token.unsqueeze(-1))
    ids = torch.arange(x.shape[-1], device=x.device)
    before = ids < token.unsqueeze(-1)
    return 1 + ((x > x_y) | ((x == x_y) & before)).sum(-1)


@dataclass(frozen=True)
class Criterion(ABC):
    """An acceptance rule ``accept y iff p_y >= tau(p)`` (``>`` when ``strict``).

    Two tie conventions (module docstring): ``ties="level-set"`` is the threshold rule read as a level set, the
    default of the tensor-level methods below (what the rule does with exact numbers);
    ``ties="worst"`` is the worst case over tie-breaks, ``accept y iff p_y > tau_worst(p)``,
    the default of every certificate. :meth:`decoder_accepts` is what real decoders do
    (first index wins).
    """

    strict: ClassVar[bool] = False
    needs_entropy: ClassVar[bool] = False
    needs_logits: ClassVar[bool] = False  # the threshold reads the raw logits, not only p (MARS)

    @abstractmethod
    def _threshold(self, s: TopSummary) -> Tensor:
        """The rule's ``tau`` for every row of a summary, float64 ``[N]``."""

    @abstractmethod
    def _worst_threshold(self, s: TopSummary) -> Tensor:
        """``tau_worst``: the worst case over tie-breaks accepts ``y`` iff ``p_y > tau_worst``."""

    def threshold_from_summary(self, s: TopSummary, ties: str = "level-set") -> Tensor:
        """``tau`` for every row of a summary, float64 ``[N]``: the rule's own (``"level-set"``,
        compared with ``>=``, or ``>`` when ``strict``) or ``tau_worst`` (``"worst"``, compared
        with ``>``), guarded by the summary's error bounds (:meth:`guard`)."""
        if check_ties(ties) == "worst":
            return self.guard(s, self._worst_threshold(s))
        return self._threshold(s)

    def guard(self, s: TopSummary, tau: Tensor) -> Tensor:
        """``tau_worst`` raised so that a token above it is accepted by the exact rule, by the
        library's own decoder and along every kernel path the summary's band allows.

        A rank or ratio threshold (strict greedy ``p(2)``, top-m ``p(m+1)``, multiplicative
        ``A p(1)``, MARS) compares two probabilities of one row, so the normaliser cancels; only the
        kernel-path band ``b`` (logit units, :attr:`TopSummary.band`) moves their ratio, by at most
        ``e^b``: ``tau e^b``. A near tie (top-2 logit gap within ``b``) thus counts as a tie.
        Criteria with an absolute threshold (additive, top-k-delta, typical) override this.
        """
        return tau if s.band is None else tau * band_factor(s.band)

    @staticmethod
    def _value_slack(s: TopSummary) -> Tensor | float:
        """``2 eta``: a computed probability is within ``e^eta`` of the exact one, and the library's
        decoder, which normalises the row again, within ``e^eta`` of it too (0 for float64 rows)."""
        return 2 * s.log_err if s.guarded() else 0.0

    def is_strict(self, ties: str = "level-set") -> bool:
        """Whether acceptance is ``p_y > tau`` (else ``p_y >= tau``) under the convention ``ties``."""
        return self.strict or check_ties(ties) == "worst"

    def top_needed(self, ties: str = "level-set") -> int:
        """How many of the largest probabilities ``threshold_from_summary`` reads (may exceed ``V``)."""
        check_ties(ties)
        return 1

    def index_rank_limit(self) -> int | None:
        """``m`` when the rule holds a rank condition ``y in topk(p, m)`` (greedy 1, top-m ``m``,
        top-k-delta ``k``), decided by real decoders with ``argmax``/``topk`` on token ids; else None."""
        return None

    def check_vocab(self, vocab: int) -> None:
        """Raise ``ValueError`` when the criterion makes no sense for a vocabulary of size ``vocab``."""

    def check_inputs(self, from_logits: bool) -> None:
        """Raise ``ValueError`` when the criterion cannot be decided from this kind of input
        (:class:`Mars` needs logits: ``from_logits=True``). Every other criterion takes both."""

    def rank_limits_from_summary(self, s: TopSummary) -> Tensor | None:
        """The rank condition's ``m`` per row of a summary, int64 ``[N]`` (``y`` must have
        :func:`index_rank` ``<= m`` on the target's tensor), or None when there is none. A
        constant :meth:`index_rank_limit` for every criterion but :class:`Mars` (2 on relaxed
        rows, 1 elsewhere)."""
        limit = self.index_rank_limit()
        if limit is None:
            return None
        return torch.full(s.values.shape[:1], limit, dtype=torch.long, device=s.values.device)

    def rank_limits(self, p: Tensor, *, from_logits: bool = False) -> Tensor | None:
        """:meth:`rank_limits_from_summary` for a tensor ``p`` (``[..., V]``): int64 ``[...]`` or None."""
        limit = self.index_rank_limit()
        if limit is None:
            return None
        return torch.full(p.shape[:-1], limit, dtype=torch.long, device=p.device)

    # -- public, tensor-level API ------------------------------------------------------------
    def _summary(self, p: Tensor, from_logits: bool, ties: str = "level-set") -> TopSummary:
        self.check_vocab(p.shape[-1])
        self.check_inputs(from_logits)
        return summarize(
            p, from_logits=from_logits, k=self.top_needed(ties), with_entropy=self.needs_entropy
        )

    def threshold(self, p: Tensor, *, from_logits: bool = False, ties: str = "level-set") -> Tensor:
        """``tau(p)`` as float64 with shape ``p.shape[:-1]`` (on the normalised distribution)."""
        s = self._summary(p, from_logits, ties)
        return self.threshold_from_summary(s, ties).reshape(s.lead_shape)

    def accept_from(self, prob: Tensor, tau: Tensor, ties: str = "level-set") -> Tensor:
        """The comparison itself: ``prob >= tau`` (``>`` for strict criteria, and always under
        ``ties="worst"``); ``tau`` from :meth:`threshold_from_summary` with the same ``ties``."""
        return prob > tau if self.is_strict(ties) else prob >= tau

    def accepts(self, p: Tensor, token: Tensor | int, *, from_logits: bool = False,
                ties: str = "level-set") -> Tensor:
        """Whether ``token`` (an id, or ids of shape ``p.shape[:-1]``) is accepted; bool tensor.

        Only the tokens asked about are lifted to float64 and normalised (by the summary's
        normaliser, the very numbers :func:`~companion.certify.summary.normalized_probabilities` gives),
        not the whole vocabulary."""
        s = self._summary(p, from_logits, ties)
        tau = self.threshold_from_summary(s, ties).reshape(s.lead_shape)
        tok = check_token(token, p.shape[:-1], p.shape[-1], p.device)
        raw = p.gather(-1, tok.unsqueeze(-1)).squeeze(-1).to(torch.float64)
        norm = s.norm.reshape(s.lead_shape)
        prob = torch.exp(raw - norm) if from_logits else raw / norm
        return self.accept_from(prob, tau, ties)

    def decoder_accepts(self, p: Tensor, token: Tensor | int, *, from_logits: bool = False) -> Tensor:
        """What transformers, vLLM and TensorRT-LLM decide: the rule's threshold test (level set)
        and, for a rank condition (:meth:`rank_limits`), ``index_rank(p, token) <= m`` on
        the tensor as given (exact ties go to the lowest id: ``greedy`` accepts ``token`` iff
        it is ``torch.argmax(p)``; ``mars:T`` iff it is the ``argmax``, or in the ``topk(2)`` on
        rows whose logit ratio relaxes the rule). A step certified under ``ties="worst"`` passes it."""
        tok = check_token(token, p.shape[:-1], p.shape[-1], p.device)
        ok = self.accepts(p, tok, from_logits=from_logits)
        limits = self.rank_limits(p, from_logits=from_logits)
        if limits is not None:
            ok = ok & (index_rank(p, tok) <= limits)
        return ok

    def rejection_mask(self, p: Tensor, *, from_logits: bool = False, ties: str = "level-set") -> Tensor:
        """Boolean ``[..., V]`` mask of the rejection region ``R(p)`` (``R_worst(p)`` with ``ties="worst"``)."""
        tau = self.threshold(p, from_logits=from_logits, ties=ties)
        # Float64 over the whole vocabulary, on purpose: the mask is the decision for every token,
        # and that decision (ties at the threshold included) is defined on the float64 normalised
        # probabilities.
        probs = normalized_probabilities(p, from_logits=from_logits)
        return ~self.accept_from(probs, tau.unsqueeze(-1), ties)


@dataclass(frozen=True)
class StrictGreedy(Criterion):
    """Accept only a target argmax: ``tau = p(1)``."""

    def _threshold(self, s: TopSummary) -> Tensor:
        return s.values[:, 0]

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return order_statistic(s, 2)

    def top_needed(self, ties: str = "level-set") -> int:
        return 2 if check_ties(ties) == "worst" else 1

    def index_rank_limit(self) -> int | None:
        return 1

    def __str__(self) -> str:
        return "greedy"


@dataclass(frozen=True)
class AdditiveRelaxed(Criterion):
    """Accept within ``delta`` of the top probability: ``tau = p(1) - delta``, ``delta >= 0``."""

    delta: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "delta", finite_positive("additive delta", self.delta, allow_zero=True))

    def _threshold(self, s: TopSummary) -> Tensor:
        return s.values[:, 0] - self.delta

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return below(s.values[:, 0] - self.delta)  # no rank condition: only the decoders' p_y >= tau

    def guard(self, s: TopSummary, tau: Tensor) -> Tensor:
        """``below(p(1) - D e^-2eta)``: accepted only if ``p_y >= p(1) - D`` holds for every
        normaliser within ``e^eta`` (``D`` is absolute; the ratio ``p_y / p(1)`` is exact)."""
        return additive_guard(s, self.delta, tau)

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

    def _threshold(self, s: TopSummary) -> Tensor:
        return self.alpha * s.values[:, 0]

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return below(self.alpha * s.values[:, 0])  # no rank condition: only the decoders' p_y >= tau

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

    def top_needed(self, ties: str = "level-set") -> int:
        return self.m + 1 if check_ties(ties) == "worst" else self.m

    def index_rank_limit(self) -> int | None:
        return self.m

    def check_vocab(self, vocab: int) -> None:
        if self.m >= vocab:
            raise ValueError(f"topm:{self.m} needs m < V, but the vocabulary has V={vocab} tokens")

    def _threshold(self, s: TopSummary) -> Tensor:
        return s.values[:, self.m - 1]

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return order_statistic(s, self.m + 1)

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

    def top_needed(self, ties: str = "level-set") -> int:
        return self.k + 1 if check_ties(ties) == "worst" else self.k

    def index_rank_limit(self) -> int | None:
        return self.k

    def check_vocab(self, vocab: int) -> None:
        if self.k > vocab:
            raise ValueError(f"topk-delta:{self.k},... needs k <= V, but the vocabulary has V={vocab} tokens")

    def _threshold(self, s: TopSummary) -> Tensor:
        return torch.maximum(s.values[:, self.k - 1], s.values[:, 0] - self.delta)

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        # The rank part worst case (a token tied at the k-th place may fall outside topk), the
        # threshold part as the decoders compare it (p_y >= p(1) - delta, no tie-break involved).
        return torch.maximum(order_statistic(s, self.k + 1), below(s.values[:, 0] - self.delta))

    def guard(self, s: TopSummary, tau: Tensor) -> Tensor:
        """The rank part as :meth:`Criterion.guard`, the threshold part as :meth:`AdditiveRelaxed.guard`."""
        rank = order_statistic(s, self.k + 1)
        if s.band is not None:
            rank = rank * band_factor(s.band)
        return torch.maximum(rank, additive_guard(s, self.delta, tau))

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

    def _threshold(self, s: TopSummary) -> Tensor:
        if s.entropy is None:
            raise ValueError("typical acceptance needs the entropy: summarise with with_entropy=True")
        return torch.clamp(self.delta * torch.exp(-s.entropy), max=self.eps)

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return self._threshold(s)  # already strict: a token at the threshold is rejected

    def guard(self, s: TopSummary, tau: Tensor) -> Tensor:
        """``min(E, D e^-H_lo) e^(2 eta)``, ``H_lo = H - 2 E_H``.

        The computed entropy is within ``E_H`` (:attr:`TopSummary.entropy_err`) of the exact one,
        and any other computation of it by the library within ``E_H`` of that, hence ``2 E_H``; a
        change of every log-probability by at most ``b`` moves ``H`` by at most ``(e^b - 1) H + b e^b``
        (``-sum p e^e (log p + e)`` with ``|e| <= b``). The threshold is absolute, so the
        normaliser's ``e^eta`` counts twice (:meth:`Criterion._value_slack`) and the band once."""
        slack = self._value_slack(s)
        err = s.entropy_err if (s.guarded() and s.entropy_err is not None) else None
        if err is None:
            return tau  # (the kernel-path band is not applied to an absolute threshold: additive_guard)
        h = s.entropy
        h_lo = h - 2 * err
        factor = torch.exp(torch.as_tensor(slack, dtype=torch.float64, device=h.device))
        return torch.clamp(self.delta * torch.exp(-h_lo), max=self.eps) * factor

    def __str__(self) -> str:
        return f"typical:{_num(self.eps)},{_num(self.delta)}"


@dataclass(frozen=True)
class Mars(Criterion):
    """MARS, margin-aware verification (arXiv:2601.15498), applied to greedy verification.

    With ``z(1) >= z(2)`` the target's two largest logits, a row is *relaxed* iff

        ``z(1) > 0``  and  ``z(2) / z(1) > theta``      (ratio in float64, ``theta = 0.87`` by default),

    and then any token among the target's top two is accepted (``tau = p(2)``, top-2's level
    set); otherwise the usual strict-greedy rule holds (``tau = p(1)``). Worst case over
    tie-breaks (``ties="worst"``): ``tau_worst = p(3)`` on relaxed rows (a token tied at the
    second place may fall outside a decoder's ``topk(2)``), ``p(2)`` elsewhere (only a unique
    maximiser is accepted); the decoders' own verdict (:meth:`decoder_accepts`) is
    ``index_rank(z, y) <= 2`` on relaxed rows, ``<= 1`` elsewhere, on the logits as given.

    Source: the authors' code (``evaluate_posterior`` in ``mars/model/utils.py`` of the GitHub
    repository 5SSjw/MARS) takes ``torch.topk`` of the target's (processed) logits, relaxes
    when ``z(2) / (z(1) + 1e-10) > relaxation_threshold`` (default 0.87) and then accepts a draft
    among the two top-k indices; there the relaxation sits in the *sampling* path (the greedy
    path is plain argmax matching); here it is applied to greedy verification. The ``1e-10``
    guard is omitted (a row whose ratio lies within ~1e-10 relative of ``theta`` may be decided
    differently from the authors' code).

    ``z(1) <= 0`` (this library's rule, not the authors'): *no relaxation*. The ratio measures how
    close the runner-up is to the top only for a positive top logit. For ``z(1) < 0`` every
    ``z(2) <= z(1)`` gives ``z(2) / z(1) >= 1 > theta`` (the authors' code would relax on every such
    row however far apart the two are: ``z = (-1, -100)`` gives 100), and at ``z(1) = 0`` the ratio
    is undefined. With fewer than two tokens (``V = 1``) nothing is relaxed either.

    The rule reads the logits, not ``p``: adding a constant ``c`` to every logit leaves ``p``
    unchanged but turns the ratio into ``(z(2) + c) / (z(1) + c)``, so the same ``p`` can be
    relaxed or not. Inputs must therefore be the model's raw logits (``from_logits=True``);
    probabilities are refused with ``ValueError``, and log-probabilities (``log_softmax``, or a
    server's logprobs) have ``z(1) <= 0``, so they are never relaxed. For a given row of logits the accepted set is still a lower level
    set of ``p``, so the target-side certificate is strict greedy's or top-2's, row by row.
    There is no drafter-side certificate of its own: the drafter side ranges over targets ``p``
    given ``q`` and knows no logit scale for them, and every ``p`` has logits that are not relaxed
    (``z = log p`` has ``z(1) <= 0``), so the infimum over all targets' logits is strict greedy's
    drafter-side certificate whatever ``theta`` is. ``0 < theta <= 1``; ``theta = 1`` never relaxes (strict
    greedy), since ``z(2) / z(1) <= 1`` when ``z(1) > 0``.
    """

    theta: float = 0.87

    needs_logits: ClassVar[bool] = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "theta", finite_positive("mars theta", self.theta, upper=1.0))

    def check_inputs(self, from_logits: bool) -> None:
        if not from_logits:
            raise ValueError(
                f"{self} needs the target's logits (from_logits=True): it compares the two largest logits "
                f"z(2)/z(1), which probabilities do not determine (adding a constant to the logits changes it)"
            )

    def relaxed_from_top(self, z1: Tensor, z2: Tensor) -> Tensor:
        """``z(1) > 0 and z(2) / z(1) > theta`` elementwise, from the two largest logits (float64)."""
        z1, z2 = z1.to(torch.float64), z2.to(torch.float64)
        positive = z1 > 0
        ratio = z2 / torch.where(positive, z1, torch.ones_like(z1))
        return positive & (ratio > self.theta)

    def _relaxed(self, s: TopSummary) -> Tensor:
        """Which rows of a summary are relaxed, bool ``[N]``; the summary must come from logits."""
        if s.top_logits is None:
            self.check_inputs(False)
        z = s.top_logits
        if z.shape[1] < 2:  # V = 1: no runner-up, no relaxation
            return torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
        return self.relaxed_from_top(z[:, 0], z[:, 1])

    def relaxed(self, logits: Tensor) -> Tensor:
        """Which rows of target logits ``[..., V]`` relax to top-2, bool ``[...]``: the rule above,
        the one definition that certificates and decoders share."""
        s = summarize(logits, from_logits=True, k=2, what="logits")
        return self._relaxed(s).reshape(s.lead_shape)

    def top_needed(self, ties: str = "level-set") -> int:
        return 3 if check_ties(ties) == "worst" else 2

    def _threshold(self, s: TopSummary) -> Tensor:
        return torch.where(self._relaxed(s), order_statistic(s, 2), s.values[:, 0])

    def _worst_threshold(self, s: TopSummary) -> Tensor:
        return torch.where(self._relaxed(s), order_statistic(s, 3), order_statistic(s, 2))

    def rank_limits_from_summary(self, s: TopSummary) -> Tensor | None:
        relaxed = self._relaxed(s)
        return torch.where(relaxed, torch.full_like(relaxed, 2, dtype=torch.long),
                           torch.ones_like(relaxed, dtype=torch.long))

    def rank_limits(self, p: Tensor, *, from_logits: bool = False) -> Tensor | None:
        self.check_inputs(from_logits)
        relaxed = self.relaxed(p)
        return torch.where(relaxed, torch.full_like(relaxed, 2, dtype=torch.long),
                           torch.ones_like(relaxed, dtype=torch.long))

    def __str__(self) -> str:
        return f"mars:{_num(self.theta)}"


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
    (re.compile(rf"mars:({_NUM})"), Mars, (float,)),
    (re.compile(r"mars"), Mars, ()),
)
SPEC_FORMS = (
    "greedy",
    "additive:DELTA",
    "multiplicative:ALPHA",
    "topm:M",
    "topk-delta:K,DELTA",
    "typical:EPS,DELTA (or typical for 0.09,0.3)",
    "mars:THETA (or mars for 0.87; needs logits)",
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
