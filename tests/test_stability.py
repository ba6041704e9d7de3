"""Precision and batch (chapter 12): where two runs' answers part, their statistics side by side, and
the committed stability profile.

Partings are checked on hand-made runs whose gaps are known in ulps, then on a tiny random model
harvested for real in bfloat16 one prompt at a time and in float32 in a batch of two; the counts
are checked branch by branch; the profile's export and load round-trip on those toy harvests, and
the committed profile is read and checked against its manifest.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from companion.analysis import stability as st
from companion.analysis.size_axis import STATISTICS, Estimate, SizePoint
from companion.analysis.traces import Traces
from companion.harvest.ties import TIE_ULPS, ulp


def _run(tokens: dict[str, list[int]], gaps: dict[str, list[float]] | None = None, z: float = 20.0) -> pa.Table:
    """A run's rows: per prompt, its tokens and top-2 gaps (in ulps of bfloat16 at the top logit ``z``)."""
    u = float(ulp(z, "bfloat16"))
    ids, steps, toks, top, gap = [], [], [], [], []
    for pid, ts in tokens.items():
        g = (gaps or {}).get(pid, [10.0] * len(ts))
        ids += [pid] * len(ts)
        steps += list(range(len(ts)))
        toks += ts
        top += [z] * len(ts)
        gap += [x * u for x in g]
    return pa.table({"prompt_id": ids, "step": steps, "token": toks, "logit_top1": top, "logit_gap": gap})


def test_partings_find_the_first_differing_step_and_its_gaps_in_ulps() -> None:
    a = _run({"p": [1, 2, 3, 4], "q": [5, 6, 7], "only-a": [1]}, {"p": [9, 9, 1, 9]})
    b = _run({"q": [5, 6, 7], "p": [1, 2, 8, 4]}, {"p": [9, 9, 2, 9]})
    found = {p.prompt_id: p for p in st.partings(a, b)}
    assert set(found) == {"p", "q"}, "only the answers both runs have"
    assert found["p"].step == 2 and found["p"].gap_ulps == (1.0, 2.0) and found["p"].worst_gap_ulps == 2.0
    assert found["p"].compared == 3 and found["q"].step is None and found["q"].compared == 3
    assert math.isnan(found["q"].worst_gap_ulps)
    s = st.summarize_partings(st.partings(a, b))
    assert (s.answers, s.steps, s.parted_steps, s.gaps_ulps, s.outside_band) == (2, 6, (2,), (2.0,), 0)
    assert s.parted_ids == ("p",)
    # cut below the parting step: the answers agree on what is compared
    cut = st.summarize_partings(st.partings(a, b, max_steps=2))
    assert cut.parted == 0 and cut.steps == 4
    # a gap beyond the band counts outside it
    far = st.summarize_partings(st.partings(a, _run({"p": [1, 2, 8, 4]}, {"p": [9, 9, TIE_ULPS + 1, 9]})))
    assert far.gaps_ulps == (TIE_ULPS + 1.0,) and far.outside_band == 1


def test_a_run_cut_at_fewer_steps_is_compared_over_the_steps_both_have() -> None:
    a = _run({"p": [1, 2, 3, 4, 5]})
    b = _run({"p": [1, 2, 3]})
    (p,) = st.partings(a, b)
    assert p.step is None and p.compared == 3


def test_partings_refuse_runs_they_cannot_compare() -> None:
    a = _run({"p": [1, 2, 3]})
    with pytest.raises(ValueError, match="logit_gap"):
        st.partings(a, a.drop(["logit_gap"]))
    gappy = pa.table({**{k: a.column(k) for k in a.column_names if k != "step"}, "step": [0, 2, 3]})
    with pytest.raises(ValueError, match="not 0, 1, 2"):
        st.partings(gappy, a)


def _point(name: str, values: dict, width: float = 0.1) -> SizePoint:
    return SizePoint(name, 0, 8, 100, {s.key: Estimate(values.get(s.key, 0.5), values.get(s.key, 0.5) - width,
                                                       values.get(s.key, 0.5) + width) for s in STATISTICS})


