"""The plumbing of the paper's evaluation (chapter 7): runs, tables and counts, no sentences.

Chapter 7 writes its prose by hand and checks each claim against the numbers computed here. Every
quantile is an order statistic (:func:`companion.analysis.traces.quantile`: the median of ``N``
values is the ``ceil(N/2)``-th smallest, not the mean of the middle two), and every parameter
count comes from :func:`companion.models.sizes.parameter_count`.
"""
from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from companion.analysis import size_axis as S
from companion.analysis.conventions import kernel_path_values, zero_share
from companion.analysis.traces import Enlargement, Summary, Traces, quantile, summarize_values
from companion.harvest.schema import column
from companion.models.sizes import ParameterCount, parameter_count

#: "Agrees" with a second-hand value: within 10 % of it.
REL_TOL = 0.10
GREEDY = column("cert", "greedy", "forward")
#: The statistics a page quotes by name: glue key stem -> (column, statistic).
HEADLINE: dict[str, tuple[str, str]] = {
    "p1_median": ("p_top1", "median"), "top10_median": ("top10_mass", "median"),
    "greedy_median": (GREEDY, "median"), "greedy_p5": (GREEDY, "p5"),
    "mult_median": (column("cert", "multiplicative:0.1", "forward"), "median"),
    "mult_p5": (column("cert", "multiplicative:0.1", "forward"), "p5"),
    "typ_median": (column("cert", "typical:0.09,0.3", "forward"), "median"),
    "tree8_median": (column("tree_cert", 8, "forward"), "median"),
}


def target_count(manifest: Mapping[str, Any]) -> ParameterCount:
    """The run's target's :class:`~companion.models.sizes.ParameterCount` (its folder's weights)."""
    target = manifest["config"]["target"]
    return parameter_count(target["name"], target.get("parameters"))


def describe_run(manifest: Mapping[str, Any]) -> str:
    """:func:`companion.book.record.describe_harvest` with each model's parameters counted by
    :func:`parameter_count` (a tied embedding once), so the page states one count per model."""
    from companion.book.record import describe_harvest

    fixed = copy.deepcopy(dict(manifest))
    for role in ("target", "drafter"):
        ident = fixed.get("config", {}).get(role)
        if ident and ident.get("name") and Path(str(ident["name"])).is_dir():
            ident["parameters"] = parameter_count(ident["name"], ident.get("parameters")).total
    return describe_harvest(fixed)


def run_facts(manifest: Mapping[str, Any], traces: Traces) -> dict[str, Any]:
    """The run's numbers a page glues: steps, answers, mean length, exact ties, the target's size
    (millions, total and without embeddings) and dtype."""
    count = target_count(manifest)
    return {"steps": traces.n_rows, "prompts": traces.n_trajectories, "mean_len": float(traces.lengths.mean()),
            "ties": int(traces.column("top2_tie").sum()), "target_total_m": count.total / 1e6,
            "target_nonemb_m": count.non_embedding / 1e6, "dtype": manifest["config"]["dtype"]}


def check_theory(traces: Traces, criteria: Sequence[str], floor: float) -> None:
    """Assert, step by step, what the theory guarantees on every target (raises on a violation):
    each relaxed certificate is at least strict greedy's, the additive floor holds where the
    additive criterion rejects something, it rejects nothing where ``p(1) <= 0.3``, the width-1 tree
    is strict greedy, and no tree certificate exceeds its ceiling ``log(m + 1)``."""
    from companion.checks import check_all, check_close, check_le

    greedy = traces.cert("greedy")
    for c in criteria:
        check_le(greedy, traces.cert(c), f"strict greedy's certificate above that of {c}", rtol=1e-12)
    rho_add = traces.cert("additive:0.3")
    fin = np.isfinite(rho_add)
    check_all(rho_add[fin] > floor, f"additive:0.3 certificate not above its floor {floor:.4f}", rho_add[fin])
    flat = traces.column("p_top1") <= 0.3
    check_all(np.isinf(rho_add[flat]), "additive:0.3 rejects something although p(1) <= 0.3", rho_add[flat])
    check_close(traces.tree_cert(1), greedy, "width-1 tree certificate vs strict greedy's", rtol=1e-12, atol=1e-15)
    for m in range(1, 9):
        check_le(traces.tree_cert(m), math.log(m + 1), f"tree m={m} above its ceiling", rtol=1e-12)


def path_summaries(traces: Traces, columns: Sequence[str], dtype: str) -> dict[str, Summary]:
    """Each column's :class:`~companion.analysis.traces.Summary` under the kernel-path convention
    (columns without kernel-path values are left out)."""
    out = {}
    for col in columns:
        x = kernel_path_values(traces, col, dtype)
        if x is not None:
            out[col] = summarize_values(x)
    return out


