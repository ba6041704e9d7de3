"""Where two runs of one prompt part, and whether either model's top-2 logits are a near tie there.

Two lossless decoders of the same prompt (ours and the replay of a recording, or ours and
transformers') make the same rounds unless a forward rounds differently: in bfloat16 a
multi-token verification, a one-token step and a whole-answer forward need not agree in the last
bits, which changes a decision only where the two largest logits are within rounding of each other.
:func:`parting` finds the first round in which two runs differ and the answer positions that round
reads; :func:`tie_rows` marks the rows of teacher-forced logits whose top-2 gap is within
:func:`companion.harvest.ties.near_ties`' band; :func:`parts_at_tie` puts the two together.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from companion.harvest.ties import near_ties
from companion.speculative.decoder import SpeculativeResult

_FIELDS = ("drafted", "submitted", "accepted", "draft_tokens")


@dataclass(frozen=True)
class Parting:
    """The first round in which two runs differ.

    ``round``: its index; ``position``: the answer tokens emitted before it (both runs agree on
    them); ``last``: the last answer position that round reads in either run (its drafts predict
    positions ``position .. position + drafted - 1``, its verification the target's tokens at
    ``position .. position + submitted``); ``fields``: what differs in it (``drafted``,
    ``submitted``, ``accepted``, ``draft_tokens``; ``rounds`` when one run has ended).
    """

    round: int
    position: int
    last: int
    fields: tuple[str, ...]


def parting(a: SpeculativeResult, b: SpeculativeResult, fields: Sequence[str] = _FIELDS) -> Parting | None:
    """Where runs ``a`` and ``b`` of one prompt first differ, round by round, in ``fields`` (default: drafts made,
    submitted, accepted and the draft tokens; transformers' runs record submitted and accepted as it reports
    them); ``None`` when they make the same rounds and the same tokens."""
    unknown = set(fields) - set(_FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; choose among {list(_FIELDS)}")
    s = 0
    for r in range(max(len(a.accepted), len(b.accepted))):
        if r >= len(a.accepted) or r >= len(b.accepted):
            run = a if r < len(a.accepted) else b
            return Parting(r, s, s + run.drafted[r], ("rounds",))
        differ = tuple(f for f in fields if getattr(a, f)[r] != getattr(b, f)[r])
        if differ:
            return Parting(r, s, s + max(a.drafted[r], b.drafted[r]), differ)
        s += a.accepted[r] + 1
    if not torch.equal(a.tokens.cpu(), b.tokens.cpu()):
        return Parting(len(a.accepted), s, s, ("tokens",))
    return None


def tie_rows(logits: Tensor, dtype: str) -> np.ndarray:
    """Per row of ``logits [n, V]`` (a model's teacher-forced rows, any float dtype): whether its two largest
    logits are a near tie in ``dtype`` (:func:`companion.harvest.ties.near_ties`, its default band)."""
    top = logits.detach().float().topk(2, dim=-1).values.cpu().numpy().astype(np.float64)
    return near_ties(top[:, 0], top[:, 0] - top[:, 1], dtype)


def parts_at_tie(where: Parting, target_ties: np.ndarray, drafter_ties: np.ndarray) -> dict[str, list[int]]:
    """The answer positions of the parting round (``where.position .. where.last``, within the rows given) at which
    the target's and the drafter's teacher-forced rows are near ties: ``{"target": [...], "drafter": [...]}``.

    Row ``t`` is the model's prediction of answer token ``t`` from the true prefix. The drafter's drafts
    past a rejected one come from its own continuation, which teacher-forced rows do not cover: a
    parting there shows no drafter tie here even when one caused it."""
    hi = where.last + 1
    return {"target": [int(t) for t in np.flatnonzero(target_ties[where.position:hi]) + where.position],
            "drafter": [int(t) for t in np.flatnonzero(drafter_ties[where.position:hi]) + where.position]}
