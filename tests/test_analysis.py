"""companion.analysis.traces against brute-force loops on small synthetic traces."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import analysis as A
from companion import certificates, kl_divergence, parse_criterion, tree_certificate
from companion.certify.criteria import PAPER_CRITERIA, index_rank
from companion.book import harvest_cache as cache
from companion.harvest import plan as planning

VOCAB = 16
TOP_K = 12


def synthetic_traces(seed: int = 0, lengths=(7, 1, 12, 5), vocab: int = VOCAB, noise: float = 1.0,
                     widths=(1, 2, 4), exact_ties: bool = False) -> tuple[A.Traces, dict]:
    """A harvest in miniature: random targets p and drafts q = softmax(log p + noise), every column
    computed by the engine the way the harvest defines it. Returns the traces and the raw tensors."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    scale = 0.5 + 4 * torch.rand(n, 1, generator=g, dtype=torch.float64)
    logits = scale * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    # a few near-ties at the top, where certificates are small
    p[::5, 1] = p[::5, 0] * (1 - 1e-3)
    if exact_ties:  # exact top-2 ties on every third row (equal before and after normalising)
        rows = torch.arange(0, n, 3)
        top2 = p[rows].topk(2, dim=-1).indices
        p[rows, top2[:, 1]] = p[rows, top2[:, 0]]
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(torch.log(p) + noise * torch.randn(n, vocab, generator=g, dtype=torch.float64), -1)
    certs = certificates(p, list(PAPER_CRITERIA), ("forward", "reverse"), tree_widths=widths)
    kl_f, kl_r = kl_divergence(p, q), kl_divergence(p, q, "reverse")
    d = q.argmax(-1)
    gtok = p.argmax(-1)
    top = p.sort(-1, descending=True).values
    entropy = -(p * p.log()).sum(-1)
    rank_g = index_rank(q, gtok)  # the decoders' rule: exact ties to the lowest id
    cols: dict = {
        "prompt_id": [f"p{i}" for i, n_i in enumerate(lengths) for _ in range(n_i)],
        "step": [t for n_i in lengths for t in range(n_i)],
        "p_top1": top[:, 0].numpy(), "margin": (top[:, 0] - top[:, 1]).numpy(),
        "top10_mass": top[:, :10].sum(-1).numpy(), "entropy": entropy.numpy(),
        "top_probs": top[:, :TOP_K].numpy(), "kl_fwd": kl_f.numpy(), "kl_rev": kl_r.numpy(),
        "draft_p": p.gather(1, d[:, None]).squeeze(1).numpy(), "token_rank_in_draft": rank_g.numpy(),
        "draft_rank": index_rank(p, d).numpy(),
    }
    for spec in PAPER_CRITERIA:
        c = parse_criterion(spec)
        cols[f"cert_fwd[{spec}]"] = certs[(spec, "forward")].numpy()
        cols[f"cert_rev[{spec}]"] = certs[(spec, "reverse")].numpy()
        acc = c.decoder_accepts(p, d)
        cols[f"accepted[{spec}]"] = acc.numpy()
        cols[f"certified_fwd[{spec}]"] = (kl_f < certs[(spec, "forward")]).numpy()
        cols[f"certified_rev[{spec}]"] = (kl_r < certs[(spec, "reverse")]).numpy()
    for m in widths:
        cols[f"tree_cert_fwd[{m}]"] = certs[(f"tree:{m}", "forward")].numpy()
        cols[f"tree_cert_rev[{m}]"] = certs[(f"tree:{m}", "reverse")].numpy()
        cols[f"covered[{m}]"] = (rank_g <= m).numpy()
        cols[f"tree_certified_fwd[{m}]"] = (kl_f < certs[(f"tree:{m}", "forward")]).numpy()
        cols[f"tree_certified_rev[{m}]"] = (kl_r < certs[(f"tree:{m}", "reverse")]).numpy()
    return A.Traces.from_columns(cols), {"p": p, "q": q, "lengths": lengths}


@pytest.fixture(scope="module")
def tr() -> A.Traces:
    return synthetic_traces()[0]


