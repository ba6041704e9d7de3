"""The embedded pair's recipe (corpus, tokenizer, shrunk retrain) and the committed assets."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from companion.cli import main as cli_main
from companion.models import load_pair
from companion.tiny_pair import ASSET_DIR
from companion.tiny_pair import corpus as corpus_mod
from companion.tiny_pair import train as train_mod
from companion.tiny_pair.config import apply_overrides, default_config, shrunk_config
from companion.tiny_pair.tokenizer import DOC_SEPARATOR, EOS_TOKEN, PAD_TOKEN, train_bpe


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


# ---------------------------------------------------------------- tokenizer

def test_bpe_tokenizer_round_trips_saves_and_is_deterministic(tmp_path: Path) -> None:
    texts = [f.text for f in corpus_mod.load_corpus(max_files=8)]
    tok = train_bpe(texts, 400)
    again = train_bpe(texts, 400)
    assert tok.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()
    assert len(tok) == 400
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.eos_token == EOS_TOKEN == "<|im_end|>" and loaded.pad_token == PAD_TOKEN
    assert loaded.eos_token_id != loaded.pad_token_id
    assert loaded.chat_template == tok.chat_template
    for special in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", DOC_SEPARATOR):
        assert loaded.convert_ids_to_tokens(loaded(special, add_special_tokens=False)["input_ids"]) == [special]
    s = "def f(x):\n\treturn x  # caf\u00e9 \u2713 \U0001f600\n"
    ids = loaded(s, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == s  # byte-level: nothing is unknown, nothing rewritten
    assert ids == tok(s, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------- config

def test_config_overrides_and_round_trip() -> None:
    cfg = apply_overrides(default_config(), {"target_stage.steps": "7", "seed": "3", "max_files": "none"})
    assert cfg.target_stage.steps == 7 and cfg.seed == 3 and cfg.max_files is None
    assert cfg.drafter_stage == default_config().drafter_stage
    assert type(cfg).from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(KeyError):
        apply_overrides(cfg, {"target_stage.nope": "1"})


# ---------------------------------------------------------------- shrunk retrain

@pytest.fixture(scope="module")
def two_builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same shrunk config built twice: once through the CLI, once through build_pair."""
    root = tmp_path_factory.mktemp("retrain")
    a, b = root / "a", root / "b"
    rc = cli_main(["retrain", "--shrink", "--out", str(a), "--no-progress", "--no-compare"])
    assert rc == 0
    train_mod.build_pair(shrunk_config(), b, progress=False, log=lambda *_: None)
    return a, b


def test_shrunk_retrain_loss_falls(two_builds: tuple[Path, Path]) -> None:
    m = json.loads((two_builds[0] / "manifest.json").read_text())
    t, d = m["training"]["target"], m["training"]["drafter"]
    assert t["steps"] == shrunk_config().target_stage.steps
    assert t["last_loss_mean"] < t["first_loss_mean"] - 0.5
    assert d["last_loss_mean"] < 0.5 * d["first_loss_mean"]  # distillation KL shrinks
    assert m["figures"]["target_loss"] < m["figures"]["drafter_loss"] + 0.5
    assert m["figures"]["eval_tokens"] > 1000


def test_same_seed_gives_identical_files_and_outputs(two_builds: tuple[Path, Path]) -> None:
    a, b = two_builds
    ma = json.loads((a / "manifest.json").read_text())
    mb = json.loads((b / "manifest.json").read_text())
    assert ma["files_sha256"] == mb["files_sha256"]
    assert ma["figures"] == mb["figures"]
    ids = torch.arange(2, 40).unsqueeze(0)
    ta, da, _ = load_pair(a / "target", a / "drafter", device="cpu")
    tb, db, _ = load_pair(b / "target", b / "drafter", device="cpu")
    assert torch.equal(ta(input_ids=ids).logits, tb(input_ids=ids).logits)
    assert torch.equal(da(input_ids=ids).logits, db(input_ids=ids).logits)
    assert not torch.equal(ta(input_ids=ids).logits, da(input_ids=ids).logits)


