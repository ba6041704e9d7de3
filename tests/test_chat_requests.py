"""The chat-request prompt set: the requests file, its split, the default subset and the committed asset."""
from __future__ import annotations

import hashlib
import json
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from companion.prompts import chat_requests as cr
from companion.assets import CHAT_REQUESTS_DIR
from companion.prompts.sets import dumps_prompts, load_prompts

REQUESTS = cr.chat_requests()  # requests.json, read and checked once
HELD = [r for r in REQUESTS if r.split == "heldout"]
# ChatML as SmolLM2's template writes one user turn (after its default system turn).
USER_OPEN, USER_CLOSE = "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"


def test_two_calls_are_equal() -> None:
    assert cr.chat_requests() == REQUESTS


def _broken_file(tmp_path: Path, change: Any) -> Path:
    data = json.loads(cr.REQUESTS_FILE.read_text(encoding="utf-8"))
    change(data)
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("change, text", [
    (lambda d: d["requests"].reverse(), "request 1: id 'chat-0660-roleplay' or kind 'roleplay' out of order"),
    (lambda d: d["requests"][1].update(text=d["requests"][0]["text"]), "chat-0002-writing: text empty, unstripped or "
                                                                       "repeated"),
    (lambda d: d["requests"][0].update(text=" x"), "chat-0001-writing: text empty, unstripped or repeated"),
    (lambda d: d["requests"][0].update(group="advice-01"), "chat-0001-writing: group 'advice-01' is not writing-NN"),
    (lambda d: d["requests"][0].pop("group"), "request 1 must have the text fields id, kind, group, text"),
    (lambda d: d["passages"].reverse(), "names no passage this request holds"),
    (lambda d: d.update(kinds=["writing"]), "kinds must be writing, open-question"),
    (lambda d: d.pop("requests"), "expected an object with lists 'passages' and 'requests'"),
])
def test_a_broken_requests_file_is_refused_in_one_line(tmp_path: Path, change: Any, text: str) -> None:
    path = _broken_file(tmp_path, change)
    with pytest.raises(cr.RequestsFileError, match=re.escape(text)) as info:
        cr.chat_requests(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_the_committed_requests_file_is_the_set(tmp_path: Path) -> None:
    """The file round-trips: read, written back in its fields and read again, it gives the same requests."""
    data = json.loads(cr.REQUESTS_FILE.read_text(encoding="utf-8"))
    assert [r["id"] for r in data["requests"]] == [r.request_id for r in REQUESTS]
    assert tuple(data["passages"]) == cr.PASSAGES and len(cr.PASSAGES) == 20
    assert cr.chat_requests(_broken_file(tmp_path, lambda d: None)) == REQUESTS


def test_size_kinds_and_ids() -> None:
    counts = Counter(r.kind for r in REQUESTS)
    assert len(REQUESTS) >= 600, len(REQUESTS)
    assert set(counts) == set(cr.KINDS) and len(counts) >= 10, counts
    assert min(counts.values()) >= 20, counts
    assert [r.request_id for r in REQUESTS] == [f"chat-{i:04d}-{r.kind}" for i, r in enumerate(REQUESTS, 1)]
    assert len({r.request_id for r in REQUESTS}) == len(REQUESTS)
    assert len({r.text for r in REQUESTS}) == len(REQUESTS)


def test_texts_are_clean() -> None:
    for r in REQUESTS:
        assert r.text == r.text.strip(), r.request_id
        assert all("  " not in line.lstrip() for line in r.text.splitlines()), r.request_id  # code keeps its indent
        assert not re.search(r"\{[a-z_]*\}", r.text), f"{r.request_id}: unfilled placeholder in {r.text!r}"


def test_docstring_counts_match_the_generator() -> None:
    counts = Counter(r.kind for r in REQUESTS)
    doc = cr.__doc__ or ""
    for kind in cr.KINDS:
        m = re.search(rf"^{re.escape(kind)}\s+(\d+)\s", doc, re.MULTILINE)
        said = m.group(1) if m else None
        assert said == str(counts[kind]), f"the docstring says {said} {kind} requests; the generator: {counts[kind]}"
    assert f"{len(REQUESTS)} requests in all" in doc


def test_split_every_kind_both_sides_about_half_and_groups_whole() -> None:
    held_share = len(HELD) / len(REQUESTS)
    assert 0.4 <= held_share <= 0.6, held_share
    for kind in cr.KINDS:
        splits = Counter(r.split for r in REQUESTS if r.kind == kind)
        assert set(splits) == set(cr.SPLITS), f"{kind}: {splits}"
        share = splits["heldout"] / sum(splits.values())
        assert 0.35 <= share <= 0.65, f"{kind}: held-out share {share:.2f}"
    sides: dict[str, set[str]] = {}
    for r in REQUESTS:
        sides.setdefault(r.group, set()).add(r.split)
    assert all(len(s) == 1 for s in sides.values()), {g: s for g, s in sides.items() if len(s) > 1}


def test_split_is_the_documented_hash_rule() -> None:
    # Recomputed from the docstring's words: per pool, rank groups by sha256("split:<group>"), first half
    # (rounded up) held out. Pools: the shared passages, and each kind's own items.
    split_of = {r.group: r.split for r in REQUESTS}
    pools: dict[str, list[str]] = {}
    for g in split_of:
        pools.setdefault("passage" if g.startswith("passage-") else g.rsplit("-", 1)[0], []).append(g)
    assert set(pools) == {"passage"} | set(cr.KINDS) - {"summarise", "extract"}
    for pool, groups in pools.items():
        ranked = sorted(groups, key=lambda g: hashlib.sha256(f"split:{g}".encode()).hexdigest())
        held = -(-len(ranked) // 2)
        assert [split_of[g] for g in ranked] == ["heldout"] * held + ["train"] * (len(ranked) - held), pool


def test_passage_kinds_share_passages_and_nothing_else_crosses_kinds() -> None:
    kinds_of: dict[str, set[str]] = {}
    for r in REQUESTS:
        kinds_of.setdefault(r.group, set()).add(r.kind)
    for group, kinds in kinds_of.items():
        if group.startswith("passage-"):
            assert kinds == {"summarise", "extract", "rewriting"}, (group, kinds)
            passage = cr.PASSAGES[int(group.split("-")[1])]
            assert all(passage in r.text for r in REQUESTS if r.group == group), group
        else:
            assert len(kinds) == 1 and group.startswith(next(iter(kinds))), (group, kinds)


def test_default_subset_first_32_cover_every_kind_and_are_held_out() -> None:
    sub = cr.default_subset(REQUESTS, 32)
    assert len(sub) == 32 and len({r.request_id for r in sub}) == 32
    assert all(r.split == "heldout" for r in sub)
    assert {r.kind for r in sub} == set(cr.KINDS)
    assert {r.kind for r in sub[:len(cr.KINDS)]} == set(cr.KINDS)
    assert len({r.group for r in sub}) == 32  # no passage, topic or template twice while there are others
    assert cr.default_subset(REQUESTS, 32) == sub
    assert cr.default_subset(REQUESTS, 32, seed=1) != sub


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(1, len(HELD)))
def test_default_subset_properties(seed: int, n: int) -> None:
    sub = cr.default_subset(REQUESTS, n, seed=seed)
    assert len(sub) == n and len({r.request_id for r in sub}) == n
    assert all(r.split == "heldout" for r in sub)
    assert sub == cr.default_subset(REQUESTS, len(HELD), seed=seed)[:n]  # a larger budget extends, never reshuffles
    k = min(n, len(cr.KINDS))
    assert len({r.kind for r in sub[:k]}) == k
    assert cr.default_subset(list(reversed(REQUESTS)), n, seed=seed) == sub  # independent of input order


@pytest.mark.parametrize("n", [0, -1, len(HELD) + 1, 2.0, True])
def test_default_subset_refuses_bad_n(n: Any) -> None:
    with pytest.raises(ValueError, match=rf"^n must be an integer from 1 to {len(HELD)} .* got {re.escape(repr(n))}$"):
        cr.default_subset(REQUESTS, n)


class WordTokenizer:
    """A stand-in tokenizer: the template wraps the text in two marker words; tokens are words."""

    chat_template = "stub"

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        assert kwargs == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}
        return f"<user> {messages[0]['content']} <assistant>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[str]]:
        assert add_special_tokens is False
        return {"input_ids": text.split()}