def split(traces: A.Traces, values) -> list[list]:
    """Per-trajectory lists, by brute force from prompt_id."""
    ids = traces.table.column("prompt_id").to_pylist()
    out: dict[str, list] = {}
    for i, v in zip(ids, list(values)):
        out.setdefault(i, []).append(v)
    return list(out.values())


# -- traces ----------------------------------------------------------------------------------


def test_traces_index_and_padding(tr):
    assert tr.criteria == list(PAPER_CRITERIA) and tr.tree_widths == [1, 2, 4] and tr.has_drafter
    assert tr.lengths.tolist() == [7, 1, 12, 5] and tr.starts.tolist() == [0, 7, 8, 20]
    x = np.arange(tr.n_rows, dtype=float)
    pad = tr.padded(x, -1.0)
    assert pad.shape == (4, 12)
    for i, row in enumerate(split(tr, x)):
        assert pad[i, : len(row)].tolist() == row and (pad[i, len(row):] == -1).all()
    assert tr.column("top_probs").shape == (tr.n_rows, TOP_K)


def test_traces_reject_unordered_rows():
    with pytest.raises(ValueError, match="contiguous"):
        A.Traces.from_columns({"prompt_id": ["a", "b", "a"], "step": [0, 0, 1]})
    with pytest.raises(ValueError, match="0, 1, 2"):
        A.Traces.from_columns({"prompt_id": ["a", "a"], "step": [1, 0]})


# -- summaries and bins --------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.floats(-1e6, 1e6), st.just(math.inf)), min_size=1, max_size=40),
       st.floats(0, 1))
def test_quantile_is_the_ceil_order_statistic(xs, q):
    ranked = sorted(xs)
    k = max(1, math.ceil(q * len(xs)))
    assert A.quantile(np.array(xs), q) == ranked[k - 1]


def test_summary_values_by_hand():
    s = A.summarize_values(np.array([3.0, math.inf, 1.0, 2.0, 10.0]))
    assert s.mean == pytest.approx(4.0) and s.median == 3.0 and s.p5 == 1.0
    assert s.n == 5 and s.n_infinite == 1 and s.infinite_share == pytest.approx(0.2)
    assert math.isinf(A.summarize_values(np.array([1.0, math.inf, math.inf])).median)


def test_target_summary_rows(tr):
    rows = A.target_summary(tr, tree_widths=(2, 4, 8))
    assert [r.column for r in rows][:2] == ["p_top1", "top10_mass"]
    by_col = {r.column: r for r in rows}
    for spec in PAPER_CRITERIA:
        v = tr.column(f"cert_fwd[{spec}]")
        assert by_col[f"cert_fwd[{spec}]"].summary.median == sorted(v)[math.ceil(0.5 * len(v)) - 1]
    # width 8 is not stored: computed from the top-12 probabilities
    assert by_col["tree_cert_fwd[8]"].ceiling == pytest.approx(math.log(9))
    md = A.summary_markdown(rows)
    assert md.count("\n") == len(rows) + 1 and "tree certificate, $m = 8$" in md


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=60), st.integers(1, 7))
def test_bins_by_brute_force(margins, n_bins):
    m = np.array(margins)
    edges = A.margin_bin_edges(m, n_bins)
    assert edges[0] == m.min() and edges[-1] == m.max() and np.all(np.diff(edges) > 0) or len(edges) == 1
    b = A.bin_index(m, edges)
    nb = max(len(edges) - 1, 1)
    for x, bi in zip(m, b):
        if len(edges) == 1:
            assert bi == 0
        elif bi == nb - 1:
            assert edges[bi] <= x <= edges[bi + 1]
        else:
            assert edges[bi] <= x < edges[bi + 1]
    flags = (np.arange(len(m)) % 3) == 0
    frac, count = A.fraction_by_bin(flags, b, nb)
    for k in range(nb):
        members = [f for f, bi in zip(flags, b) if bi == k]
        assert count[k] == len(members)
        if members:
            assert frac[k] == pytest.approx(sum(members) / len(members))
        else:
            assert math.isnan(frac[k])


