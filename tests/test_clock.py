"""The committed clock measurements' reader and the ratios the clock chapter quotes."""
from __future__ import annotations

import json
import math

import pytest

from companion.speculative.clock import (
    Goal,
    committed_costs,
    committed_wallclock,
    modelled_speedups,
    model_check,
    paired_ratio,
    run_ratio,
    speedups,
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


@pytest.mark.parametrize("lo, hi, outcome", [
    (1.06, 1.2, "reached"), (0.9, 0.99, "not reached"), (1.01, 1.04, "not reached"), (1.0, 1.1, "unresolved"),
])
def test_goal_outcome_is_read_from_the_interval(lo, hi, outcome):
    assert Goal({"geomean": (lo + hi) / 2, "lo": lo, "hi": hi}, 1.05).outcome == outcome


def test_model_check_is_the_relative_error_of_each_prediction():
    off = model_check({"a": 1.5, "b": 1.2}, {"a": 1.2, "b": 1.25})
    assert off["a"] == pytest.approx(-0.2) and off["b"] == pytest.approx(1.25 / 1.2 - 1)
    with pytest.raises(ValueError, match="different modes"):
        model_check({"a": 1.0}, {"b": 1.0})


def test_speedups_recompute_the_committed_record_from_its_runs():
    """Every ratio the clock chapter quotes is the record's own (recomputed from its runs, not retyped)."""
    record = committed_wallclock("qwen2.5-coder")
    assert record is not None
    got = speedups(record)
    for name, stored in record["ratios"].items():
        assert got[name]["geomean"] == pytest.approx(stored["geomean"], rel=1e-9), name
        assert got[name]["pairs"] == stored["pairs"]
    # the evidence behind the intervals: (prompt, repeat) pairs of the prompts and repeats the record names
    assert {r["pairs"] for r in got.values()} == {record["prompts"] * record["repeats"]}
    assert modelled_speedups(record)["hf best"] == pytest.approx(1 / record["modelled_cost"]["hf best"])


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