def greedy_zero_share(traces: Traces, dtype: str) -> tuple[float, float]:
    """``(exact ties, kernel paths)``: the share of steps whose strict-greedy certificate is exactly 0."""
    return zero_share(traces.cert("greedy")), zero_share(kernel_path_values(traces, GREEDY, dtype))


@dataclass(frozen=True)
class NoteComparison:
    """This run's statistics against the note's Qwen3-1.7B values: within :data:`REL_TOL`, lower, higher."""

    agree: tuple[tuple[str, str], ...]
    lower: tuple[tuple[str, str], ...]
    higher: tuple[tuple[str, str], ...]

    @property
    def n(self) -> int:
        return len(self.agree) + len(self.lower) + len(self.higher)


def compare_to_note(values: Mapping[tuple[str, str], float]) -> NoteComparison:
    """Sort every statistic of :data:`~companion.analysis.size_axis.REPORTED` by ``(v - a) / a``."""
    rel = {k: (values[k] - a) / a for k, (a, _) in S.REPORTED.items()}
    return NoteComparison(tuple(k for k, r in rel.items() if abs(r) <= REL_TOL),
                          tuple(k for k, r in rel.items() if r < -REL_TOL),
                          tuple(k for k, r in rel.items() if r > REL_TOL))


def second_hand_rows(labels: Mapping[str, str], exact: Mapping[str, Summary], paths: Mapping[str, Summary],
                     closed_world: Mapping[str, Summary]) -> list[list[str]]:
    """The rows of the table beside the note: quantity, statistic, this run under exact ties and under
    kernel paths, the closed-world pair, the note's Qwen3-1.7B and Qwen3-4B (a dash: none)."""
    names = {"mean": "mean (finite)", "median": "median", "p5": "5th percentile"}
    rows = []
    for (col, stat), (a, b) in S.REPORTED.items():
        cells = [labels[col], names[stat], f"{getattr(exact[col], stat):.4f}",
                 f"{getattr(paths[col], stat):.4f}" if col in paths else "-",
                 f"{getattr(closed_world[col], stat):.3f}" if col in closed_world else "-",
                 f"{a:.3f}", "-" if b is None else f"{b:.3f}"]
        rows.append(cells)
    return rows


def kinds_table(traces: Traces, kind_of: Mapping[str, str], eos: set[int]) -> tuple[list[list[str]], list[str]]:
    """Rows per kind of request, least confident first (answers, mean length, share ended by the
    end-of-turn token, top-1 5th percentile and median, order statistics), and the kinds in that order."""
    pid = np.asarray(traces.table.column("prompt_id").to_pylist())
    p1, tokens = traces.column("p_top1"), traces.column("token")
    masks = {k: np.array([kind_of[i] == k for i in pid]) for k in sorted(set(kind_of.values()))}
    kinds = sorted(masks, key=lambda k: quantile(p1[masks[k]], 0.05))
    rows = []
    for k in kinds:
        ids = sorted(set(pid[masks[k]]))
        ended = sum(int(tokens[pid == i][-1]) in eos for i in ids)
        rows.append([f"`{k}`", f"{len(ids)}", f"{masks[k].sum() / len(ids):.0f}", f"{ended / len(ids):.0%}",
                     f"{quantile(p1[masks[k]], 0.05):.3f}", f"{quantile(p1[masks[k]], 0.5):.3f}"])
    return rows, kinds


def least_confident_steps(traces: Traces, decode: Callable[[list[int]], str], kind_of: Mapping[str, str],
                          n_answers: int = 3, per_answer: int = 3, width: int = 70) -> list[str]:
    """Printable lines: the least confident steps (top-1 below 0.5) of the first ``n_answers`` answers
    that have any, each with the answer so far and the target's three likeliest tokens there."""
    pid = np.asarray(traces.table.column("prompt_id").to_pylist())
    p1, step, tokens = traces.column("p_top1"), traces.column("step"), traces.column("token")
    top_ids, top_probs = np.asarray(traces.table.column("top_ids").to_pylist()), traces.column("top_probs")

    def tail(s: str) -> str:
        s = " ".join(s.split())
        return s if len(s) <= width else "…" + s[-(width - 1):]

    lines: list[str] = []
    shown = 0
    for i in dict.fromkeys(pid.tolist()):
        rows = np.flatnonzero(pid == i)
        rows = rows[np.argsort(step[rows])]
        low = [r for r in rows if p1[r] < 0.5]
        if not low or shown == n_answers:
            continue
        shown += 1
        lines.append(f"[{kind_of.get(i, i)}] {len(rows)} steps, {len(low)} with top-1 below 0.5")
        for r in sorted(low, key=lambda r: p1[r])[:per_answer]:
            before = decode([int(t) for t in tokens[rows][: int(step[r])]])
            top3 = "   ".join(f"{decode([int(t)])!r} {p:.2f}" for t, p in zip(top_ids[r][:3], top_probs[r][:3]))
            lines.append(f"  step {int(step[r])}, after {tail(before)!r}:\n      {top3}")
    return lines


