"""Chapter 8's plumbing (companion.analysis.drafter_report) and chapter 9's (companion.cli_runner)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.analysis.drafter_report import agreement_rows, confidence_groups, pair_facts
from companion.cli_runner import show_error


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.booleans()), min_size=1, max_size=60))
def test_confidence_groups_partition_and_agreement_counts(steps) -> None:
    p1 = np.array([s[0] for s in steps])
    agree = np.array([s[1] for s in steps])
    groups = confidence_groups(p1)
    membership = np.stack([m for _, m in groups]).sum(0)
    assert (membership == 1).all()                      # every step in exactly one group
    rows = agreement_rows(agree, groups)
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    n_dis = int((~agree).sum())
    if n_dis:
        assert sum(r.share_of_disagreements for r in rows) == pytest.approx(1.0)
    # against counting by hand: the group of p is the number of inner edges at or below it
    index = [sum(x >= e for e in (0.25, 0.5, 0.75, 0.9)) for x, _ in steps]
    for g, r in enumerate(rows):
        mine = [a for (_, a), i in zip(steps, index) if i == g]
        assert r.share == pytest.approx(len(mine) / len(steps))
        if mine:
            assert r.agreement == pytest.approx(np.mean(mine))
        else:
            assert np.isnan(r.agreement)


def test_pair_facts_reads_the_manifest() -> None:
    manifest = {"config": {
        "target": {"name": "t", "parameters": 1_500_000_000,
                   "converted_from": {"display_name": "Target-1.5B"}},
        "drafter": {"name": "/x/d", "parameters": 500_000_000},
        "dtype": "bfloat16", "device_type": "cpu", "prompt_set": {"n_prompts": 4}, "n_steps": 32}}
    f = pair_facts(manifest, rows=100)
    assert (f.target, f.drafter, f.published_drafter) == ("Target-1.5B", "/x/d", False)
    assert (f.target_params_m, f.drafter_params_m, f.n_prompts, f.n_steps, f.rows) == (1500, 500, 4, 32, 100)


def test_show_error_returns_the_error_and_fails_without_one(capsys) -> None:
    err = show_error(lambda: int("x"))
    assert isinstance(err, ValueError) and "ValueError" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="expected an error"):
        show_error(lambda: None)