def _request(words: int, rid: str = "chat-9999-writing") -> cr.ChatRequest:
    return cr.ChatRequest(rid, "writing", " ".join(["word"] * words), "train", "writing-99")


def test_build_counts_tokens_and_names_kind_and_split() -> None:
    ok = _request(62)  # + 2 marker words = 64 tokens: the least allowed
    (p,) = cr.build_prompt_set(WordTokenizer(), [ok])
    assert (p.prompt_id, p.n_tokens, p.source, p.line) == (ok.request_id, 64, "chat-requests:writing:train", 0)
    assert p.text == f"<user> {ok.text} <assistant>"


def test_build_refuses_a_short_request_by_name() -> None:
    short = _request(61, "chat-0042-code")  # 63 tokens templated
    with pytest.raises(ValueError, match=r"^request chat-0042-code has 63 tokens once chat-templated; every "
                                         r"request must have at least 64$"):
        cr.build_prompt_set(WordTokenizer(), [_request(80), short, _request(90)])


def test_build_refuses_a_tokenizer_without_chat_template() -> None:
    tok = WordTokenizer()
    tok.chat_template = None  # type: ignore[assignment]
    with pytest.raises(ValueError, match="^tokenizer must have a chat template"):
        cr.build_prompt_set(tok, [_request(80)])


