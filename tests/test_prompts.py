"""The default prompt set and the prompt-file format."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from companion.prompts import Prompt, dumps_prompts, load_prompts, prompt_set_digest
from companion.tiny_pair import ASSET_DIR
from companion.tiny_pair.corpus import is_held_out


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    return load_prompts("default")


def test_default_prompts_shape(prompts: list[Prompt]) -> None:
    assert len(prompts) >= 200
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    assert len({p.text for p in prompts}) == len(prompts)
    assert all(p.n_tokens >= 64 for p in prompts)
    assert all(p.text.isascii() and "\t" not in p.text and not p.text.endswith("\n") for p in prompts)
    assert len({p.source for p in prompts}) >= 10  # spread over many held-out files


def test_default_prompts_are_held_out_and_token_counts_are_true(prompts: list[Prompt]) -> None:
    tok = AutoTokenizer.from_pretrained(ASSET_DIR / "tokenizer")
    assert all(is_held_out(p.source) for p in prompts)
    for p in prompts:
        assert len(tok(p.text, add_special_tokens=False)["input_ids"]) == p.n_tokens, p.prompt_id


def test_digest_is_the_file_sha256_and_in_manifest(prompts: list[Prompt]) -> None:
    raw = (ASSET_DIR / "prompts.jsonl").read_bytes()
    digest = prompt_set_digest(prompts)
    assert digest == hashlib.sha256(raw).hexdigest()
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
    assert manifest["prompts"]["sha256"] == digest and manifest["prompts"]["count"] == len(prompts)


def test_round_trip_and_errors(tmp_path: Path) -> None:
    ps = [Prompt("a", "x = 1\ny = 'caf\u00e9'", 5, "m.py", 3), Prompt("b", "z", 1, "n.py")]
    f = tmp_path / "p.jsonl"
    f.write_text(dumps_prompts(ps), encoding="utf-8")
    assert load_prompts(f) == ps
    assert prompt_set_digest(ps) != prompt_set_digest(ps[::-1])
    f.write_text(dumps_prompts([ps[0], ps[0]]), encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate"):
        load_prompts(f)
    f.write_text('{"prompt_id": "a"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="not a prompt record"):
        load_prompts(f)
    with pytest.raises(FileNotFoundError, match="not a preset"):
        load_prompts("no-such-set")
