"""``companion cache``: listing the weights cache and pruning what the code no longer uses.

A fake cache (``COMPANION_CACHE`` in ``tmp_path``) holds folders made by hand with the records
that :mod:`companion.models.weights.convert` and :mod:`companion.models.weights.distilled_drafter` write: no
model is fetched or converted.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from companion import cli
from companion.models.weights import convert
from companion.models.weights.cache_cli import current_drafter_name, human_size
from companion.models.weights.registry import GgufSource, source

SMOL = "smollm2-135m-instruct"
QWEN_SMALL = "qwen2.5-coder-0.5b-instruct"


def _files(folder: Path, sizes: dict[str, int]) -> dict[str, int]:
    folder.mkdir(parents=True)
    for name, size in sizes.items():
        (folder / name).write_bytes(b"x" * size)
    return sizes


def _record(folder: Path, record: dict) -> None:
    (folder / convert.RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def make_model(root: Path, src: GgufSource, *, version: int = convert.CONVERSION_VERSION, sha256: str | None = None,
               tokenizer: str = "", model: str | None = None) -> Path:
    """A model folder as ensure_converted leaves it (tiny files), with its record; ``model``: another name."""
    sha256 = sha256 or src.sha256
    model = model or src.name
    folder = root / f"{model}-{sha256[:16]}-v{version}"
    files = _files(folder, {"config.json": 20, "model.safetensors": 1000, "tokenizer.json": 30})
    _record(folder, {"model": model, "display_name": src.display_name, "gguf_file": src.file, "gguf_sha256": sha256,
                     "quantization": src.quantization, "dtype": src.dtype, "conversion_version": version,
                     "tokenizer": tokenizer, "files": files})
    return folder


def make_tokenizer(root: Path, group: str, fingerprint: str, version: int = convert.TOKENIZER_VERSION) -> Path:
    """A tokenizer folder as ensure_tokenizer leaves it."""
    folder = root / f"tokenizer-{group}-{fingerprint[:16]}-v{version}"
    _files(folder, {"tokenizer.json": 300})
    _record(folder, {"tokenizer_fingerprint": fingerprint, "group": group, "tokenizer_version": version})
    return folder


def make_drafter(root: Path, name: str, weights: str, target: str) -> Path:
    """A drafter folder as drafter_dir leaves it."""
    folder = root / name
    _files(folder, {"model.safetensors": 700})
    _record(folder, {"drafter_files_sha256": {"model.safetensors": weights}, "target": target})
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> dict[str, Path]:
    """A cache holding current, stale, leftover and unknown entries; name -> path."""
    root = tmp_path / "cache"
    root.mkdir()
    monkeypatch.setenv("COMPANION_CACHE", str(root))
    smol, qwen = source(SMOL), source(QWEN_SMALL)
    tok = make_tokenizer(root, "smollm2", "a" * 64)
    current = make_model(root, smol, tokenizer=tok.name)
    drafter_name = current_drafter_name(current.name)
    assert drafter_name is not None, "the committed drafter has a manifest"
    outside = tmp_path / "outside"
    _files(outside, {"precious.txt": 5})
    damaged = make_model(root, qwen, tokenizer="tokenizer-qwen2.5-coder-" + "b" * 16 + "-v2")
    (damaged / "model.safetensors").write_bytes(b"short")  # not the size the record names
    made = {
        "current model": current,
        "current tokenizer": tok,
        "current drafter": make_drafter(root, drafter_name, "d" * 64, current.name),
        "old version": make_model(root, smol, version=convert.CONVERSION_VERSION - 1),
        "other gguf": make_model(root, smol, sha256="c" * 64),
        "not in registry": make_model(root, smol, model="retired-model"),
        "damaged": damaged,
        "stale tokenizer": make_tokenizer(root, "qwen2.5-coder", "b" * 64),
        "old drafter": make_drafter(root, f"smollm2_drafter-{'e' * 16}-{current.name}", "e" * 64, current.name),
        "partial": root / f".{current.name}.partial-4242",
        "old aside": root / f"{tok.name}.old-4243",
        "download": root / "downloads" / smol.file,
        "download partial": root / "downloads" / f".{smol.file}.partial-4244",
        "download work": root / "downloads" / f".download-{SMOL}-4245",
        "unknown folder": root / "my-notes",
        "unknown file": root / "README.txt",
        "link": root / "linked",
    }
    _files(made["partial"], {"model.safetensors": 10})
    _files(made["old aside"], {"tokenizer.json": 10})
    _files(made["download work"], {"part.whl": 10})
    made["download"].write_bytes(b"g" * 50)
    made["download partial"].write_bytes(b"g" * 5)
    _files(made["unknown folder"], {"a.txt": 3})
    made["unknown file"].write_text("mine")
    made["link"].symlink_to(outside, target_is_directory=True)
    for lock in (SMOL, QWEN_SMALL, tok.name):
        (root / f".{lock}.lock").touch()
    made["outside"] = outside
    return made


CURRENT = ("current model", "current tokenizer", "current drafter")
STALE = ("old version", "other gguf", "not in registry", "damaged", "stale tokenizer", "old drafter", "partial",
         "old aside", "download", "download partial", "download work")
KEPT_UNKNOWN = ("unknown folder", "unknown file", "link")


def _rel(made: dict[str, Path], key: str) -> str:
    path = made[key]
    return f"downloads/{path.name}" if path.parent.name == "downloads" else path.name


def _status_of(out: str) -> dict[str, str]:
    """Entry name -> status, from the listing's lines (``status size unit  name  about``)."""
    rows = {}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in ("current", "stale", "unknown"):
            rows[words[3]] = words[0]
    return rows


