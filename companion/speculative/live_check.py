"""Live decoding against the replay and against transformers, round for round (chapter 10's check).

:func:`live_check` decodes a few prompts live with :func:`~companion.speculative.generate` under
some built-in schedules and the certificate rule, replays the same policies on recordings of the
same answers, runs ``transformers``' assisted generation under the built-ins, and reports where any
two runs part (:func:`~companion.speculative.parting.parting`) and whether either model's
teacher-forced top-2 logits are a near tie in the round where they do.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from companion.speculative.parting import Parting, parting, parts_at_tie, tie_rows


@dataclass(frozen=True)
class Departure:
    """Two runs of one (prompt, policy) that part: ``who`` (``replay`` or ``transformers``), where, and the near
    ties of the target's and the drafter's teacher-forced rows in that round (answer positions)."""

    who: str
    policy: str
    prompt: int
    where: Parting
    ties: dict[str, list[int]]

    @property
    def at_tie(self) -> bool:
        return bool(self.ties["target"] or self.ties["drafter"])


@dataclass
class LiveCheck:
    """The outcome of :func:`live_check`. ``ours[policy]``: our decoder's runs, one per prompt."""

    ours: dict[str, list[Any]]
    replay_matched: int
    runs: int
    hf_matched: int
    hf_total: int
    departures: list[Departure]
    seconds: float

    @property
    def at_tie(self) -> int:
        """How many of the departures part in a round where either model's top-2 logits are a near tie."""
        return sum(d.at_tie for d in self.departures)


def live_check(target: Any, drafter: Any, prompt_ids: Sequence[torch.Tensor], answers: Sequence[Sequence[int]],
               builtins: Sequence[str], certificate: Any, n_tokens: int, dtype: str) -> LiveCheck:
    """Decode ``prompt_ids`` live for ``n_tokens`` tokens under ``builtins`` and the calibrated rule
    ``certificate`` (a zero-argument factory of a fresh policy); replay them on recordings of
    ``answers``; run ``transformers`` under ``builtins``; and list every run that parts from ours."""
    import time

    from companion.speculative import generate, hf_agreement, record_chains, replay

    t0 = time.perf_counter()
    ties: list[Any] = [None] * len(prompt_ids)

    def keep(i: int):
        def inner(p_logits: torch.Tensor, q_logits: torch.Tensor) -> None:
            ties[i] = (tie_rows(p_logits, dtype), tie_rows(q_logits, dtype))
        return inner

    chains = [record_chains(target, drafter, ids, max_new_tokens=n_tokens, text=list(a[:n_tokens]), inspect=keep(i))
              for i, (ids, a) in enumerate(zip(prompt_ids, answers))]
    ours: dict[str, list[Any]] = {}
    departures: list[Departure] = []
    for spec in list(builtins) + ["certificate"]:
        make = certificate if spec == "certificate" else (lambda s=spec: s)
        ours[spec] = [generate(target, drafter, ids, policy=make(), max_new_tokens=n_tokens) for ids in prompt_ids]
        for i, ch in enumerate(chains):
            if (where := parting(ours[spec][i], replay(ch, make()))) is not None:
                departures.append(Departure("replay", spec, i, where, parts_at_tie(where, *ties[i])))
    replay_parted = len(departures)
    hf = hf_agreement(target, drafter, list(prompt_ids), list(builtins), max_new_tokens=n_tokens,
                      reference=lambda spec, i: ours[spec][i])
    for (spec, i), theirs in hf.runs.items():
        if (where := parting(ours[spec][i], theirs, fields=("submitted", "accepted"))) is not None:
            departures.append(Departure("transformers", spec, i, where, parts_at_tie(where, *ties[i])))
    if len(departures) - replay_parted != hf.total - hf.matched:
        raise RuntimeError(f"transformers' runs that part ({len(departures) - replay_parted}) are not its "
                           f"mismatches ({hf.total - hf.matched}): {hf.mismatches[:5]}")
    runs = len(prompt_ids) * (len(builtins) + 1)
    return LiveCheck(ours, runs - replay_parted, runs, hf.matched, hf.total, departures, time.perf_counter() - t0)


def text_departures(runs: Sequence[Any], answers: Sequence[Sequence[int]], rows: Sequence[dict[str, Any]],
                    dtype: str) -> list[tuple[int, int, bool]]:
    """Where each live run's text first departs from the harvested answer of its prompt:
    ``(prompt, position, whether the target's top-2 logits are a near tie there)``, one per run that departs.

    The harvest's batched answers are the target's greedy text, so one-sequence decoding gives the
    same tokens; in a reduced precision a batched and a one-sequence forward may round a near tie
    (:func:`companion.harvest.ties.near_ties`) differently, and only there. ``rows[i]``: prompt ``i``'s
    harvested columns ``logit_top1`` and ``logit_gap`` in step order
    (:func:`companion.speculative.harvest_rounds.harvest_rows_by_prompt`)."""
    from companion.harvest.ties import near_ties

    out = []
    for i, (run, answer, cols) in enumerate(zip(runs, answers, rows)):
        got = [int(t) for t in run.tokens.tolist()]
        j = next((t for t, (a, b) in enumerate(zip(got, answer)) if a != b), None)
        if j is not None:
            tie = bool(near_ties(cols["logit_top1"][j:j + 1], cols["logit_gap"][j:j + 1], dtype)[0])
            out.append((i, j, tie))
    return out
