"""load_pair: local folders, presets, dtype/device defaults, vocabulary check, offline errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from companion.models.devices import resolve_device
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from companion.models import loading as cm
from companion.models import presets
from companion.models.loading import WeightsUnavailableError, load_pair


def _tokenizer(vocab: list[str]) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over ``vocab`` (ids in list order), enough to test vocabulary checks."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=vocab[0], eos_token=vocab[1], pad_token=vocab[2])


VOCAB = ["<unk>", "<eos>", "<pad>"] + [f"w{i}" for i in range(29)]


def _save_tiny(path: Path, vocab: list[str], hidden: int = 16, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = Qwen3Config(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                         tie_word_embeddings=True, eos_token_id=1, pad_token_id=2)
    Qwen3ForCausalLM(config).save_pretrained(path)
    _tokenizer(vocab).save_pretrained(path)
    return path


def test_local_target_only(tmp_path: Path) -> None:
    path = _save_tiny(tmp_path / "t", VOCAB)
    target, drafter, tok = load_pair(target=path)
    assert drafter is None
    assert isinstance(target, Qwen3ForCausalLM) and not target.training
    assert target.dtype == torch.float32 and target.device.type == "cpu"  # CPU auto: fp32
    assert len(tok) == len(VOCAB)
    ids = tok("w0 w1 w2", return_tensors="pt")["input_ids"]
    assert ids.tolist() == [[3, 4, 5]]
    assert target(input_ids=ids).logits.shape == (1, 3, len(VOCAB))


def test_local_pair_dtype_and_device(tmp_path: Path) -> None:
    t = _save_tiny(tmp_path / "t", VOCAB, hidden=32)
    d = _save_tiny(tmp_path / "d", VOCAB, hidden=16, seed=1)
    target, drafter, _ = load_pair(t, d, device="cpu", dtype="bfloat16")
    assert drafter is not None and not drafter.training
    assert target.dtype == drafter.dtype == torch.bfloat16
    assert target.config.hidden_size == 32 and drafter.config.hidden_size == 16


def test_auto_device_and_dtype() -> None:
    dev = resolve_device(None)
    assert dev.type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert cm.resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert cm.resolve_dtype(None, torch.device("cuda")) == torch.bfloat16
    assert cm.resolve_dtype("float16", dev) == torch.float16
    with pytest.raises(ValueError):
        cm.resolve_dtype("float17", dev)


def test_vocab_size_mismatch_raises(tmp_path: Path) -> None:
    t = _save_tiny(tmp_path / "t", VOCAB)
    d = _save_tiny(tmp_path / "d", VOCAB + ["extra"])
    with pytest.raises(ValueError, match="tokenizers differ: .* has 32 tokens"):
        load_pair(t, d)


def test_vocab_map_mismatch_raises(tmp_path: Path) -> None:
    swapped = VOCAB[:3] + [VOCAB[4], VOCAB[3]] + VOCAB[5:]  # same size, two ids exchanged
    t = _save_tiny(tmp_path / "t", VOCAB)
    d = _save_tiny(tmp_path / "d", swapped)
    with pytest.raises(ValueError, match="different ids"):
        load_pair(t, d)


def test_missing_local_folder_gives_helpful_error(tmp_path: Path) -> None:
    # A local path is never sent to the hub, nor suggested for download.
    missing = tmp_path / "no" / "such" / "model"
    with pytest.raises(WeightsUnavailableError) as info:
        load_pair(target=missing)
    assert str(info.value) == (
        f"Could not load the tokenizer '{missing}': no such folder. Pass a folder written by save_pretrained "
        "(with its config.json and tokenizer files), or a hub id such as Qwen/Qwen3-1.7B.")
    assert isinstance(info.value, OSError)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WeightsUnavailableError, match="no tokenizer.json or tokenizer_config.json in it"):
        load_pair(target=empty)
    with pytest.raises(WeightsUnavailableError, match=r"not a model folder saved with save_pretrained \(no config.json"):
        cm.load_model(empty)


@pytest.mark.parametrize("name, local", [
    ("/abs/path", True), ("./rel", True), ("../up/model", True), ("~/models/x", True), ("a/b/c", True),
    ("Qwen/Qwen3-1.7B", False), ("gpt2", False), ("models/target", False),
])
def test_local_paths_and_hub_ids(name: str, local: bool) -> None:
    assert cm.looks_like_local_path(name) is local


def test_an_existing_folder_is_local_whatever_its_name(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "models" / "target").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert cm.looks_like_local_path("models/target")


def test_drafter_false_overrides_the_presets(tmp_path: Path) -> None:
    t = _save_tiny(tmp_path / "t", VOCAB)
    d = _save_tiny(tmp_path / "d", VOCAB, seed=1)
    presets.register_preset("test-with-drafter", str(t), str(d))
    try:
        assert load_pair("test-with-drafter")[1] is not None
        assert load_pair("test-with-drafter", False)[1] is None
    finally:
        presets.PRESETS.pop("test-with-drafter", None)


def test_tokenizer_mismatch_names_the_tokenizer_given(tmp_path: Path) -> None:
    t = _save_tiny(tmp_path / "t", VOCAB)
    d = _save_tiny(tmp_path / "d", VOCAB, seed=1)
    other = tmp_path / "tok"
    _tokenizer(VOCAB + ["extra"]).save_pretrained(other)
    with pytest.raises(ValueError) as info:
        load_pair(t, d, other)
    assert str(info.value) == (f"tokenizers differ: tokenizer '{other}' has 33 tokens, target '{t}' has 32; "
                               "the target, the drafter and the tokenizer must share one vocabulary")
    bare = tmp_path / "bare"  # a target folder without a tokenizer: only the drafter's is compared
    torch.manual_seed(0)
    Qwen3ForCausalLM.from_pretrained(t).save_pretrained(bare)
    with pytest.raises(ValueError) as info:
        load_pair(bare, d, other)
    assert str(info.value).startswith(f"tokenizers differ: tokenizer '{other}' has 33 tokens, drafter '{d}' has 32")


def test_model_dtypes_only() -> None:
    with pytest.raises(ValueError, match="unknown dtype 'float8': expected one of bfloat16, float16, float32, float64"):
        cm.resolve_dtype("float8", torch.device("cpu"))
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        cm.resolve_dtype("int8", torch.device("cpu"))


def test_offline_hub_id_gives_helpful_error(tmp_path: Path) -> None:
    # HF_HUB_OFFLINE is read when huggingface_hub is imported: a fresh interpreter sees it as a user would.
    code = (
        "from companion.models.loading import load_pair, WeightsUnavailableError\n"
        "try:\n"
        "    load_pair(target='companion-tests/no-such-model-xyz', drafter='companion-tests/no-such-drafter')\n"
        "except WeightsUnavailableError as e:\n"
        "    print('RAISED', e)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("RAISED")
    assert "huggingface-cli download companion-tests/no-such-model-xyz" in res.stdout
    assert "HF_HUB_OFFLINE is set" in res.stdout


def test_default_preset_and_registration(tmp_path: Path) -> None:
    assert "default" in presets.preset_names()
    t = _save_tiny(tmp_path / "t", VOCAB)
    presets.register_preset("test-local-only", str(t))
    try:
        target, drafter, tok = load_pair("test-local-only")
        assert drafter is None and len(tok) == len(VOCAB)
        presets.register_preset("test-local-only", str(t))  # same spec again: fine
        with pytest.raises(ValueError, match="already registered"):
            presets.register_preset("test-local-only", str(t), drafter=str(t))
    finally:
        presets.PRESETS.pop("test-local-only", None)
