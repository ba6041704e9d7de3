"""Where a harvest folder stands, from its manifest: ``companion harvest-status DIR``.

What a cluster user checks before analysing a run (or after a node died): the manifest's status
(``complete``; ``running``: running now, or killed without a trace; ``incomplete``; ``interrupted``),
how many rows, prompts and shards it holds out of how many, which shards are missing, the runs
that wrote it (one per launch, with its number of processes) and the lock files beside the folder
(:mod:`companion.harvest.lock`) with their holders.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from companion.harvest import lock, store


def harvest_status(out: str | os.PathLike[str]) -> dict[str, Any]:
    """The status of harvest folder ``out`` as a JSON-able dict.

    Keys: ``out``, ``status``, ``rows``, ``prompts``, ``shards`` (complete), ``shards_total``
    (complete + missing), ``missing_shards``, ``runs`` (``[{"world_size", "rows", "finished"}]``),
    ``prompt_set``, ``preset`` and ``locks`` (``[{"file", "host", "pid", "since", "untouched_s"}]``:
    ``untouched_s`` is the seconds since the file's last heartbeat by this machine's clock).
    Raises ``FileNotFoundError`` without a manifest and ``ValueError`` for a damaged one
    (``companion.harvest.read_manifest``).
    """
    folder = Path(out)
    manifest = store.read_manifest(folder)
    totals = manifest.get("totals", {})
    missing = list(manifest.get("missing_shards", []))
    done = int(totals.get("shards", 0))
    return {
        "out": str(folder),
        "status": manifest.get("status"),
        "rows": int(totals.get("rows", 0)),
        "prompts": int(totals.get("prompts", 0)),
        "shards": done,
        "shards_total": done + len(missing),
        "missing_shards": missing,
        "runs": [{"world_size": r.get("world_size"), "rows": r.get("rows"), "finished": r.get("finished")}
                 for r in manifest.get("runs", [])],
        "prompt_set": manifest.get("prompt_set_name"),
        "preset": manifest.get("extra", {}).get("preset"),
        "locks": _locks(folder),
    }


def _locks(folder: Path) -> list[dict[str, Any]]:
    """The lock files of ``folder`` (every rank's), with the holder each names."""
    found = []
    for path in sorted(folder.parent.glob(folder.name + ".*lock")):
        if path.name not in (folder.name + ".lock",) and not path.name.startswith(folder.name + ".rank"):
            continue
        holder = lock.read_holder(path) or {}
        try:
            untouched = round(time.time() - path.stat().st_mtime, 1)
        except FileNotFoundError:
            continue
        found.append({"file": str(path), "host": holder.get("host"), "pid": holder.get("pid"),
                      "since": holder.get("since"), "untouched_s": untouched})
    return found