def test_equal_count_bins_are_balanced():
    m = np.random.default_rng(0).random(1000)
    edges = A.margin_bin_edges(m, 10)
    counts = np.bincount(A.bin_index(m, edges), minlength=10)
    assert len(edges) == 11 and counts.min() >= 99 and counts.max() <= 101


def test_certified_fraction_by_bin_brute_force(tr):
    margin = tr.column("margin")
    edges = A.margin_bin_edges(margin, 4)
    certs = {c: tr.cert(c) for c in ("greedy", "additive:0.3")}
    eps = [0.001, 0.05, 0.3]
    curves = A.certified_fraction_by_bin(margin, certs, eps, edges)
    b = A.bin_index(margin, edges)
    for label, rho in certs.items():
        assert curves.values[label].shape == (3, curves.n_bins)
        for e, budget in enumerate(eps):
            for k in range(curves.n_bins):
                idx = [i for i in range(len(margin)) if b[i] == k]
                assert curves.values[label][e, k] == pytest.approx(sum(rho[i] > budget for i in idx) / len(idx))
    assert curves.counts.sum() == tr.n_rows


# -- runs -----------------------------------------------------------------------------------


def brute_runs(traj: list[list[float]], eps: float) -> list[int]:
    out = []
    for row in traj:
        for t in range(len(row)):
            n = 0
            while t + n < len(row) and row[t + n] > eps:
                n += 1
            out.append(n)
    return out


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 0.005, 0.02, 0.2, 1.5, math.inf]), min_size=1, max_size=9),
                min_size=1, max_size=5))
def test_mean_run_length_brute_force(traj):
    ids = [f"t{i}" for i, row in enumerate(traj) for _ in row]
    steps = [t for row in traj for t in range(len(row))]
    values = np.array([v for row in traj for v in row])
    traces = A.Traces.from_columns({"prompt_id": ids, "step": steps, "c": values})
    eps = [0.001, 0.01, 0.1, 1.0]
    got = A.mean_run_length(traces, values, eps)
    for e, budget in enumerate(eps):
        assert got[e] == pytest.approx(np.mean(brute_runs(traj, budget)))
    assert A.mean_run_length(traces, values, 0.01) == pytest.approx(got[1])


def test_run_length_curves_cover_criteria_and_trees(tr):
    curves = A.run_length_curves(tr, [0.01, 0.1], tree_widths=(2, 8))
    assert set(curves) == set(PAPER_CRITERIA) | {"tree:2", "tree:8"}
    traj = split(tr, tr.tree_cert(8))
    assert curves["tree:8"][1] == pytest.approx(np.mean(brute_runs(traj, 0.1)))
    # larger budgets certify less
    for y in curves.values():
        assert y[0] >= y[1]


# -- tree certificates and thresholds from the stored top-k ---------------------------------------


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 11])
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_tree_certificates_from_top_match_the_engine(m, divergence):
    traces, raw = synthetic_traces(seed=3)
    got = A.tree_certificates_from_top(traces.column("top_probs"), m, divergence)
    want = tree_certificate(raw["p"], m, divergence).numpy()
    assert np.allclose(got, want, rtol=1e-12, atol=1e-15)
    if m in traces.tree_widths:
        stored = traces.column(f"tree_cert_{'fwd' if divergence == 'forward' else 'rev'}[{m}]")
        assert np.allclose(got, stored, rtol=1e-12, atol=1e-15)
        assert traces.tree_cert(m, divergence) is stored
    with pytest.raises(ValueError):
        A.tree_certificates_from_top(traces.column("top_probs"), TOP_K, divergence)


@pytest.mark.parametrize("spec", PAPER_CRITERIA)
def test_thresholds_from_top_match_the_criteria(spec):
    traces, raw = synthetic_traces(seed=4)
    got = A.thresholds_from_top(traces, spec)
    want = parse_criterion(spec).threshold(raw["p"]).numpy()
    assert np.allclose(got, want, rtol=1e-12, atol=1e-15)


# -- acceptance, soundness, tightness, trees -----------------------------------------------------


