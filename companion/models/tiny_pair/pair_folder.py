"""A closed-world pair folder (the committed one, or a copy): what it holds, how to read and check it.

The layout is the committed ``companion/assets/default_pair``'s (built by the retired ``companion
retrain``; see :mod:`companion.models.tiny_pair`). ``pair-report`` reads a folder through this module.
Every problem with a folder given as a pair (missing, a file, a part missing, a damaged or foreign
manifest, prompts that do not parse) is a :class:`PairFolderError` with one line, found before any
model is loaded.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from companion.models.tiny_pair.chat_corpus import TASK_SETS

MANIFEST_NAME = "manifest.json"
PAIR_PARTS = (MANIFEST_NAME, "target/config.json", "drafter/config.json", "prompts.jsonl")


class PairFolderError(ValueError):
    """A folder given as a pair that is not one (missing, a file, no manifest, a part missing, a damaged manifest)."""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest itself, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def verify_files(pair_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """Relative paths whose sha256 differs from the manifest's (or that are missing)."""
    bad = []
    for rel, digest in manifest.get("files_sha256", {}).items():
        p = pair_dir / rel
        if not p.is_file() or sha256_file(p) != digest:
            bad.append(rel)
    return bad


def read_pair_manifest(pair_dir: str | Path) -> dict[str, Any]:
    """The manifest of a pair folder, after checking it is one.

    Checks, in this order: the folder and its parts (:data:`PAIR_PARTS`), the manifest is a JSON
    object, its ``config`` (the recipe it was built with, a record) is a mapping whose ``task_set``
    is one this version generates (:data:`~companion.models.tiny_pair.chat_corpus.TASK_SETS`, so its
    prompts can be regenerated and checked), ``files_sha256`` (when present) maps paths to
    digests, and the sections a report reads (``training``, ``figures``, ``models``, ``corpus``)
    are mappings when present. Raises :class:`PairFolderError` with one line naming the folder or
    file and what is wrong, before any model is loaded.
    """
    pair_dir = Path(pair_dir)
    what = "a pair folder holds " + ", ".join(PAIR_PARTS) + " (as companion/assets/default_pair does)"
    if not pair_dir.exists():
        raise PairFolderError(f"{pair_dir}: no such folder; {what}")
    if not pair_dir.is_dir():
        raise PairFolderError(f"{pair_dir} is a file; {what}")
    if (pair_dir / "config.json").is_file() and not (pair_dir / MANIFEST_NAME).exists():
        raise PairFolderError(f"{pair_dir} is a single model folder, not a pair; {what}")
    missing = [part for part in PAIR_PARTS if not (pair_dir / part).is_file()]
    if missing:
        raise PairFolderError(f"{pair_dir}: not a pair folder (no {', '.join(missing)}); {what}")
    path = pair_dir / MANIFEST_NAME
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise PairFolderError(f"{path} is damaged (not valid JSON: {err})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict):
        raise PairFolderError(f"{path} is not a pair manifest (no 'config' mapping)")
    task_set = manifest["config"].get("task_set")
    if task_set not in TASK_SETS:
        raise PairFolderError(f"{path}: its config's task_set {task_set!r} is not one this version generates "
                              f"({', '.join(TASK_SETS)})")
    digests = manifest.get("files_sha256")
    if digests is not None and not (isinstance(digests, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in digests.items())):
        raise PairFolderError(f"{path} is damaged: 'files_sha256' must map file paths to sha256 digests, "
                              f"got {type(digests).__name__}")
    corpus = manifest.get("corpus")
    if not isinstance(corpus, dict) or not isinstance(corpus.get("digest_sha256"), str):
        raise PairFolderError(f"{path} is not a pair manifest (no 'corpus' record with its digest_sha256)")
    for section in ("training", "figures", "models", "speed"):
        value = manifest.get(section)
        if value is not None and not isinstance(value, dict):
            raise PairFolderError(f"{path} is damaged: {section!r} must be a mapping, got {type(value).__name__}")
    return manifest


def read_pair_prompts(pair_dir: str | Path) -> list[Any]:
    """The pair's ``prompts.jsonl`` (:func:`companion.prompts.sets.load_prompts`); :class:`PairFolderError` if it does not parse."""
    from companion.prompts.sets import load_prompts

    try:
        return load_prompts(Path(pair_dir) / "prompts.jsonl")
    except (ValueError, OSError) as err:
        raise PairFolderError(f"{' '.join(str(err).split())}") from None
