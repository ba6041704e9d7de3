"""The standard-library request family: the frozen file, its rules, the prompt asset and the mixed set."""
from __future__ import annotations

import json
import platform
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from companion.prompts import stdlib_requests as sr
from companion.prompts.sets import dumps_prompts, load_prompts

REQUESTS = sr.stdlib_requests()


def test_the_file_holds_the_documented_number_of_requests_with_tasks_in_turn() -> None:
    assert len(REQUESTS) == sr.N_REQUESTS
    tasks = [t for t, _ in sr.TASKS]
    for i, r in enumerate(REQUESTS):
        assert r.task == tasks[i % len(tasks)] and r.request_id == f"stdlib-{i + 1:04d}-{r.task}"
        name = sr.qualified_name(r.module, r.function)
        opening = sr.OPENING.format(name=name)
        ask = dict(sr.TASKS)[r.task].format(name=name)
        assert r.text.startswith(opening + "\n\n```\n") and r.text.endswith("\n```\n\n" + ask), r.request_id
        quoted = r.text[len(opening) + 6: -len(ask) - 6]
        assert sr.MIN_DOC_CHARS <= len(quoted), f"{r.request_id}: {len(quoted)} characters of documentation"


def test_the_per_module_cap_and_the_rank_order_hold() -> None:
    homes = Counter(f"{r.module}.{r.function.split('.')[0]}" if "." in r.function else r.module for r in REQUESTS)
    assert max(homes.values()) <= sr.PER_MODULE, homes.most_common(3)
    keys = [sr.hashlib.sha256(f"stdlib:{r.module}.{r.function}".encode()).hexdigest() for r in REQUESTS]
    assert keys == sorted(keys), "the requests are not in the documented hash order"
    assert all(r.module in sr.MODULES or (r.module, r.function.split(".")[0]) in sr.TYPES for r in REQUESTS)


def test_provenance_names_the_python_and_the_license() -> None:
    about = sr.about()
    assert re.fullmatch(r"3\.\d+\.\d+", about["python"]) and about["implementation"] == "CPython"
    assert "Python Software Foundation License" in about["license"]
    assert about["tasks"] == dict(sr.TASKS) and about["modules"] == list(sr.MODULES)


@pytest.mark.skipif(platform.python_version() != sr.about()["python"] or platform.python_implementation() != "CPython",
                    reason="the family was built from another Python's docstrings; only that one rebuilds it")
def test_the_builder_rebuilds_the_committed_file_on_the_python_that_made_it() -> None:
    document = sr.requests_document(sr.build_requests())
    assert document == json.loads(sr.REQUESTS_FILE.read_text(encoding="utf-8"))


def _broken(tmp_path: Path, change: Any) -> Path:
    data = json.loads(sr.REQUESTS_FILE.read_text(encoding="utf-8"))
    change(data)
    path = tmp_path / "requests.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("change, text", [
    (lambda d: d["requests"].reverse(), "request 1: id 'stdlib-0300-"),
    (lambda d: d["requests"][0].update(text=" x"), "text unstripped, not naming"),
    (lambda d: d["requests"][1].update(module=d["requests"][0]["module"], function=d["requests"][0]["function"]),
     "text unstripped, not naming"),
    (lambda d: d["requests"][0].pop("task"), "request 1 must have the text fields id, module, function, task, text"),
    (lambda d: d.pop("about"), "expected an object with 'about'"),
])
def test_a_broken_file_is_refused_in_one_line(tmp_path: Path, change: Any, text: str) -> None:
    path = _broken(tmp_path, change)
    with pytest.raises(sr.RequestsFileError, match=re.escape(text)) as info:
        sr.stdlib_requests(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_the_mixed_set_takes_the_families_in_turn() -> None:
    chat, stdlib, mixed = load_prompts("chat-requests"), load_prompts("stdlib-requests"), load_prompts("chat-and-stdlib")
    assert len(mixed) == 2 * min(len(chat), len(stdlib))
    assert mixed[0::2] == chat[: len(mixed) // 2] and mixed[1::2] == stdlib[: len(mixed) // 2]
    # the full profile's 500: every chat request among them is held out
    assert all(p.source.endswith(":heldout") for p in mixed[:500:2])


def test_the_asset_is_what_the_smollm2_tokenizer_builds_and_every_prompt_is_long_enough() -> None:
    from transformers import AutoTokenizer

    from companion.prompts.chat_requests import MIN_TOKENS
    from companion.prompts.families import retemplated
    from companion.models.weights import ensure_converted

    smol = AutoTokenizer.from_pretrained(ensure_converted("smollm2-135m-instruct", progress=False))
    prompts = sr.build_prompt_set(smol, REQUESTS)
    assert dumps_prompts(prompts) == sr.ASSET_FILE.read_text(encoding="utf-8"), "rebuild the asset"
    assert load_prompts("stdlib-requests") == prompts
    assert all(p.n_tokens >= MIN_TOKENS and p.source == f"stdlib-requests:{r.module}:{r.task}"
               for p, r in zip(prompts, REQUESTS))
    assert retemplated(prompts, smol) == prompts


def test_every_request_is_long_enough_in_qwens_template() -> None:
    from companion.prompts.chat_requests import MIN_TOKENS
    from companion.prompts.families import retemplated
    from companion.models.loading import load_tokenizer
    from companion.models.weights import converted_dir, source
    from companion.models.weights.convert import cache_is_current

    folder = converted_dir(source("qwen2.5-coder-1.5b-instruct"))
    if not cache_is_current(folder, source("qwen2.5-coder-1.5b-instruct")):
        pytest.skip("the Qwen pair is not converted here (COMPANION_SKIP_QWEN=1)")
    ours = retemplated(load_prompts("stdlib-requests"), load_tokenizer(folder))
    assert all(p.text.startswith("<|im_start|>system\nYou are Qwen") for p in ours)
    short = [(p.prompt_id, p.n_tokens) for p in ours if p.n_tokens < MIN_TOKENS]
    assert not short, f"requests under {MIN_TOKENS} tokens in Qwen's template: {short}"