def estimate_cell(e: S.Estimate) -> str:
    """A value with its 95 % interval: ``0.123 (0.100-0.150)``."""
    return f"{e.value:.3f} ({e.low:.3f}-{e.high:.3f})"


def size_table(points: Sequence[S.SizePoint], full: S.SizePoint | None,
               dtypes: Mapping[str, str]) -> tuple[list[str], list[list[str]]]:
    """The size table's header and rows: each statistic at each measured size, the full profile, the
    note's two values. A column head names the model, its non-embedding size and its dtype."""
    head = (["statistic"] + [f"{p.name} ({p.non_embedding_parameters / 1e6:,.0f}M, {dtypes[p.name]})"
                             for p in points]
            + ([f"full profile, {full.n_prompts} prompts"] if full is not None else [])
            + [f"{m} (second-hand)" for m, _ in S.REPORTED_MODELS])
    rows = []
    for st in S.STATISTICS:
        cells = [estimate_cell(p.estimates[st.key]) for p in points]
        if full is not None:
            cells.append(estimate_cell(full.estimates[st.key]))
        a, b = S.REPORTED[st.key]
        rows.append([st.label] + cells + [f"{a:.3f}", "not given" if b is None else f"{b:.3f}"])
    return head, rows


def orderings(points: Sequence[S.SizePoint]) -> dict[str, int]:
    """How many statistics :func:`~companion.analysis.size_axis.ordering` puts in each class."""
    out = {"rises": 0, "falls": 0, "rises (overlapping)": 0, "falls (overlapping)": 0, "no order": 0}
    for st in S.STATISTICS:
        out[S.ordering(points, st.key)] += 1
    return out


def closer_to_note(small: S.SizePoint, large: S.SizePoint) -> tuple[int, int]:
    """``(statistics the larger model brings closer to the note's Qwen3-1.7B value, statistics)``."""
    note = {k: a for k, (a, _) in S.REPORTED.items()}
    keys = [st.key for st in S.STATISTICS if st.key in note]
    closer = sum(abs(large.estimates[k].value - note[k]) < abs(small.estimates[k].value - note[k]) for k in keys)
    return closer, len(keys)


def family_table(runs: Mapping[str, Traces | None], n_boot: int, seed: int
                 ) -> tuple[dict[tuple[str, str], S.SizePoint], list[str], list[list[str]]]:
    """Each statistic per prompt family and pooled, for each run: the points, the header and rows."""
    points: dict[tuple[str, str], S.SizePoint] = {}
    for run, tr in runs.items():
        if tr is None:
            continue
        parts = S.by_family(tr)
        for fam in ("chat", "stdlib"):
            if fam in parts:
                points[(run, fam)] = S.size_point(fam, parts[fam], 0, n_boot=n_boot, seed=seed)
        points[(run, "pooled")] = S.size_point("pooled", tr, 0, n_boot=n_boot, seed=seed)
    names = {**S.FAMILY_NAMES, "pooled": "pooled"}
    head = ["statistic"] + [f"{run}: {names[fam]} ({points[(run, fam)].n_prompts})" for run, fam in points]
    rows = [[st.label] + [estimate_cell(points[k].estimates[st.key]) for k in points] for st in S.STATISTICS]
    return points, head, rows


def enlargement_rows(enl: Enlargement, budgets: Sequence[float]) -> list[list[str]]:
    """The enlargement table's rows: gains at each budget (points, vacuous steps left out), median
    factor over strict greedy and the share rejecting nothing, lowest / highest margin bin."""
    lo, hi = 0, len(enl.counts) - 1
    rows = []
    for label in enl.gain:
        real = enl.real_gain(label)
        cells = [f"{100 * real[e, lo]:+.0f} / {100 * real[e, hi]:+.0f} pts" for e in range(len(budgets))]
        cells.append(f"{enl.median_ratio[label][lo]:.3g} / {enl.median_ratio[label][hi]:.3g}")
        cells.append(f"{enl.vacuous[label][lo]:.0%} / {enl.vacuous[label][hi]:.0%}")
        name = f"`{label}`" if not label.startswith("tree") else f"tree $m = {label[5:]}$"
        rows.append([name] + cells)
    return rows


