"""Array replays of the built-in policies and of the oracle's dynamic programme on a recording.

:func:`companion.speculative.replay` drives any :class:`~companion.speculative.Policy` call by
call, one :class:`~companion.speculative.policies.DraftStep` at a time; that is the reference. For
transformers' built-ins (:class:`~companion.speculative.policies.Constant`,
:class:`~companion.speculative.policies.Confidence`,
:class:`~companion.speculative.policies.Heuristic`) the drafts a round makes are a function of a
few per-position numbers, worked out once per recording (:class:`ChainArrays`): the chain's
length, where it first drafts an end-of-sequence token, where its ``q(1)`` first falls below a
threshold, and ``L_s``. :func:`replay_builtin` then loops over rounds only, with integer
arithmetic, and returns the same :class:`~companion.speculative.SpeculativeResult` (and leaves a
policy object in the same state) as the reference; ``tests/test_replay_fast.py`` checks that on
random recordings for every built-in. :func:`oracle_dp` is the oracle's programme with each
position's options priced in one array operation: the same float64 sums, the same tie rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from companion.speculative.decoder import SpeculativeResult, Timings
from companion.speculative.policies import (
    Confidence,
    Constant,
    DraftStep,
    Heuristic,
    Policy,
    kl_scale_score,
    unit_score,
)

if TYPE_CHECKING:
    from companion.speculative.costs import CostModel
    from companion.speculative.recording import RecordedChains

class ChainsTooShort(ValueError):
    """A replay asked for a draft past a chain recorded with ``max_drafts`` (record longer chains, or ``None``)."""


_NEVER = 1 << 62
"""A stop index past any chain: the event does not happen in the recorded drafts."""


@dataclass
class ChainArrays:
    """What the array replays read from one recording, per text position ``s``.

    ``length[s]``: drafts recorded from ``s``; ``eos_stop[s]``: ``1 +`` the index of the chain's first
    end-of-sequence draft (the decoder stops drafting after it), :data:`_NEVER` if none;
    ``next_eos[s]``: the first text position ``>= s`` holding an end-of-sequence token (``n`` if
    none); ``drafts[s]``: the chain's tokens; ``q1[s, j]``: ``q(1)`` of draft ``j`` (``nan`` past the
    chain); ``nxt[s][k]``: the position after a round at ``s`` that submits ``k`` drafts.
    """

    n: int
    matched: list[int]
    length: list[int]
    eos_stop: list[int]
    next_eos: list[int]
    drafts: list[tuple[int, ...]]
    q1: np.ndarray
    nxt: list[np.ndarray]
    _low: dict[float, list[int]] = field(default_factory=dict, repr=False)
    _plain: dict[int, tuple[DraftStep, ...]] = field(default_factory=dict, repr=False)
    _scores: dict[tuple[str, str], np.ndarray] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, chains: RecordedChains) -> ChainArrays:
        n = len(chains.tokens)
        eos = chains.eos_token_ids
        length = [len(c) for c in chains.chains]
        width = max(length, default=0)
        q1 = np.full((n, width), np.nan)
        eos_stop, drafts, nxt = [], [], []
        for s, chain in enumerate(chains.chains):
            q1[s, :len(chain)] = [d.q1 for d in chain]
            tokens = tuple(d.token for d in chain)
            drafts.append(tokens)
            eos_stop.append(next((j + 1 for j, t in enumerate(tokens) if t in eos), _NEVER))
            L = chains.matched[s]
            nxt.append(np.minimum(s + np.minimum(np.arange(len(chain) + 1), L) + 1, n))
        next_eos = [n] * (n + 1)
        for t in range(n - 1, -1, -1):
            next_eos[t] = t if chains.tokens[t] in eos else next_eos[t + 1]
        return cls(n, list(chains.matched), length, eos_stop, next_eos[:n], drafts, q1, nxt)

    def plain(self, s: int, chain: tuple[DraftStep, ...]) -> tuple[DraftStep, ...]:
        """``chain`` (the recording's chain from ``s``) without the certificate: the steps a policy that did
        not ask for it observes (``rho`` left at ``nan``), made on first use and kept."""
        if s not in self._plain:
            self._plain[s] = tuple(DraftStep(token=d.token, q1=d.q1, q2=d.q2) for d in chain)
        return self._plain[s]

    def scores(self, chains: RecordedChains, kind: str, cal: str) -> np.ndarray:
        """``[n, width]``: the score a calibrated rule of ``kind`` (``cal``) keeps for each recorded draft once it
        is verified (``Calibrated._score`` of the step it observes), ``nan`` past the chain; made once per
        ``(kind, cal)`` with the policy's own scalar functions, so with its bits."""
        key = (kind, cal)
        if key not in self._scores:
            score = kl_scale_score if cal == "kl" else unit_score
            out = np.full(self.q1.shape, np.nan)
            for s, chain in enumerate(chains.chains):
                out[s, :len(chain)] = [score(kind, d) for d in chain]
            self._scores[key] = out
        return self._scores[key]

    def low_stop(self, threshold: float) -> list[int]:
        """Per position, ``1 +`` the index of the chain's first draft with ``q(1) < threshold`` (the
        confidence stop comes after that draft), :data:`_NEVER` if none (cached per threshold)."""
        if threshold not in self._low:
            low = self.q1 < threshold           # nan (past the chain) compares False, as no draft
            first = np.argmax(low, axis=1) if low.shape[1] else np.zeros(self.n, dtype=int)
            hit = low.any(axis=1) if low.shape[1] else np.zeros(self.n, dtype=bool)
            self._low[threshold] = [int(j) + 1 if h else _NEVER for j, h in zip(first, hit)]
        return self._low[threshold]


def chain_arrays(chains: RecordedChains) -> ChainArrays:
    """The recording's :class:`ChainArrays`, made once and kept on the recording."""
    cached = chains._arrays
    if cached is None:
        cached = ChainArrays.of(chains)
        object.__setattr__(chains, "_arrays", cached)
    return cached


def is_builtin(policy: Policy) -> bool:
    """Whether :func:`replay_builtin` replays ``policy``: exactly one of the three built-in classes (a
    subclass may change any call, so it goes through the reference)."""
    return type(policy) in (Constant, Confidence, Heuristic)


def replay_builtin(chains: RecordedChains, pol: Policy, criterion: str) -> SpeculativeResult:
    """:func:`companion.speculative.replay` of a built-in policy object, round by round on :class:`ChainArrays`.

    A round at ``s`` (``cap = max_new_tokens - s - 1``) drafts ``min(K, cap)`` tokens (``K``:
    ``k``, or ``int(K)`` of the heuristic's running ``K``), fewer when the chain drafts an
    end-of-sequence token or a token with ``q(1)`` below the threshold first (that draft is
    kept); every draft is submitted; ``min(k, L_s)`` are accepted, and the text advances by them
    and the target's token, ending at an end-of-sequence token. The heuristic's ``K`` is updated
    as its ``end_round`` does and left on ``pol``, as the reference leaves it. Raises the
    reference's ``ValueError`` where it would (a chain too short for a round, a text too short).
    """
    fa = chain_arrays(chains)
    n, max_new = fa.n, chains.max_new_tokens
    heuristic = type(pol) is Heuristic
    low = fa.low_stop(pol.threshold) if type(pol) is not Constant else [_NEVER] * n
    k_float = float(pol.k)
    accepted: list[int] = []
    drafted: list[int] = []
    draft_tokens: list[list[int]] = []
    s = 0
    ended = False
    cap = stop = None
    while s < max_new and not ended:
        if s >= n:
            raise ValueError(f"replay reached position {s} past the recorded text of {n} tokens")
        cap = max_new - s - 1
        budget = min(int(k_float) if heuristic else pol.k, cap)
        d = min(budget, fa.eos_stop[s], low[s])
        stop = low[s] <= d
        if d > fa.length[s]:
            # the reference raises mid-round: this round's start_round ran, no low draft was observed
            pol._cap = cap
            if type(pol) is not Constant:
                pol._stop = False
            if heuristic:
                pol.k = k_float
            raise ChainsTooShort(f"policy {pol} asks for draft {fa.length[s] + 1} at position {s}, but the chains were "
                             f"recorded with max_drafts = {chains.max_drafts}; record with a larger max_drafts (or None)")
        a = min(d, fa.matched[s])
        step = min(a + 1, n - s)
        e = fa.next_eos[s]
        if e < s + step:
            step = e - s + 1
            ended = True
        if heuristic:
            k_float = k_float + 2.0 if a == d else max(1.0, k_float - 1.0)
        accepted.append(a)
        drafted.append(d)
        draft_tokens.append(list(fa.drafts[s][:d]))
        s += step
    if heuristic:
        pol.k = k_float
    if cap is not None:   # the state the last round's start_round / observe calls leave
        pol._cap = cap
        if type(pol) is not Constant:
            pol._stop = stop
    nan = math.nan
    return SpeculativeResult(
        tokens=torch.tensor(chains.tokens[:s], dtype=torch.long),
        target_forwards=len(accepted),
        drafter_forwards=sum(drafted),
        accepted=accepted,
        submitted=list(drafted),
        drafted=drafted,
        policy=str(pol),
        criterion=criterion,
        timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
        draft_tokens=draft_tokens,
        ended_by_eos=ended,
        extra={"replayed": True},
    )


def oracle_dp(chains: RecordedChains, costs: CostModel) -> tuple[list[float], list[int]]:
    """``best[s]`` (least cost from ``s`` to the end of the text) and ``choice[s]`` (drafts submitted there).

    The reference's programme: from ``s``, ``k = 0 .. len(chains[s])`` drafts cost
    ``(V(k) + c k) + best[next(s, k)]``, the least wins and ties go to the fewest drafts (the first
    minimum, as ``min`` over ``(cost, k)`` pairs). The prices ``V(k) + c k`` are worked out once and
    each position's options are one float64 array sum (the same two additions per option, so the
    same bits), instead of a Python list of tuples.
    """
    fa = chain_arrays(chains)
    n = fa.n
    width = max(fa.length, default=0)
    price = np.array([costs.verify_cost(k) + costs.c * k for k in range(width + 1)])
    best = np.zeros(n + 1)
    choice = [0] * n
    for s in range(n - 1, -1, -1):
        options = price[:fa.length[s] + 1] + best[fa.nxt[s]]
        j = int(np.argmin(options))
        best[s] = options[j]
        choice[s] = j
    return best.tolist(), choice


def oracle_dp_many(recordings: list[RecordedChains], costs: CostModel) -> list[tuple[list[float], list[int]]]:
    """:func:`oracle_dp` of every recording at once: position by position from the end, all recordings
    still that long together, each position's options one row of a float64 array sum (the same
    two additions per option, the same first minimum), so the same ``best`` and ``choice`` bit for bit."""
    arrays = [chain_arrays(ch) for ch in recordings]
    n = np.array([fa.n for fa in arrays], dtype=np.intp)
    longest = int(n.max(initial=0))
    width = max((max(fa.length, default=0) for fa in arrays), default=0)
    price = np.array([costs.verify_cost(k) + costs.c * k for k in range(width + 1)])
    length = np.full((len(arrays), longest), -1, dtype=np.intp)
    matched = np.zeros((len(arrays), longest), dtype=np.intp)
    for r, fa in enumerate(arrays):
        length[r, :fa.n] = fa.length
        matched[r, :fa.n] = fa.matched
    best = np.zeros((len(arrays), longest + 1))
    choice = np.zeros((len(arrays), longest), dtype=np.intp)
    ks = np.arange(width + 1)
    for s in range(longest - 1, -1, -1):
        rows = np.flatnonzero(n > s)
        nxt = np.minimum(s + np.minimum(ks[None, :], matched[rows, s][:, None]) + 1, n[rows][:, None])
        options = price[None, :] + best[rows[:, None], nxt]
        options[ks[None, :] > length[rows, s][:, None]] = np.inf
        j = np.argmin(options, axis=1)
        best[rows, s] = options[np.arange(rows.size), j]
        choice[rows, s] = j
    return [(best[r, :n[r] + 1].tolist(), choice[r, :n[r]].tolist()) for r in range(len(arrays))]
