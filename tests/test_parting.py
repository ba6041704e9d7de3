"""Where two runs part (companion.speculative.parting), and the near ties there.

Oracles: runs written by hand, round by round, with the parting round and its answer positions
worked out by hand; tie rows against companion.harvest.ties' own band (called, not copied).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from companion.harvest.ties import tie_band
from companion.speculative import SpeculativeResult, Timings
from companion.speculative.parting import Parting, parting, parts_at_tie, tie_rows


def run(accepted, drafted, draft_tokens=None, tokens=None) -> SpeculativeResult:
    n = sum(a + 1 for a in accepted)
    draft_tokens = draft_tokens or [[7] * d for d in drafted]
    return SpeculativeResult(tokens=torch.tensor(tokens or list(range(n))), target_forwards=len(accepted),
                             drafter_forwards=sum(drafted), accepted=list(accepted), submitted=list(drafted),
                             drafted=list(drafted), policy="constant:4", criterion="greedy",
                             timings=Timings(math.nan, math.nan, math.nan), draft_tokens=draft_tokens)


def test_identical_runs_do_not_part():
    assert parting(run([2, 4, 1], [4, 4, 4]), run([2, 4, 1], [4, 4, 4])) is None


def test_the_first_differing_round_and_the_positions_it_reads():
    # rounds 0 and 1 emit 3 and 5 tokens: round 2 starts at answer position 8 and reads 8..12 (4 drafts, bonus)
    a, b = run([2, 4, 1, 0], [4, 4, 4, 2]), run([2, 4, 3], [4, 4, 4])
    assert parting(a, b) == Parting(2, 8, 12, ("accepted",))
    # drafts that differ (same counts) are named; one run stopping drafting earlier too
    c = run([2, 4, 1, 0], [4, 4, 4, 2], draft_tokens=[[7] * 4, [7] * 4, [7, 8, 7, 7], [7] * 2])
    assert parting(a, c).fields == ("draft_tokens",)
    d = run([2, 4, 1, 0], [4, 4, 6, 2])
    assert parting(a, d) == Parting(2, 8, 14, ("drafted", "submitted", "draft_tokens"))
    # only the fields asked about: transformers' runs are compared on what it reports
    assert parting(a, c, fields=("submitted", "accepted")) is None
    assert parting(a, b, fields=("submitted", "accepted")).fields == ("accepted",)
    # the same rounds, one run longer: it parts where the shorter one ended
    assert parting(run([2, 4], [4, 4]), run([2, 4, 0], [4, 4, 1])) == Parting(2, 8, 9, ("rounds",))
    # the same rounds, other tokens
    assert parting(run([1], [2], tokens=[5, 6]), run([1], [2], tokens=[5, 9])) == Parting(1, 2, 2, ("tokens",))


def test_tie_rows_use_the_harvest_band_and_parts_at_tie_looks_inside_the_round_only():
    z1 = 10.0
    band = float(tie_band(z1, "bfloat16"))
    gaps = [0.0, band, 2.5 * band, 3.0, band, 0.5]
    logits = torch.full((len(gaps), 6), -5.0)
    logits[:, 0] = z1
    logits[:, 3] = torch.tensor([z1 - g for g in gaps])
    ties = tie_rows(logits, "bfloat16")
    assert ties.tolist() == [True, True, False, False, True, False]
    where = Parting(1, 2, 4, ("accepted",))
    no_ties = np.zeros(len(gaps), dtype=bool)
    assert parts_at_tie(where, ties, no_ties) == {"target": [4], "drafter": []}
    assert parts_at_tie(where, no_ties, ties) == {"target": [], "drafter": [4]}
    assert parts_at_tie(Parting(0, 0, 1, ("accepted",)), ties, ties) == {"target": [0, 1], "drafter": [0, 1]}