@dataclass(frozen=True)
class LowMargin:
    """The abstract's claim counted: of the relaxed criteria and tree widths, how many grow strict
    greedy's certificate by a larger median factor in the lowest-margin bin than in the highest
    (``factor_more``), how many are infinite in both (``both_infinite``), and per budget how many
    gain more certified share there (vacuous steps left out)."""

    labels: tuple[str, ...]
    factor_more: tuple[str, ...]
    both_infinite: tuple[str, ...]
    gain_more: dict[float, int]
    vacuous_low: tuple[str, ...]


def low_margin(enl: Enlargement, budgets: Sequence[float]) -> LowMargin:
    """Count :class:`LowMargin` from ``enl`` (lowest bin 0, highest the last)."""
    lo, hi = 0, len(enl.counts) - 1
    labels = tuple(enl.gain)
    r = enl.median_ratio
    return LowMargin(labels, tuple(x for x in labels if r[x][lo] > r[x][hi]),
                     tuple(x for x in labels if np.isinf(r[x][lo]) and np.isinf(r[x][hi])),
                     {e: sum(enl.real_gain(x)[i, lo] > enl.real_gain(x)[i, hi] for x in labels)
                      for i, e in enumerate(budgets)},
                     tuple(x for x in labels if enl.vacuous[x][lo] > 0))


def closed_world_params() -> float:
    """The closed-world pair's target parameters, from its shipped manifest."""
    from companion.assets import DEFAULT_PAIR_DIR

    return float(json.loads((DEFAULT_PAIR_DIR / "manifest.json").read_text())["models"]["target"]["params"])


def size_runs(harvest: Any, traces: Traces, presets: str, *, n_prompts: int, n_steps: int,
              batch_size: int, seed: int, device: str, threads: int
              ) -> tuple[dict[str, tuple[Traces, int]], list[str]]:
    """This run and the size axis's other targets on the same prompts (harvested or reused through
    the shared cache): model name -> (traces, non-embedding parameters), this run first; and the
    presets skipped (models not on this machine, or other prompts)."""
    from companion.book.harvest_cache import chapter_traces
    from companion.harvest import load_traces
    from companion.harvest.plan import plan_harvest
    from companion.models.presets import preset_or_fallback

    name, size = S.describe_traces(harvest.manifest)
    out = {name: (traces, size)}
    skipped: list[str] = []
    ids = set(traces.table.column("prompt_id").to_pylist())
    for other in [p.strip() for p in presets.split(",") if p.strip()]:
        notes: list[str] = []
        if preset_or_fallback(other, notes.append) != other:
            skipped.append(f"`{other}` ({notes[0]})")
            continue
        planned = plan_harvest(other, n_prompts=n_prompts, seed=seed).prompts or []
        if {p.prompt_id for p in planned} != ids:  # e.g. this run on a paper preset's sample
            skipped.append(f"`{other}` (its prompts are not this run's)")
            continue
        h = chapter_traces(other, device=device, seed=seed, n_prompts=n_prompts, n_steps=n_steps,
                           batch_size=batch_size, processes=1, cpu_threads=threads)
        t = Traces(load_traces(h.traces_dir), h.manifest)
        if set(t.table.column("prompt_id").to_pylist()) != ids:
            raise ValueError(f"the {other} run answered other prompts than this run's")
        n, s = S.describe_traces(h.manifest)
        out.setdefault(n, (t, s))
    return out, skipped


#: The size axis's models as the page names them (glue keys ``size_<key>_m``).
SIZE_MODELS = {"1p5b": "Qwen2.5-Coder-1.5B-Instruct", "0p5b": "Qwen2.5-Coder-0.5B-Instruct",
               "smollm": "SmolLM2-135M-Instruct"}


def size_glue(points: Sequence[S.SizePoint], dtypes: Mapping[str, str]) -> dict[str, Any]:
    """The size axis's numbers a page glues: each model's non-embedding size (millions) and the dtypes
    the Qwen models and SmolLM2 ran in ("not measured" for a model missing here)."""
    by_name = {p.name: p for p in points}
    out: dict[str, Any] = {}
    for key, name in SIZE_MODELS.items():
        out[f"size_{key}_m"] = by_name[name].non_embedding_parameters / 1e6 if name in by_name else math.nan
    qwen = sorted({d for n, d in dtypes.items() if n.startswith("Qwen")})
    out["qwen_dtype"] = " and ".join(qwen) if qwen else "not measured"
    out["smollm_dtype"] = dtypes.get(SIZE_MODELS["smollm"], "not measured")
    return out


def ties_default() -> str:
    """The tie convention :func:`companion.certify.certificates.certificates` applies by default."""
    import inspect

    from companion.certify.certificates import certificates

    return str(inspect.signature(certificates).parameters["ties"].default)