def test_acceptance_table_brute_force(tr):
    rows = {r.criterion: r for r in A.acceptance_table(tr)}
    n = tr.n_rows
    for spec in PAPER_CRITERIA:
        acc = tr.column(f"accepted[{spec}]")
        cf = [tr.column("kl_fwd")[i] < tr.column(f"cert_fwd[{spec}]")[i] for i in range(n)]
        r = rows[spec]
        assert r.accepted == pytest.approx(sum(acc) / n)
        assert r.certified_fwd == pytest.approx(sum(cf) / n)
        assert r.tightness_fwd == pytest.approx(sum(a and c for a, c in zip(acc, cf)) / sum(acc))
        assert r.violations == 0


def test_soundness_holds_and_counts_every_check(tr):
    rep = A.soundness(tr, tree_widths=range(1, 9))
    assert rep.steps == tr.n_rows
    assert rep.checks == tr.n_rows * 2 * (len(PAPER_CRITERIA) + 8)
    assert rep.total_violations == 0 and rep.total_mismatches == 0
    assert len(rep.violations) == 2 * (len(PAPER_CRITERIA) + 8)


def test_soundness_holds_on_exact_ties():
    """Tied targets and drafters close to them: the worst-case certificates stay sound against the
    decoders' verdicts (first index wins), and the recomputed flags agree with the stored ones."""
    traces, raw = synthetic_traces(seed=3, lengths=(40, 40, 40), noise=0.05, exact_ties=True)
    p = raw["p"]
    tied = (p.sort(-1, descending=True).values[:, :2].diff(dim=-1) == 0).squeeze(-1)
    assert int(tied.sum()) >= 30
    rep = A.soundness(traces, tree_widths=(1, 2, 4))
    assert rep.total_violations == 0 and rep.total_mismatches == 0, (rep.violations, rep.flag_mismatches)
    # tied rows: strict greedy certifies nothing, and the level-set certificate would have
    cert = np.asarray(traces.column("certified_fwd[greedy]")).astype(bool)
    assert not cert[tied.numpy()].any()
    level = certificates(p, ["greedy"], "forward", ties="level-set")[("greedy", "forward")]
    wrong = (kl_divergence(p, raw["q"]) < level) & ~torch.tensor(traces.column("accepted[greedy]").astype(bool))
    assert int(wrong.sum()) > 0


def test_soundness_detects_a_violation_and_a_bad_flag():
    traces, _ = synthetic_traces(seed=1)
    cols = {n: traces.table.column(n).to_pylist() for n in traces.table.column_names}
    # a rejected greedy step made "certified" by shrinking its KL below the certificate
    rejected = [i for i, a in enumerate(cols["accepted[greedy]"]) if not a]
    assert rejected
    i = rejected[0]
    cols["kl_fwd"][i] = cols["cert_fwd[greedy]"][i] / 2
    # and a stored acceptance flag contradicting the threshold rule
    j = next(k for k, a in enumerate(cols["accepted[topm:4]"]) if a)
    cols["accepted[topm:4]"][j] = False
    bad = A.soundness(A.Traces.from_columns({k: np.array(v) if k != "top_probs" else np.array(v) for k, v in cols.items()}))
    assert bad.violations["greedy (fwd)"] >= 1
    assert bad.flag_mismatches["certified_fwd[greedy]"] >= 1
    assert bad.flag_mismatches["accepted[topm:4]"] == 1


def test_tightness_by_bin_brute_force(tr):
    edges = A.margin_bin_edges(tr.column("margin"), 3)
    curves = A.tightness_by_bin(tr, edges)
    b = A.bin_index(tr.column("margin"), edges)
    for spec in ("greedy", "topm:4"):
        for k in range(curves.n_bins):
            idx = [i for i in range(tr.n_rows) if b[i] == k and tr.column(f"accepted[{spec}]")[i]]
            cert = [tr.column("kl_fwd")[i] < tr.column(f"cert_fwd[{spec}]")[i] for i in idx]
            assert curves.values[f"accepted:{spec}"][k] == len(idx)
            if idx:
                assert curves.values[spec][k] == pytest.approx(sum(cert) / len(idx))


