"""The plumbing of chapter 12 (precision and ties): runs, tables and counts, no sentences.

Three measurements of one model's numerics, each from committed records or the shared harvest:
the kernel-path band (:mod:`companion.harvest.kernel_paths`), the two tie conventions
(:mod:`companion.analysis.conventions`) and the answers and statistics under another precision
or batch (:mod:`companion.analysis.stability`). Quantiles are order statistics
(:func:`companion.analysis.traces.quantile`).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from companion.analysis import conventions as CV
from companion.analysis import stability as ST
from companion.analysis.size_axis import STATISTICS, SizePoint
from companion.analysis.traces import Traces


def kernel_path_rows(paths: Mapping[str, Any], dtype: str) -> list[list[str]]:
    """Per pair of kernel paths: flips, the widest gap at a flip, how far the top logit moved (max,
    99th percentile) and how far the top-2 gap moved (max), in ulps of the top logit."""
    from companion.harvest import kernel_paths as KP

    flips, moves = KP.compare(dict(paths), dtype)
    return [[pair.replace("/", " / "), f"{m['flips']:.0f}",
             f"{max((f.widest for f in flips if f'{f.a}/{f.b}' == pair), default=0):g}",
             f"{m['top1_max']:g}", f"{m['top1_p99']:g}", f"{m['gap_max']:g}"] for pair, m in moves.items()]


@dataclass(frozen=True)
class ConventionRun:
    """One run under both conventions: near ties, its rows and where each criterion is lowered."""

    label: str
    dtype: str
    steps: int
    near: int
    rows: dict[str, CV.ConventionRow]
    lowering: dict[str, CV.Lowering]


def convention_run(label: str, traces: Traces, criteria: Sequence[str], dtype: str) -> ConventionRun:
    """:func:`~companion.analysis.conventions.convention_rows` and
    :func:`~companion.analysis.conventions.lowering` of every criterion and stored tree width."""
    rows = {r.criterion: r for r in CV.convention_rows(traces, list(criteria), dtype)}
    low = {c: x for c in rows if (x := CV.lowering(traces, c, dtype)) is not None}
    return ConventionRun(label, dtype, traces.n_rows, CV.near_tie_count(traces, dtype), rows, low)


def convention_table(runs: Sequence[ConventionRun]) -> list[list[str]]:
    """Rows: run, criterion, median and 5th percentile under both conventions, steps lowered on near
    ties and elsewhere, the largest relative drop elsewhere."""
    out = []
    for run in runs:
        for c, r in run.rows.items():
            low = run.lowering.get(c)
            out.append([run.label, f"`{c}`", f"{r.median_exact:.4g}", f"{r.median_paths:.4g}",
                        f"{r.p5_exact:.3g}", f"{r.p5_paths:.3g}",
                        f"{low.on_near_ties:,}" if low else "-", f"{low.elsewhere:,}" if low else "-",
                        f"{low.largest_drop_elsewhere:.2%}" if low else "-"])
    return out


def weights_of(manifest: Mapping[str, Any]) -> str:
    """The GGUF file (or the weights) a run's target came from: runs of other weights are not compared."""
    target = manifest["config"]["target"] if "config" in manifest else manifest
    conv = target.get("converted_from") or {}
    return conv.get("gguf_sha256") or json.dumps(target.get("weights_sha256"), sort_keys=True)


@dataclass
class StabilityRuns:
    """The runs of one model set side by side: label -> traces, and which is which."""

    runs: dict[str, Traces] = field(default_factory=dict)
    this: str = ""
    full: str | None = None
    alone: dict[str, str] = field(default_factory=dict)  # dtype -> label of a committed batch-1 run
    profile_manifest: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)


