"""The committed clock measurements' reader and the sentences of chapter 10's wall-clock section."""
from __future__ import annotations

import json
import math

import pytest

from companion.speculative.clock import (
    Goal,
    committed_costs,
    committed_wallclock,
    goal_sentence,
    model_check,
    model_check_sentence,
    paired_ratio,
    run_ratio,
)
from companion.speculative.costs import CostSamples


def test_paired_ratio_is_the_geometric_mean_of_the_pairs():
    r = paired_ratio([2.0, 8.0], [1.0, 2.0])
    assert r["geomean"] == pytest.approx(math.sqrt(2 * 4)) and (r["min"], r["max"]) == (pytest.approx(2), pytest.approx(4))
    assert r["lo"] <= r["geomean"] <= r["hi"] and r["pairs"] == 2
    assert paired_ratio([3.0, 3.0], [1.0, 1.0])["lo"] == pytest.approx(3.0)   # no spread: the interval is the point
    with pytest.raises(ValueError, match="as many"):
        paired_ratio([1.0], [1.0, 2.0])


def _record(speeds: dict[str, list[float]]) -> dict:
    runs = [{"mode": m, "prompt": i, "repeat": 0, "tokens": 10, "wall_s": 10 / v} for m, vs in speeds.items()
            for i, v in enumerate(vs)]
    return {"runs": runs, "modes": list(speeds), "ratios": {}, "tokens_per_s": {}, "modelled_cost": {}}


def test_run_ratio_pairs_runs_by_prompt_and_repeat():
    rec = _record({"plain": [4.0, 5.0], "ours certificate": [6.0, 5.0]})
    assert run_ratio(rec, "ours certificate", "plain")["geomean"] == pytest.approx(math.sqrt(1.5))
    with pytest.raises(ValueError, match="no pair"):
        run_ratio(rec, "hf best", "plain")


@pytest.mark.parametrize("lo, hi, outcome, words", [
    (1.06, 1.2, "reached", "is reached"),
    (0.9, 0.99, "not reached", "slower than it"),
    (1.01, 1.04, "not reached", "faster than it"),
    (0.98, 1.03, "not reached", "not resolved from it"),
    (1.0, 1.1, "unresolved", "not resolved"),
])
def test_goal_sentence_has_a_branch_per_outcome(lo, hi, outcome, words):
    goal = Goal({"geomean": (lo + hi) / 2, "lo": lo, "hi": hi}, 1.05)
    assert goal.outcome == outcome
    text = goal_sentence(goal, "`transformers` under `constant:4`", "LIMITS")
    assert words in text and "1.05x" in text and f"[{lo:.2f}, {hi:.2f}]" in text
    assert ("LIMITS" in text) == (outcome != "reached")


def test_model_check_sentence_names_every_miss():
    ok = model_check({"a": 1.5, "b": 1.2}, {"a": 1.45, "b": 1.25})
    assert "predicts every measured speed-up within 10%" in model_check_sentence(ok)
    off = model_check({"a": 1.5, "b": 1.2}, {"a": 1.2, "b": 1.25})
    text = model_check_sentence(off)
    assert "misses 1 of the 2" in text and "`a` underestimated by 20.0%" in text and "`b`" not in text
    with pytest.raises(ValueError, match="different modes"):
        model_check({"a": 1.0}, {"b": 1.0})


def test_committed_files_read_and_refused(tmp_path):
    assert committed_costs("nothing", tmp_path) is None and committed_wallclock("nothing", tmp_path) is None
    samples = CostSamples(target_s={1: (1.0, 1.1), 2: (1.2, 1.3)}, drafter_s=(0.4, 0.5), context=8, threads=2)
    (tmp_path / "p.json").write_text(json.dumps({"preset": "p", "samples": samples.to_json()}))
    got, record = committed_costs("p", tmp_path)
    assert got == samples and record["preset"] == "p"
    (tmp_path / "q.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        committed_costs("q", tmp_path)
    (tmp_path / "p_wallclock.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="lacks modes"):
        committed_wallclock("p", tmp_path)
