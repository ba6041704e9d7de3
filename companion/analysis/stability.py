"""How stable the paper's statistics are to the precision and the batch a step is computed in.

Two harvests of one model on the same prompts need not give the same answers. A greedy step
takes the largest logit; when the two largest nearly tie, the rounding of one kernel path can
order them differently from another's, and from there on the two answers are different texts.
The kernel path changes with the dtype (bfloat16 or float32) and with the batch a prompt is
decoded in (its neighbours set the padding and the shapes of every matrix product).

Two measurements, on runs of the same prompts:

* **Where answers part** (:func:`partings`). For every prompt both runs answered, the first step
  whose greedy tokens differ; up to it the prefixes are equal, so both runs computed the same
  step. At that step, each run's top-2 logit gap in units in the last place of ``dtype`` at its
  top logit (:func:`companion.harvest.ties.ulp`); a parting whose gaps are both within
  :data:`companion.harvest.ties.TIE_ULPS` lies in the near-tie band, where rounding alone can
  reverse the order.
* **The statistics side by side** (:func:`side_by_side`). Every statistic of the paper's table
  (:data:`companion.analysis.size_axis.STATISTICS`) on each run, restricted to the prompts all the
  runs answered and to the steps all of them computed, with its 95 % bootstrap interval over
  prompts; :func:`shifts` says, run by run, how far each moves from a reference run's value and
  whether it stays inside the reference's interval.

The page that reads these numbers writes its sentences by hand and checks each against them; an
answer that parts in several pairs of runs is one answer (:func:`distinct_parted`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from companion.analysis.size_axis import STATISTICS, SizePoint, Statistic, size_point
from companion.analysis.traces import Traces
from companion.harvest.ties import TIE_ULPS, ulp

_NEEDED = ("prompt_id", "step", "token", "logit_top1", "logit_gap")


@dataclass(frozen=True)
class Parting:
    """One prompt answered by two runs: the first step whose tokens differ (None: none differ over the
    ``compared`` steps both runs have), and there each run's top-2 logit gap in ulps of the dtype."""

    prompt_id: str
    compared: int
    step: int | None
    gap_ulps: tuple[float, float] | None

    @property
    def parted(self) -> bool:
        return self.step is not None

    @property
    def worst_gap_ulps(self) -> float:
        """The larger of the two runs' gaps at the parting step (NaN when the answers do not part)."""
        return max(self.gap_ulps) if self.gap_ulps is not None else math.nan


def _rows(table: pa.Table, max_steps: int | None) -> dict[str, dict[str, np.ndarray]]:
    missing = [c for c in _NEEDED if c not in table.column_names]
    if missing:
        raise ValueError(f"a run's table lacks the columns {missing} (needed to find where answers part)")
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in _NEEDED}
    out: dict[str, dict[str, np.ndarray]] = {}
    for pid in dict.fromkeys(cols["prompt_id"].tolist()):
        rows = np.flatnonzero(cols["prompt_id"] == pid)
        rows = rows[np.argsort(cols["step"][rows], kind="stable")]
        if max_steps is not None:
            rows = rows[cols["step"][rows] < max_steps]
        steps = cols["step"][rows]
        if not np.array_equal(steps, np.arange(len(steps))):
            raise ValueError(f"prompt {pid}: its steps are not 0, 1, 2, ... (a run with gaps cannot be compared)")
        out[str(pid)] = {c: cols[c][rows] for c in _NEEDED[2:]}
    return out


def partings(a: pa.Table | Traces, b: pa.Table | Traces, *, dtype: str = "bfloat16",
             max_steps: int | None = None) -> list[Parting]:
    """Compare two runs prompt by prompt (the prompts of ``a`` that ``b`` also answered, in ``a``'s order).

    A prompt's tokens are compared from step 0 over the steps both runs have (and below
    ``max_steps``); the first step where they differ is its parting step, and the gaps there are
    ``logit_gap / ulp(logit_top1, dtype)`` of run ``a`` and run ``b``. An answer ends in a run at its
    end-of-turn token, so two answers with equal tokens end together; one that is longer in one run
    only because the other was cut at fewer steps is compared over the steps both have.
    """
    ta = a.table if isinstance(a, Traces) else a
    tb = b.table if isinstance(b, Traces) else b
    ra, rb = _rows(ta, max_steps), _rows(tb, max_steps)
    out = []
    for pid, x in ra.items():
        if pid not in rb:
            continue
        y = rb[pid]
        n = min(len(x["token"]), len(y["token"]))
        differ = np.flatnonzero(x["token"][:n] != y["token"][:n])
        if differ.size == 0:
            out.append(Parting(pid, n, None, None))
            continue
        s = int(differ[0])
        gaps = tuple(float(r["logit_gap"][s] / ulp(r["logit_top1"][s], dtype)) for r in (x, y))
        out.append(Parting(pid, s + 1, s, gaps))  # type: ignore[arg-type]
    return out


