"""SmolLM2-135M-Instruct from the package index (the loader's own refusals are tests/test_weights.py's):
the converted model and its tokenizer, its distilled drafter, and the harvest against transformers'
own greedy generate (token for token, logits step by step)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from companion.models import presets
from companion.models.weights import ensure_converted
from companion.models.weights.distilled_drafter import drafter_dir
from companion.models.weights.fetch import file_sha256
from companion.models.loading import WeightsUnavailableError, load_pair

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -------------------------------------------------------------------------------------------------
# The real model, end to end (setup.sh converts it once; a second load is quick)


@pytest.fixture(scope="module")
def smol():
    target, drafter, tok = load_pair("smollm2", False, device="cpu", dtype="float32")
    assert drafter is None, "False asks for no drafter"
    return target, tok


def test_the_converted_model_is_smollm2_135m_instruct(smol) -> None:
    target, tok = smol
    cfg = target.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert sum(p.numel() for p in target.parameters()) == 134_515_008
    # The repaired special tokens: answers end (and batches pad) with <|im_end|>, and encoding adds nothing.
    assert tok.eos_token == "<|im_end|>" == tok.pad_token and tok.eos_token_id == 2 == target.generation_config.eos_token_id
    assert tok("Hello world").input_ids == tok("Hello world", add_special_tokens=False).input_ids
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")


def test_second_load_is_quick() -> None:
    import time

    t0 = time.perf_counter()
    folder = ensure_converted("smollm2-135m-instruct", progress=False)
    load_pair(str(folder), False, device="cpu")
    assert time.perf_counter() - t0 < 10, "the cached conversion should load in about a second (3 s goal; 10 s slack for a shared machine)"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_harvest_agrees_with_generate_token_for_token(smol, tmp_path, dtype) -> None:
    """The harvest's greedy tokens are generate's, and its per-step logits are generate's output_logits,
    in float32 and in bfloat16 (the GPU path's dtype, rehearsed on the CPU)."""
    from companion.harvest import load_traces
    from companion.harvest.core import harvest
    from companion.prompts.ultrachat import chat_prompt

    target, tok = smol
    if dtype == "bfloat16":
        target, _, tok = load_pair("smollm2", False, device="cpu", dtype="bfloat16")
    requests = ["What is the capital of France? Answer in one sentence.", "Write two lines about the sea."]
    prompts = [chat_prompt(tok, r) for r in requests]
    seen: dict[int, list[torch.Tensor]] = {}

    def hook(positions, first, lp, lq, cols):
        for b, i in enumerate(positions):
            seen.setdefault(i, []).append(lp[b].clone())

    n = 24
    harvest(target, None, tok, prompts, tmp_path / "h", n_steps=n, batch_size=1, progress=False, hook=hook,
            stop_at_eos=False, order="given")
    table = load_traces(tmp_path / "h")
    for i, text in enumerate(prompts):
        enc = tok(text, return_tensors="pt", add_special_tokens=False)
        ids = enc.input_ids
        # eos_token_id=None: generate runs all n steps past <|im_end|>, as the harvest does without stop_at_eos.
        out = target.generate(**enc, max_new_tokens=n, do_sample=False, output_logits=True, eos_token_id=None,
                              return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
        tokens = table.filter(table.column("prompt_index").to_numpy() == i).column("token").to_pylist()
        assert tokens == out.sequences[0, ids.shape[1]:].tolist(), f"prompt {i}: tokens differ from generate's"
        ours = torch.cat(seen[i])[:n].float()
        theirs = torch.cat(out.logits)[:n].float()
        # Same model, same prefix, same kernels: equal up to the last bits of a bf16 or fp32 logit.
        tol = 1e-4 if dtype == "float32" else 2e-2
        torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol,
                                   msg=lambda m: f"prompt {i}: per-step logits differ from output_logits: {m}")


def test_preset_harvest_cli_refuses_a_prompt_longer_than_the_context(tmp_path) -> None:
    long_prompt = tmp_path / "long.jsonl"
    long_prompt.write_text(json.dumps({"text": "word " * 9000}) + "\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-m", "companion", "harvest", "--preset", "smollm2", "--prompts",
                          str(long_prompt), "--out", str(tmp_path / "out"), "--no-progress", "--threads", "1"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 2, res.stderr
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "8192 positions" in lines[0], res.stderr


def test_the_preset_brings_the_committed_drafter() -> None:
    """The drafter (companion build-drafter) loads with the target's tokenizer, its vocabulary checked by sha256."""
    from companion.assets import SMOLLM2_DRAFTER_DIR
    from companion.models.loading import vocabulary_sha256

    target, drafter, tok = load_pair("smollm2", device="cpu")
    manifest = json.loads((SMOLLM2_DRAFTER_DIR / "manifest.json").read_text())
    assert drafter is not None and drafter.config.vocab_size == target.config.vocab_size
    assert drafter.own_parameters() == manifest["drafter"]["params"]
    # Its embedding is the target's (not stored with the drafter), in the drafter's saved dtype.
    emb = target.get_input_embeddings().weight
    assert drafter.model.embed_tokens.weight.numel() == manifest["drafter"]["shared_embedding_params"] == emb.numel()
    assert torch.equal(drafter.model.embed_tokens.weight,
                       emb.to(getattr(torch, manifest["recipe"]["save_dtype"])).to(drafter.dtype))
    assert vocabulary_sha256(tok) == manifest["vocabulary_sha256"]
    assert sum(f.stat().st_size for f in SMOLLM2_DRAFTER_DIR.iterdir()) <= 25_000_000, "assets at most 25 MB"


def test_a_drafter_of_another_vocabulary_is_refused(monkeypatch, tmp_path) -> None:
    from companion.assets import SMOLLM2_DRAFTER_DIR

    fake = tmp_path / "smollm2_drafter"
    fake.mkdir()
    manifest = json.loads((SMOLLM2_DRAFTER_DIR / "manifest.json").read_text())
    manifest["vocabulary_sha256"] = "0" * 64
    (fake / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(presets, "ASSETS_DIR", tmp_path)
    with pytest.raises(WeightsUnavailableError, match="trained on another vocabulary"):
        drafter_dir(fake, ensure_converted("smollm2-135m-instruct", progress=False), "1" * 64, root=tmp_path / "cache")
    with pytest.raises(WeightsUnavailableError, match="trained on another vocabulary"):
        load_pair("smollm2", device="cpu")
    # The target alone never reads the drafter's files.
    target, none, _ = load_pair("smollm2", False, device="cpu")
    assert none is None and target.config.num_hidden_layers == 30


def test_a_drafter_asset_with_its_own_embedding_is_refused(monkeypatch, tmp_path) -> None:
    """The committed drafter shares the target's embedding; an asset that brings one is not what was built."""
    from safetensors.torch import save_file

    fake = tmp_path / "smollm2_drafter"
    fake.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2, dtype=torch.bfloat16),
               "model.norm.weight": torch.ones(2, dtype=torch.bfloat16)}, str(fake / "model.safetensors"))
    manifest = {"vocabulary_sha256": "1" * 64,
                "files_sha256": {"model.safetensors": file_sha256(fake / "model.safetensors")}}
    (fake / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(presets, "ASSETS_DIR", tmp_path)
    with pytest.raises(WeightsUnavailableError, match="holds its own model.embed_tokens.weight"):
        drafter_dir(fake, ensure_converted("smollm2-135m-instruct", progress=False), "1" * 64, root=tmp_path / "cache")
    left = [f.name for f in (tmp_path / "cache").iterdir() if "drafter" in f.name and not f.name.endswith(".lock")]
    assert left == [], f"nothing half-assembled is left in the cache, found {left}"


def test_in_float32_assisted_generation_follows_the_harvests_rounds_exactly(tmp_path) -> None:
    """In float32 every kernel path rounds alike to the bits that decide a token: transformers' assisted
    generation (constant k = 4) makes exactly the rounds the harvest predicts (companion.speculative.harvest_rounds),
    which chapter 8 asserts in float32 and checks up to near ties in bfloat16."""
    from companion.harvest import load_traces
    from companion.harvest.core import harvest
    from companion.prompts.sets import load_prompts
    from companion.speculative.harvest_rounds import compare_runs, harvest_rows_by_prompt
    from companion.speculative.hf import hf_assisted_generate

    target, drafter, tok = load_pair("smollm2", device="cpu", dtype="float32")
    prompts = [p.text for p in load_prompts("chat-requests")[:3]]
    n = 24
    harvest(target, drafter, tok, prompts, tmp_path / "h", n_steps=n, batch_size=3, progress=False, order="given")
    rows = harvest_rows_by_prompt(load_traces(tmp_path / "h"), range(len(prompts)))
    runs = []
    for text in prompts:
        ids = tok(text, add_special_tokens=False).input_ids
        r = hf_assisted_generate(target, drafter, ids, policy="constant:4", max_new_tokens=n)
        runs.append((r.tokens.tolist(), r.accepted))
    res = compare_runs(rows, runs, k=4, n=n, dtype="float32")
    assert res.identical == res.prompts == 3, res.details
    assert res.rounds > len(prompts), "several rounds a prompt, so the rounds are compared, not only the tokens"
