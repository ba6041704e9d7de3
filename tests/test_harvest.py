"""Trace harvesting: statistics against the engine, decoding, files, resume, processes, presets, real shapes.

Models are random Qwen3s built here (``companion.harvest.toy``): a target with varied, peaked
distributions and a drafter that is its noisy copy, with a byte-level tokenizer. Nothing is
downloaded and the embedded pair is not needed.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from companion.certify.certificates import certificates, kl_divergence
from companion.certify.criteria import PAPER_CRITERIA, parse_criterion
from companion.harvest import (
    SCHEMA,
    HarvestConfigError,
    StepStatistics,
    arrow_schema,
    column_names,
    harvest,
    load_traces,
    read_manifest,
    schema_markdown,
)
from companion.models import presets as pr
from companion.prompts import ultrachat
from companion.harvest.decode import decode_batch
from companion.harvest.toy import byte_tokenizer, save_pair, toy_pair
from companion.models.loading import load_pair
from companion.prompts.sets import Prompt, dumps_prompts
from companion.certify.stochastic import total_variation
from companion.certify.summary import summarize
from companion.harvest.schema import column

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
WIDTHS = (1, 2, 4, 8)
TEXTS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "import os\nimport sys\n\nprint(sys.argv)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
    "hello",
    "for i in range(10):\n    total += i * i\n",
    "# comment\nx = {'a': 1, 'b': [1, 2, 3]}\n",
    "while True:\n    break\n",
]


@pytest.fixture(autouse=True)
def _one_thread():
    # CPU float reductions depend on the thread count: subprocesses run with 1 thread, so do we.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair():
    return toy_pair(vocab=512, hidden=64, layers=2)


@pytest.fixture(scope="module")
def pair_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target, drafter, tok = toy_pair(vocab=512, hidden=64, layers=2)
    paths = save_pair(root, target, drafter, tok)
    prompts = [Prompt(f"p{i:02d}", TEXTS[i % len(TEXTS)] * (1 + i % 3), -1, "test") for i in range(10)]
    paths["prompts"] = root / "prompts.jsonl"
    paths["prompts"].write_text(dumps_prompts(prompts), encoding="utf-8")
    return paths


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    return env


def _cli(pair_dir, out, *extra: str) -> list[str]:
    return [PY, "-m", "companion", "harvest", "--out", str(out), "--target", str(pair_dir["target"]),
            "--drafter", str(pair_dir["drafter"]), "--prompts", str(pair_dir["prompts"]), "--threads", "1",
            "--no-progress", *extra]


def _list_column(table: pa.Table, name: str) -> np.ndarray:
    """A fixed-size list column as a 2-D array."""
    arr = table.column(name).combine_chunks()
    return np.asarray(arr.flatten()).reshape(len(arr), arr.type.list_size)


def _assert_tables_equal(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.remove_metadata() == b.schema.remove_metadata()
    assert a.num_rows == b.num_rows
    for name in a.column_names:
        assert a.column(name).equals(b.column(name)), name


# -------------------------------------------------------------------------------------------------
# Schema


def test_schema_table_and_names() -> None:
    md = schema_markdown()
    assert md.count("\n") == len(SCHEMA) + 2
    assert "`cert_fwd[{spec}]`" in md and "`cert_fwd[additive:0.3]`" in md and "`covered[4]`" in md
    names = column_names(["greedy", "additive:0.3"], [1, 4], drafter=True)
    for expected in ("prompt_id", "step", "cert_fwd[additive:0.3]", "cert_rev[greedy]", "accepted[additive:0.3]",
                     "certified_fwd[additive:0.3]", "tree_cert_fwd[4]", "covered[4]", "tree_certified_fwd[1]"):
        assert expected in names
    target_only = column_names(["greedy"], [1], drafter=False)
    assert "kl_fwd" not in target_only and "covered[1]" not in target_only and "cert_fwd[greedy]" in target_only
    schema = arrow_schema(["greedy"], [1, 2], True, 64)
    assert schema.field("top_probs").type == pa.list_(pa.float64(), 64)
    assert schema.names == column_names(["greedy"], [1, 2], True)


# -------------------------------------------------------------------------------------------------
# Statistics against the engine, from full logits


def _logit_rows(v: int, seed: int = 0) -> torch.Tensor:
    """Peaked, flat and tied rows, plus one with masked (-inf) tokens."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randn(v, generator=g) * s for s in (0.3, 1.0, 3.0, 8.0, 15.0)]
    tie = torch.randn(v, generator=g) * 4.0
    i, j = torch.topk(tie, 2).indices
    tie[j] = tie[i]
    rows.append(tie)
    masked = torch.randn(v, generator=g) * 5.0
    masked[::3] = -torch.inf
    rows.append(masked)
    return torch.stack(rows)