def test_seed_reaches_the_chat_corpus_and_the_weights(tmp_path: Path, two_builds: tuple[Path, Path]) -> None:
    m1 = train_mod.build_pair(apply_overrides(shrunk_config(), {"seed": "1"}), tmp_path / "s1",
                              progress=False, log=lambda *_: None).manifest
    m0 = json.loads((two_builds[0] / "manifest.json").read_text())
    assert m1["seed"] == 1
    assert m1["corpus"]["digest_sha256"] == m0["corpus"]["digest_sha256"]  # same stdlib files
    assert m1["corpus"]["chat_digest_sha256"] != m0["corpus"]["chat_digest_sha256"]  # other conversations
    assert m1["files_sha256"]["target/model.safetensors"] != m0["files_sha256"]["target/model.safetensors"]
    assert m1["files_sha256"]["drafter/model.safetensors"] != m0["files_sha256"]["drafter/model.safetensors"]


def test_reused_target_gives_the_same_build(tmp_path: Path, two_builds: tuple[Path, Path]) -> None:
    a = two_builds[0]
    m = train_mod.build_pair(shrunk_config(), tmp_path / "r", progress=False, log=lambda *_: None,
                             reuse_target=a).manifest
    assert m["files_sha256"] == json.loads((a / "manifest.json").read_text())["files_sha256"]
    assert m["training"]["target"]["reused"] is True
    with pytest.raises(ValueError, match="cannot reuse the target.*target_stage"):
        train_mod.build_pair(apply_overrides(shrunk_config(), {"target_stage.lr": "0.02"}), tmp_path / "x",
                             progress=False, log=lambda *_: None, reuse_target=a)
    assert not (tmp_path / "x").exists()