def test_tree_coverage_brute_force(tr):
    cov = A.tree_coverage(tr, range(1, 9))
    rank = tr.column("token_rank_in_draft")
    for k, m in enumerate(range(1, 9)):
        assert cov.covered[k] == pytest.approx(np.mean([r <= m for r in rank]))
        rho = A.tree_certificates_from_top(tr.column("top_probs"), m)
        assert cov.certified[k] == pytest.approx(np.mean(tr.column("kl_fwd") < rho))
        assert cov.violations[k] == 0
    assert np.all(np.diff(cov.covered) >= 0) and np.all(np.diff(cov.certified) >= 0)


# -- rounds ---------------------------------------------------------------------------------


def brute_round(flags_traj: list[list[bool]], k: int | None) -> list[int]:
    out = []
    for row in flags_traj:
        for t in range(len(row)):
            n = 0
            while t + n < len(row) and row[t + n] and (k is None or n < k):
                n += 1
            out.append(n)
    return out


@settings(max_examples=120, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=10), min_size=1, max_size=4),
       st.one_of(st.none(), st.integers(1, 6)))
def test_round_lengths_brute_force(traj, k):
    ids = [f"t{i}" for i, row in enumerate(traj) for _ in row]
    steps = [t for row in traj for t in range(len(row))]
    flags = np.array([f for row in traj for f in row])
    traces = A.Traces.from_columns({"prompt_id": ids, "step": steps})
    assert A.round_lengths(traces, flags, k).tolist() == brute_round(traj, k)


def test_accepted_length_per_round(tr):
    r = A.accepted_length_per_round(tr, (1, 2, 4, 100))
    assert r.eps == A.quantile(tr.column("kl_fwd"), 0.5)
    for spec in PAPER_CRITERIA:
        acc = split(tr, tr.column(f"accepted[{spec}]"))
        cert = split(tr, tr.column("kl_fwd") < tr.column(f"cert_fwd[{spec}]"))
        bud = split(tr, tr.column(f"cert_fwd[{spec}]") > r.eps)
        for i, k in enumerate((1, 2, 4, 100)):
            assert r.measured[spec][i] == pytest.approx(np.mean(brute_round(acc, k)))
            assert r.certified[spec][i] == pytest.approx(np.mean(brute_round(cert, k)))
            assert r.budget[spec][i] == pytest.approx(np.mean(brute_round(bud, k)))
        # soundness makes the certified length a lower bound, step by step
        assert r.min_gap[spec] >= 0
        assert np.all(r.certified[spec] <= r.measured[spec] + 1e-12)
        assert r.measured[spec][0] == pytest.approx(np.mean(tr.column(f"accepted[{spec}]")))
    fixed = A.accepted_length_per_round(tr, (3,), ["greedy"], eps=0.05)
    assert fixed.eps == 0.05 and list(fixed.measured) == ["greedy"]


def test_markdown_table_formats():
    md = A.markdown_table(["a", "b"], [["x", 0.5], ["y", math.inf], ["z", math.nan]])
    assert md.splitlines()[2] == "| x | 0.5 |" and "+\\infty" in md and "n/a" in md


# -- harvesting for a chapter --------------------------------------------------------------------


def test_default_traces_dir_names_the_configuration(tmp_path: Path):
    d = cache.default_traces_dir("default", 48, 64, device_type="cpu", batch_size=8, seed=0, runs_root=tmp_path)
    assert d == tmp_path / "default-48x64-cpu-b8-seed0"
    assert cache.default_traces_dir("default", 48, 64, runs_root=tmp_path).name == "default-48x64-cpu-bauto-seed0"