@pytest.mark.parametrize("v", [97, 3000])
def test_step_statistics_match_engine(v: int) -> None:
    lp = _logit_rows(v, 0)
    lq = lp.clone()
    noise = torch.randn(lp.shape, generator=torch.Generator().manual_seed(1))
    for r, s in enumerate((0.0, 0.05, 0.5, 2.0, 0.3, 0.01, 0.2)):
        lq[r] = lp[r] + s * noise[r]
    lq[-1] = torch.where(torch.isinf(lp[-1]), lp[-1], lq[-1])
    stats = StepStatistics(PAPER_CRITERIA, WIDTHS, vocab=v, top_k=16)
    cols = stats(lp, lq)
    assert set(cols) == set(column_names(stats.specs, WIDTHS, True)) - {"prompt_id", "prompt_index", "prompt_tokens", "step"}

    ref = certificates(lp, PAPER_CRITERIA, ("forward", "reverse"), tree_widths=WIDTHS, from_logits=True)
    for spec in stats.specs:
        torch.testing.assert_close(cols[f"cert_fwd[{spec}]"], ref[(spec, "forward")], rtol=0, atol=0)
        torch.testing.assert_close(cols[f"cert_rev[{spec}]"], ref[(spec, "reverse")], rtol=0, atol=0)
    for m in WIDTHS:
        torch.testing.assert_close(cols[f"tree_cert_fwd[{m}]"], ref[(f"tree:{m}", "forward")], rtol=0, atol=0)

    s = summarize(lp, from_logits=True, k=16, with_entropy=True)
    torch.testing.assert_close(cols["top_probs"], s.values)
    torch.testing.assert_close(cols["entropy"], s.entropy)
    probs = torch.softmax(lp.double(), -1)
    sorted_p = probs.sort(-1, descending=True).values
    torch.testing.assert_close(cols["p_top1"], sorted_p[:, 0], rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(cols["margin"], sorted_p[:, 0] - sorted_p[:, 1], rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(cols["top10_mass"], sorted_p[:, :10].sum(1), rtol=1e-6, atol=1e-12)
    assert cols["top2_tie"].tolist() == [False] * 5 + [True, False]
    assert torch.equal(cols["token"], lp.argmax(-1))

    # KL and TV: float64 throughout, so they match an all-float64 reference to rounding, and the
    # engine's functions (float32 normalisers) to their own accuracy.
    lp64, lq64 = torch.log_softmax(lp.double(), -1), torch.log_softmax(lq.double(), -1)
    finite = torch.isfinite(lp64)
    ref_fwd = torch.where(finite, lp64.exp() * (lp64 - lq64), 0.0).sum(-1)
    ref_rev = torch.where(finite, lq64.exp() * (lq64 - lp64), 0.0).sum(-1)
    torch.testing.assert_close(cols["kl_fwd"], ref_fwd.clamp(min=0), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(cols["kl_rev"], ref_rev.clamp(min=0), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(cols["tv"], 0.5 * (lp64.exp() - lq64.exp()).abs().sum(-1), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(cols["kl_fwd"], kl_divergence(lp, lq, "forward", from_logits=True), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(cols["kl_rev"], kl_divergence(lp, lq, "reverse", from_logits=True), rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(cols["tv"], total_variation(lp, lq, from_logits=True), rtol=1e-4, atol=1e-7)
    assert cols["kl_fwd"][0] == 0 and cols["tv"][0] < 1e-15  # identical rows

    d = lq.argmax(-1)
    assert torch.equal(cols["draft_token"], d)
    for spec in stats.specs:
        c = parse_criterion(spec)
        assert torch.equal(cols[f"accepted[{spec}]"], c.decoder_accepts(lp, d, from_logits=True)), spec
        # Soundness, row by row: certified implies accepted.
        assert not bool((cols[f"certified_fwd[{spec}]"] & ~cols[f"accepted[{spec}]"]).any()), spec
        assert not bool((cols[f"certified_rev[{spec}]"] & ~cols[f"accepted[{spec}]"]).any()), spec
    g = lp.argmax(-1)
    for r in range(lp.shape[0]):
        # ranks as a stable descending sort orders the row (exact ties to the lowest id)
        order_p = torch.sort(lp[r], descending=True, stable=True).indices.tolist()
        order_q = torch.sort(lq[r], descending=True, stable=True).indices.tolist()
        assert int(cols["draft_rank"][r]) == 1 + order_p.index(int(d[r]))
        assert int(cols["token_rank_in_draft"][r]) == 1 + order_q.index(int(g[r]))
        assert bool(cols["accepted[greedy]"][r]) == (int(d[r]) == int(g[r]))
        for m in WIDTHS:
            assert bool(cols[f"covered[{m}]"][r]) == (int(g[r]) in order_q[:m])
            if cols[f"tree_certified_fwd[{m}]"][r] or cols[f"tree_certified_rev[{m}]"][r]:
                assert cols[f"covered[{m}]"][r]
    # The identical row is certified for every criterion that rejects something.
    assert all(bool(cols[f"certified_fwd[{s}]"][0]) for s in stats.specs if torch.isfinite(ref[(s, "forward")][0]))


def test_step_statistics_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="top_k"):
        StepStatistics(["greedy"], [1], vocab=100, top_k=5)
    with pytest.raises(ValueError, match="tree width"):
        StepStatistics(["greedy"], [100], vocab=100)
    with pytest.raises(ValueError, match="malformed"):
        StepStatistics(["gready"], [1], vocab=100)
    stats = StepStatistics(["greedy"], [1], vocab=50, top_k=10)
    bad = torch.randn(2, 50)
    bad[1, 3] = torch.nan
    with pytest.raises(ValueError, match="NaN"):
        stats(bad, torch.randn(2, 50))


# -------------------------------------------------------------------------------------------------
# Decoding and a whole harvest in process


def test_greedy_decoding_matches_generate(pair) -> None:
    target, drafter, tok = pair
    ids = [tok(t)["input_ids"] for t in TEXTS[:3]]
    res = decode_batch(target, None, ids, 12, None, chunk_steps=1, pad_id=tok.pad_token_id, stop_at_eos=False)
    for b, one in enumerate(ids):
        gen = target.generate(torch.tensor([one]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                              pad_token_id=tok.pad_token_id)
        # Batched (left-padded) and unbatched decoding agree token for token on these prompts.
        assert res.columns["token"][b].tolist() == gen[0, len(one):].tolist()


def test_harvest_end_to_end(pair, tmp_path) -> None:
    target, drafter, tok = pair
    seen = []

    def hook(prompts, first, lp, lq, cols):
        if len(seen) < 3:
            seen.append((prompts, first, lp.clone(), lq.clone(), {k: v.clone() for k, v in cols.items()}))

    manifest = harvest(target, drafter, tok, TEXTS, tmp_path / "h", n_steps=20, batch_size=3, chunk_steps=4,
                       progress=False, hook=hook, stop_at_eos=False)
    table = load_traces(tmp_path / "h")
    assert manifest["status"] == "complete" and table.num_rows == len(TEXTS) * 20
    assert manifest["totals"]["rows"] == table.num_rows and manifest["totals"]["prompts"] == len(TEXTS)
    assert table.schema.names == manifest["schema"]
    cfg = manifest["config"]
    assert cfg["criteria"] == list(PAPER_CRITERIA) and cfg["tree_widths"] == list(WIDTHS)
    assert cfg["dtype"] == "float32" and cfg["device_type"] == "cpu" and "state_dict_sha256" in cfg["target"]
    for key in ("torch", "transformers", "pyarrow", "accelerate"):
        assert key in manifest["environment"]["versions"]
    assert manifest["runs"][0]["steps_per_s"] > 0

    # Rows of one prompt are contiguous, steps 0..19, prompt ids as given.
    pid = np.asarray(table.column("prompt_index"))
    step = np.asarray(table.column("step"))
    for i in range(len(TEXTS)):
        assert step[pid == i].tolist() == list(range(20))
    assert set(table.column("prompt_id").to_pylist()) == {f"prompt-{i:05d}" for i in range(len(TEXTS))}

    # Certificates in the traces equal the engine's, recomputed from the very logits of those steps.
    for prompts, first, lp, lq, cols in seen:
        flat = lp.reshape(-1, lp.shape[-1])
        ref = certificates(flat, PAPER_CRITERIA, ("forward", "reverse"), tree_widths=WIDTHS, from_logits=True)
        s_len = lp.shape[1]
        for b, prompt in enumerate(prompts):
            rows = table.filter(pa.compute.equal(table.column("prompt_index"), prompt))
            for j in range(s_len):
                row = rows.slice(first + j, 1).to_pylist()[0]
                for spec in PAPER_CRITERIA:
                    assert row[f"cert_fwd[{spec}]"] == float(ref[(spec, "forward")][b * s_len + j])
                    assert row[f"cert_rev[{spec}]"] == float(ref[(spec, "reverse")][b * s_len + j])
                assert row["kl_fwd"] == pytest.approx(
                    float(kl_divergence(lp[b, j], lq[b, j], "forward", from_logits=True)), rel=1e-6, abs=1e-9)

    # Soundness on every step: certified implies accepted, tree-certified implies covered.
    for spec in PAPER_CRITERIA:
        for d in ("fwd", "rev"):
            cert = np.asarray(table.column(f"certified_{d}[{spec}]"))
            assert not np.any(cert & ~np.asarray(table.column(f"accepted[{spec}]"))), (spec, d)
    for m in WIDTHS:
        assert not np.any(np.asarray(table.column(f"tree_certified_fwd[{m}]")) & ~np.asarray(table.column(f"covered[{m}]")))
    # The run is not degenerate: some certified, some accepted-but-uncertified, some rejected.
    acc = np.asarray(table.column("accepted[greedy]"))
    cert = np.asarray(table.column("certified_fwd[greedy]"))
    assert cert.any() and (acc & ~cert).any() and (~acc).any()

    # The drafter, fed block by block, sees what a full teacher-forced forward sees.
    first_prompt = table.filter(pa.compute.equal(table.column("prompt_index"), 0))
    seq = tok(TEXTS[0])["input_ids"] + first_prompt.column("token").to_pylist()
    with torch.no_grad():
        full_p = target(torch.tensor([seq])).logits[0, len(seq) - 21:-1]
        full_q = drafter(torch.tensor([seq])).logits[0, len(seq) - 21:-1]
    kl_full = kl_divergence(full_p, full_q, "forward", from_logits=True).numpy()
    np.testing.assert_allclose(np.asarray(first_prompt.column("kl_fwd")), kl_full, rtol=1e-3, atol=1e-6)


def test_stop_at_eos_and_drafterless(pair, tmp_path) -> None:
    target, _, tok = pair
    free = harvest(target, None, tok, TEXTS[:4], tmp_path / "free", n_steps=10, batch_size=4, progress=False,
                   stop_at_eos=False)
    t_free = load_traces(tmp_path / "free")
    assert "kl_fwd" not in t_free.column_names and free["config"]["drafter"] is None
    tokens = np.asarray(t_free.column("token")).reshape(4, 10)
    eos = int(tokens[0, 3])  # pretend the 4th token of prompt 0 is an end of sequence
    harvest(target, None, tok, TEXTS[:4], tmp_path / "eos", n_steps=10, batch_size=4, progress=False,
            eos_token_ids=[eos])
    t_eos = load_traces(tmp_path / "eos")
    for i in range(4):
        hits = np.nonzero(tokens[i] == eos)[0]
        expected = int(hits[0]) + 1 if hits.size else 10
        rows = np.asarray(t_eos.column("prompt_index")) == i
        assert rows.sum() == expected
        # Recorded steps are the same numbers as without the stop.
        np.testing.assert_array_equal(np.asarray(t_eos.column("cert_fwd[greedy]"))[rows],
                                      np.asarray(t_free.column("cert_fwd[greedy]"))[np.asarray(t_free.column("prompt_index")) == i][:expected])


def test_bf16_ties_are_counted(pair, tmp_path) -> None:
    target, drafter, tok = pair
    t16, d16 = target.to(torch.bfloat16), drafter.to(torch.bfloat16)
    try:
        manifest = harvest(t16, d16, tok, TEXTS, tmp_path / "bf16", n_steps=24, batch_size=4, progress=False,
                           stop_at_eos=False, criteria=["greedy", "additive:0.3"], tree_widths=[1, 2])
    finally:
        target.float(), drafter.float()
    table = load_traces(tmp_path / "bf16")
    ties = np.asarray(table.column("top2_tie"))
    assert manifest["config"]["dtype"] == "bfloat16"
    assert manifest["totals"]["top2_tie_steps"] == int(ties.sum()) > 0
    # On a tie the margin is 0; the decoder takes the first maximiser and a draft of the other one
    # is rejected, so the worst-case strict-greedy certificate is 0 there (nothing is certified),
    # and acceptance is the id-based check draft_token == token.
    top = _list_column(table, "top_probs")
    assert np.all(np.asarray(table.column("margin"))[ties] == 0) and np.all(top[ties, 0] == top[ties, 1])
    assert np.all(np.asarray(table.column("cert_fwd[greedy]"))[ties] == 0)
    assert np.all(np.asarray(table.column("cert_rev[greedy]"))[ties] == 0)
    assert np.all(np.asarray(table.column("margin"))[~ties] > 0)
    assert np.all(np.asarray(table.column("cert_fwd[greedy]"))[~ties] > 0)
    acc = np.asarray(table.column("accepted[greedy]"))
    assert np.array_equal(acc, np.asarray(table.column("draft_token")) == np.asarray(table.column("token")))
    for d in ("fwd", "rev"):
        cert = np.asarray(table.column(f"certified_{d}[greedy]"))
        assert not np.any(cert & ~acc) and not np.any(cert[ties])
        for m in (1, 2):
            tree = np.asarray(table.column(f"tree_certified_{d}[{m}]"))
            assert not np.any(tree & ~np.asarray(table.column(f"covered[{m}]")))


def test_bad_inputs_and_refusals(pair, tmp_path) -> None:
    target, drafter, tok = pair
    with pytest.raises(ValueError, match="no tokens"):
        harvest(target, drafter, tok, [""], tmp_path / "a", n_steps=2, progress=False)
    with pytest.raises(ValueError, match="positions"):
        harvest(target, drafter, tok, ["x" * 600], tmp_path / "b", n_steps=2, progress=False)
    with pytest.raises(ValueError, match="duplicate prompt_id"):
        harvest(target, drafter, tok, [Prompt("a", "x", 1, "t"), Prompt("a", "y", 1, "t")], tmp_path / "c", progress=False)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    with pytest.raises(HarvestConfigError, match="not empty"):
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "d", n_steps=2, progress=False)
    assert not (tmp_path / "a").exists() or not (tmp_path / "a" / "manifest.json").exists()

    harvest(target, drafter, tok, TEXTS[:2], tmp_path / "e", n_steps=3, progress=False)
    before = (tmp_path / "e" / "manifest.json").read_bytes()
    with pytest.raises(HarvestConfigError, match="n_steps: existing 3, now 4"):
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "e", n_steps=4, progress=False)
    with pytest.raises(HarvestConfigError, match="criteria"):
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "e", n_steps=3, criteria=["greedy"], progress=False)
    assert (tmp_path / "e" / "manifest.json").read_bytes() == before
    # The same configuration again: nothing to do, nothing changes in the rows.
    again = harvest(target, drafter, tok, TEXTS[:2], tmp_path / "e", n_steps=3, progress=False)
    assert again["status"] == "complete" and len(again["runs"]) == 1


def test_thread_count_and_numerics_are_part_of_the_configuration(pair, tmp_path) -> None:
    # CPU float reductions are split across threads: one and two threads may differ in the last
    # bits, so a resume with another thread count would mix two programs' rows. It is refused.
    target, drafter, tok = pair
    first = harvest(target, drafter, tok, TEXTS[:2], tmp_path / "t", n_steps=2, progress=False)
    numerics = first["config"]["numerics"]
    assert numerics["torch_threads"] == 1 and numerics["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    before = (tmp_path / "t" / "manifest.json").read_bytes()
    torch.set_num_threads(2)
    with pytest.raises(HarvestConfigError) as info:
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "t", n_steps=2, progress=False)
    assert str(info.value) == (f"{tmp_path / 't'} already holds a harvest with a different configuration "
                               "(numerics.torch_threads: existing 1, now 2): use another output directory, "
                               f"or delete {tmp_path / 't'} to start over")
    assert (tmp_path / "t" / "manifest.json").read_bytes() == before


def test_a_harvest_with_other_columns_is_another_configuration(pair, tmp_path) -> None:
    # A harvest written by a version without a column this version reads (say top_tail) must not be
    # resumed or reused: its shards would lack the column. Simulate one by editing its manifest.
    from companion.harvest import store

    target, drafter, tok = pair
    first = harvest(target, drafter, tok, TEXTS[:2], tmp_path / "old", n_steps=2, progress=False)
    assert "top_tail" in first["config"]["columns"] and first["config"]["columns"] == first["schema"]
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    manifest["config"]["columns"] = [c for c in manifest["config"]["columns"] if c != "top_tail"]
    manifest["config_digest"] = store.config_digest(manifest["config"])
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HarvestConfigError, match="columns"):
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "old", n_steps=2, progress=False)


def test_a_harvest_by_other_engine_code_is_another_configuration(pair, tmp_path) -> None:
    # The package's version does not change with a commit; the digest of the engine's sources does.
    # A folder harvested by other certificate code is not resumed (rows of two programs).
    from companion.harvest import store

    target, drafter, tok = pair
    first = harvest(target, drafter, tok, TEXTS[:2], tmp_path / "old", n_steps=2, progress=False)
    assert first["config"]["software"]["engine"] == store.engine_digest()
    manifest = json.loads((tmp_path / "old" / "manifest.json").read_text())
    manifest["config"]["software"]["engine"] = "0" * 64
    manifest["config_digest"] = store.config_digest(manifest["config"])
    (tmp_path / "old" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(HarvestConfigError, match="software"):
        harvest(target, drafter, tok, TEXTS[:2], tmp_path / "old", n_steps=2, progress=False)


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # one byte in the middle of the largest column chunk: inside a compressed data page (the
        # middle of the file can be the footer's metadata, which page checksums do not cover)
        import pyarrow.parquet as pq

        group = pq.ParquetFile(path).metadata.row_group(0)
        chunk = max((group.column(i) for i in range(group.num_columns)), key=lambda c: c.total_compressed_size)
        data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip"])
@pytest.mark.parametrize("recorded", [True, False], ids=["in-manifest", "killed-before-recording"])
def test_damaged_shard_is_named_on_load_and_recomputed_on_resume(pair, tmp_path, capsys, how, recorded) -> None:
    target, drafter, tok = pair
    out = tmp_path / "h"
    kwargs = dict(n_steps=6, batch_size=2, progress=False, stop_at_eos=False)
    first = harvest(target, drafter, tok, TEXTS[:6], out, **kwargs)
    reference = load_traces(out)
    assert all(s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() for s in first["shards"])
    bad = out / first["shards"][1]["file"]
    if not recorded:  # as after a SIGKILL: the shard is there, the manifest does not list it yet
        manifest = json.loads((out / "manifest.json").read_text())
        manifest["status"], manifest["shards"] = "running", manifest["shards"][:1]
        (out / "manifest.json").write_text(json.dumps(manifest))
    _damage(bad, how)

    with pytest.raises(ValueError) as info:
        load_traces(out, allow_incomplete=not recorded)
    assert str(info.value).startswith(f"{bad} is damaged (")
    assert str(info.value).endswith("): rerun the harvest command to recompute it")
    if recorded:
        assert "the manifest records" in str(info.value)

    capsys.readouterr()
    again = harvest(target, drafter, tok, TEXTS[:6], out, **kwargs)
    err = capsys.readouterr().err
    assert err.startswith(f"companion harvest: {bad} is damaged (") and err.endswith("); recomputing shard 1\n")
    assert again["status"] == "complete" and again["runs"][-1]["rows"] == len(first["shards"][1]["prompt_ids"]) * 6
    _assert_tables_equal(load_traces(out), reference)
    # The recomputed shard's rows are bit-identical (above); its file differs (it records its compute
    # time), and the manifest now holds that file's sha256.
    assert all(s["sha256"] == hashlib.sha256((out / s["file"]).read_bytes()).hexdigest() for s in again["shards"])
    assert [s["sha256"] for s in again["shards"]][::2] == [s["sha256"] for s in first["shards"]][::2]


def test_default_preset_no_drafter_is_target_only(tmp_path, capsys) -> None:
    from companion.cli import main
    from companion.harvest.schema import arrow_schema
    from companion.models.tiny_pair import ASSET_DIR

    if not (ASSET_DIR / "target" / "config.json").exists():
        pytest.skip("the embedded pair is not in this checkout")
    out = tmp_path / "paper-setting"
    assert main(["harvest", "--out", str(out), "--no-drafter", "--n-prompts", "2", "--steps", "4", "--threads", "1",
                 "--no-progress"]) == 0
    manifest = read_manifest(out)
    table = load_traces(out)
    assert manifest["config"]["drafter"] is None and manifest["config"]["drafter_dtype"] is None
    target_only = arrow_schema(list(PAPER_CRITERIA), list(WIDTHS), False, 64).names
    assert manifest["schema"] == table.column_names == target_only
    assert not any(c.startswith(("kl_", "accepted[", "covered[", "draft_")) for c in table.column_names)


# -------------------------------------------------------------------------------------------------
# Interruption and resume (a real process, killed)


def test_resume_after_sigkill_equals_uninterrupted_run(pair_dir, tmp_path) -> None:
    out = tmp_path / "killed"
    args = _cli(pair_dir, out, "--steps", "48", "--batch-size", "1", "--prompts-per-shard", "1")
    proc = subprocess.Popen(args, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shard_dir = out / "shards"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if shard_dir.is_dir() and any(p.suffix == ".parquet" for p in shard_dir.iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the harvest ended before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    written = sorted(p.name for p in shard_dir.iterdir() if p.suffix == ".parquet")
    assert 1 <= len(written) < 10
    assert read_manifest(out)["status"] == "running"
    with pytest.raises(ValueError, match="not complete"):
        load_traces(out)
    partial = load_traces(out, allow_incomplete=True)
    assert partial.num_rows == 48 * len(written)

    # A failed two-process run can leave its second process's record; the resume must not keep it.
    (out / "parts").mkdir(exist_ok=True)
    (out / "parts" / "rank1.json").write_text("{}")
    done = subprocess.run(args, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(out)
    assert manifest["status"] == "complete" and manifest["totals"]["shards"] == 10
    assert not (out / "parts").exists(), sorted(p.name for p in (out / "parts").iterdir())
    assert manifest["runs"][-1]["world_size"] == 1
    assert not list(shard_dir.glob(".*tmp*"))

    # Reference: the same harvest in this process, uninterrupted.
    target, drafter, tok = load_pair(pair_dir["target"], pair_dir["drafter"], device="cpu")
    from companion.prompts.sets import load_prompts

    ref = harvest(target, drafter, tok, load_prompts(pair_dir["prompts"]), tmp_path / "whole", n_steps=48,
                  batch_size=1, prompts_per_shard=1, progress=False)
    assert ref["config_digest"] == manifest["config_digest"]
    _assert_tables_equal(load_traces(out), load_traces(tmp_path / "whole"))


# -------------------------------------------------------------------------------------------------
# Several processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one(pair_dir, tmp_path) -> None:
    single = tmp_path / "single"
    r = subprocess.run(_cli(pair_dir, single, "--steps", "12", "--batch-size", "2"), env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    multi = tmp_path / "multi"
    accelerate = [PY, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                  "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
                  "-m", "companion"] + _cli(pair_dir, multi, "--steps", "12", "--batch-size", "2")[3:]
    r = subprocess.run(accelerate, env=_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    manifest = read_manifest(multi)
    assert manifest["status"] == "complete" and manifest["runs"][-1]["world_size"] == 2
    assert {p["rank"] for p in manifest["runs"][-1]["ranks"]} == {0, 1}
    names = sorted(p.name for p in (multi / "shards").iterdir())
    assert any(".rank1." in n for n in names) and any(".rank0." in n for n in names)
    assert not (multi / "parts").exists()
    assert manifest["config_digest"] == read_manifest(single)["config_digest"]
    _assert_tables_equal(load_traces(multi), load_traces(single))


# -------------------------------------------------------------------------------------------------
# Presets and prompts


def _chat_tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
    return tok


def test_ultrachat_selection(tmp_path) -> None:
    rows = [{"prompt_id": f"id{i}", "prompt": "word " * (i % 30), "messages": []} for i in range(200)]
    rows.append(dict(rows[5]))  # a duplicate prompt_id is skipped
    path = tmp_path / "uc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tok = _chat_tokenizer()
    chosen = ultrachat.select_ultrachat_prompts(ultrachat.ultrachat_rows(path), tok, n=20, min_tokens=64, seed=0)
    assert len(chosen) == 20 and len({p.prompt_id for p in chosen}) == 20
    assert all(p.n_tokens >= 64 and p.text.endswith("<think>\n\n</think>\n\n") for p in chosen)
    assert all(p.text.startswith("<|im_start|>user\n") for p in chosen)
    # Seeded hash order: deterministic, different for another seed, independent of row order.
    again = ultrachat.select_ultrachat_prompts(ultrachat.ultrachat_rows(path), tok, n=20, min_tokens=64, seed=0)
    assert [p.prompt_id for p in again] == [p.prompt_id for p in chosen]
    reversed_rows = ultrachat.select_ultrachat_prompts(
        [ultrachat._row(r, i) for i, r in enumerate(reversed(rows))], tok, n=20, min_tokens=64, seed=0)
    assert [p.prompt_id for p in reversed_rows] == [p.prompt_id for p in chosen]
    other = ultrachat.select_ultrachat_prompts(ultrachat.ultrachat_rows(path), tok, n=20, min_tokens=64, seed=1)
    assert [p.prompt_id for p in other] != [p.prompt_id for p in chosen]
    thinking = ultrachat.chat_prompt(tok, "hi", enable_thinking=True)
    assert "<think>" not in thinking
    # The same rows as a Parquet file (the dataset's own format).
    pq.write_table(pa.Table.from_pylist([{"prompt_id": r["prompt_id"], "prompt": r["prompt"]} for r in rows[:200]]),
                   tmp_path / "train_sft-00000-of-00001.parquet")
    from_parquet = ultrachat.select_ultrachat_prompts(ultrachat.ultrachat_rows(tmp_path), tok, n=20, min_tokens=64, seed=0)
    assert [p.prompt_id for p in from_parquet] == [p.prompt_id for p in chosen]
    with pytest.raises(ValueError, match="only"):
        ultrachat.select_ultrachat_prompts(ultrachat.ultrachat_rows(path), tok, n=500, min_tokens=64)


def test_paper_presets_and_clear_errors(monkeypatch, tmp_path) -> None:
    for name, target in (("paper-qwen3-1.7b", "Qwen/Qwen3-1.7B"), ("paper-qwen3-4b", "Qwen/Qwen3-4B")):
        p = pr.get_preset(name)
        assert (p.target, p.drafter, p.n_prompts, p.min_prompt_tokens, p.n_steps) == (target, "Qwen/Qwen3-0.6B", 500, 64, 128)
        assert p.criteria == PAPER_CRITERIA and p.enable_thinking is False and p.seed == 0
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(ultrachat.PromptsUnavailableError, match="pip install datasets"):
        next(ultrachat.ultrachat_rows(None))
    import companion.models.tiny_pair as tp

    monkeypatch.setattr(tp, "ASSET_DIR", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="Restore it from the repository"):
        pr.check_default_assets()
    with pytest.raises(ValueError, match="unknown harvest preset"):
        pr.get_preset("paper-qwen3-8b")


def test_default_preset_without_assets_fails_clearly(monkeypatch, tmp_path, capsys) -> None:
    import companion.models.tiny_pair as tp
    from companion.cli import main

    monkeypatch.setattr(tp, "ASSET_DIR", tmp_path / "no_assets")
    assert main(["harvest", "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "embedded pair" in err and "Restore it from the repository" in err
    assert not (tmp_path / "out").exists()


def test_default_preset_runs_on_the_embedded_pair(tmp_path, capsys) -> None:
    from companion.cli import main
    from companion.models.tiny_pair import ASSET_DIR

    if not (ASSET_DIR / "target" / "config.json").exists():
        pytest.skip("the embedded pair is not in this checkout")
    assert main(["harvest", "--out", str(tmp_path / "d"), "--n-prompts", "2", "--steps", "4", "--no-progress"]) == 0
    manifest = read_manifest(tmp_path / "d")
    table = load_traces(tmp_path / "d")
    # the preset's name, not its former one ("default", which README says was renamed)
    assert manifest["extra"]["preset"] == "closed-world" and manifest["config"]["drafter"] is not None
    assert table.num_rows <= 8 and "accepted[greedy]" in table.column_names
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "complete"


def test_cli_reports_errors_without_traceback(pair_dir, tmp_path) -> None:
    r = subprocess.run(_cli(pair_dir, tmp_path / "x", "--steps", "2", "--criteria", "additive:-1"), env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "companion harvest:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


# -------------------------------------------------------------------------------------------------
# The real Qwen3 shapes (random weights, two layers)


def test_qwen3_shapes_are_the_real_ones() -> None:
    from companion.harvest.shapes import QWEN3_SHAPES, qwen3_config

    expected = {  # hidden, intermediate, layers, query heads
        "Qwen3-0.6B": (1024, 3072, 28, 16), "Qwen3-1.7B": (2048, 6144, 28, 16), "Qwen3-4B": (2560, 9728, 36, 32)}
    for name, (h, i, n, q) in expected.items():
        c = qwen3_config(name)
        assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads) == (h, i, n, q)
        assert (c.vocab_size, c.num_key_value_heads, c.head_dim, c.tie_word_embeddings) == (151_936, 8, 128, True)
        assert QWEN3_SHAPES[name]["max_position_embeddings"] == 40_960
    assert qwen3_config("Qwen3-4B", 2).num_hidden_layers == 2


@pytest.mark.slow
def test_harvest_at_real_qwen3_shapes(tmp_path) -> None:
    """Qwen3-1.7B- and Qwen3-4B-shaped targets (one layer each) with a Qwen3-0.6B-shaped drafter, V = 151,936.

    Random weights give nearly flat distributions over the full vocabulary: the certificate
    engine's deep-boundary paths run on every step, at the real size.
    """
    from companion.harvest.shapes import random_qwen3

    drafter = random_qwen3("Qwen3-0.6B", 1, seed=1)
    tok = byte_tokenizer()
    for shape in ("Qwen3-1.7B", "Qwen3-4B"):
        target = random_qwen3(shape, 1, seed=0)
        seen = []
        manifest = harvest(target, drafter, tok, TEXTS[:2], tmp_path / shape, n_steps=3, batch_size=2, chunk_steps=3,
                           progress=False, hook=lambda *a: seen.append((a[2].clone(), a[4])))
        del target
        table = load_traces(tmp_path / shape)
        assert table.num_rows == 6 and manifest["status"] == "complete"
        assert manifest["config"]["target"]["parameters"] > 389_000_000 if shape == "Qwen3-4B" else True
        lp, cols = seen[0]
        assert lp.shape == (2, 3, 151_936)
        ref = certificates(lp.reshape(-1, 151_936), PAPER_CRITERIA, ("forward", "reverse"), tree_widths=WIDTHS,
                           from_logits=True)
        for spec in PAPER_CRITERIA:
            torch.testing.assert_close(cols[f"cert_fwd[{spec}]"], ref[(spec, "forward")], rtol=0, atol=0)
            torch.testing.assert_close(cols[f"cert_rev[{spec}]"], ref[(spec, "reverse")], rtol=0, atol=0)
            assert not np.any(np.asarray(table.column(f"certified_fwd[{spec}]"))
                              & ~np.asarray(table.column(f"accepted[{spec}]")))
        ids = _list_column(table, "top_ids")
        assert ids.shape == (6, 64) and np.all(ids < 151_936) and np.all(ids >= 0)


def test_readme_documents_the_current_schema() -> None:
    readme = (ROOT / "companion" / "harvest" / "README.md").read_text(encoding="utf-8")
    assert schema_markdown() in readme, "regenerate the table in companion/harvest/README.md with schema_markdown()"


def test_cli_missing_weights_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys) -> None:
    from companion.cli import main

    import huggingface_hub.constants
    import transformers.utils.hub

    # huggingface_hub and transformers read HF_HUB_OFFLINE once, at import (already done here):
    # set their flags too, as a fresh interpreter with the variable set would have them, so that
    # the test does not spend ~45 s retrying a hub this machine cannot reach.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(transformers.utils.hub, "_is_offline_mode", True)
    rc = main(["harvest", "--target", "nonexistent-org/nonexistent-model", "--no-drafter",
               "--out", str(tmp_path / "out"), "--n-prompts", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("companion harvest: ") and "huggingface-cli download" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_column_names_come_from_the_schema_templates() -> None:
    from companion.harvest.schema import column

    assert column("cert", "greedy", "forward") == "cert_fwd[greedy]"
    assert column("tree_cert", 4, "reverse") == "tree_cert_rev[4]"
    assert column("accepted", "topm:4") == "accepted[topm:4]"
    assert column("covered", 8) == "covered[8]"
    assert column("tree_certified", 2, "fwd") == "tree_certified_fwd[2]"
    names = set(column_names(["greedy"], [4], True))
    assert {column("certified", "greedy", d) for d in ("forward", "reverse")} <= names
    with pytest.raises(ValueError, match="need a divergence"):
        column("cert", "greedy")
    with pytest.raises(ValueError, match="divergence must be"):
        column("cert", "greedy", "both")


def test_a_stop_request_ends_the_harvest_as_ctrl_c_does(pair, tmp_path) -> None:
    # What the CLI does with a Ctrl-C during decoding: ask to stop, honoured after the current block.
    target, drafter, tok = pair
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3  # one check before the first shard, one after each of its 2 steps

    out = tmp_path / "stopped"
    with pytest.raises(KeyboardInterrupt):
        harvest(target, drafter, tok, TEXTS[:4], out, n_steps=2, batch_size=1, prompts_per_shard=1,
                chunk_steps=1, stop=stop, progress=False)
    manifest = read_manifest(out)
    assert manifest["status"] == "interrupted" and manifest["totals"]["shards"] == 1
    again = harvest(target, drafter, tok, TEXTS[:4], out, n_steps=2, batch_size=1, prompts_per_shard=1,
                    chunk_steps=1, progress=False)
    assert again["status"] == "complete" and again["totals"]["shards"] == 4


# -------------------------------------------------------------------------------------------------
# Shard plan: balanced by work, every prompt once


def _count_plan(token_ids: list[list[int]], per_shard: int) -> list[list[int]]:
    """The plan before it was balanced by work: length-sorted runs of ``per_shard`` prompts."""
    positions = sorted(range(len(token_ids)), key=lambda i: (len(token_ids[i]), i))
    return [positions[i:i + per_shard] for i in range(0, len(positions), per_shard)]


def _rank_work(plan: list[list[int]], token_ids: list[list[int]], n_steps: int, world: int) -> list[int]:
    """Each process's work (prompt tokens + n_steps per prompt) when shard i goes to rank i mod world."""
    from companion.harvest.core import shard_work

    work = [0] * world
    for i, shard in enumerate(plan):
        work[i % world] += sum(shard_work(len(token_ids[j]), n_steps) for j in shard)
    return work


def _check_plan(plan: list[list[int]], token_ids: list[list[int]], per_shard: int, order: str) -> None:
    from companion.harvest.core import shard_count

    flat = [i for shard in plan for i in shard]
    assert sorted(flat) == list(range(len(token_ids)))  # every prompt, once
    assert len(plan) >= shard_count(len(token_ids), per_shard)
    assert len(plan) % 2 == 0 or len(plan) in (1, len(token_ids))
    assert all(1 <= len(s) <= per_shard for s in plan)
    if order == "length":  # contiguous runs of the length order: batches pad little
        assert flat == sorted(range(len(token_ids)), key=lambda i: (len(token_ids[i]), i))
    else:
        assert flat == list(range(len(token_ids)))


@pytest.mark.parametrize("n", [36, 50, 101, 333])
@pytest.mark.parametrize("per_shard", [8, 16, 32])
@pytest.mark.parametrize("order", ["length", "given"])
def test_shard_plan_balances_two_processes_on_skewed_lengths(n: int, per_shard: int, order: str) -> None:
    from companion.harvest.core import _shard_plan

    rng = np.random.default_rng(n * 100 + per_shard)
    # log-uniform prompt lengths from 16 to 1,024 tokens: a 64-fold skew
    lengths = np.exp(rng.uniform(np.log(16), np.log(1024), n)).astype(int)
    token_ids = [[1] * int(k) for k in lengths]
    plan = _shard_plan(token_ids, order, per_shard, 128)
    _check_plan(plan, token_ids, per_shard, order)
    work = _rank_work(plan, token_ids, 128, 2)
    assert max(work) <= 1.15 * min(work), work


def test_shard_plan_edge_cases() -> None:
    from companion.harvest.core import _shard_plan, shard_count

    assert _shard_plan([], "length", 4, 10) == [] and shard_count(0, 4) == 0
    assert _shard_plan([[1, 2]], "length", 4, 10) == [[0]]
    assert _shard_plan([[1, 2], [3]], "length", 2, 10) == [[1, 0]]  # one batch holds them: one shard
    skewed = [[1] * (5 + 40 * (i % 3)) for i in range(16)]  # one batch of unequal prompts: still one shard
    assert len(_shard_plan(skewed, "length", 16, 128)) == 1
    assert shard_count(3, 8) == 1 and shard_count(3, 2) == 2 and shard_count(10, 1) == 10 and shard_count(36, 16) == 4
    one_each = _shard_plan([[1]] * 5, "given", 1, 3)
    assert one_each == [[0], [1], [2], [3], [4]]
    # one prompt far longer than the rest: it sits alone at the end, the plan stays feasible
    token_ids = [[1] * 10] * 9 + [[1] * 5000]
    plan = _shard_plan(token_ids, "length", 4, 0)
    _check_plan(plan, token_ids, 4, "length")
    assert plan[-1] == [9]


def test_shard_plan_on_the_chat_requests() -> None:
    """The chapters' harvest: the first 36 chat requests, batch 16, 128 steps, two processes.
    Counted in prompts the old plan gave one process 20 prompts and the other 16."""
    from companion.harvest.core import _shard_plan, shard_work

    path = ROOT / "companion" / "assets" / "chat_requests" / "prompts.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:36]]
    token_ids = [[1] * r["n_tokens"] for r in rows]
    for name, plan in (("old (16 prompts a shard)", _count_plan(token_ids, 16)),
                       ("new (balanced by work)", _shard_plan(token_ids, "length", 16, 128))):
        shard_w = [sum(shard_work(len(token_ids[i]), 128) for i in s) for s in plan]
        work = _rank_work(plan, token_ids, 128, 2)
        prompts = [sum(len(s) for i, s in enumerate(plan) if i % 2 == r) for r in range(2)]
        print(f"{name}: shards {[len(s) for s in plan]} prompts, work {shard_w} tokens; "
              f"process 0 {prompts[0]} prompts {work[0]} tokens, process 1 {prompts[1]} prompts {work[1]} tokens, "
              f"ratio {max(work) / min(work):.3f}")
    plan = _shard_plan(token_ids, "length", 16, 128)
    _check_plan(plan, token_ids, 16, "length")
    work = _rank_work(plan, token_ids, 128, 2)
    assert max(work) <= 1.15 * min(work), work
    old = _rank_work(_count_plan(token_ids, 16), token_ids, 128, 2)
    assert max(work) / min(work) < max(old) / min(old)


def test_weight_hashes_are_remembered_by_name_size_and_mtime(tmp_path, monkeypatch) -> None:
    """model_identity hashes a folder's weight files once; a file that changes is hashed again."""
    import os

    from companion.harvest import store

    w = tmp_path / "model.safetensors"
    w.write_bytes(b"a" * 1000)
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"c")
    store._weights_sha256(other, [other / "model.safetensors"])
    assert not (other / store._SHA_MEMO).exists(), "a folder the cache did not write keeps no memo"
    (tmp_path / "companion-conversion.json").write_text("{}")
    calls: list[Path] = []
    real = store.file_sha256
    monkeypatch.setattr(store, "file_sha256", lambda f: calls.append(f) or real(f))
    first = store._weights_sha256(tmp_path, [w])
    assert first == {"model.safetensors": real(w)} and len(calls) == 1
    assert store._weights_sha256(tmp_path, [w]) == first and len(calls) == 1, "remembered"
    w.write_bytes(b"b" * 1001)
    os.utime(w, ns=(1, 1))
    assert store._weights_sha256(tmp_path, [w]) == {"model.safetensors": real(w)} != first and len(calls) == 2


# ---------------------------------------------------------------------------------------------
# The kernel-path convention: near ties of the model's dtype count as ties.


def _rows_with_near_tie(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    z = 2.0 * torch.randn(4, 4096, generator=g)
    z[:, 0] += torch.tensor([18.0, 22.0, 26.0, 14.0])
    z[0, 0], z[0, 1] = 20.0, 19.875  # 1 bfloat16 ulp at 20: a near tie, not an exact one
    z[1, 1] = z[1, 0] - 3.0  # a clear gap
    return z.to(dtype)


def test_kernel_path_columns_count_near_ties_as_ties() -> None:
    from companion.harvest.stats import StepStatistics

    specs = ["greedy", "multiplicative:0.1", "topm:4", "additive:0.3", "typical:0.09,0.3"]
    logits = _rows_with_near_tie(torch.bfloat16)
    stats = StepStatistics(specs, [2], vocab=4096)
    t = stats.target(logits)
    for spec in specs:
        for d in ("forward", "reverse"):
            paper, path = t[column("cert", spec, d)], t[column("path_cert", spec, d)]
            assert bool((path <= paper).all()), (spec, d, path.tolist(), paper.tolist())
    assert float(t[column("path_cert", "greedy", "forward")][0]) == 0.0
    assert float(t[column("cert", "greedy", "forward")][0]) > 1e-4  # the paper's convention: not a tie
    assert float(t[column("path_cert", "greedy", "forward")][1]) == float(t[column("cert", "greedy", "forward")][1])
    # the drafter equal to the target at the near tie: certified under exact ties, not under kernel paths
    d_cols = stats.drafter(logits, logits.clone(), t)
    assert bool(d_cols[column("certified", "greedy", "forward")][0])
    assert not bool(d_cols[column("path_certified", "greedy", "forward")][0])
    for spec in specs:  # path-certified implies certified (its certificate is never larger)
        for d in ("forward", "reverse"):
            assert not bool((d_cols[column("path_certified", spec, d)] & ~d_cols[column("certified", spec, d)]).any())


def test_kernel_path_columns_equal_the_others_in_float64() -> None:
    from companion.harvest.stats import StepStatistics

    logits = _rows_with_near_tie(torch.float64)
    t = StepStatistics(["greedy", "multiplicative:0.1"], [], vocab=4096).target(logits)
    for spec in ("greedy", "multiplicative:0.1"):
        assert torch.equal(t[column("cert", spec, "forward")], t[column("path_cert", spec, "forward")])
    with pytest.raises(ValueError, match="path_dtype"):
        StepStatistics(["greedy"], [], vocab=4096, path_dtype="bf16")


def test_traces_under_kernel_paths_swap_the_columns() -> None:
    from companion.analysis.traces import Traces

    tr = Traces.from_columns({"prompt_id": ["a", "a"], "step": [0, 1], "cert_fwd[greedy]": [0.5, 0.2],
                              "path_cert_fwd[greedy]": [0.0, 0.2], "certified_fwd[greedy]": [True, False],
                              "path_certified_fwd[greedy]": [False, False], "tree_cert_fwd[2]": [0.9, 0.8]})
    assert tr.has_kernel_paths()
    kp = tr.under_kernel_paths()
    assert kp.cert("greedy").tolist() == [0.0, 0.2]
    assert kp.column("certified_fwd[greedy]").tolist() == [False, False]
    assert kp.tree_cert(2).tolist() == [0.9, 0.8] and not kp.has("path_cert_fwd[greedy]")
    old = Traces.from_columns({"prompt_id": ["a"], "step": [0], "cert_fwd[greedy]": [0.5]})
    assert not old.has_kernel_paths()
    with pytest.raises(KeyError, match="harvest them again"):
        old.under_kernel_paths()