def test_manifest_records_everything(two_builds: tuple[Path, Path]) -> None:
    a = two_builds[0]
    m = json.loads((a / "manifest.json").read_text())
    for key in ("python", "torch", "transformers", "tokenizers"):
        assert m["versions"][key]
    assert m["seed"] == 0 and m["config"]["vocab_size"] == shrunk_config().vocab_size
    files = corpus_mod.load_corpus(max_files=shrunk_config().max_files)
    assert m["corpus"]["digest_sha256"] == corpus_mod.corpus_digest(files)
    assert m["corpus"]["files"] == [f.relpath for f in files]
    on_disk = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(m["files_sha256"]) == on_disk
    assert all(train_mod.sha256_file(a / rel) == h for rel, h in m["files_sha256"].items())
    cfg = json.loads((a / "target" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["dtype"] == "float16"


def test_pair_report_cli_on_shrunk_build(two_builds: tuple[Path, Path], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "pair"
    shutil.copytree(two_builds[0], a)  # this test corrupts a file: keep the shared build intact
    assert cli_main(["pair-report", "--pair", str(a), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fresh"]["files_ok"] is True
    # recomputed with the saved weights: equal to what the build recorded (same threads, same corpus)
    assert out["fresh"]["figures"]["target_loss"] == pytest.approx(out["manifest_figures"]["target_loss"], abs=1e-4)
    assert out["fresh"]["speed"]["target_greedy_tokens_per_s"] > 0
    # a corrupted file is reported and turns the exit code non-zero
    (a / "prompts.jsonl").write_text((a / "prompts.jsonl").read_text() + "\n")
    assert cli_main(["pair-report", "--pair", str(a), "--no-recompute", "--no-speed"]) == 1
    text = capsys.readouterr().out
    assert "MISMATCH: prompts.jsonl" in text
    assert "strict-greedy certificate: median (nats)" in text and "accepted drafts per round" in text


def test_shrunk_build_is_a_chat_pair(two_builds: tuple[Path, Path]) -> None:
    a = two_builds[0]
    m = json.loads((a / "manifest.json").read_text())
    target, drafter, tok = load_pair(a / "target", a / "drafter", device="cpu")
    stop = target.generation_config.eos_token_id
    assert sorted(stop) == sorted([tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids(DOC_SEPARATOR)])
    from companion.prompts import load_prompts

    prompts = load_prompts(a / "prompts.jsonl")
    assert len(prompts) == shrunk_config().n_prompts
    for p in prompts:
        assert p.text.startswith("<|im_start|>user\n") and p.text.endswith("</think>\n\n")
        question = p.text[len("<|im_start|>user\n"):p.text.index("<|im_end|>")]
        assert tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                       add_generation_prompt=True) == p.text
    r = m["figures"]["regime"]
    assert r["n_prompts"] == shrunk_config().regime_prompts
    assert 0 < r["top1_median"] <= 1 and 0 <= r["eos_rate"] <= 1 and r["greedy_certificate_median"] >= 0
    assert r["n_steps"] <= r["n_prompts"] * r["max_steps"]
    h = m["figures"]["assisted"]  # transformers' assisted generation, constant drafts per round
    k = shrunk_config().assisted_num_tokens
    assert h["num_assistant_tokens"] == k and h["n_prompts"] == r["n_prompts"]
    assert 0 <= h["accepted_per_round"] <= k
    assert h["tokens_per_round"] == pytest.approx(h["accepted_per_round"] + 1, abs=1e-4)
    # The same rounds from the companion's own speculative decoder (an independent implementation).
    from companion.speculative import generate

    runs = [generate(target, drafter, tok(p.text, add_special_tokens=False)["input_ids"], policy=f"constant:{k}",
                     max_new_tokens=r["max_steps"], eos_token_id=stop) for p in prompts[: r["n_prompts"]]]
    assert sum(x.rounds for x in runs) == h["rounds"]
    assert sum(len(x.tokens) for x in runs) == h["new_tokens"]


def test_shrunk_closed_build_reports_its_own_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A build on the "closed" task set: its corpus, prompts and per-task table are that set's, and
    ``pair-report`` regenerates the same requests (and table) from the manifest's config."""
    from companion.prompts import load_prompts
    from companion.tiny_pair.closed_tasks import CLOSED_TASKS

    out = tmp_path / "closed"
    rc = cli_main(["retrain", "--shrink", "--out", str(out), "--no-progress", "--no-compare",
                   "--set", "task_set=closed", "--set", "prompt_min_tokens=8"])
    assert rc == 0
    capsys.readouterr()
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["task_set"] == "closed" and m["corpus"]["chat_task_set"] == "closed"
    assert set(m["corpus"]["chat_tasks"]) == set(CLOSED_TASKS)
    assert {p.source.removeprefix("chat:") for p in load_prompts(out / "prompts.jsonl")} <= set(CLOSED_TASKS)
    tasks = m["figures"]["tasks"]
    assert set(tasks) - {"all"} <= set(CLOSED_TASKS) and tasks["all"]["n"] == shrunk_config().regime_prompts
    assert cli_main(["pair-report", "--pair", str(out), "--json", "--no-speed"]) == 0
    fresh = json.loads(capsys.readouterr().out)["fresh"]["tasks"]
    assert fresh.keys() == tasks.keys()
    for task in tasks:
        assert fresh[task]["exact_match"] == tasks[task]["exact_match"]
        assert fresh[task]["top1_p5"] == pytest.approx(tasks[task]["top1_p5"], abs=1e-4)
    # which held-out requests the build trained on: checked against the training conversations' text
    from companion.tiny_pair import chat_corpus as chat
    from companion.tiny_pair.tasks_report import pair_task_table

    answers: list[dict] = []
    pair_task_table(out, answers=answers)
    cfg = shrunk_config()
    training_text = "\n".join(chat.conversations(chat.make_material(corpus_mod.split_corpus(
        corpus_mod.load_corpus(max_files=cfg.max_files))[0]), cfg.seed, cfg.chat_conversations, "train", "closed"))
    assert len(answers) == cfg.regime_prompts
    for a in answers:
        assert a["seen"] == (chat.user_turn(a["request"]) in training_text), a


def test_unknown_task_set_is_refused_before_training(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["retrain", "--shrink", "--out", "unused", "--set", "task_set=open"]) == 2
    assert "unknown chat task set 'open'; expected one of mixed, closed" in capsys.readouterr().err


def test_held_out_figures_score_only_weighted_tokens() -> None:
    """With loss weights, the held-out figures are those of the weighted tokens alone (checked by hand)."""
    import torch.nn.functional as F

    from companion.tiny_pair.evaluate import evaluate_pair

    cfg = shrunk_config()
    torch.manual_seed(0)
    target = train_mod.make_model(cfg.target, cfg, 50, 1, 0)
    drafter = train_mod.make_model(cfg.drafter, cfg, 50, 1, 0)
    ids = torch.randint(2, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    w = (torch.rand(3, 16, generator=torch.Generator().manual_seed(2)) < 0.5).long()
    kw = dict(tokenizer=None, max_tokens=10_000, greedy_prompts=[], greedy_steps=0, progress=False)
    plain = evaluate_pair(target, drafter, held_windows=ids, **kw)
    ones = evaluate_pair(target, drafter, held_windows=ids, held_weights=torch.ones_like(ids), **kw)
    assert ones.to_dict() == plain.to_dict() and plain.eval_tokens == 3 * 15
    got = evaluate_pair(target, drafter, held_windows=ids, held_weights=w, **kw)
    keep = w[:, 1:].reshape(-1) > 0
    with torch.no_grad():
        logits = target(input_ids=ids).logits[:, :-1].reshape(-1, 50)[keep]
    want = F.cross_entropy(logits, ids[:, 1:].reshape(-1)[keep]).item()
    assert got.eval_tokens == int(keep.sum()) < plain.eval_tokens
    assert got.target_loss == pytest.approx(want, rel=1e-5)
    assert got.held_out.n_steps == int(keep.sum())
    with pytest.raises(ValueError, match="held_weights has shape"):
        evaluate_pair(target, drafter, held_windows=ids, held_weights=w[:, :5], **kw)


def test_interrupted_stage_resumes_to_the_same_weights(tmp_path: Path) -> None:
    """A stage stopped mid-way and rerun from its checkpoint ends with exactly the weights of an uninterrupted run."""
    cfg = shrunk_config()
    data = torch.randint(0, 300, (40, 32), generator=torch.Generator().manual_seed(5))
    st = cfg.target_stage

    def fresh():
        torch.manual_seed(0)
        return train_mod.make_model(cfg.drafter, cfg, 300, 0, 1)

    with train_mod.torch_threads(1):
        ref = fresh()
        train_mod._run_stage(ref, data, st, torch.Generator().manual_seed(3), train_mod.lm_loss, "a", False)
        calls = [0]

        def crashing(model, batch):
            calls[0] += 1
            if calls[0] == 23:
                raise KeyboardInterrupt
            return train_mod.lm_loss(model, batch)

        ck = tmp_path / "stage.pt"
        with pytest.raises(KeyboardInterrupt):
            train_mod._run_stage(fresh(), data, st, torch.Generator().manual_seed(3), crashing, "b", False,
                                 checkpoint=ck, checkpoint_every=10)
        assert torch.load(ck, weights_only=False)["step"] == 20
        resumed = fresh()
        log = train_mod._run_stage(resumed, data, st, torch.Generator().manual_seed(3), train_mod.lm_loss, "c",
                                   False, checkpoint=ck, checkpoint_every=10)
    assert len(log.losses) == st.steps
    for (name, p), q in zip(ref.named_parameters(), resumed.parameters()):
        assert torch.equal(p, q), name


def test_build_failure_leaves_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "pair"
    out.mkdir()
    (out / "keep.txt").write_text("previous build")

    def failing(cfg, root: Path, **kwargs):
        (root / "target").mkdir()
        (root / "target" / "partial.bin").write_bytes(b"\0" * 10)
        raise RuntimeError("simulated failure mid-build")

    monkeypatch.setattr(train_mod, "_build_into", failing)
    with pytest.raises(RuntimeError, match="simulated"):
        train_mod.build_pair(shrunk_config(), out, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pair"]  # no staging folder left behind
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


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
        assert train_mod.sha256_file(ASSET_DIR / rel) == h, rel
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
    assert manifest["config"] == default_config().to_dict()  # the committed pair is the default recipe
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
    assert f"(`companion/tiny_pair/{module}.py`)" in text
    assert f"{manifest['models']['target']['params'] / 1e6:.0f}M-parameter" in text
    assert f"{manifest['models']['drafter']['params'] / 1e6:.1f}M-parameter" in text


def test_default_pair_loads_with_qwen3_code_path() -> None:
    from companion.tiny_pair import chat_corpus as chat

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
