"""Files of a harvest: Parquet shards, the JSON manifest, and reading them back.

Layout of an output directory::

    manifest.json                           configuration, provenance, timings, shard list
    shards/shard-00000.rank0.parquet        one shard = one fixed group of prompts, all their steps
    shards/shard-00001.rank1.parquet        (the rank of the process that wrote it is in the name)
    parts/rank1.json                        per-process run records, merged into the manifest at the end

Every file is written to a temporary name in the same folder, flushed to disk and renamed into
place (``os.replace`` is atomic on POSIX), so a shard or manifest either exists whole or not at
all: an interrupted harvest loses at most the shards in progress, and a rerun recomputes
exactly those. Each shard's Parquet metadata carries the harvest's configuration digest, the
shard index and its prompt ids, so foreign or stale shards are detected instead of mixed in.

Damage after the fact (a truncated or altered file) is caught by checksums: the manifest
records the sha256 of every shard file, and every Parquet page carries a CRC-32. A resume
verifies every shard before keeping it (the sha256 when the manifest has it, else a full read
with page checksums, for shards written by a run that was killed before it could record them)
and recomputes the damaged ones; :func:`load_traces` verifies every shard it reads.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from companion import atomic

FORMAT = "companion-harvest/1"
MANIFEST = "manifest.json"
SHARD_DIR = "shards"
PARTS_DIR = "parts"
META_KEY = b"companion.harvest"
_SHARD_RE = re.compile(r"shard-(\d{5,})\.rank(\d+)\.parquet")


class HarvestConfigError(ValueError):
    """The output directory holds a harvest made with a different configuration."""


# -------------------------------------------------------------------------------------------------
# Provenance


def package_versions() -> dict[str, str]:
    """Versions of the interpreter and of every package that shapes the numbers."""
    out = {"python": platform.python_version()}
    for name in ("companion", "torch", "transformers", "tokenizers", "accelerate", "safetensors", "numpy", "pyarrow"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


# The source files whose code computes a harvest's columns: the certificate engine and the step statistics.
_ENGINE_SOURCES = ("certify/*.py", "harvest/stats.py", "harvest/schema.py", "harvest/decode.py")


def engine_digest() -> str:
    """sha256 of the sources that compute a harvest's columns (:data:`_ENGINE_SOURCES`, in name order).

    The package's version number does not change with every commit, so a harvest records this too:
    a folder harvested by other code is another configuration (not resumed, and the chapters'
    shared cache harvests afresh) instead of rows of two programs mixed in one folder."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for pattern in _ENGINE_SOURCES:
        for path in sorted(root.glob(pattern)):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    """sha256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


_SHA_MEMO = ".companion-sha256.json"


def _weights_sha256(folder: Path, files: list[Path]) -> dict[str, str]:
    """sha256 of each weight file, remembered beside them by name, size and modification time.

    Hashing the 1.5B model's 3.5 GB took 3.3 s of every harvest; a file whose size and
    modification time are those remembered is not read again. Only the cache's own folders (those
    with a ``companion-conversion.json`` record) keep a memo; any other folder, a checkout's
    assets among them, and one this process cannot write, is hashed each time.
    """
    memo_path = folder / _SHA_MEMO
    try:
        memo = json.loads(memo_path.read_text())
        memo = memo if isinstance(memo, dict) else {}
    except (OSError, ValueError):
        memo = {}
    out, changed = {}, False
    for f in files:
        st = f.stat()
        key = f"{f.name}:{st.st_size}:{st.st_mtime_ns}"
        if not isinstance(memo.get(key), str):
            memo[key] = file_sha256(f)
            changed = True
        out[f.name] = memo[key]
    if changed and (folder / "companion-conversion.json").is_file():
        try:
            from companion.atomic import write_text

            write_text(memo_path, json.dumps(memo, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass
    return out


def model_identity(model: Any) -> dict[str, Any]:
    """What identifies a model's weights: its hub commit, else sha256 of its weight files, else of its tensors.

    ``name`` is ``config._name_or_path``. A model loaded from the hub has ``config._commit_hash``
    (``revision``); a model loaded from a local folder gets the sha256 of each weight file
    there; a model built in memory gets the sha256 of its state dict (names, dtypes, shapes,
    bytes, in name order). ``config_sha256`` covers the architecture (the config as JSON).
    """
    cfg = model.config
    name = getattr(cfg, "_name_or_path", "") or getattr(model, "name_or_path", "") or ""
    ident: dict[str, Any] = {
        "name": str(name),
        "class": type(model).__name__,
        "config_sha256": hashlib.sha256(cfg.to_json_string(use_diff=False).encode()).hexdigest(),
        "parameters": int(sum(p.numel() for p in model.parameters())),
    }
    commit = getattr(cfg, "_commit_hash", None)
    folder = Path(str(name)) if name else None
    record = folder / "companion-conversion.json" if folder is not None else None
    if record is not None and record.is_file():  # converted from a GGUF file of the package-index registry
        try:
            conv = json.loads(record.read_text())
            ident["converted_from"] = {k: conv[k] for k in ("model", "display_name", "quantization", "gguf_sha256",
                                                             "conversion_version") if k in conv}
        except (OSError, ValueError):
            pass
    if commit:
        ident["revision"] = str(commit)
    elif folder is not None and folder.is_dir() and any(folder.glob(p) for p in _WEIGHT_PATTERNS):
        files = sorted({f for p in _WEIGHT_PATTERNS for f in folder.glob(p)})
        ident["weights_sha256"] = _weights_sha256(folder, files)
    else:
        import torch

        h = hashlib.sha256()
        seen: dict[tuple[int, int], str] = {}
        for key, tensor in sorted(model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            h.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
            where = (t.untyped_storage().data_ptr(), t.storage_offset())
            if where in seen:  # tied weights: hash the bytes once, name the alias
                h.update(f"={seen[where]};".encode())
                continue
            seen[where] = key
            h.update(memoryview(t.view(-1).view(torch.uint8).numpy()))
        ident["state_dict_sha256"] = h.hexdigest()
    return ident


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """sha256 of the tokenizer's full definition (fast tokenizers) or of its vocabulary."""
    ident: dict[str, Any] = {"name": str(getattr(tokenizer, "name_or_path", "")), "size": len(tokenizer)}
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        ident["sha256"] = hashlib.sha256(backend.to_str().encode()).hexdigest()
    else:
        vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
        ident["sha256"] = hashlib.sha256(json.dumps(vocab).encode()).hexdigest()
    return ident


