"""``pair-report``: check a saved closed-world pair against its manifest, load it, and describe it."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from companion.models.tiny_pair.pair_folder import (  # noqa: F401 (re-exported: where callers found them first)
    PAIR_PARTS, PairFolderError, read_pair_manifest, read_pair_prompts, verify_files)


def pair_report(pair_dir: str | Path, *, load: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, fresh)``: the stored manifest and what was checked now.

    ``fresh`` holds ``files_ok``/``files_bad`` (every file's sha256 against the manifest) and, with
    ``load``, ``load_seconds``: the time :func:`companion.models.loading.load_pair` takes on this machine
    (float32, CPU). The figures are the manifest's, measured when the pair was built; the recipe that
    measured them was retired with ``companion retrain`` (see :mod:`companion.models.tiny_pair`).
    """
    pair_dir = Path(pair_dir)
    manifest = read_pair_manifest(pair_dir)
    read_pair_prompts(pair_dir)
    bad = verify_files(pair_dir, manifest)
    fresh: dict[str, Any] = {"files_ok": not bad, "files_bad": bad}
    if load and not bad:
        import torch

        from companion.models.loading import load_pair

        start = time.perf_counter()
        load_pair(pair_dir / "target", pair_dir / "drafter", device="cpu", dtype=torch.float32)
        fresh["load_seconds"] = round(time.perf_counter() - start, 3)
    return manifest, fresh
