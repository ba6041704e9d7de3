"""Writing files and folders so that a reader never sees half of one.

Every writer here prepares the new content under a temporary name in the same folder (one
filesystem, so the final step is a rename) and then renames it into place with ``os.replace``,
which POSIX makes atomic: a reader sees the old file or the new one, never a mixture, and an
interruption leaves the old one intact. Temporary names carry the process id, so two processes
writing the same path do not trample each other's temporaries.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path


def write_bytes(path: Path, data: bytes, tag: str = "") -> None:
    """Write ``data`` to ``path`` via a temporary file beside it, fsync and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp{tag}-{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(path: Path, text: str) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def replace_dir(staging: Path, out_dir: Path, *, aside: Path | None = None) -> None:
    """Move a finished ``staging`` folder to ``out_dir``, replacing any previous one.

    Two renames: the previous folder aside, the new one in. Between them ``out_dir`` is briefly
    absent, never half-written; the previous folder is removed only once the new one is in place.

    ``staging`` and ``aside`` must be on ``out_dir``'s filesystem (a rename cannot cross one);
    usually ``staging`` lies beside ``out_dir``. ``aside`` is where the previous folder waits
    while the new one moves in: by default ``<out_dir>.old-<pid>`` beside it; a caller with a
    scratch folder of its own may name a path in it, so that an interruption between the two
    renames leaves the previous folder there rather than beside ``out_dir``. Once the new folder
    is in place the replacement has succeeded: a previous folder that cannot be removed is left
    at ``aside`` rather than reported as a failure. If the second rename fails, the previous
    folder is put back before the error is raised.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if out_dir.exists():
        old = aside if aside is not None else out_dir.with_name(out_dir.name + f".old-{os.getpid()}")
        os.replace(out_dir, old)
    try:
        os.replace(staging, out_dir)
    except BaseException:
        if old is not None:  # put the previous folder back: out_dir is never left absent by a failure
            os.replace(old, out_dir)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