@dataclass(frozen=True)
class PartingSummary:
    """:func:`partings` counted: answers compared, how many part, their parting steps and worst gaps (ulps)."""

    answers: int
    steps: int
    parted_steps: tuple[int, ...]
    gaps_ulps: tuple[float, ...]
    band_ulps: float
    parted_ids: tuple[str, ...] = ()  # the prompts whose answers part, in the order of parted_steps

    @property
    def parted(self) -> int:
        return len(self.parted_steps)

    @property
    def outside_band(self) -> int:
        return sum(g > self.band_ulps for g in self.gaps_ulps)


def summarize_partings(found: Sequence[Parting], band_ulps: float = TIE_ULPS) -> PartingSummary:
    """Count ``found``: answers, steps compared, each parting's step and larger gap (in the order found)."""
    parted = [p for p in found if p.parted]
    return PartingSummary(len(found), sum(p.compared for p in found), tuple(int(p.step) for p in parted),
                          tuple(p.worst_gap_ulps for p in parted), float(band_ulps),
                          tuple(p.prompt_id for p in parted))


def distinct_parted(summaries: Sequence[PartingSummary]) -> tuple[int, int]:
    """``(answers, outside)`` over several pairs of runs: the distinct prompts whose answers part in at
    least one pair, and of those the prompts that part outside the band in at least one pair. An
    answer that parts between three pairs of runs is counted once, not three times."""
    parted: set[str] = set()
    outside: set[str] = set()
    for s in summaries:
        for pid, gap in zip(s.parted_ids, s.gaps_ulps):
            parted.add(pid)
            if gap > s.band_ulps:
                outside.add(pid)
    return len(parted), len(outside)


def restrict(traces: Traces, prompt_ids: Sequence[str], max_steps: int | None = None) -> Traces:
    """``traces`` with only the answers of ``prompt_ids`` and, of each, the steps below ``max_steps``."""
    keep = pc.is_in(traces.table.column("prompt_id"), value_set=pa.array(list(prompt_ids), pa.string()))
    if max_steps is not None:
        keep = pc.and_(keep, pc.less(traces.table.column("step"), max_steps))
    return Traces(traces.table.filter(keep), traces.manifest)


def side_by_side(runs: Mapping[str, Traces], *, max_steps: int | None = None, n_boot: int = 1000, seed: int = 0,
                 statistics: Sequence[Statistic] = STATISTICS) -> dict[str, SizePoint]:
    """Every statistic on each run, over the prompts every run answered (in the first run's order) and
    the steps below ``max_steps``, with its bootstrap interval over prompts
    (:func:`companion.analysis.size_axis.size_point`; the point's size field is 0)."""
    if not runs:
        return {}
    ids = [list(dict.fromkeys(t.table.column("prompt_id").to_pylist())) for t in runs.values()]
    common = [i for i in ids[0] if all(i in set(other) for other in ids[1:])]
    if not common:
        raise ValueError("the runs share no prompt, so their statistics cannot be set side by side")
    return {name: size_point(name, restrict(t, common, max_steps), 0, n_boot=n_boot, seed=seed, statistics=statistics)
            for name, t in runs.items()}


@dataclass(frozen=True)
class Shift:
    """One run's statistics against a reference run's: how many lie inside the reference's interval, and
    the largest difference relative to the reference value (its statistic's label)."""

    run: str
    inside: int
    total: int
    largest_relative: float
    largest_label: str


def shifts(points: Mapping[str, SizePoint], reference: str,
           statistics: Sequence[Statistic] = STATISTICS) -> list[Shift]:
    """Each other run's :class:`Shift` against ``reference``. A value inside means ``low <= value <= high``
    of the reference's estimate; the relative difference is ``|v - v_ref| / |v_ref|`` (the absolute one
    where ``v_ref`` is 0; equal infinities differ by 0)."""
    ref = points[reference]
    out = []
    for name, point in points.items():
        if name == reference:
            continue
        inside, worst, worst_label = 0, -1.0, ""
        for st in statistics:
            r, v = ref.estimates[st.key], point.estimates[st.key].value
            inside += bool(r.low <= v <= r.high) or (v == r.value)
            if v == r.value:
                rel = 0.0
            elif math.isinf(v) or math.isinf(r.value):
                rel = math.inf
            else:
                rel = abs(v - r.value) / (abs(r.value) if r.value != 0 else 1.0)
            if rel > worst:
                worst, worst_label = rel, st.label
        out.append(Shift(name, inside, len(statistics), worst, worst_label))
    return out
