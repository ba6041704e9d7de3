"""Replay a drafting policy on a recording: the rounds a lossless :func:`~companion.speculative.generate` makes."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from companion.speculative.decoder import SpeculativeResult, Timings
from companion.speculative.policies import Policy, RoundOutcome, parse_policy
from companion.speculative.recording import _GREEDY, RecordedChains, _check_chains
from companion.speculative.replay_fast import ChainsTooShort, chain_arrays, is_builtin, replay_builtin


def replay(chains: RecordedChains, policy: str | Policy, *, fast: bool = True) -> SpeculativeResult:
    """Decode ``chains``' prompt under ``policy`` without a model: the rounds a lossless :func:`generate` makes.

    The policy is driven exactly as the decoder drives it (see ``Policy``): per round
    ``start_round(cap)``, then ``wants_draft`` / ``observe`` per draft with the recorded
    ``q(1)``, ``q(2)`` and (when the policy asks for it) the strict-greedy certificate, then
    ``submit``; ``min(k, L_s)`` of ``k`` submitted drafts are accepted, the target's token follows,
    and ``end_round`` receives ``KL(p || q)`` at the verified positions when the policy reads it.
    A :class:`Policy` object carries its state over (as with ``generate``); a spec string gives a
    fresh one. The result has no timings (``nan``) and no per-round seconds.

    ``fast``: transformers' built-ins (``constant``, ``confidence``, ``heuristic``) are replayed by
    ``companion.speculative.replay_fast.replay_builtin`` from per-position arrays, with the
    same result and the same policy state; ``False`` drives every policy call by call (the reference).
    """
    _check_chains(chains)
    pol = parse_policy(policy)
    if fast and is_builtin(pol):
        return replay_builtin(chains, pol, str(_GREEDY))
    needs_rho = bool(getattr(pol, "needs_certificate", False))
    needs_kl = bool(getattr(pol, "needs_kl", False))
    text = chains.tokens
    n = len(text)
    accepted: list[int] = []
    submitted: list[int] = []
    drafted: list[int] = []
    draft_tokens: list[list[int]] = []
    s = 0
    ended_by_eos = False
    while s < chains.max_new_tokens and not ended_by_eos:
        if s >= n:
            raise ValueError(f"replay reached position {s} past the recorded text of {n} tokens")
        chain = chains.chains[s]
        # what a policy that did not ask for the certificate observes: the steps without it (made once)
        seen = chain if needs_rho else chain_arrays(chains).plain(s, chain)
        cap = chains.cap(s)
        pol.start_round(cap)
        drafts: list[int] = []
        while len(drafts) < cap and pol.wants_draft(len(drafts)):
            j = len(drafts)
            if j >= len(chain):
                raise ChainsTooShort(f"policy {pol} asks for draft {j + 1} at position {s}, but the chains were recorded "
                                 f"with max_drafts = {chains.max_drafts}; record with a larger max_drafts (or None)")
            step = chain[j]
            drafts.append(step.token)
            pol.observe(seen[j])
            if step.token in chains.eos_token_ids:
                break
        k = min(max(int(pol.submit(len(drafts))), 0), len(drafts))
        a = min(k, chains.matched[s])
        new = list(text[s:s + a + 1])
        if any(t in chains.eos_token_ids for t in new):
            first = next(i for i, t in enumerate(new) if t in chains.eos_token_ids)
            new = new[:first + 1]
            ended_by_eos = True
        kl: tuple[float, ...] = ()
        if needs_kl and k:
            kl = tuple(chains.kl[s:s + min(a + 1, k)])
        pol.end_round(RoundOutcome(drafted=len(drafts), submitted=k, accepted=a, kl=kl))
        accepted.append(a)
        submitted.append(k)
        drafted.append(len(drafts))
        draft_tokens.append(drafts[:k])
        s += len(new)
    nan = math.nan
    return SpeculativeResult(
        tokens=torch.tensor(text[:s], dtype=torch.long),
        target_forwards=len(accepted),
        drafter_forwards=sum(drafted),
        accepted=accepted,
        submitted=submitted,
        drafted=drafted,
        policy=str(pol),
        criterion=str(_GREEDY),
        timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
        draft_tokens=draft_tokens,
        ended_by_eos=ended_by_eos,
        extra={"replayed": True},
    )


def fits(chains: RecordedChains, policies: Sequence[str | Policy]) -> bool:
    """Whether every policy in ``policies`` replays on ``chains`` without asking for a draft past a recorded
    chain (chains recorded with ``max_drafts``); a spec string is replayed from a fresh policy, a
    :class:`Policy` from a copy of its state (``fresh()``), so the check changes nothing."""
    _check_chains(chains)
    for policy in policies:
        try:
            replay(chains, policy.fresh() if isinstance(policy, Policy) else policy)
        except ChainsTooShort:
            return False
    return True
