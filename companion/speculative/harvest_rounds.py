"""A harvest as the rounds of a lossless speculative decoder, and where another decoder parts from it.

Along the target's greedy text ``g_0 g_1 ...`` a harvest records at every step the drafter's
greedy token ``d_t`` on the same prefix (teacher-forced). A lossless decoder with a constant
draft length ``k`` (transformers' assisted generation with ``num_assistant_tokens=k`` and a
constant schedule) is therefore determined by the harvest: a round that starts after ``s``
tokens drafts ``d_s, d_{s+1}, ...`` as long as they equal the text (the drafter's context is then
the text itself), so it accepts ``min(k_s, L_s)`` drafts, ``L_s`` the number of consecutive steps
from ``s`` with ``d_t = g_t`` and ``k_s = min(k, n - s - 1)`` (no draft past the last of ``n``
tokens, as transformers caps it), then adds the target's token: the next round starts after
``s + accepted + 1`` tokens. :func:`rounds_from_harvest` computes those rounds;
:func:`first_divergence` finds the first generated position where two runs part (in a token, or in
how many drafts a round accepted); :func:`compare_runs` checks a decoder's runs against the
harvest's and, in a dtype where kernel paths round differently, whether each parting lies at a
near tie (:mod:`companion.harvest.ties`) of the target or the drafter.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from companion.harvest.ties import near_ties


def rounds_from_harvest(tokens: Sequence[int], drafts: Sequence[int], k: int, n: int | None = None) -> list[int]:
    """Accepted drafts per round of a lossless constant-``k`` decoder along the harvested text (module docstring).

    ``n``: the decoder's ``max_new_tokens`` (default: the text's length). The draft budget is
    ``min(k, n - s - 1)`` whatever the text's length: an answer that ends (at its end token)
    before ``n`` ends inside a round, its end token accepted as a draft like any other.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    n = len(tokens) if n is None else n
    m = min(n, len(tokens))
    agree = [int(d) == int(g) for g, d in zip(tokens[:m], drafts[:m])]
    out, s = [], 0
    while s < m:
        budget = max(0, min(k, n - s - 1))
        run = 0
        while run < budget and s + run < m and agree[s + run]:
            run += 1
        out.append(run)
        s += run + 1
    return out


def first_divergence(tokens_a: Sequence[int], accepted_a: Sequence[int], tokens_b: Sequence[int],
                     accepted_b: Sequence[int]) -> int | None:
    """The first generated position where two runs differ, or None when identical.

    A token that differs at position ``j`` gives ``j``; a round (starting after ``s`` tokens) whose
    accepted counts differ, ``a`` against ``b``, gives ``s + min(a, b)``, the first draft that one
    run accepted and the other did not. Runs of different lengths with equal tokens and rounds
    differ at the end of the shorter.
    """
    ta, tb = [int(t) for t in tokens_a], [int(t) for t in tokens_b]
    token_pos = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    round_pos, s = None, 0
    for a, b in zip(accepted_a, accepted_b):
        if a != b:
            round_pos = s + min(a, b)
            break
        s += a + 1
    found = [p for p in (token_pos, round_pos) if p is not None]
    if found:
        return min(found)
    if len(ta) != len(tb) or len(accepted_a) != len(accepted_b):
        return min(len(ta), len(tb))
    return None


@dataclass(frozen=True)
class RunComparison:
    """A decoder's runs against the harvest's rounds, prompt by prompt (see :func:`compare_runs`)."""

    prompts: int
    tokens: int
    rounds: int
    identical: int                       # prompts identical round for round
    divergences: list[tuple[int, int]]   # (prompt, first differing position) of the others
    at_near_tie: list[bool]              # per divergence: the target's or the drafter's step there is a near tie
    near_tie_steps: int                  # harvested steps compared that are near ties (target or drafter)
    details: list[str] = field(default_factory=list)

    @property
    def unexplained(self) -> int:
        """Divergences that lie at no near tie."""
        return sum(not x for x in self.at_near_tie)


def compare_runs(harvest_rows: Sequence[dict], runs: Sequence[tuple[Sequence[int], Sequence[int]]], *, k: int,
                 n: int, dtype: str) -> RunComparison:
    """Compare decoder runs ``(tokens, accepted per round)`` with the harvest's rounds, prompt by prompt.

    ``harvest_rows[i]`` holds prompt ``i``'s harvested steps as arrays (by step):
    ``token``, ``draft_token``, ``logit_top1``, ``logit_gap``, ``draft_logit_top1``,
    ``draft_logit_gap``; runs decode ``n`` tokens with constant draft length ``k``.
    """
    if len(harvest_rows) != len(runs):
        raise ValueError(f"{len(harvest_rows)} harvested prompts against {len(runs)} runs")
    identical = n_tokens = n_rounds = tie_steps = 0
    divergences: list[tuple[int, int]] = []
    at_tie: list[bool] = []
    details: list[str] = []
    for i, (rows, (tokens, accepted)) in enumerate(zip(harvest_rows, runs)):
        m = min(n, len(rows["token"]))
        ties = (near_ties(rows["logit_top1"][:m], rows["logit_gap"][:m], dtype)
                | near_ties(rows["draft_logit_top1"][:m], rows["draft_logit_gap"][:m], dtype))
        tie_steps += int(ties.sum())
        expected = rounds_from_harvest(rows["token"][:m], rows["draft_token"][:m], k, n)
        n_tokens += len(tokens)
        n_rounds += len(accepted)
        pos = first_divergence(rows["token"][:m], expected, tokens, accepted)
        if pos is None:
            identical += 1
            continue
        divergences.append((i, pos))
        explained = bool(pos < m and ties[pos])
        at_tie.append(explained)
        where = (f"target gap {rows['logit_gap'][pos]:.4g} at z {rows['logit_top1'][pos]:.4g}, drafter gap "
                 f"{rows['draft_logit_gap'][pos]:.4g} at z {rows['draft_logit_top1'][pos]:.4g}") if pos < m else "past the harvest"
        details.append(f"prompt {i}: first parts at position {pos} ({where})")
    return RunComparison(len(runs), n_tokens, n_rounds, identical, divergences, at_tie, tie_steps, details)


def harvest_rows_by_prompt(table, prompt_indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """The columns :func:`compare_runs` reads, per prompt index, sorted by step, from a harvest table."""
    names = ("token", "draft_token", "logit_top1", "logit_gap", "draft_logit_top1", "draft_logit_gap")
    cols = {c: table.column(c).to_numpy() for c in (*names, "prompt_index", "step")}
    out = []
    for i in prompt_indices:
        mask = cols["prompt_index"] == i
        order = np.argsort(cols["step"][mask], kind="stable")
        out.append({c: cols[c][mask][order] for c in names})
    return out
