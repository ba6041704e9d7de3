"""The weights cache never writes or deletes through a link it did not make, nor takes a user's files along
(issue 66): a linked ``downloads/`` or model folder is refused in one line, a harvest ``--out`` inside the cache
is refused, a folder holding foreign files is neither converted over nor pruned; and the messages of a lock that
is a folder, a disk that fills during the download, a lock held by another process and a SIGTERM."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from companion import cli
from companion.models.weights import convert, fetch
from tests.test_hostile_weights import (ROOT, _INTERRUPTED, _fetch, _hear_ctrl_c, _intact, _left, _refused,  # noqa: F401
                                        model)


def test_downloads_linked_to_a_users_folder_is_refused_and_nothing_there_is_touched(model, tmp_path, capsys):
    src, root, calls = model
    root.mkdir()
    mine = tmp_path / "my-files"
    mine.mkdir()
    (mine / src.file).write_text("my own file of the same name")
    (root / "downloads").symlink_to(mine)
    line = _refused(capsys, "is a symbolic link to")
    assert "never follows a link it did not make" in line and f"rm {root / 'downloads'}" in line
    assert calls == [] and sorted(p.name for p in mine.iterdir()) == [src.file]
    assert (mine / src.file).read_text() == "my own file of the same name"
    assert cli.main(["cache", "--prune"]) == 0            # the two agree: prune never follows it either
    capsys.readouterr()
    assert (mine / src.file).read_text() == "my own file of the same name"
    (root / "downloads").unlink()
    assert _fetch(capsys)[0] == 0
    _intact(convert.converted_dir(src, root))


def test_a_model_folder_linked_elsewhere_is_refused_when_it_must_be_written(model, tmp_path, capsys):
    src, root, calls = model
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text("mine")
    convert.converted_dir(src, root).symlink_to(elsewhere)
    line = _refused(capsys, "is a symbolic link to")
    assert str(elsewhere) in line and calls == [] and (elsewhere / "notes.txt").read_text() == "mine"


def test_harvest_out_inside_the_cache_is_refused_in_one_line(model, capsys):
    src, root, _ = model
    assert _fetch(capsys)[0] == 0
    folder = convert.converted_dir(src, root)
    out = folder / "my-harvest"
    code = cli.main(["harvest", "--preset", "closed-world", "--out", str(out), "--steps", "2", "--n-prompts", "1"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "inside the weights cache" in err[0], (code, err)
    assert not out.exists()


def test_a_damaged_folder_holding_a_users_files_is_not_converted_over(model, capsys):
    src, root, calls = model
    assert _fetch(capsys)[0] == 0
    folder = convert.converted_dir(src, root)
    (folder / "my-harvest").mkdir()
    (folder / "my-harvest" / "rows.parquet").write_text("a user's harvest")
    (folder / "model.safetensors").write_bytes(b"damaged")
    line = _refused(capsys, "file(s) the companion did not write")
    assert "my-harvest/rows.parquet" in line and "move them out of the cache" in line
    assert (folder / "my-harvest" / "rows.parquet").read_text() == "a user's harvest"


def test_prune_keeps_a_stale_folder_holding_a_users_files(model, capsys):
    src, root, _ = model
    assert _fetch(capsys)[0] == 0
    folder = convert.converted_dir(src, root)
    record = json.loads((folder / "companion-conversion.json").read_text())
    stale = root / f"{src.name}-{'0' * 16}-v{convert.CONVERSION_VERSION}"   # a conversion of an older file
    stale.mkdir()
    for name in record["files"]:
        (stale / name).write_bytes((folder / name).read_bytes())
    (stale / "companion-conversion.json").write_text(json.dumps({**record, "gguf_sha256": "0" * 64}))
    (stale / "mine.txt").write_text("a user's notes")
    assert cli.main(["cache", "--prune"]) == 0
    out = capsys.readouterr().out
    assert f"kept {stale.name}: it holds 1 file(s) the companion did not write (first: mine.txt)" in out, out
    assert (stale / "mine.txt").read_text() == "a user's notes"
    (stale / "mine.txt").unlink()
    assert cli.main(["cache", "--prune"]) == 0
    assert f"deleting {stale.name}" in capsys.readouterr().out and not stale.exists()


def test_a_lock_that_is_a_folder_names_the_fix(model, capsys):
    src, root, _ = model
    (root / f".{src.name}.lock").mkdir(parents=True)
    line = _refused(capsys, "is a folder where the companion keeps a lock file")
    assert f"rmdir {root / ('.' + src.name + '.lock')}" in line


def test_a_disk_that_fills_during_the_download_says_so():
    parts = ()
    out = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
    line = fetch._pip_failure(out, parts, "fetching X", None)
    assert "disk filled up" in line and "reachable" not in line


def test_a_second_process_says_that_it_waits(tmp_path):
    import fcntl
    root = tmp_path / "cache"
    root.mkdir()
    lock = root / ".m.lock"
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        code = ("import sys; from pathlib import Path; from companion.models.weights.convert import locked\n"
                "with locked(Path(sys.argv[1]), 'm'):\n    print('got it', flush=True)\n")
        proc = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        first = proc.stdout.readline()
        assert "another process is converting m" in first and "waiting" in first, first
        fcntl.flock(fh, fcntl.LOCK_UN)
    assert proc.stdout.readline().strip() == "got it"
    assert proc.wait(timeout=30) == 0


def test_sigterm_during_a_fetch_is_one_line_exit_143_and_cleans_up(model, tmp_path):
    src, root, _ = model
    data = {**src.__dict__, "parts": [list(p.__dict__.values()) for p in src.parts],
            "tokens": [src.tokens.eos, src.tokens.pad, src.tokens.bos, list(src.tokens.stop)]}
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, json.dumps(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "converting"
        assert _left(root), "the partial conversion and the download are there while it runs"
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 143 and len(lines) == 1 and "SIGTERM" in lines[0], err
    assert _left(root) == [] and not convert.converted_dir(src, root).exists()
