"""The target-side statistics the paper reports, at several model sizes, with intervals over prompts.

A statistic is a summary (``mean`` over finite values, ``median``, ``p5``: the 5th percentile,
as :func:`companion.analysis.traces.summarize_values`) of one per-step column over every step of a
run. Its interval is a percentile bootstrap over prompts: the prompts (whole answers) are
resampled with replacement ``n_boot`` times, the statistic is recomputed on the steps of each
resample, and the 2.5th and 97.5th percentiles of those values (order statistics, as
:func:`companion.analysis.traces.quantile`) bound a 95 % interval. Steps of
one answer are dependent, so prompts, not steps, are the unit resampled.

Sizes are non-embedding parameters: every parameter except the input embedding and the output
head (:func:`companion.models.sizes.non_embedding_parameters`), the count model cards give beside the total and the
one that does not depend on whether a conversion ties the head to the embedding.

:data:`REPORTED` holds the values a second-hand account gives for the paper's two targets (see
:data:`REPORTED_SOURCE`); they are copied, not measured here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from companion.analysis.traces import Traces, quantile
from companion.harvest.schema import column
from companion.models.sizes import non_embedding_parameters

STATS = ("mean", "median", "p5")


@dataclass(frozen=True)
class Statistic:
    """One statistic of the paper's table: a column, a summary of it, and the family it is plotted with."""

    column: str
    stat: str
    family: str
    label: str

    @property
    def key(self) -> tuple[str, str]:
        """The statistic's ``(column, stat)`` pair, its key in the tables."""
        return (self.column, self.stat)


_GREEDY = column("cert", "greedy", "forward")
#: The statistics the reading note reports for the paper's targets, grouped in families (one figure each).
STATISTICS: tuple[Statistic, ...] = (
    Statistic("p_top1", "mean", "top-1 probability", "top-1 probability, mean"),
    Statistic("p_top1", "median", "top-1 probability", "top-1 probability, median"),
    Statistic("p_top1", "p5", "top-1 probability", "top-1 probability, 5th percentile"),
    Statistic(_GREEDY, "mean", "strict greedy's certificate", "strict greedy, mean (finite)"),
    Statistic(_GREEDY, "median", "strict greedy's certificate", "strict greedy, median"),
    Statistic(_GREEDY, "p5", "strict greedy's certificate", "strict greedy, 5th percentile"),
    Statistic(column("cert", "additive:0.3", "forward"), "p5", "relaxed criteria", "additive:0.3, 5th percentile"),
    Statistic(column("cert", "multiplicative:0.1", "forward"), "p5", "relaxed criteria",
              "multiplicative:0.1, 5th percentile"),
    Statistic(column("cert", "typical:0.09,0.3", "forward"), "p5", "relaxed criteria",
              "typical:0.09,0.3, 5th percentile"),
    Statistic(column("tree_cert", 2, "forward"), "median", "tree certificates", "tree m = 2, median"),
    Statistic(column("tree_cert", 4, "forward"), "median", "tree certificates", "tree m = 4, median"),
    Statistic(column("tree_cert", 8, "forward"), "median", "tree certificates", "tree m = 8, median"),
    Statistic(column("tree_cert", 2, "forward"), "p5", "tree certificates", "tree m = 2, 5th percentile"),
    Statistic(column("tree_cert", 4, "forward"), "p5", "tree certificates", "tree m = 4, 5th percentile"),
    Statistic(column("tree_cert", 8, "forward"), "p5", "tree certificates", "tree m = 8, 5th percentile"),
    Statistic("top10_mass", "p5", "top-10 mass", "top-10 mass, 5th percentile"),
)
#: The families of :data:`STATISTICS`, in order: one figure each.
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(s.family for s in STATISTICS))

#: Where :data:`REPORTED` comes from (second-hand: the paper's full text is not public to us).
REPORTED_SOURCE = ("the reading note on the paper in the GitHub repository edgeai1/speculative-decoding-knowledge-base, "
                   "file papers/01-foundations-theory-surveys/2026--when-is-a-draft-accepted-2026.md at commit "
                   "29dd605")
#: The paper's targets as the note names them, with their non-embedding parameters from Qwen's model
#: cards (huggingface.co/Qwen/Qwen3-1.7B: 1.4B; huggingface.co/Qwen/Qwen3-4B: 3.6B).
REPORTED_MODELS: tuple[tuple[str, float], ...] = (("Qwen3-1.7B", 1.4e9), ("Qwen3-4B", 3.6e9))
#: ``(column, stat) -> (Qwen3-1.7B, Qwen3-4B)`` as the note gives them; None where it gives none.
REPORTED: dict[tuple[str, str], tuple[float, float | None]] = {
    ("p_top1", "mean"): (0.845, 0.871),
    ("p_top1", "median"): (0.969, 0.988),
    ("p_top1", "p5"): (0.343, 0.391),
    ("top10_mass", "p5"): (0.901, 0.927),
    (_GREEDY, "mean"): (0.438, 0.468),
    (_GREEDY, "median"): (0.559, 0.619),
    (_GREEDY, "p5"): (0.006, 0.007),
    (column("cert", "additive:0.3", "forward"), "p5"): (0.102, 0.107),
    (column("cert", "multiplicative:0.1", "forward"), "p5"): (0.279, 0.296),
    (column("cert", "typical:0.09,0.3", "forward"), "p5"): (0.375, 0.378),
    (column("tree_cert", 2, "forward"), "median"): (0.962, None),
    (column("tree_cert", 4, "forward"), "median"): (1.456, None),
    (column("tree_cert", 8, "forward"), "median"): (2.038, None),
    (column("tree_cert", 2, "forward"), "p5"): (0.071, None),
    (column("tree_cert", 4, "forward"), "p5"): (0.249, None),
    (column("tree_cert", 8, "forward"), "p5"): (0.531, None),
}