def test_chapter_traces_harvests_reuses_and_replaces_stale(tmp_path: Path, monkeypatch):
    from companion.harvest.toy import toy_pair

    pairs = {"n": 0}

    def fake_load(plan, device=None, dtype=None, _noise=[0.1]):
        pairs["n"] += 1
        t, d, tok = toy_pair(vocab=300, hidden=32, layers=1, noise=_noise[0])
        return t, d, tok, [f"prompt number {i}: abc" for i in range(plan.n_prompts or len(plan.prompts))]

    monkeypatch.setattr(planning, "load_planned", fake_load)
    kw = dict(device="cpu", n_prompts=3, n_steps=4, batch_size=2, runs_root=tmp_path)
    first = cache.chapter_traces("default", **kw)
    assert first.harvested_rows == 12 and first.manifest["status"] == "complete"
    assert first.traces_dir == tmp_path / "default-3x4-cpu-b2-seed0"
    again = cache.chapter_traces("default", **kw)
    assert again.harvested_rows == 0 and again.traces_dir == first.traces_dir
    assert "preset `default`" in again.describe()
    # a complete traces_dir is used without loading any model
    loads = pairs["n"]
    given = cache.chapter_traces("default", traces_dir=str(first.traces_dir), **kw)
    assert pairs["n"] == loads and given.harvested_rows == 0
    # another configuration (other weights) in the cache: moved aside and harvested again
    fake_load.__defaults__[-1][0] = 0.3
    fresh = cache.chapter_traces("default", **kw)
    assert fresh.harvested_rows == 12
    assert (tmp_path / "default-3x4-cpu-b2-seed0.stale" / "manifest.json").is_file()
    # ... but never in a directory the user named: an unfinished one of another configuration is refused
    import json
    import shutil

    from companion.harvest.store import HarvestConfigError

    mine = tmp_path / "mine"
    shutil.copytree(first.traces_dir, mine)
    manifest = json.loads((mine / "manifest.json").read_text())
    manifest["status"] = "incomplete"
    (mine / "manifest.json").write_text(json.dumps(manifest))
    fake_load.__defaults__[-1][0] = 0.5
    with pytest.raises(HarvestConfigError):
        cache.chapter_traces("default", traces_dir=str(mine), **kw)
    assert (mine / "manifest.json").is_file() and not (tmp_path / "mine.stale").exists()



def test_a_chapter_notes_the_harvests_it_analyses_for_the_status_page(tmp_path: Path, monkeypatch):
    """Under `companion reproduce` (the notes file set), every harvest a chapter asks for is noted once, and
    the status page names its models and their weights from the manifests (issue 56: "(none)" for 7, 8, 10)."""
    from companion.book.execute import HARVEST_NOTES_ENV, noted_harvests
    from companion.book.record import ChapterExecution, RunRecord, harvest_description, render_status_markdown
    from companion.harvest.toy import toy_pair

    def fake_load(plan, device=None, dtype=None):
        t, d, tok = toy_pair(vocab=300, hidden=32, layers=1, noise=0.1)
        return t, d, tok, [f"prompt number {i}: abc" for i in range(plan.n_prompts)]

    monkeypatch.setattr(planning, "load_planned", fake_load)
    kw = dict(device="cpu", n_steps=4, batch_size=2, runs_root=tmp_path)
    monkeypatch.delenv(HARVEST_NOTES_ENV, raising=False)
    cache.chapter_traces("default", n_prompts=2, **kw)   # a notebook opened by hand: nothing noted anywhere
    notes = tmp_path / "notes" / "07_eval.txt"
    monkeypatch.setenv(HARVEST_NOTES_ENV, str(notes))
    main = cache.chapter_traces("default", n_prompts=2, **kw)
    cache.chapter_traces("default", n_prompts=2, **kw)
    other = cache.chapter_traces("default", n_prompts=3, **kw)
    assert noted_harvests(notes) == [str(main.traces_dir.resolve()), str(other.traces_dir.resolve())]
    described = harvest_description(noted_harvests(notes))
    digest = main.manifest["config"]["target"]["state_dict_sha256"][:16]
    assert described.count("preset `default`") == 2 and f"tensors' sha256 {digest}…" in described, described
    run = ChapterExecution(chapter="07_eval", source="notebooks/07_eval.ipynb", source_sha256="abc", profile="cpu",
                           parameters={"device": "cpu", "preset": "default", "traces_dir": ""}, device="cpu",
                           device_name="", started="2026-01-02T03:04:05Z", seconds=1.0, harvest=described)
    status = render_status_markdown(RunRecord({"07_eval": run}), [("07_eval", "", "abc")])
    row = next(line for line in status.splitlines() if line.startswith("| 07_eval |") and "preset" in line)
    assert "(none)" not in row and "traces ``" not in row and digest in row, row


