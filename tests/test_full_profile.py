"""The committed full profile: its manifest, its rows, and agreement with steps recomputed here.

The profile is 500 prompts x up to 128 steps of Qwen2.5-Coder-1.5B-Instruct (an hour on two
cores, never run by the test suite); these tests read the committed file and recompute the first
steps of two of its prompts (one of each family: the default build's first prompts), comparing
them with :func:`companion.harvest.full_profile.compare_steps` (its docstring justifies the
tolerances). Measured here: with 1 and 2 threads, and with oneDNN and ATen held to AVX2
(`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`, as on a CPU without bf16 instructions), the
recomputed steps' top logits were within 1 and 2 ulps of the committed ones, and no tokens parted.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from companion.harvest import full_profile as fp
from companion.harvest.ties import ulp


@pytest.fixture(scope="module")
def committed() -> tuple[pa.Table, dict]:
    return fp.load()


def test_the_manifest_says_how_the_data_were_made(committed) -> None:
    table, m = committed
    for key in ("command", "harvest_command", "code_commit", "prompt_set", "weights_sha256", "converted_from",
                "dtype", "batch_size", "threads", "cpu", "versions", "harvested", "wall_s", "data_sha256",
                "non_embedding_parameters"):
        assert m.get(key) not in (None, "", [], {}), f"the manifest lacks {key}"
    assert m["command"] == fp.COMMAND and m["harvest_command"].startswith("companion harvest ")
    assert m["prompt_set"]["name"] == f"{fp.PROFILE.prompts}[:{fp.PROFILE.n_prompts}]"
    assert m["prompt_set"]["n_prompts"] == fp.PROFILE.n_prompts == 500
    assert (m["dtype"], m["batch_size"], m["threads"], m["n_steps"]) == ("bfloat16", fp.PROFILE.batch_size,
                                                                         fp.PROFILE.threads, fp.PROFILE.n_steps)
    assert m["converted_from"]["conversion_version"] >= 1 and len(m["converted_from"]["gguf_sha256"]) == 64
    assert m["rows"] == table.num_rows and m["columns"] == table.column_names
    assert (fp.FULL_PROFILE_DIR / m["data_file"]).stat().st_size == m["data_bytes"] <= 50_000_000


def test_every_answer_runs_from_step_0_and_ends_at_its_end_token_or_the_step_budget(committed) -> None:
    table, m = committed
    ids = table.column("prompt_id").to_pylist()
    step = np.asarray(table.column("step"))
    token = np.asarray(table.column("token"))
    starts = [i for i in range(len(ids)) if i == 0 or ids[i] != ids[i - 1]]
    assert len(starts) == len(set(ids)) == 500, "each prompt's rows once and contiguous"
    ends = starts[1:] + [len(ids)]
    eos = {151643, 151645}  # Qwen2.5's <|endoftext|> and <|im_end|>
    for a, b in zip(starts, ends):
        assert np.array_equal(step[a:b], np.arange(b - a)), ids[a]
        assert b - a == m["n_steps"] or int(token[b - 1]) in eos, f"{ids[a]} stops early at no end token"
        assert not any(int(t) in eos for t in token[a:b - 1]), f"{ids[a]} runs past an end token"
    assert 55_000 <= table.num_rows <= 64_000, "about the paper's 63,000 steps"
    fams = {i.split("-", 1)[0] for i in ids}
    assert fams == {"chat", "stdlib"}


def test_the_certificates_keep_the_theorys_orderings(committed) -> None:
    """Relaxed certificates are never below strict greedy's; trees grow with m up to log(m + 1)."""
    table, _ = committed
    g = np.asarray(table.column("cert_fwd[greedy]"))
    for c in ("additive:0.3", "multiplicative:0.1", "typical:0.09,0.3"):
        assert np.all(np.asarray(table.column(f"cert_fwd[{c}]")) >= g - 1e-9), c
    prev = np.asarray(table.column("tree_cert_fwd[1]"))
    assert np.allclose(prev, g, rtol=0, atol=1e-9)
    for m in (2, 4, 8):
        cur = np.asarray(table.column(f"tree_cert_fwd[{m}]"))
        assert np.all(cur >= prev - 1e-9) and np.all(cur <= np.log(m + 1) + 1e-9), m
        prev = cur