def summary_statistic(x: np.ndarray, stat: str) -> float:
    """``mean`` over the finite values (NaN if none), ``median`` = ``Q(0.5)``, ``p5`` = ``Q(0.05)`` (all values)."""
    x = np.asarray(x, dtype=np.float64)
    if stat == "mean":
        finite = x[np.isfinite(x)]
        return float(finite.mean()) if finite.size else math.nan
    if stat == "median":
        return quantile(x, 0.5)
    if stat == "p5":
        return quantile(x, 0.05)
    raise ValueError(f"unknown statistic {stat!r}: expected one of {', '.join(STATS)}")


def values(traces: Traces, col: str) -> np.ndarray:
    """A statistic's per-step values: the stored column (tree widths the harvest did not store: from top-64)."""
    if col.startswith("tree_cert_fwd["):
        return traces.tree_cert(int(col[len("tree_cert_fwd["):-1]))
    return traces.column(col)


@dataclass(frozen=True)
class Estimate:
    """A statistic on one run: its value over every step and a 95 % bootstrap interval over prompts."""

    value: float
    low: float
    high: float

    def overlaps(self, other: "Estimate") -> bool:
        """Whether the two confidence intervals share a point."""
        return not (self.high < other.low or other.high < self.low)


def bootstrap_statistic(traces: Traces, col: str, stat: str, *, n_boot: int = 1000, seed: int = 0) -> Estimate:
    """``stat`` of ``col`` over every step, and its percentile-bootstrap 95 % interval over prompts.

    Each resample draws ``n_prompts`` answers with replacement (``numpy.random.default_rng(seed)``)
    and recomputes the statistic on the concatenation of their steps.
    """
    x = values(traces, col)
    value = summary_statistic(x, stat)
    rng = np.random.default_rng(seed)
    starts, lengths = traces.starts, traces.lengths
    per_prompt = [x[s:s + n] for s, n in zip(starts, lengths)]
    draws = np.empty(n_boot)
    for b in range(n_boot):
        pick = rng.integers(0, len(per_prompt), len(per_prompt))
        draws[b] = summary_statistic(np.concatenate([per_prompt[i] for i in pick]), stat)
    kept = draws[~np.isnan(draws)]  # a resample with no finite value has no mean
    # order statistics, not interpolation: a statistic can be +inf (a criterion that rejects nothing)
    low, high = (quantile(kept, 0.025), quantile(kept, 0.975)) if kept.size else (math.nan, math.nan)
    return Estimate(value, float(low), float(high))


#: A prompt's family, from its id's first word: the project's chat requests or the standard-library requests.
FAMILY_NAMES: dict[str, str] = {"chat": "chat requests", "stdlib": "standard-library requests"}


def family_of(prompt_id: str) -> str:
    """``"chat"`` for ``chat-NNNN-<kind>``, ``"stdlib"`` for ``stdlib-NNNN-<task>``, else ``"other"``."""
    head = str(prompt_id).split("-", 1)[0]
    return head if head in FAMILY_NAMES else "other"


def by_family(traces: Traces) -> dict[str, Traces]:
    """The run's steps split by prompt family (:func:`family_of`), each family's answers whole and in order."""
    ids = np.asarray(traces.table.column("prompt_id").to_pylist())
    families = np.array([family_of(i) for i in ids])
    out = {}
    for fam in dict.fromkeys(families.tolist()):
        out[fam] = Traces(traces.table.filter(pa.array(families == fam)), traces.manifest)
    return out


@dataclass(frozen=True)
class SizePoint:
    """One measured run on the size axis: its model, size, and every statistic's estimate."""

    name: str
    non_embedding_parameters: int
    n_prompts: int
    n_steps: int
    estimates: Mapping[tuple[str, str], Estimate]


def size_point(name: str, traces: Traces, non_embedding: int, *, n_boot: int = 1000, seed: int = 0,
               statistics: Sequence[Statistic] = STATISTICS) -> SizePoint:
    """Every statistic of ``statistics`` on ``traces``, with its interval (:func:`bootstrap_statistic`)."""
    return SizePoint(name, int(non_embedding), traces.n_trajectories, traces.n_rows,
                     {s.key: bootstrap_statistic(traces, s.column, s.stat, n_boot=n_boot, seed=seed)
                      for s in statistics})


def ordering(points: Sequence[SizePoint], key: tuple[str, str]) -> str:
    """How a statistic moves across ``points`` sorted by size: ``"rises"`` or ``"falls"`` when every step
    up in size moves it the same way with intervals that do not overlap; ``"rises (overlapping)"`` or
    ``"falls (overlapping)"`` when the values are monotone but some neighbouring intervals overlap;
    ``"no order"`` otherwise."""
    ordered = sorted(points, key=lambda p: p.non_embedding_parameters)
    est = [p.estimates[key] for p in ordered]
    diffs = [b.value - a.value for a, b in zip(est, est[1:])]
    if all(d > 0 for d in diffs):
        direction = "rises"
    elif all(d < 0 for d in diffs):
        direction = "falls"
    else:
        return "no order"
    separated = all(not a.overlaps(b) for a, b in zip(est, est[1:]))
    return direction if separated else f"{direction} (overlapping)"


def describe_traces(manifest: Mapping[str, Any]) -> tuple[str, int]:
    """A run's model name and non-embedding parameters, from its harvest manifest (the model folder's config)."""
    target = manifest["config"]["target"]
    name = target.get("converted_from", {}).get("display_name") or Path(str(target["name"])).name
    return name, non_embedding_parameters(target["name"], target["parameters"])
