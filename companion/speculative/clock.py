"""Committed measurements of the clock for a preset's pair, and the ratios they give.

Two files per preset in ``companion/assets/measured_costs/`` (written by the scripts of
``benchmarks/``, each with its provenance: machine, threads, load, library versions, date, command):

* ``<preset>.json``: ``benchmarks/measure_costs.py``, every interleaved timing of ``c`` and
  ``V(1 .. kmax)`` at batch 1 (:class:`~companion.speculative.costs.CostSamples`);
* ``<preset>_wallclock.json``: ``benchmarks/bench_wallclock.py``, tokens per second of plain
  greedy decoding, ``transformers``' assisted generation (its default schedule and the built-in
  chosen on calibration prompts) and this package's decoder under the certificate rule, timed side
  by side, with ratios over pairs of runs timed back to back;
* ``<preset>_trees.json``: ``benchmarks/bench_trees.py``, the tree cost model (``V(N)``, ``D(w)``) and, unless
  it was written with ``--costs-only``, every candidate tree shape's modelled speed-up on calibration prompts
  and the clock of plain decoding, ``transformers``' assisted generation, our chain decoder and the best tree
  shape of each family (its ``runs``).

:func:`committed_costs`, :func:`committed_wallclock` and :func:`committed_trees` read them (``None`` when the preset has
none); :func:`paired_ratio` is the ratio the benchmark reports, recomputed from its runs;
:func:`speedups` every ratio a page quotes, and :func:`model_check` how far the cost model's
predicted speed-ups are from the measured ones (the verdicts as data: ratio, interval, outcome).
"""
from __future__ import annotations

import json
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


def committed_trees(preset: str, folder: Path | None = None) -> dict[str, Any] | None:
    """The preset's committed tree benchmark record (``benchmarks/bench_trees.py --out``), or ``None``."""
    record = _read((folder or MEASURED_DIR) / f"{preset}_trees.json")
    if record is not None:
        # a record of the cost model alone (--costs-only) has no clock; one with runs has all of it
        needed = ("tree_cost_model", "tree_costs") + (("modes", "clocked_trees", "best_tree", "best_builtin",
                                                       "calibration_modelled_tree", "modelled_speedup")
                                                      if "runs" in record else ())
        missing = [k for k in needed if k not in record]
        if missing:
            raise ValueError(f"the tree benchmark record of {preset!r} lacks {', '.join(missing)}")
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


def model_check(measured: dict[str, float], modelled: dict[str, float], tolerance: float = 0.10) -> dict[str, float]:
    """Per mode, the modelled speed-up over the measured one, minus 1 (``|x| <= tolerance``: the model predicts it)."""
    if set(measured) != set(modelled):
        raise ValueError(f"measured and modelled speed-ups name different modes: {sorted(measured)} and {sorted(modelled)}")
    return {m: modelled[m] / measured[m] - 1.0 for m in measured}


def speedups(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Every ratio of tokens per second a page quotes, recomputed from the record's runs (:func:`run_ratio`).

    ``"<mode> / plain"`` for every decoding mode but plain, ``"ours certificate / hf default"``,
    ``"ours certificate / hf best"`` and, when the record has it, ``"ours best / hf best"`` (the two
    decoders under one schedule). Each: geometric mean over (prompt, repeat) pairs, 95 % bootstrap
    interval over pairs, extremes and the number of pairs.
    """
    out = {f"{m} / plain": run_ratio(record, m, "plain") for m in record["modes"] if m != "plain"}
    for a, b in (("ours certificate", "hf default"), ("ours certificate", "hf best"), ("ours best", "hf best")):
        if a in record["modes"] and b in record["modes"]:
            out[f"{a} / {b}"] = run_ratio(record, a, b)
    return out


def modelled_speedups(record: dict[str, Any]) -> dict[str, float]:
    """Per drafting mode, the speed-up over plain decoding the cost model predicts: 1 over its modelled cost."""
    return {m: 1.0 / record["modelled_cost"][m] for m in record["modes"] if m != "plain"}