def config_digest(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a configuration."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Human-readable list of the keys whose values differ (recursively)."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.extend(config_differences(a, b, name + "."))
        elif a != b:
            diffs.append(f"{name}: existing {json.dumps(a)}, now {json.dumps(b)}")
    return diffs


# -------------------------------------------------------------------------------------------------
# Atomic files


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON in ``path``, written atomically (:func:`companion.atomic.write_bytes`)."""
    atomic.write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n").encode())


def read_manifest(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a harvest directory.

    ``FileNotFoundError`` if there is none; ``ValueError`` naming the file if it is not valid
    JSON (cut short or edited) or not a companion harvest manifest.
    """
    path = Path(out_dir) / MANIFEST
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        what = (f"not valid JSON: {err.msg}, line {err.lineno} column {err.colno}"
                if isinstance(err, json.JSONDecodeError) else "not UTF-8")
        raise ValueError(f"{path} is damaged ({what}): restore it, or delete {Path(out_dir)} and rerun to "
                         "start the harvest over") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{path} is not a companion harvest manifest (format {got!r}, expected {FORMAT!r})")
    return manifest


# -------------------------------------------------------------------------------------------------
# Shards


def shard_name(index: int, rank: int) -> str:
    return f"shard-{index:05d}.rank{rank}.parquet"


def write_shard(out_dir: Path, index: int, rank: int, table: pa.Table, meta: dict[str, Any]) -> tuple[Path, str]:
    """Write one shard atomically (zstd Parquet, CRC-32 per page) with ``meta`` in its schema metadata.

    Returns the path and the sha256 of the bytes written (hashed before the rename into place).
    """
    table = table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
    folder = out_dir / SHARD_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / shard_name(index, rank)
    tmp = folder / f".{path.name}.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp, compression="zstd", write_page_checksum=True)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        digest = file_sha256(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path, digest


def shard_problem(path: Path, config_digest: str, sha256: str | None = None) -> str | None:
    """Why the shard file ``path`` cannot be used; None if it is sound.

    With ``sha256`` (the manifest's record): the file's sha256 must equal it. Without: the whole
    file is read, verifying every page's CRC-32, and its metadata must name ``config_digest``
    and the row count it holds. A shard of another configuration is not damage: it raises
    :class:`HarvestConfigError`.
    """
    if sha256 is not None:
        actual = file_sha256(path)
        if actual != sha256:
            return f"its sha256 is {actual[:12]}..., the manifest records {sha256[:12]}..."
    try:
        md = pq.read_schema(path).metadata or {}
        meta = json.loads(md[META_KEY]) if META_KEY in md else None
        if meta is None:
            return "no companion metadata in its footer"
        if sha256 is None:
            table = pq.read_table(path, page_checksum_verification=True)
            if table.num_rows != meta.get("rows"):
                return f"it holds {table.num_rows} rows, its metadata says {meta.get('rows')}"
    except (OSError, pa.ArrowException, ValueError) as err:  # truncated, corrupt pages, bad footer
        return " ".join(str(err).split()) or type(err).__name__
    if meta.get("config_digest") != config_digest:
        raise HarvestConfigError(f"{path} was written by a harvest with another configuration: move it away, or "
                                 "harvest into another folder")
    return None


def shard_meta(path: Path) -> dict[str, Any]:
    """The companion metadata of a shard file (reads only the footer; ``ValueError`` naming it if unreadable)."""
    try:
        md = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"{path} is not a readable Parquet file ({str(err).splitlines()[0]})") from None
    if META_KEY not in md:
        raise ValueError(f"{path} is not a companion harvest shard")
    return json.loads(md[META_KEY])


