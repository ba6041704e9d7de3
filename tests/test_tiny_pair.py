"""The closed-world pair, frozen: its corpus split, its committed assets, and ``pair-report``."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import Qwen3ForCausalLM

from companion.cli import main as cli_main
from companion.models.loading import load_pair
from companion.models.tiny_pair import ASSET_DIR
from companion.models.tiny_pair import corpus as corpus_mod
from companion.models.tiny_pair.pair_folder import sha256_file


# ---------------------------------------------------------------- corpus

def test_corpus_selection_is_sorted_and_excludes_tests_and_third_party() -> None:
    rels = corpus_mod.list_stdlib_files()
    assert len(rels) > 200
    assert rels == sorted(rels)
    assert all(r.endswith(".py") for r in rels)
    for r in rels:
        parts = r.split("/")
        assert parts[0] not in corpus_mod.EXCLUDED_TOP_LEVEL
        assert "test" not in parts[:-1] and "tests" not in parts[:-1]
    assert "os.py" in rels and "json/decoder.py" in rels


def test_split_is_by_path_hash_and_both_sides_nonempty() -> None:
    rels = corpus_mod.list_stdlib_files()
    held = [r for r in rels if corpus_mod.is_held_out(r)]
    assert 0.01 < len(held) / len(rels) < 0.12
    # deterministic and path-only: the same answer twice, independent of content
    assert held == [r for r in rels if corpus_mod.is_held_out(r)]
    files = corpus_mod.load_corpus(max_files=16)
    train, held_files = corpus_mod.split_corpus(files)
    assert train and held_files and len(files) == 16
    assert all(f.held_out for f in held_files) and not any(f.held_out for f in train)


def test_corpus_digest_depends_on_content_and_order() -> None:
    a = corpus_mod.SourceFile("a.py", "x = 1\n")
    b = corpus_mod.SourceFile("b.py", "y = 2\n")
    d = corpus_mod.corpus_digest([a, b])
    assert d == corpus_mod.corpus_digest([a, b])
    assert d != corpus_mod.corpus_digest([b, a])
    assert d != corpus_mod.corpus_digest([a, corpus_mod.SourceFile("b.py", "y = 3\n")])
    # length prefixes: moving a character across the path/text boundary changes the digest
    assert corpus_mod.corpus_digest([corpus_mod.SourceFile("ab", "c")]) != \
        corpus_mod.corpus_digest([corpus_mod.SourceFile("a", "bc")])


# ---------------------------------------------------------------- committed assets

@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((ASSET_DIR / "manifest.json").read_text())


def test_committed_files_match_manifest(manifest: dict) -> None:
    hashes = manifest["files_sha256"]
    for sub in ("tokenizer", "target", "drafter"):
        assert any(k.startswith(sub + "/") for k in hashes)
    assert "prompts.jsonl" in hashes and hashes["prompts.jsonl"] == manifest["prompts"]["sha256"]
    for rel, h in hashes.items():
        assert sha256_file(ASSET_DIR / rel) == h, rel
    assert (ASSET_DIR / "target" / "model.safetensors").stat().st_size <= 25 * 1000 * 1000


def test_committed_figures(manifest: dict) -> None:
    f = manifest["figures"]
    # held-out answers (the tokens the loss was on): the target beats its 10x smaller drafter, which agrees
    assert f["target_loss"] < f["drafter_loss"] - 0.1
    assert f["held_out"]["agreement_top1"] >= 0.7
    assert f["held_out"]["overlap"] >= 0.8
    models = manifest["models"]
    assert 4_000_000 <= models["target"]["params"] <= 6_000_000
    assert 7 <= models["target"]["params"] / models["drafter"]["params"] <= 14
    h = f["assisted"]  # transformers' assisted generation: drafts pay off on this pair
    assert h["num_assistant_tokens"] == 4 and h["accepted_per_round"] >= 1.5


def test_committed_pair_is_the_chat_recipe_in_the_chat_regime(manifest: dict) -> None:
    """The embedded target is in a chat LLM's regime on its own greedy answers (issue 14's targets)."""
    assert manifest["config"]["task_set"] == "closed" and manifest["corpus"]["chat_task_set"] == "closed"
    r = manifest["figures"]["regime"]
    assert r["n_prompts"] == 64 and r["max_steps"] == 128
    assert r["top1_median"] >= 0.85 and r["top1_mean"] >= 0.70
    assert r["greedy_certificate_median"] >= 0.30
    assert r["eos_rate"] >= 0.5
    assert r["drafter_greedy_acceptance"] >= 0.75


def test_how_to_read_describes_the_committed_recipe(manifest: dict) -> None:
    """The recipe's numbers the reading guide states are the committed manifest's."""
    text = (Path(__file__).resolve().parents[1] / "book" / "how_to_read.md").read_text()
    share = manifest["config"]["natural_share"]
    assert (f"makes up {share * 100:.0f} % of the training windows" in text) == (share > 0), share
    assert f"{manifest['models']['vocab_size']:,}-token" in text
    module = {"closed": "closed_tasks", "mixed": "chat_corpus"}[manifest["config"]["task_set"]]
    assert f"(`companion/models/tiny_pair/{module}.py`)" in text
    assert f"{manifest['models']['target']['params'] / 1e6:.0f}M-parameter" in text
    assert f"{manifest['models']['drafter']['params'] / 1e6:.1f}M-parameter" in text


def test_default_pair_loads_with_qwen3_code_path() -> None:
    from companion.models.tiny_pair import chat_corpus as chat

    target, drafter, tok = load_pair("default")
    assert isinstance(target, Qwen3ForCausalLM) and isinstance(drafter, Qwen3ForCausalLM)
    assert not target.training and not drafter.training
    assert target.dtype == torch.float32 and target.device.type == "cpu"
    assert len(tok) == target.config.vocab_size == drafter.config.vocab_size
    # A request written for this test in the corpus's style; the pair is scored on the answer only,
    # as it was trained (answer-only loss).
    question = "Could you tell me which city is the capital of Peru?"
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == chat.user_turn(question)
    ids = tok(chat.conversation(question, "The capital of Peru is Lima."), return_tensors="pt")["input_ids"]
    n = len(tok(prompt)["input_ids"])
    with torch.no_grad():
        lp = target(input_ids=ids).logits[0, n - 1:-1].log_softmax(-1)
        lq = drafter(input_ids=ids).logits[0, n - 1:-1].log_softmax(-1)
    nll = -lp.gather(-1, ids[0, n:, None]).mean()
    assert torch.isfinite(lp).all() and torch.isfinite(lq).all()
    # untrained: ~log(4096) = 8.3 nats a token; the committed target knows how this answer goes
    assert nll < 1.0, f"answer NLL {nll:.3f} nats/token"
    assert (lp.argmax(-1) == lq.argmax(-1)).float().mean() >= 0.8  # the drafter mostly agrees


# ---------------------------------------------------------------- frozen, and how to check it

def test_the_assets_say_they_are_frozen_and_how_they_were_made(manifest: dict) -> None:
    readme = (ASSET_DIR / "README.md").read_text(encoding="utf-8")
    assert "**Frozen.**" in readme and "companion retrain --out companion/assets/default_pair" in readme
    assert "companion pair-report" in readme
    import companion.models.tiny_pair as tp

    assert "frozen" in (tp.__doc__ or "") and "README.md" in (tp.__doc__ or "")
    # the history it quotes is this build's: the recipe's numbers are the manifest's
    assert f"{manifest['config']['target_stage']['steps']} x {manifest['config']['target_stage']['batch_size']} x " \
           f"{manifest['config']['seq_len']}" in readme
    assert f"{manifest['config']['natural_share'] * 100:.0f} % share" in readme


def test_pair_report_checks_the_committed_pair(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["pair-report", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fresh"]["files_ok"] and report["fresh"]["files_bad"] == []
    assert 0 < report["fresh"]["load_seconds"] < 60
    assert report["manifest_figures"]["assisted"]["accepted_per_round"] >= 1.5


def test_pair_report_names_a_damaged_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "pair"
    shutil.copytree(ASSET_DIR, copy)
    (copy / "drafter" / "config.json").write_text("{}")
    assert cli_main(["pair-report", "--pair", str(copy)]) == 1  # nothing is loaded from a damaged pair
    out = capsys.readouterr().out
    assert "MISMATCH: drafter/config.json" in out and "load_pair" not in out
    assert "training target: 2,000 steps" in out