def _synthetic(z: list[float], tokens: list[int], gap: float = 1.0) -> pa.Table:
    n = len(z)
    return pa.table({"prompt_id": ["p"] * n, "step": list(range(n)), "token": tokens,
                     "p_top1": [0.5] * n, "logit_top1": z, "logit_gap": [gap] * n})


def test_compare_steps_stops_at_a_near_tie_and_names_what_differs() -> None:
    u = float(ulp(20.0, "bfloat16"))
    a = _synthetic([20.0, 20.0, 20.0], [1, 2, 3])
    same = fp.compare_steps(a, _synthetic([20.0 + 4 * u, 20.0, 20.0], [1, 2, 3]))
    assert same.failures == () and same.steps == 3 and same.max_logit_ulps == 4
    off = fp.compare_steps(a, _synthetic([20.0 + 5 * u, 20.0, 20.0], [1, 2, 3]))
    assert len(off.failures) == 1 and "differ by 5 ulps (> 4)" in off.failures[0]
    other_token = fp.compare_steps(a, _synthetic([20.0, 20.0, 20.0], [1, 9, 3]))
    assert other_token.failures == ("p step 1: tokens 2 and 9 differ at no near tie",)
    tie = pa.table({**{k: a.column(k) for k in a.column_names if k != "logit_gap"}, "logit_gap": [1.0, u, 1.0]})
    at_tie = fp.compare_steps(tie, _synthetic([20.0, 20.0, 20.0], [1, 9, 7]))
    assert at_tie.failures == () and at_tie.stopped_at_near_tie == 1 and at_tie.steps == 2
    same_at_tie = fp.compare_steps(tie, _synthetic([20.0, 20.0, 20.0], [1, 2, 3]))  # a near tie both runs broke alike
    assert same_at_tie.failures == () and same_at_tie.stopped_at_near_tie == 0 and same_at_tie.steps == 3


def test_steps_recomputed_here_agree_with_the_committed_rows(committed, tmp_path) -> None:
    """The default build's first two prompts (a chat request, a standard-library request), 32 steps,
    recomputed by the harvest on this machine, against the committed rows."""
    from companion.prompts.families import retemplated
    from companion.harvest import load_traces
    from companion.harvest.core import harvest
    from companion.harvest.plan import plan_harvest
    from companion.models.loading import load_pair
    from companion.prompts.sets import prompt_set_digest
    from companion.models.weights import converted_dir, source
    from companion.models.weights.convert import cache_is_current

    name = "qwen2.5-coder-1.5b-instruct"
    if not cache_is_current(converted_dir(source(name)), source(name)):
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not converted in the cache: scripts/setup.sh should have fetched it")
        pytest.skip(f"{name} is not converted here: run `companion fetch-weights`")
    table, m = committed
    plan = plan_harvest(fp.PROFILE.preset, no_drafter=True, prompts=fp.PROFILE.prompts, n_prompts=fp.PROFILE.n_prompts)
    # bfloat16 as committed, also on a CPU without bf16 instructions (where the registry would pick float32)
    target, _, tok = load_pair(plan.target, False, plan.tokenizer, device="cpu", dtype="bfloat16")
    prompts = retemplated(plan.prompts, tok)
    assert prompt_set_digest(prompts) == m["prompt_set"]["sha256"], "the committed profile is of another prompt set"
    harvest(target, None, tok, prompts[:2], tmp_path / "h", n_steps=32, batch_size=2, progress=False)
    mine = load_traces(tmp_path / "h")
    result = fp.compare_steps(table, mine)
    assert result.prompts == 2 and result.steps >= 32, result  # tokens part only at near ties, if at all
    assert not result.failures, result.failures


def test_code_commit_leaves_out_the_folder_being_written(tmp_path) -> None:
    from companion.harvest import full_profile as fp_mod

    root = Path(fp_mod.__file__).resolve().parents[2]
    probe = root / "companion" / "assets" / "full_profile" / "_probe_uncommitted.txt"
    probe.write_text("x")
    try:
        with_out = fp_mod._code_commit(outputs=probe.parent)
        without = fp_mod._code_commit()
    finally:
        probe.unlink()
    if without.startswith("unknown"):
        pytest.skip("not a git checkout")
    assert "_probe_uncommitted.txt" not in with_out
    assert "companion/assets/full_profile/" in without
