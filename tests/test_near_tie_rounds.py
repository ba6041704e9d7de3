"""Near ties in the model's dtype (companion.harvest.ties) and a harvest read as the rounds of a lossless
constant-k decoder (companion.speculative.harvest_rounds), against brute force and torch's own spacing."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.harvest.ties import near_ties, tie_band, ulp
from companion.speculative.harvest_rounds import compare_runs, first_divergence, rounds_from_harvest


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("z", [0.37, 1.0, 3.9, 12.0, 16.0, 20.5, -17.25, 100.0])
def test_ulp_is_torchs_spacing(dtype, z) -> None:
    t = torch.tensor(abs(z), dtype=getattr(torch, dtype)).abs()
    spacing = (torch.nextafter(t, torch.tensor(1e4, dtype=t.dtype)) - t).item()
    assert ulp(t.item(), dtype) == spacing


def test_the_band_is_four_ulps_and_holds_exact_ties() -> None:
    assert tie_band(16.0, "bfloat16") == 0.5 and tie_band(12.0, "bfloat16") == 0.25   # 4 ulps of 0.125, 0.0625
    z1 = np.array([16.0, 16.0, 16.0, 16.0])
    gap = np.array([0.0, 0.125, 0.5, 0.625])
    assert near_ties(z1, gap, "bfloat16").tolist() == [True, True, True, False]


EOS = -7


def _rounds_by_simulation(tokens, drafts, k, n):
    """A decoder simulated token by token: it drafts from the text while its drafts agree, never past
    ``n`` tokens, and stops when the end token is emitted (accepted as a draft or as a round's own)."""
    out, emitted = [], []
    while len(emitted) < n and (not emitted or emitted[-1] != EOS):
        s = len(emitted)
        accepted = 0
        for j in range(max(0, min(k, n - s - 1))):
            if drafts[s + j] != tokens[s + j]:
                break
            accepted += 1
            emitted.append(tokens[s + j])
            if tokens[s + j] == EOS:
                break
        out.append(accepted)
        if emitted and emitted[-1] == EOS:
            break
        emitted.append(tokens[s + accepted])
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 6), st.integers(0, 8), st.booleans())
def test_rounds_from_harvest_match_a_token_by_token_simulation(agree, k, extra, ends) -> None:
    """With or without an end token, and with max_new_tokens at or past the harvested answer's length."""
    tokens = list(range(len(agree)))
    if ends:
        tokens[-1] = EOS  # the harvest keeps the end token and stops there
    drafts = [t if a else -2 for t, a in zip(tokens, agree)]
    n = len(tokens) + (extra if ends else 0)
    got = rounds_from_harvest(tokens, drafts, k, n)
    assert got == _rounds_by_simulation(tokens + [0] * extra, drafts + [0] * extra, k, n)
    assert sum(got) + len(got) >= len(tokens), "every token is an accepted draft or a round's own token"


def test_first_divergence_finds_tokens_and_rounds() -> None:
    assert first_divergence([1, 2, 3], [2, 0], [1, 2, 3], [2, 0]) is None
    assert first_divergence([1, 2, 3], [2, 0], [1, 9, 3], [2, 0]) == 1
    assert first_divergence([1, 2, 3, 4], [1, 1], [1, 2, 3, 4], [0, 2]) == 0
    assert first_divergence([1, 2, 3, 4, 5], [1, 2], [1, 2, 3, 4, 5], [1, 1, 0]) == 3
    assert first_divergence([1, 2], [1], [1, 2, 3], [1, 0]) == 2


def test_compare_runs_explains_a_parting_at_a_near_tie_only() -> None:
    tokens = np.arange(8)
    rows = {"token": tokens, "draft_token": tokens.copy(), "logit_top1": np.full(8, 16.0),
            "logit_gap": np.full(8, 3.0), "draft_logit_top1": np.full(8, 16.0), "draft_logit_gap": np.full(8, 3.0)}
    rows["logit_gap"][5] = 0.125  # a near tie of the target at position 5
    same = (tokens.tolist(), rounds_from_harvest(tokens, tokens, 4))
    parted = (tokens[:5].tolist() + [99, 6, 7], same[1])
    elsewhere = (tokens[:2].tolist() + [99] + tokens[3:].tolist(), same[1])
    res = compare_runs([rows, rows, rows], [same, parted, elsewhere], k=4, n=8, dtype="bfloat16")
    assert (res.identical, res.divergences, res.at_near_tie, res.unexplained) == (1, [(1, 5), (2, 2)], [True, False], 1)
    assert res.near_tie_steps == 3 and "position 2" in res.details[1]
