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

The sentences a page prints (:func:`parting_sentence`, :func:`statistics_sentence`) are computed
from those numbers alone, one branch per outcome.
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
                          tuple(p.worst_gap_ulps for p in parted), float(band_ulps))


def _ulps(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.2g}"


def parting_sentence(a: str, b: str, answers: int, parted_steps: Sequence[int], gaps_ulps: Sequence[float],
                     band_ulps: float = TIE_ULPS, dtype: str = "bfloat16") -> str:
    """What two runs' partings show, from the counts alone (:class:`PartingSummary`'s fields)."""
    if len(parted_steps) != len(gaps_ulps):
        raise ValueError("one gap per parting step")
    if answers == 0:
        return f"{a} and {b} share no answer, so where they part cannot be measured."
    k = len(parted_steps)
    if k == 0:
        return (f"{a} and {b} give the same tokens on the one answer they share." if answers == 1 else
                f"{a} and {b} give the same tokens on all {answers} answers they share.")
    steps = ", ".join(str(s) for s in sorted(parted_steps))
    rest = f"the other {k} part at steps" if k > 1 else "the other one parts at step"
    head = f"{a} and {b} give the same tokens on {answers - k} of the {answers} answers they share; {rest} {steps}"
    outside = [g for g in gaps_ulps if g > band_ulps]
    worst = max(gaps_ulps)
    if not outside:
        return (head + f", each where the two largest logits lie within {_ulps(worst)} {dtype} "
                f"ulp{'s' if worst != 1 else ''} of each other in both runs, inside the near-tie band of "
                f"{_ulps(band_ulps)}: there rounding alone can choose the token.")
    within = k - len(outside)
    return (head + f"; {within} of the partings lie inside the near-tie band of {_ulps(band_ulps)} {dtype} ulps and "
            f"{len(outside)} outside it (the largest gap {_ulps(worst)} ulps): "
            + ("that one is" if len(outside) == 1 else "those are")
            + " not explained by rounding at a near tie alone.")


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


def statistics_sentence(reference: str, answers: int, found: Sequence[Shift]) -> str:
    """What the statistics side by side show against ``reference``, from the counts alone."""
    if not found:
        return f"Only {reference} was measured, so nothing is compared."
    parts = []
    for s in found:
        if s.largest_relative == 0:
            parts.append(f"{s.run} gives every one of the {s.total} statistics exactly as {reference} does")
            continue
        where = ("every one inside" if s.inside == s.total else f"{s.inside} of the {s.total} inside")
        parts.append(f"{s.run} moves the {s.total} statistics by at most {s.largest_relative:.1%} "
                     f"({s.largest_label}), {where} {reference}'s 95 % interval")
    head = "; ".join(parts) + "."
    head = head[0].upper() + head[1:]
    if answers < 2:
        return (head + f" With {answers} answer{'' if answers == 1 else 's'}, a bootstrap over prompts has no spread, "
                "so these differences cannot be set against a sampling interval.")
    if all(s.inside == s.total for s in found):
        tail = (f" On these {answers} answers, then, no run moves a statistic beyond {reference}'s sampling interval; "
                "intervals over so few answers are wide, so this bounds the effect by their width, no closer.")
    else:
        moved = [s.run for s in found if s.inside < s.total]
        names = moved[0] if len(moved) == 1 else ", ".join(moved[:-1]) + " and " + moved[-1]
        tail = (f" So {names} move{'s' if len(moved) == 1 else ''} some statistics further than resampling "
                f"these {answers} answers moves them: on those statistics the numerics matter at this sample size.")
    return head + tail

def conclusion(parted: int, outside_band: int, moved_runs: int) -> str:
    """One sentence from the totals over every pair compared: answers that part, partings outside the
    near-tie band, and runs that move some statistic beyond the reference's interval."""
    if parted == 0:
        tokens = "Precision and batch changed no answer measured here"
    elif outside_band == 0:
        tokens = (f"Precision and batch changed {parted} answer{'s' if parted != 1 else ''}, every one at a near tie, "
                  "so a token-for-token reproduction of these answers needs the same dtype and the same batches")
    else:
        tokens = (f"Precision and batch changed {parted} answer{'s' if parted != 1 else ''}, {outside_band} of them "
                  "at a step that is not a near tie")
    if moved_runs == 0:
        return tokens + ("; the paper's statistics stayed inside their sampling intervals, so at this sample size "
                         "their values are not a property of the numerics.")
    return tokens + (f"; {moved_runs} run{'s' if moved_runs != 1 else ''} moved some statistic beyond its sampling "
                     "interval, so those values depend on the numerics as well as on the prompts.")