def test_the_listing_marks_current_stale_and_unknown_and_deletes_nothing(cache, capsys) -> None:
    before = sorted(p.name for p in cache["current model"].parent.rglob("*"))
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    status = _status_of(out)
    assert {k: status.get(_rel(cache, k)) for k in CURRENT} == {k: "current" for k in CURRENT}
    assert {k: status.get(_rel(cache, k)) for k in STALE} == {k: "stale" for k in STALE}
    assert {k: status.get(_rel(cache, k)) for k in KEPT_UNKNOWN} == {k: "unknown" for k in KEPT_UNKNOWN}
    assert not any(".lock" in name for name in status), "lock files are not listed"
    assert len(status) == len(CURRENT) + len(STALE) + len(KEPT_UNKNOWN)
    # what wrote them, and why a folder is stale
    current_line = next(line for line in out.splitlines() if _rel(cache, "current model") in line)
    assert "SmolLM2-135M-Instruct" in current_line and source(SMOL).sha256[:16] in current_line
    assert f"conversion v{convert.CONVERSION_VERSION}" in current_line
    assert f"this code writes v{convert.CONVERSION_VERSION}" in out and "not the registry's" in out
    assert "retired-model is not in the registry" in out and "damaged" in out and "old drafter build" in out
    assert out.splitlines()[0].startswith(f"cache: {cache['current model'].parent}: ")
    assert sorted(p.name for p in cache["current model"].parent.rglob("*")) == before


def test_dry_run_prints_what_prune_would_delete_and_deletes_nothing(cache, capsys) -> None:
    assert cli.main(["cache", "--prune", "--dry-run"]) == 0
    out = capsys.readouterr().out
    would = {line.split()[2] for line in out.splitlines() if line.startswith("would delete ")}
    assert would == {_rel(cache, k) for k in STALE}
    assert all(path.exists() or path.is_symlink() for path in cache.values())
    assert f"would delete {len(STALE)} entries" in out