_CONCURRENT_HARVEST = """
import json, sys
from companion.book import harvest_cache as cache
from companion.harvest import plan as planning
from companion.harvest.toy import toy_pair

def fake_load(plan, device=None, dtype=None):
    t, d, tok = toy_pair(vocab=300, hidden=32, layers=1, noise=0.1)
    return t, d, tok, [f"prompt number {i}: abc" for i in range(plan.n_prompts)]

planning.load_planned = fake_load
got = cache.chapter_traces("default", device="cpu", n_prompts=6, n_steps=8, batch_size=2, runs_root=sys.argv[1])
print(json.dumps({"rows": got.harvested_rows, "status": got.manifest["status"]}))
"""


def test_chapters_harvesting_at_once_share_one_harvest(tmp_path: Path):
    """Two processes (chapters 7 and 8 under a parallel `companion reproduce`) ask for the same
    uncached harvest at once: one harvests, the other waits for it and reuses it; nothing is damaged."""
    import json
    import subprocess
    import sys

    from companion.harvest import load_traces

    procs = [subprocess.Popen([sys.executable, "-c", _CONCURRENT_HARVEST, str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    results = sorted(json.loads(out.strip().splitlines()[-1])["rows"] for out, _ in outs)
    assert results == [0, 48], results  # 6 prompts x 8 steps harvested once
    traces = load_traces(tmp_path / "default-6x8-cpu-b2-seed0")  # verifies every shard's sha256
    assert len(traces) == 48


def test_a_chapter_harvest_in_two_processes_equals_one(tmp_path: Path, monkeypatch, capsys):
    """chapter_traces(processes=2) on the CPU: the same rows as one process (shards dealt out by
    torch.distributed.run), capped at the shards there are, and a failed launch falls back to
    this process after saying why."""
    import sys

    from companion.harvest import load_traces

    kw = dict(device="cpu", n_prompts=4, n_steps=8, batch_size=2)
    two = cache.chapter_traces("closed-world", runs_root=tmp_path / "two", processes=2, **kw)
    one = cache.chapter_traces("closed-world", runs_root=tmp_path / "one", processes=1, **kw)
    assert two.manifest["runs"][-1]["world_size"] == 2 and one.manifest["runs"][-1]["world_size"] == 1
    assert two.harvested_rows == one.harvested_rows > 0
    assert two.manifest["config_digest"] == one.manifest["config_digest"]
    assert load_traces(two.traces_dir).equals(load_traces(one.traces_dir))
    assert not (two.traces_dir / "parts").exists()
    assert cache.chapter_traces("closed-world", runs_root=tmp_path / "two", processes=2, **kw).harvested_rows == 0
    # one shard (4 prompts in a batch of 4): one process, whatever was asked
    single = cache.chapter_traces("closed-world", runs_root=tmp_path / "single", processes=2,
                                  **{**kw, "batch_size": 4})
    assert single.manifest["runs"][-1]["world_size"] == 1
    # the workers cannot start: said in one line, then harvested here
    monkeypatch.setattr(sys, "executable", "/bin/false")
    fell_back = cache.chapter_traces("closed-world", runs_root=tmp_path / "fallback", processes=2, **kw)
    said = capsys.readouterr().out
    assert "2-process harvest" in said and "failed (exit status 1" in said and "going on in this process" in said, said
    assert fell_back.manifest["runs"][-1]["world_size"] == 1
    assert load_traces(fell_back.traces_dir).equals(load_traces(one.traces_dir))
    with pytest.raises(ValueError, match="processes must be a whole number >= 1"):
        cache.chapter_traces("closed-world", runs_root=tmp_path / "bad", processes=0, **kw)


def test_enlargement_by_bin_brute_force(tr):
    edges = A.margin_bin_edges(tr.column("margin"), 3)
    eps = [0.01, 0.1]
    enl = A.enlargement_by_bin(tr, edges, eps, tree_widths=(2, 8))
    assert set(enl.gain) == (set(PAPER_CRITERIA) - {"greedy"}) | {"tree:2", "tree:8"}
    b = A.bin_index(tr.column("margin"), edges)
    g = tr.cert("greedy")
    assert np.allclose(g, tr.tree_cert(1))  # strict greedy is the width-1 tree
    for label in ("additive:0.3", "topm:4", "tree:8"):
        rho = tr.tree_cert(8) if label == "tree:8" else tr.cert(label)
        for k in range(enl.counts.size):
            idx = [i for i in range(tr.n_rows) if b[i] == k]
            for e, budget in enumerate(eps):
                want = np.mean([rho[i] > budget for i in idx]) - np.mean([g[i] > budget for i in idx])
                assert enl.gain[label][e, k] == pytest.approx(want)
            ratios = sorted(rho[i] / g[i] for i in idx if g[i] > 0)
            assert enl.median_ratio[label][k] == ratios[math.ceil(len(ratios) / 2) - 1]
    # relaxing never shrinks the certified region: gains are >= 0, ratios >= 1
    for label in enl.gain:
        assert np.all(enl.gain[label] >= 0) and np.all(enl.median_ratio[label] >= 1 - 1e-12)


def _with_mars(seed: int = 4) -> tuple[dict, np.ndarray]:
    """Synthetic traces plus mars:0.87 columns computed from logits with a positive offset (so
    that some rows relax): certificates and the decoders' verdict on those logits."""
    from companion.certify.criteria import Mars

    traces, raw = synthetic_traces(seed=seed, lengths=(30, 30), noise=0.3)
    p, q = raw["p"], raw["q"]
    z = torch.log(p) + 8.0  # same p; the offset decides which rows MARS relaxes
    mars = Mars(0.87)
    d = q.argmax(-1)
    certs = certificates(z, ["mars:0.87"], ("forward", "reverse"), from_logits=True)
    kl_f, kl_r = kl_divergence(p, q), kl_divergence(p, q, "reverse")
    cols = {n: traces.table.column(n).to_pylist() for n in traces.table.column_names}
    cols = {k: np.array(v) for k, v in cols.items()}
    cols["cert_fwd[mars:0.87]"] = certs[("mars:0.87", "forward")].numpy()
    cols["cert_rev[mars:0.87]"] = certs[("mars:0.87", "reverse")].numpy()
    cols["accepted[mars:0.87]"] = mars.decoder_accepts(z, d, from_logits=True).numpy()
    cols["certified_fwd[mars:0.87]"] = (kl_f < certs[("mars:0.87", "forward")]).numpy()
    cols["certified_rev[mars:0.87]"] = (kl_r < certs[("mars:0.87", "reverse")]).numpy()
    return cols, mars.relaxed(z).numpy()


def test_soundness_of_mars_uses_the_stored_acceptance():
    """MARS is not decidable from top-k probabilities: soundness reads its stored ``accepted``
    column. Relaxed rows accept the runner-up, which the probabilities alone would call rejected."""
    cols, relaxed = _with_mars()
    assert relaxed.any() and not relaxed.all(), f"relaxed on {int(relaxed.sum())} of {len(relaxed)} rows"
    traces = A.Traces.from_columns(cols)
    assert "mars:0.87" in traces.criteria
    rep = A.soundness(traces, tree_widths=(1, 2))
    assert rep.violations["mars:0.87 (fwd)"] == 0 and rep.violations["mars:0.87 (rev)"] == 0, rep.violations
    assert "accepted[mars:0.87]" not in rep.flag_mismatches
    assert rep.total_violations == 0 and rep.total_mismatches == 0, (rep.violations, rep.flag_mismatches)
    # the stored column is what is checked: a certified row flagged "rejected" is a violation
    cert = cols["certified_fwd[mars:0.87]"].astype(bool)
    assert cert.any(), "no mars:0.87 row certified"
    i = int(np.flatnonzero(cert)[0])
    cols["accepted[mars:0.87]"] = cols["accepted[mars:0.87]"].copy()
    cols["accepted[mars:0.87]"][i] = False
    bad = A.soundness(A.Traces.from_columns(cols), tree_widths=(1, 2))
    assert bad.violations["mars:0.87 (fwd)"] == 1, bad.violations