def test_shifts_count_statistics_inside_the_reference_interval() -> None:
    k0, k1 = STATISTICS[0].key, STATISTICS[1].key
    ref = _point("ref", {})
    same = _point("same", {})
    near = _point("near", {k0: 0.55})
    far = _point("far", {k0: 0.55, k1: 1.0})
    inf = _point("inf", {k1: math.inf})
    got = {s.run: s for s in st.shifts({"ref": ref, "same": same, "near": near, "far": far, "inf": inf}, "ref")}
    n = len(STATISTICS)
    assert got["same"].inside == n and got["same"].largest_relative == 0
    assert got["near"].inside == n and got["near"].largest_relative == pytest.approx(0.1)
    assert got["near"].largest_label == STATISTICS[0].label
    assert got["far"].inside == n - 1 and got["far"].largest_relative == pytest.approx(1.0)
    assert got["far"].largest_label == STATISTICS[1].label
    assert got["inf"].inside == n - 1 and math.isinf(got["inf"].largest_relative)


def test_an_answer_parting_in_several_pairs_is_counted_once() -> None:
    """Three pairs of runs, one prompt parting in all three: one answer, not three."""
    a = st.PartingSummary(8, 100, (5, 9), (1.0, 6.0), 4.0, ("p1", "p2"))
    b = st.PartingSummary(8, 100, (5,), (2.0,), 4.0, ("p1",))
    c = st.PartingSummary(8, 100, (7, 3), (3.0, 0.5), 4.0, ("p1", "p3"))
    assert sum(s.parted for s in (a, b, c)) == 5
    assert st.distinct_parted([a, b, c]) == (3, 1)  # p1, p2, p3; only p2 parts outside the band
    assert st.distinct_parted([]) == (0, 0)


def _toy_harvest(out: Path, dtype: torch.dtype, batch_size: int, n_prompts: int = 4, n_steps: int = 12) -> Traces:
    from companion.harvest import harvest, load_traces, read_manifest
    from companion.harvest.toy import toy_pair

    torch.manual_seed(0)
    target, _, tok = toy_pair(vocab=300, hidden=32, layers=1, noise=0.1)
    target = target.to(dtype)
    prompts = [f"prompt number {i}: " + "abc" * (i + 1) for i in range(n_prompts)]
    harvest(target, None, tok, prompts, out, n_steps=n_steps, batch_size=batch_size, progress=False,
            tree_widths=(1, 2, 4, 8), stop_at_eos=False)
    return Traces(load_traces(out), read_manifest(out))


@pytest.fixture(scope="module")
def toy_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stability")
    _toy_harvest(root / "bfloat16-b1", torch.bfloat16, 1)
    _toy_harvest(root / "float32-b2", torch.float32, 2)
    _toy_harvest(root / "float32-b1", torch.float32, 1)
    return root


@pytest.fixture(scope="module")
def toy_runs(toy_root) -> dict[str, Traces]:
    from companion.harvest import load_traces, read_manifest

    return {d.name: Traces(load_traces(d), read_manifest(d)) for d in sorted(toy_root.iterdir()) if d.is_dir()}


def test_partings_on_a_toy_pair_harvested_in_two_precisions(toy_runs) -> None:
    bf, f32 = toy_runs["bfloat16-b1"], toy_runs["float32-b2"]
    assert [p.step for p in st.partings(bf, bf)] == [None] * 4, "a run never parts from itself"
    found = st.partings(bf, f32)
    assert len(found) == 4 and sum(p.compared for p in found) <= bf.n_rows
    ta, tb = bf.table.to_pylist(), f32.table.to_pylist()
    for p in found:
        xa = sorted((r for r in ta if r["prompt_id"] == p.prompt_id), key=lambda r: r["step"])
        xb = sorted((r for r in tb if r["prompt_id"] == p.prompt_id), key=lambda r: r["step"])
        s = p.step if p.step is not None else len(xa)
        assert [r["token"] for r in xa[:s]] == [r["token"] for r in xb[:s]], "equal tokens before the parting"
        if p.step is not None:
            assert xa[s]["token"] != xb[s]["token"]
            want = [r[s]["logit_gap"] / float(ulp(r[s]["logit_top1"], "bfloat16")) for r in (xa, xb)]
            assert p.gap_ulps == pytest.approx(tuple(want))