def test_prune_deletes_the_stale_entries_only(cache, capsys) -> None:
    root = cache["current model"].parent
    assert cli.main(["cache", "--prune"]) == 0
    out = capsys.readouterr().out
    deleted = {line.split()[1] for line in out.splitlines() if line.startswith("deleting ")}
    assert deleted == {_rel(cache, k) for k in STALE}
    assert not any(cache[k].exists() for k in STALE)
    assert all(cache[k].exists() for k in CURRENT + KEPT_UNKNOWN)
    assert cache["link"].is_symlink() and (cache["outside"] / "precious.txt").is_file(), "nothing outside the root"
    assert (root / f".{SMOL}.lock").is_file(), "lock files stay"
    assert convert.cache_is_current(cache["current model"], source(SMOL))
    # pruned: a second listing has nothing stale left
    assert cli.main(["cache"]) == 0
    assert "stale" not in _status_of(capsys.readouterr().out).values()


_HOLD = """
import fcntl, sys, time
with open(sys.argv[1], "a") as fh:
    fcntl.flock(fh, fcntl.LOCK_EX)
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_an_entry_whose_lock_another_process_holds_is_skipped(cache, capsys) -> None:
    root = cache["current model"].parent
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(root / f".{SMOL}.lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli.main(["cache", "--prune"]) == 0
    finally:
        holder.communicate("\n", timeout=30)
    out = capsys.readouterr().out
    # everything a SmolLM2 conversion writes under its lock: its old folders, leftovers and downloads
    busy = ("old version", "other gguf", "partial", "download", "download partial", "download work")
    for key in busy:
        assert f"skipped {_rel(cache, key)}: its lock .{SMOL}.lock is held by another process" in out
        assert cache[key].exists()
    assert not any(cache[k].exists() for k in STALE if k not in busy)


def test_a_folder_converted_again_after_the_listing_is_not_deleted(cache) -> None:
    """Between the survey and the deletion another process may finish converting the damaged folder
    (it takes the model's lock, which prune waits for): prune looks again under the lock."""
    import io

    from companion.models.weights.cache_cli import prune, survey

    root, damaged = cache["current model"].parent, cache["damaged"]
    entries = survey(root)
    assert next(e for e in entries if e.path == damaged).status == "stale"
    (damaged / "model.safetensors").write_bytes(b"x" * 1000)  # the conversion finished: current again
    said = io.StringIO()
    prune(root, entries, dry_run=False, out=said)
    assert f"kept {damaged.name}: it is in use now" in said.getvalue()
    assert convert.cache_is_current(damaged, source(QWEN_SMALL))
    assert not cache["old version"].exists()


def test_no_cache_yet_is_said_in_one_line(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("COMPANION_CACHE", str(tmp_path / "nothing-here"))
    assert cli.main(["cache", "--prune"]) == 0
    assert capsys.readouterr().out == f"cache: {tmp_path / 'nothing-here'} does not exist (nothing cached yet)\n"
    assert not (tmp_path / "nothing-here").exists()


@pytest.mark.parametrize("args, make, said", [
    (["--dry-run"], None, "--dry-run shows what --prune would delete: pass both"),
    ([], "file", "is not a folder; point COMPANION_CACHE at a folder"),
    (["--prune", "--everything"], None, "unrecognized arguments: --everything"),
])
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, monkeypatch, capsys, args, make, said) -> None:
    root = tmp_path / "cache"
    if make == "file":
        root.write_text("not a folder")
    monkeypatch.setenv("COMPANION_CACHE", str(root))
    assert cli.main(["cache", *args]) == 2
    captured = capsys.readouterr()
    assert said in captured.err and captured.err.count("\n") == 1 and captured.out == ""


def test_sizes_read_in_decimal_units() -> None:
    assert [human_size(n) for n in (0, 999, 1000, 517_400_000, 3_554_214_752, 1_234_567_890_123)] == \
        ["0 B", "999 B", "1 kB", "517 MB", "3.55 GB", "1235 GB"]