def existing_shards(out_dir: Path) -> dict[int, Path]:
    """Complete shard files by index. Two files for one index (two runs disagreeing) is an error."""
    found: dict[int, Path] = {}
    folder = out_dir / SHARD_DIR
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        m = _SHARD_RE.fullmatch(path.name)
        if not m:
            continue
        index = int(m.group(1))
        if index in found:
            raise ValueError(f"two files for shard {index} in {folder}: {found[index].name} and {path.name}")
        found[index] = path
    return found


def remove_stale_temporaries(out_dir: Path, rank: int, world: int) -> list[Path]:
    """Delete temporary shard files left by killed processes of this rank (rank 0: also of ranks >= world)."""
    removed = []
    folder = out_dir / SHARD_DIR
    if not folder.is_dir():
        return removed
    pattern = re.compile(r"\.shard-\d+\.rank(\d+)\.parquet\.tmp-\d+")
    for path in folder.iterdir():
        m = pattern.fullmatch(path.name)
        if m and (int(m.group(1)) == rank or (rank == 0 and int(m.group(1)) >= world)):
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


# -------------------------------------------------------------------------------------------------
# Reading traces back


def load_traces(out_dir: str | os.PathLike[str], columns: Sequence[str] | None = None, *,
                allow_incomplete: bool = False) -> pa.Table:
    """All steps of a harvest as one ``pyarrow.Table`` (shards in index order, prompts in shard order).

    ``columns`` selects columns (``None``: all). A harvest whose manifest is not ``complete``
    raises ``ValueError`` unless ``allow_incomplete``, which reads the shards present. Every
    shard is verified against the sha256 the manifest records for it (a shard the manifest does
    not list yet is read with its page checksums verified); a damaged one raises ``ValueError``
    naming the file. Use ``table.to_pandas()`` if pandas is installed (it is not a dependency),
    or ``table.column(name)`` / ``.to_numpy()`` without it. Rows of one prompt are contiguous and
    ordered by ``step``.
    """
    out = Path(out_dir)
    manifest = read_manifest(out)
    status = manifest.get("status")
    if status != "complete" and not allow_incomplete:
        why = {"running": "running, or stopped without a trace (killed)", "interrupted": "interrupted"}.get(status, status)
        raise ValueError(f"harvest in {out} is not complete (status {status!r}: {why}); "
                         "rerun the same command to finish it, or pass allow_incomplete=True")
    digest = manifest["config_digest"]
    recorded = {s["index"]: s for s in manifest.get("shards", [])}
    paths = existing_shards(out) if allow_incomplete else {i: out / s["file"] for i, s in recorded.items()}
    tables = []
    for index in sorted(paths):
        path = paths[index]
        if not path.is_file():
            raise ValueError(f"{path} is missing: rerun the harvest command to recompute it")
        sha = recorded[index].get("sha256") if index in recorded and recorded[index]["file"] == \
            f"{SHARD_DIR}/{path.name}" else None
        problem = shard_problem(path, digest, sha)
        if problem is not None:
            raise ValueError(f"{path} is damaged ({problem}): rerun the harvest command to recompute it")
        t = pq.read_table(path, columns=list(columns) if columns is not None else None,
                          page_checksum_verification=True)
        tables.append(t.replace_schema_metadata(None))
    if not tables:
        from companion.harvest.schema import arrow_schema

        full = arrow_schema(manifest["config"]["criteria"], manifest["config"]["tree_widths"],
                            manifest["config"]["drafter"] is not None, manifest["config"]["top_k"])
        if columns is not None:
            full = pa.schema([full.field(c) for c in columns])
        return full.empty_table()
    return pa.concat_tables(tables)


