"""``companion prefetch`` and ``companion harvest-status``: the steps before and after a harvest on many
processes (the book's "Beyond one machine" page). The whole recipe, both commands included, is rehearsed
in ``tests/test_rank_failure.py``; here, what each says on its own."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from companion.cli import main
from companion.harvest.lock import exclusive, lock_path
from companion.harvest.store import FORMAT


def _manifest(out: Path, **fields: object) -> None:
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps({"format": FORMAT, **fields}))


def test_status_of_an_incomplete_harvest_names_what_is_missing_and_who_holds_it(tmp_path: Path, capsys) -> None:
    out = tmp_path / "traces"
    _manifest(out, status="incomplete", totals={"rows": 61_234, "prompts": 480, "shards": 15},
              missing_shards=[7], runs=[{"world_size": 8, "rows": 61_234, "finished": "2026-12-06T10:00:00+0000"}],
              prompt_set_name="HuggingFaceH4/ultrachat_200k:train_sft", extra={"preset": "paper-qwen3-1.7b"})
    with exclusive(out, rank=3):
        assert main(["harvest-status", str(out)]) == 1
        lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{out}: incomplete, 61,234 rows, 480 prompts, 15 of 16 shards"
    assert lines[1] == "missing shards: 7"
    assert lines[2] == "run finished 2026-12-06T10:00:00+0000: 8 process(es), 61,234 rows"
    assert lines[3].startswith(f"lock {lock_path(out, 3)}: held by pid ")
    assert main(["harvest-status", "--json", str(out)]) == 1  # the lock is gone once released
    info = json.loads(capsys.readouterr().out)
    assert info["locks"] == [] and info["preset"] == "paper-qwen3-1.7b" and info["shards_total"] == 16


def test_status_of_a_complete_harvest_exits_0(tmp_path: Path, capsys) -> None:
    out = tmp_path / "traces"
    _manifest(out, status="complete", totals={"rows": 10, "prompts": 2, "shards": 1}, runs=[])
    assert main(["harvest-status", str(out)]) == 0
    assert capsys.readouterr().out == f"{out}: complete, 10 rows, 2 prompts, 1 of 1 shards\n"


@pytest.mark.parametrize("make", ["nothing", "damaged"])
def test_status_of_a_folder_without_a_readable_manifest_is_one_line_and_exit_2(tmp_path: Path, capsys,
                                                                               make: str) -> None:
    out = tmp_path / "traces"
    if make == "damaged":
        out.mkdir()
        (out / "manifest.json").write_text("{\"format\": ")
    assert main(["harvest-status", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("companion harvest-status: ")
    assert ("holds no manifest.json" in err) if make == "nothing" else ("is damaged" in err)


def test_prefetch_of_a_missing_local_model_is_refused_in_one_line(tmp_path: Path, capsys) -> None:
    assert main(["prefetch", "--target", str(tmp_path / "no-such-model"), "--no-drafter"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"companion prefetch: --target {tmp_path / 'no-such-model'}")


def test_prefetch_loads_the_local_pair_and_prompts_and_says_where_the_hub_cache_is(capsys) -> None:
    assert main(["prefetch", "--preset", "closed-world", "--n-prompts", "5"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["prompts"] == 5 and info["prompt_set"] == "default[:5]" and info["max_prompt_tokens"] > 0
    assert info["target_parameters"] > info["drafter_parameters"] > 0 and info["hub_cache"]
