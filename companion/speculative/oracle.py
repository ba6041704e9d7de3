"""The least modelled cost any lossless chain policy reaches on a recording, and the rounds that reach it."""
from __future__ import annotations

import math
from typing import Any

import torch

from companion.speculative.costs import CostModel
from companion.speculative.decoder import SpeculativeResult, Timings
from companion.speculative.recording import _GREEDY, RecordedChains, _check_chains
from companion.speculative.replay_fast import chain_arrays, oracle_dp, oracle_dp_many


def _check_costs(costs: Any) -> CostModel:
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel (companion.speculative.CostModel: c and the V(k) table), "
                         f"got {type(costs).__name__}")
    return costs


def _advance(chains: RecordedChains, s: int, k: int) -> int:
    """Position after a round at ``s`` that submits ``k`` drafts: ``min(k, L_s)`` accepted plus the target's
    token, which is not emitted when the accepted drafts already end the text with its end-of-sequence token."""
    return min(s + min(k, chains.matched[s]) + 1, len(chains.tokens))


def _dp(chains: RecordedChains, costs: CostModel, fast: bool = True) -> tuple[list[float], list[int]]:
    """``best[s]``: least cost from ``s`` to the end of the text; ``choice[s]``: drafts submitted there.

    ``fast``: :func:`~companion.speculative.replay_fast.oracle_dp` (the same sums and tie rule, one
    array operation per position); ``False``: the reference loop below."""
    if fast:
        return oracle_dp(chains, costs)
    n = len(chains.tokens)
    best = [0.0] * (n + 1)
    choice = [0] * n
    for s in range(n - 1, -1, -1):
        # a round drafts i >= k tokens and submits k: drafting more than it submits only adds c;
        # submitting more than L_s gains nothing but can cost less where V(k) is not monotone
        options = [(costs.verify_cost(k) + costs.c * k + best[_advance(chains, s, k)], k)
                   for k in range(len(chains.chains[s]) + 1)]
        best[s], choice[s] = min(options)
    return best, choice


def oracle_plan(chains: RecordedChains, costs: CostModel, *, fast: bool = True) -> list[int]:
    """Drafts submitted per round by a lossless chain policy of least modelled cost on ``chains``.

    Dynamic programming over positions: from ``s`` a round drafts and submits ``k`` drafts of the
    recorded chain (``k <= len(chains[s])``), costs ``V(k) + c k`` and continues at
    ``s + min(k, L_s) + 1`` (the accepted drafts and the target's token). Ties go to the fewest
    drafts. ``fast``: as :func:`_dp`'s.
    """
    _, choice = _dp(_check_chains(chains), _check_costs(costs), fast)
    plan, s = [], 0
    while s < len(chains.tokens):
        plan.append(choice[s])
        s = _advance(chains, s, choice[s])
    return plan


def oracle_cost(chains: RecordedChains, costs: CostModel) -> float:
    """Least modelled cost per generated token any lossless chain policy reaches on ``chains``' text.

    ``(sum_r V(k_r) + c * drafter calls) / tokens`` minimised over every sequence of rounds (see
    :func:`oracle_plan`); the convention of :func:`~companion.speculative.modelled_cost`
    (prefill counted as an ordinary forward). ``nan`` for an empty text.
    """
    n = len(_check_chains(chains).tokens)
    _check_costs(costs)
    if n == 0:
        return math.nan
    return _dp(chains, costs)[0][0] / n


def oracle_result(chains: RecordedChains, costs: CostModel, *, fast: bool = True) -> SpeculativeResult:
    """The rounds of :func:`oracle_plan` as a :class:`SpeculativeResult` (policy ``"oracle"``), so that
    :func:`~companion.speculative.modelled_cost` and the comparison's bootstrap price it like any policy."""
    plan = oracle_plan(chains, costs, fast=fast)
    accepted, draft_tokens = [], []
    s = 0
    for k in plan:
        accepted.append(min(k, chains.matched[s]))
        draft_tokens.append([d.token for d in chains.chains[s][:k]])
        s = _advance(chains, s, k)
    return _replayed_result(chains, plan, accepted, draft_tokens)


def _replayed_result(chains: RecordedChains, plan: list[int], accepted: list[int],
                     draft_tokens: list[list[int]]) -> SpeculativeResult:
    """The oracle's rounds on ``chains`` as a :class:`SpeculativeResult` (replayed: no timings)."""
    nan = math.nan
    return SpeculativeResult(
        tokens=torch.tensor(chains.tokens, dtype=torch.long),
        target_forwards=len(plan),
        drafter_forwards=sum(plan),
        accepted=accepted,
        submitted=list(plan),
        drafted=list(plan),
        policy="oracle",
        criterion=str(_GREEDY),
        timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
        draft_tokens=draft_tokens,
        ended_by_eos=chains.ended_by_eos,
        extra={"replayed": True},
    )


def oracle_results(recordings: list[RecordedChains], costs: CostModel, *, fast: bool = True) -> list[SpeculativeResult]:
    """:func:`oracle_result` of every recording: the same results, the programmes of all of them run at once
    (``companion.speculative.replay_fast.oracle_dp_many``) when ``fast``."""
    for ch in recordings:
        _check_chains(ch)
    _check_costs(costs)
    if not fast:
        return [oracle_result(ch, costs, fast=False) for ch in recordings]
    out = []
    for ch, (_, choice) in zip(recordings, oracle_dp_many(list(recordings), costs)):
        drafts = chain_arrays(ch).drafts
        n = len(ch.tokens)
        plan, accepted, draft_tokens = [], [], []
        s = 0
        while s < n:
            k = choice[s]
            a = min(k, ch.matched[s])
            plan.append(k)
            accepted.append(a)
            draft_tokens.append(list(drafts[s][:k]))
            s = min(s + a + 1, n)
        out.append(_replayed_result(ch, plan, accepted, draft_tokens))
    return out