def test_asset_matches_the_generator() -> None:
    path = CHAT_REQUESTS_DIR / "prompts.jsonl"
    assert path == cr.ASSET_FILE and path.stat().st_size < 1_000_000
    prompts = load_prompts(path)
    assert path.read_text(encoding="utf-8") == dumps_prompts(prompts)  # canonical serialisation
    ordered = cr.asset_order(REQUESTS)
    assert [p.prompt_id for p in prompts] == [r.request_id for r in ordered]
    held = sum(r.split == "heldout" for r in REQUESTS)
    # The file's first n prompts are the default build's seeded held-out sample of n, for any n.
    for n in (1, 32, held):
        assert [p.prompt_id for p in prompts[:n]] == [r.request_id for r in cr.default_subset(REQUESTS, n)]
    assert all(p.source.endswith(":train") for p in prompts[held:])
    for i, (p, r) in enumerate(zip(prompts, ordered)):
        assert p.source == f"chat-requests:{r.kind}:{r.split}" and p.line == i, p.prompt_id
        assert p.text.count(USER_OPEN) == 1 and p.text.endswith(USER_CLOSE), p.prompt_id
        user = p.text.split(USER_OPEN, 1)[1].removesuffix(USER_CLOSE)
        assert user == r.text, f"{p.prompt_id}: the asset's user turn differs from the generator's; rebuild it"
        assert p.n_tokens >= cr.MIN_TOKENS, f"{p.prompt_id}: {p.n_tokens} tokens"
    lengths = sorted(p.n_tokens for p in prompts)
    said = re.search(r"requests have (\d+) to (\d+) tokens, median (\d+)", " ".join((cr.__doc__ or "").split()))
    got = (lengths[0], lengths[-1], statistics.median(lengths))
    assert said and tuple(float(x) for x in said.groups()) == got, f"the docstring's lengths vs the asset's {got}"


def test_cli_refuses_bad_paths_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "prompts.jsonl"
    assert cr.main(["--tokenizer", str(tmp_path / "missing"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --tokenizer must be a folder") and "missing" in err
    assert cr.main(["--tokenizer", str(tmp_path), "--out", str(tmp_path / "no" / "p.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --out must be a file in an existing folder")
    assert list(tmp_path.iterdir()) == []


def _smollm2_tokenizer_dir() -> Path:
    """The real loader's converted folder (scripts/setup.sh fetches and converts SmolLM2)."""
    from companion.models.weights import ensure_converted

    return ensure_converted("smollm2-135m-instruct", progress=False)


def test_asset_is_what_the_smollm2_tokenizer_builds(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = _smollm2_tokenizer_dir()
    prompts = cr.build_prompt_set(AutoTokenizer.from_pretrained(folder), cr.asset_order(REQUESTS))
    assert dumps_prompts(prompts) == cr.ASSET_FILE.read_text(encoding="utf-8"), "rebuild the asset"
    out = tmp_path / "prompts.jsonl"
    assert cr.main(["--tokenizer", str(folder), "--out", str(out)]) == 0
    assert out.read_bytes() == cr.ASSET_FILE.read_bytes()