def iso_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def numerics_record(device: Any) -> dict[str, Any]:
    """What, besides models, dtype, batching and versions, changes the bits of a harvest on ``device``.

    On the CPU: the number of torch threads (float reductions are split across threads: one and
    two threads differ in the last bits) and the instruction set ATen dispatches to
    (``torch.backends.cpu.get_cpu_capability()``: AVX2, AVX512, ...). On CUDA: the GPU model, the
    CUDA and cuDNN versions, and whether float32 matmuls may use TF32. Part of the configuration
    digest, so a resume never mixes rows computed under two of these.
    """
    import torch

    dev = torch.device(device)
    record: dict[str, Any] = {"float32_matmul_precision": torch.get_float32_matmul_precision()}
    if dev.type == "cuda":
        record |= {"gpu": torch.cuda.get_device_name(dev), "cuda": torch.version.cuda,
                   "cudnn": torch.backends.cudnn.version(), "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    else:
        record |= {"torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    return record


def environment_record(device: Any, world: int) -> dict[str, Any]:
    """Versions, platform, device name: recorded, and partly compared on resume (see ``harvest``)."""
    import torch

    dev = torch.device(device)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    return {
        "versions": package_versions(),
        "platform": platform.platform(),
        "argv": list(sys.argv),
        "device": str(dev),
        "device_name": name,
        "world_size": world,
        "torch_threads": torch.get_num_threads(),
    }


def summarize_shards(paths: Iterable[Path], checksums: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Shard records for the manifest: the shards' own metadata, the file and its sha256.

    ``checksums`` maps file names to sha256 already known (computed when written or verified);
    the others are hashed here.
    """
    known = checksums or {}
    return [shard_meta(p) | {"file": f"{SHARD_DIR}/{p.name}", "sha256": known.get(p.name) or file_sha256(p)}
            for p in paths]