def test_side_by_side_on_a_toy_pair(toy_runs) -> None:
    runs = {"bf16": toy_runs["bfloat16-b1"], "f32": toy_runs["float32-b2"], "f32 again": toy_runs["float32-b1"]}
    points = st.side_by_side(runs, max_steps=8, n_boot=50)
    assert all(p.n_prompts == 4 and p.n_steps == 32 for p in points.values()), "4 prompts x the first 8 steps"
    shifts = {s.run: s for s in st.shifts(points, "bf16")}
    assert set(shifts) == {"f32", "f32 again"} and all(s.total == len(STATISTICS) for s in shifts.values())
    itself = st.shifts({"a": points["bf16"], "b": points["bf16"]}, "a")
    assert itself[0].largest_relative == 0 and itself[0].inside == len(STATISTICS)
    first = runs["bf16"].table.column("prompt_id")[0].as_py()
    restricted = st.restrict(runs["bf16"], [first], 5)
    assert restricted.n_trajectories == 1 and restricted.n_rows == 5
    with pytest.raises(ValueError, match="share no prompt"):
        st.side_by_side({"a": runs["bf16"], "b": st.restrict(runs["f32"], ["nothing"])})


def test_the_profile_exports_and_loads_its_variants(toy_root, toy_runs, tmp_path) -> None:
    import json
    import shutil

    from companion.harvest import stability_profile as sp

    variants = (sp.Variant("bfloat16", 1), sp.Variant("float32", 2))
    run_root = tmp_path / "runs"
    for v in variants:
        shutil.copytree(toy_root / v.name, run_root / v.name)
    data = tmp_path / "data"
    manifest = sp.export(run_root, data, variants=variants)
    tables, loaded = sp.load(data)
    assert loaded == json.loads((data / "manifest.json").read_text()) and manifest["variants"] == loaded["variants"]
    assert list(tables) == ["bfloat16-b1", "float32-b2"]
    for v in loaded["variants"]:
        assert tables[v["name"]].num_rows == v["rows"] == toy_runs[v["name"]].n_rows
        assert "cert_fwd[greedy]" in tables[v["name"]].column_names and "top_ids" not in tables[v["name"]].column_names
        assert v["harvest_command"].startswith("companion harvest ") and f"--dtype {v['dtype']}" in v["harvest_command"]
    assert [(v["dtype"], v["batch_size"]) for v in loaded["variants"]] == [("bfloat16", 1), ("float32", 2)]
    broken = data / "float32-b2.parquet"
    broken.write_bytes(b"x" + broken.read_bytes()[1:])
    with pytest.raises(ValueError, match="does not match the sha256"):
        sp.load(data)
    with pytest.raises(FileNotFoundError, match="stability-profile"):
        sp.load(tmp_path / "nothing")
    shutil.copytree(toy_root / "float32-b2", run_root / "float32-b1")  # a folder named for another batch
    with pytest.raises(ValueError, match="not float32, batch 1"):
        sp.export(run_root, tmp_path / "other", variants=(sp.Variant("float32", 1),))


def test_the_committed_profile_is_what_its_manifest_and_the_command_say() -> None:
    """The committed data: every variant of VARIANTS, the profile's prompts and steps, the full profile's model."""
    from companion.harvest import full_profile
    from companion.harvest import stability_profile as sp

    tables, m = sp.load()
    assert m["command"] == sp.COMMAND and "uncommitted" not in m["code_commit"]
    assert [(v["dtype"], v["batch_size"]) for v in m["variants"]] == [(v.dtype, v.batch_size) for v in sp.VARIANTS]
    assert m["prompt_set"]["name"] == f"{sp.PROFILE.prompts}[:{sp.PROFILE.n_prompts}]" and m["n_steps"] == sp.PROFILE.n_steps
    _, fm = full_profile.load()
    assert m["converted_from"]["gguf_sha256"] == fm["converted_from"]["gguf_sha256"], "the full profile's model"
    for v in m["variants"]:
        t = tables[v["name"]]
        assert t.num_rows == v["rows"] and t.column_names == v["columns"] and v["threads"] == sp.PROFILE.threads
        assert v["harvest_command"] == "companion " + " ".join(
            sp.PROFILE.harvest_argv(sp.Variant(v["dtype"], v["batch_size"]), sp.DEFAULT_RUN_DIR / v["name"]))
        ids = list(dict.fromkeys(t.column("prompt_id").to_pylist()))
        assert len(ids) == sp.PROFILE.n_prompts and all(
            len([s for s in t.filter(pc.equal(t.column("prompt_id"), i)).column("step").to_pylist()])
            <= sp.PROFILE.n_steps for i in ids)
