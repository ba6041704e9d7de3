"""Committed measurements of the clock for a preset's pair, and what they say, in sentences.

Two files per preset in ``companion/assets/measured_costs/`` (written by the scripts of
``benchmarks/``, each with its provenance: machine, threads, load, library versions, date, command):

* ``<preset>.json``: ``benchmarks/measure_costs.py``, every interleaved timing of ``c`` and
  ``V(1 .. kmax)`` at batch 1 (:class:`~companion.speculative.costs.CostSamples`);
* ``<preset>_wallclock.json``: ``benchmarks/bench_wallclock.py``, tokens per second of plain
  greedy decoding, ``transformers``' assisted generation (its default schedule and the built-in
  chosen on calibration prompts) and this package's decoder under the certificate rule, timed side
  by side, with ratios over pairs of runs timed back to back.

:func:`committed_costs` and :func:`committed_wallclock` read them (``None`` when the preset has
none); :func:`paired_ratio` is the ratio the benchmark reports, recomputed from its runs;
:func:`goal_sentence` and :func:`model_check_sentence` state the two goals' outcomes, one branch
per outcome.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from companion.speculative.costs import CostSamples

#: Folder of the committed measurements.
MEASURED_DIR: Path = Path(__file__).resolve().parents[1] / "assets" / "measured_costs"


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} does not hold a measurement record (a JSON object)")
    return data


def committed_costs(preset: str, folder: Path | None = None) -> tuple[CostSamples, dict[str, Any]] | None:
    """``(the timings, the whole record with its provenance)`` of the preset's committed cost measurement, or ``None``."""
    record = _read((folder or MEASURED_DIR) / f"{preset}.json")
    if record is None:
        return None
    if "samples" not in record:
        raise ValueError(f"the cost measurement of {preset!r} has no samples")
    return CostSamples.from_json(record["samples"]), record


def committed_wallclock(preset: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The preset's committed wall-clock benchmark record (``benchmarks/bench_wallclock.py --out``), or ``None``."""
    record = _read((folder or MEASURED_DIR) / f"{preset}_wallclock.json")
    if record is not None:
        missing = [k for k in ("runs", "modes", "ratios", "tokens_per_s", "modelled_cost") if k not in record]
        if missing:
            raise ValueError(f"the wall-clock record of {preset!r} lacks {', '.join(missing)}")
    return record


def paired_ratio(num: Sequence[float], den: Sequence[float], *, n_boot: int = 2000, seed: int = 0) -> dict[str, float]:
    """Geometric mean of ``num[i] / den[i]`` over pairs, with its min, max and 95 % bootstrap interval over pairs."""
    if len(num) != len(den) or not len(num):
        raise ValueError(f"need as many numerators as denominators, at least one: got {len(num)} and {len(den)}")
    logs = np.log(np.asarray(num, float) / np.asarray(den, float))
    rng = np.random.default_rng(seed)
    boot = np.exp(logs[rng.integers(0, len(logs), (n_boot, len(logs)))].mean(1))
    return {"geomean": float(np.exp(logs.mean())), "lo": float(np.quantile(boot, 0.025)),
            "hi": float(np.quantile(boot, 0.975)), "min": float(np.exp(logs.min())), "max": float(np.exp(logs.max())),
            "pairs": len(logs)}


def run_ratio(record: dict[str, Any], mode: str, over: str) -> dict[str, float]:
    """:func:`paired_ratio` of ``mode``'s tokens/s over ``over``'s, paired by (prompt, repeat), from the record's runs."""
    speed = {(r["mode"], r["prompt"], r["repeat"]): r["tokens"] / r["wall_s"] for r in record["runs"]}
    pairs = sorted({(p, rep) for m, p, rep in speed if m == over})
    if not pairs or any((mode, p, rep) not in speed for p, rep in pairs):
        raise ValueError(f"the record has no pair of runs of {mode!r} and {over!r} for every (prompt, repeat)")
    return paired_ratio([speed[(mode, p, rep)] for p, rep in pairs], [speed[(over, p, rep)] for p, rep in pairs])


@dataclass(frozen=True)
class Goal:
    """The clock goal: ``ratio`` (ours over the baseline, paired) against ``target`` (e.g. 1.05)."""

    ratio: dict[str, float]
    target: float

    @property
    def outcome(self) -> str:
        """``reached`` (the interval's low end >= target), ``not reached`` (its high end < target), else ``unresolved``."""
        if self.ratio["lo"] >= self.target:
            return "reached"
        if self.ratio["hi"] < self.target:
            return "not reached"
        return "unresolved"


def _x(v: float) -> str:
    return f"{v:.2f}x"


def goal_sentence(goal: Goal, baseline: str, limits: str) -> str:
    """One sentence per outcome of :class:`Goal`; ``limits`` (a clause) says what bounds the ratio when it falls short."""
    r = goal.ratio
    size = f"{_x(r['geomean'])} [{r['lo']:.2f}, {r['hi']:.2f}] the tokens per second of {baseline}"
    if goal.outcome == "reached":
        return f"the goal of {_x(goal.target)} is reached: our decoder under the certificate rule ran at {size}"
    faster = ("faster than it" if r["lo"] > 1 else "slower than it" if r["hi"] < 1 else
              "not resolved from it")
    if goal.outcome == "not reached":
        return (f"the goal of {_x(goal.target)} is not reached: our decoder under the certificate rule ran at {size} "
                f"({faster}); {limits}")
    return (f"whether the goal of {_x(goal.target)} is reached is not resolved: our decoder under the certificate rule "
            f"ran at {size} ({faster}), an interval on both sides of {goal.target:g}; {limits}")


def model_check(measured: dict[str, float], modelled: dict[str, float], tolerance: float = 0.10) -> dict[str, float]:
    """Per mode, the modelled speed-up over the measured one, minus 1 (``|x| <= tolerance``: the model predicts it)."""
    if set(measured) != set(modelled):
        raise ValueError(f"measured and modelled speed-ups name different modes: {sorted(measured)} and {sorted(modelled)}")
    return {m: modelled[m] / measured[m] - 1.0 for m in measured}


def model_check_sentence(errors: dict[str, float], tolerance: float = 0.10) -> str:
    """Whether the cost model predicts every measured speed-up within ``tolerance``; names those it misses."""
    if not errors:
        raise ValueError("no speed-ups to check")
    worst = max(errors, key=lambda m: abs(errors[m]))
    off = {m: e for m, e in errors.items() if not abs(e) <= tolerance or math.isnan(e)}
    if not off:
        return (f"the cost model predicts every measured speed-up within {tolerance:.0%} (the furthest, `{worst}`, by "
                f"{errors[worst]:+.1%})")
    listing = ", ".join(f"`{m}` {'over' if e > 0 else 'under'}estimated by {abs(e):.1%}" for m, e in off.items())
    return (f"the cost model misses {len(off)} of the {len(errors)} measured speed-ups by more than {tolerance:.0%}: "
            f"{listing}")
