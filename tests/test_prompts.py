"""The default prompt set and the prompt-file format."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from companion.prompts.sets import Prompt, dumps_prompts, load_prompts, prompt_set_digest
from companion.models.tiny_pair import ASSET_DIR
from companion.models.tiny_pair import chat_corpus as chat
from companion.models.tiny_pair import corpus as corpus_mod


@pytest.fixture(scope="module")
def prompts() -> list[Prompt]:
    return load_prompts("default")


def test_default_prompts_shape(prompts: list[Prompt]) -> None:
    manifest = json.loads((ASSET_DIR / "manifest.json").read_text())["prompts"]
    assert len(prompts) >= 200
    assert len({p.prompt_id for p in prompts}) == len(prompts)
    assert len({p.text for p in prompts}) == len(prompts)
    assert all(manifest["min_tokens"] <= p.n_tokens <= manifest["max_tokens"] for p in prompts)
    # user turns in the chat template, ending where the assistant's answer starts
    assert all(p.text.startswith(f"{chat.IM_START}user\n") and p.text.endswith(chat.GENERATION_PREFIX)
               for p in prompts)
    assert all(p.text.isascii() and "\t" not in p.text for p in prompts)
    tasks = {p.source.removeprefix("chat:") for p in prompts}
    task_set = json.loads((ASSET_DIR / "manifest.json").read_text())["config"]["task_set"]
    assert all(p.source.startswith("chat:") for p in prompts) and tasks <= set(chat.tasks_of(task_set))
    assert len(tasks) >= 10  # spread over many kinds of request


def test_default_prompts_are_held_out_and_token_counts_are_true(prompts: list[Prompt]) -> None:
    # Each prompt is conversation `line` of the generator's "prompts" stream on held-out material.
    import platform

    tok = AutoTokenizer.from_pretrained(ASSET_DIR / "tokenizer")
    for p in prompts:
        assert len(tok(p.text, add_special_tokens=False)["input_ids"]) == p.n_tokens, p.prompt_id
    built_with = json.loads((ASSET_DIR / "manifest.json").read_text())["corpus"]["python"]
    if built_with != platform.python_version():
        pytest.skip(f"the pair was built on Python {built_with}; this interpreter's standard library differs")
    files = corpus_mod.load_corpus(None)
    _, held = corpus_mod.split_corpus(files)
    material = chat.make_material(held)
    task_set = json.loads((ASSET_DIR / "manifest.json").read_text())["config"]["task_set"]
    for p in prompts[:64]:
        task, question, _ = chat.generate(material, 0, p.line, "prompts", task_set)
        assert p.text == chat.user_turn(question) and p.source == f"chat:{task}", p.prompt_id


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


# -------------------------------------------------------------------------------------------------
# Files of your own: plain text, JSONL with only 'text', and every malformed case named by file:line

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from companion.prompts.sets import with_token_counts  # noqa: E402


def test_plain_text_file_is_one_prompt_a_line(tmp_path: Path) -> None:
    f = tmp_path / "mine.txt"
    f.write_text("first prompt\n\n  indented, kept as is  \r\nlast without newline", encoding="utf-8")
    got = load_prompts(f)
    assert got == [Prompt("line-00001", "first prompt", -1, "mine.txt", 1),
                   Prompt("line-00003", "  indented, kept as is  ", -1, "mine.txt", 3),
                   Prompt("line-00004", "last without newline", -1, "mine.txt", 4)]
    # A text file whose lines look like JSON is still text: the suffix decides.
    f.write_text('{"text": "x"}\n', encoding="utf-8")
    assert load_prompts(f)[0].text == '{"text": "x"}'


def test_jsonl_with_only_text_gets_ids_sources_and_lines(tmp_path: Path) -> None:
    f = tmp_path / "mine.jsonl"
    f.write_text('{"text": "a"}\n\n{"text": "b", "prompt_id": 7, "topic": "ignored"}\n{"text": "c", "n_tokens": 3}\n',
                 encoding="utf-8")
    assert load_prompts(f) == [Prompt("line-00001", "a", -1, "mine.jsonl", 1), Prompt("7", "b", -1, "mine.jsonl", 3),
                               Prompt("line-00004", "c", 3, "mine.jsonl", 4)]


def test_token_counts_are_filled_only_where_unknown() -> None:
    ps = [Prompt("a", "xyz", -1, "s"), Prompt("b", "uv", 9, "s")]
    assert with_token_counts(ps, len) == [Prompt("a", "xyz", 3, "s"), Prompt("b", "uv", 9, "s")]


FIELDS = "'text' (a non-empty string; optional: 'prompt_id', 'n_tokens', 'source', 'line')"


@pytest.mark.parametrize("name, content, message", [
    ("p.jsonl", b'{"text": "a"}\n{"text": "b"\n',
     "{f}:2: not valid JSON (Expecting ',' delimiter at column 13); each line must be one JSON object with " + FIELDS),
    ("p.jsonl", b'{"prompt": "a"}\n', "{f}:1: not a prompt record: needs " + FIELDS + ", got keys ['prompt']"),
    ("p.jsonl", b'{"text": ""}\n', "{f}:1: not a prompt record: needs " + FIELDS + ", got 'text' = ''"),
    ("p.jsonl", b'["a"]\n', "{f}:1: not a prompt record: expected a JSON object with " + FIELDS + ", got list"),
    ("p.jsonl", b'{"text": "a", "n_tokens": "5"}\n', "{f}:1: not a prompt record: 'n_tokens' must be an integer, got '5'"),
    ("p.jsonl", b'{"text": "a", "prompt_id": "x"}\n{"text": "b", "prompt_id": "x"}\n',
     "{f}:2: duplicate prompt_id 'x' (first on line 1)"),
    ("p.txt", b"ok\ncaf\xe9\n", "{f}:2: not UTF-8 text (byte 0xe9 at column 4); save the file as UTF-8"),
    ("p.txt", b"\n  \n", "{f}: no prompts (the file has no non-blank line)"),
])
def test_malformed_files_are_named_by_line(tmp_path: Path, name: str, content: bytes, message: str) -> None:
    f = tmp_path / name
    f.write_bytes(content)
    with pytest.raises(ValueError) as info:
        load_prompts(f)
    assert str(info.value) == message.format(f=f)


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not a preset \\(chat-and-stdlib, chat-requests, chat-requests-train, default, stdlib-requests\\) and not an existing file"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(FileNotFoundError, match="and a folder"):
        load_prompts(tmp_path)


_prompt = st.builds(Prompt, st.text(min_size=1, alphabet=st.characters(min_codepoint=1, max_codepoint=0x10FFFF,
                                                                        blacklist_categories=("Cs",))).map(str),
                    st.text(min_size=1), st.integers(-1, 10**6), st.text(), st.integers(0, 10**6))


@settings(max_examples=60, deadline=None)
@given(st.lists(_prompt, max_size=8, unique_by=lambda p: p.prompt_id).filter(bool))
def test_canonical_jsonl_round_trips(tmp_path_factory, prompts: list[Prompt]) -> None:
    f = tmp_path_factory.mktemp("rt") / "p.jsonl"
    f.write_text(dumps_prompts(prompts), encoding="utf-8")
    assert load_prompts(f) == prompts


_line = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), min_size=1)


@settings(max_examples=60, deadline=None)
@given(st.lists(_line, min_size=1, max_size=8))
def test_text_file_round_trips(tmp_path_factory, lines: list[str]) -> None:
    f = tmp_path_factory.mktemp("txt") / "p.txt"
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept = [(n, t) for n, t in enumerate(lines, 1) if t.strip()]
    if not kept:
        with pytest.raises(ValueError, match="no prompts"):
            load_prompts(f)
        return
    got = load_prompts(f)
    assert [(p.line, p.text, p.prompt_id) for p in got] == [(n, t, f"line-{n:05d}") for n, t in kept]


def test_request_kind_names_both_families_and_nothing_else() -> None:
    from companion.prompts.sets import Prompt, request_kind

    assert request_kind(Prompt("chat-0001-code", "x", 1, "chat-requests:code:heldout")) == "code"
    assert request_kind(Prompt("stdlib-0001-test", "x", 1, "stdlib-requests:os.path:test")) == "stdlib-test"
    assert request_kind(Prompt("line-00001", "x", 1, "mine.txt")) is None
    kinds = {request_kind(p) for p in load_prompts("chat-and-stdlib")[:24]}
    assert None not in kinds and any(k.startswith("stdlib-") for k in kinds)