def stability_runs(traces: Traces, manifest: Mapping[str, Any], full: Traces | None,
                   full_manifest: Mapping[str, Any] | None) -> StabilityRuns:
    """This run, the full profile (if of the same weights) and the committed stability profile's
    variants (each prompt decoded alone, in bfloat16 and in float32)."""
    from companion.harvest import stability_profile

    config = manifest["config"]
    out = StabilityRuns()
    out.this = f"this run ({config['dtype']}, batches of {config['batch_size']})"
    out.runs[out.this] = traces
    if full is not None and full_manifest is not None and weights_of(full_manifest) == weights_of(manifest):
        out.full = (f"the full profile ({full_manifest['dtype']}, batches of {full_manifest['batch_size']} "
                    f"of {full.n_trajectories})")
        out.runs[out.full] = full
    else:
        out.notes.append("the full profile is not of this run's model")
    try:
        tables, prof = stability_profile.load()
    except FileNotFoundError as err:
        out.notes.append(f"this checkout has no stability profile ({err})")
        return out
    if weights_of(prof) != weights_of(manifest):
        out.notes.append(f"the stability profile is of {prof['model']}, not of this run's model")
        return out
    out.profile_manifest = prof
    for v in prof["variants"]:
        label = (f"each prompt alone in {v['dtype']}" if v["batch_size"] == 1
                 else f"batches of {v['batch_size']} in {v['dtype']}")
        out.alone[v["dtype"]] = label
        out.runs[label] = Traces(tables[v["name"]], prof)
    return out


def partings_by_pair(s: StabilityRuns, n_steps: int, full_steps: int | None
                     ) -> tuple[dict[str, ST.PartingSummary], int | None]:
    """Where answers part: precision (``prec``: bfloat16 against float32, each prompt alone), batch
    (``batch``: this run against bfloat16 alone) and this run against the full profile (``fp``);
    and the steps every run computed (``cut``)."""
    prof_steps = s.profile_manifest["n_steps"] if s.profile_manifest else None
    cut = min(x for x in (prof_steps, n_steps, full_steps if s.full else None) if x) if s.runs else None
    pairs = {"prec": (s.alone.get("bfloat16"), s.alone.get("float32"), prof_steps),
             "batch": (s.this, s.alone.get("bfloat16"), cut), "fp": (s.this, s.full, None)}
    out = {}
    for key, (a, b, steps) in pairs.items():
        if a is None or b is None:
            continue
        out[key] = ST.summarize_partings(ST.partings(s.runs[a], s.runs[b], dtype="bfloat16", max_steps=steps))
    return out, cut


def statistics_table(points: Mapping[str, SizePoint]) -> list[list[str]]:
    """Each statistic per run (value and 95 % interval)."""
    return [[st.label] + [f"{p.estimates[st.key].value:.3f} ({p.estimates[st.key].low:.3f}-"
                          f"{p.estimates[st.key].high:.3f})" for p in points.values()] for st in STATISTICS]


#: The criteria that compare two probabilities, so that the band moves their comparison on every
#: step (a token against alpha times the top; the m-th against the (m+1)-th).
COMPARING = ("multiplicative:", "topk-delta:", "topm:")


def check_conventions(claims: Any, run: ConventionRun, tag: str = "") -> None:
    """Check the claims chapter 12 makes about one run under both conventions (``tag`` prefixes
    the claim names, one set per run): strict greedy is lowered on near ties only, its 5th
    percentile falls to 0 while its median moves by under 1 %, every other criterion and tree of
    width 2 or more keeps a positive 5th percentile, and only the criteria that compare two
    probabilities are lowered on other steps."""
    g, low = run.rows["greedy"], run.lowering["greedy"]
    claims.check(f"{tag}greedy near ties only", low.elsewhere == 0 and g.lowered <= run.near,
                 "strict greedy's certificate is lowered only on near ties",
                 elsewhere=low.elsewhere, lowered=g.lowered, near=run.near)
    claims.check(f"{tag}greedy p5 falls to 0", g.p5_paths == 0 < g.p5_exact,
                 "strict greedy's 5th percentile falls to 0 under kernel paths",
                 exact=g.p5_exact, paths=g.p5_paths)
    claims.check(f"{tag}greedy median stays", abs(g.median_paths - g.median_exact) < 0.01 * g.median_exact,
                 "strict greedy's median moves by less than 1 %",
                 exact=g.median_exact, paths=g.median_paths)
    others = {c: r.p5_paths for c, r in run.rows.items() if c not in ("greedy", "tree:1")}
    claims.check(f"{tag}others stay positive", all(v > 0 for v in others.values()),
                 "every other criterion and tree width keeps a positive 5th percentile",
                 **{c.replace(":", "_").replace(",", "_").replace(".", "p"): v for c, v in others.items()})
    elsewhere = [c for c, x in run.lowering.items() if x.elsewhere > 0]
    claims.check(f"{tag}only comparisons elsewhere", all(c.startswith(COMPARING) for c in elsewhere),
                 "only criteria that compare two probabilities are lowered off the near ties",
                 lowered_elsewhere=", ".join(elsewhere))
