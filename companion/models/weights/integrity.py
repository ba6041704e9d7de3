"""A cache folder's files against the sha256 its writer recorded, checked once per change.

Every folder the companion writes into the weights cache (a converted model, a shared
tokenizer, an assembled drafter) holds a record, ``companion-conversion.json``, that lists each
of its files with its size (``files``) and its sha256 (``sha256``), computed when the folder was
written (:func:`seal`). :func:`folder_problem` says why a folder's files are not the ones its
record lists: a file missing, at another size, or with other bytes of the same size.

Hashing a converted model (up to 3 GB) takes seconds, so a check is remembered: a memo beside
the record (``companion-checked.json``) holds, per file, the sha256 found and the file's size,
mtime, ctime and inode when it was found. A file whose four are unchanged since is not read
again, so an unchanged folder costs a ``stat`` per file and two small JSON reads; any write to a
file (same size or not), a copy or a restore changes one of them and the file is hashed again
on its next use. The same is remembered within the process, for caches the memo cannot be
written to (a read-only disk).

A record written before the sha256 were recorded (``files`` but no ``sha256``) is accepted at
the sizes it lists: its files are hashed on the first check and the digests kept in the memo
are the reference from then on (the record itself is never rewritten).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from pathlib import Path

from companion.atomic import write_text

#: The record every cache folder the companion writes holds.
RECORD = "companion-conversion.json"
#: The memo of the last check of a folder's files (:func:`folder_problem`).
MEMO = "companion-checked.json"
#: Files of a folder that are not its content (never listed in its record).
BOOKKEEPING = (RECORD, MEMO)
_BLOCK = 1 << 22
#: Checks made in this process: folder -> per file, the sha256 found and its stat keys then.
_CHECKED: dict[str, dict[str, dict]] = {}


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def read_record(folder: Path) -> dict | None:
    """The record of ``folder``, or None when it is missing or unreadable."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def foreign_files(folder: Path, record: dict | None = None) -> list[str]:
    """Entries of ``folder`` (relative paths, sorted) that its record does not list and that are not bookkeeping:
    what someone else put there, which replacing or deleting the folder would take along."""
    record = read_record(folder) if record is None else record
    listings = [(record or {}).get(key) for key in ("files", "sha256", "drafter_files_sha256")]
    listings = [x for x in listings if isinstance(x, dict) and x]
    if not listings:  # a record that lists no files cannot tell whose a file is: claim nothing
        return []
    listed = set(BOOKKEEPING).union(*listings)
    found = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if path.is_dir() and not path.is_symlink():
            continue
        if rel not in listed:
            found.append(rel)
    return sorted(found)


def _stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _read_memo(folder: Path) -> dict:
    try:
        memo = json.loads((folder / MEMO).read_text())
    except (OSError, ValueError):
        return {}
    files = memo.get("files") if isinstance(memo, dict) else None
    return files if isinstance(files, dict) else {}


def _write_memo(folder: Path, files: dict[str, dict]) -> None:
    """The memo, written atomically; a cache that cannot be written to keeps none (checked again next time)."""
    with contextlib.suppress(OSError):
        write_text(folder / MEMO, json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")


def seal(folder: Path, record: dict) -> dict:
    """Write ``record`` into ``folder`` with every file's size and sha256 added, and a memo of the check.

    Called on a finished folder before it is renamed into place (a rename changes none of its
    files' stat keys), so its first use reads nothing again.
    """
    names = sorted(f.name for f in folder.iterdir() if f.is_file() and f.name not in BOOKKEEPING)
    files, digests, memo = {}, {}, {}
    for name in names:
        path = folder / name
        digests[name] = file_sha256(path)
        st = path.stat()
        files[name] = st.st_size
        memo[name] = {"sha256": digests[name], "stat": _stat_key(st)}
    full = {**record, "files": files, "sha256": digests}
    write_text(folder / RECORD, json.dumps(full, indent=1, sort_keys=True) + "\n")
    _write_memo(folder, memo)
    return full


def folder_problem(folder: Path, record: dict | None = None, *, remember: bool = True) -> str | None:
    """Why ``folder``'s files are not those its record lists (one phrase), or None when they are.

    Every file the record lists must be a file at the recorded size; one whose stat keys changed
    since its last check (or that was never checked) is hashed and must have the recorded sha256
    (for an older record without digests: the one its memo holds, if any). ``remember``: keep
    what was found in the memo (and in this process) so that the next check of an unchanged
    folder reads no file. An unreadable file raises ``OSError``.
    """
    record = read_record(folder) if record is None else record
    if record is None:
        return "it has no readable record"
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "its record lists no files (written before this companion checked them)"
    digests = record.get("sha256") if isinstance(record.get("sha256"), dict) else None
    key = str(folder)
    in_process = _CHECKED.get(key, {})
    memo = _read_memo(folder)
    found: dict[str, dict] = {}
    hashed = False
    for name, size in files.items():
        path = folder / name
        try:
            st = path.stat()
        except OSError:
            return f"{name} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{name} is not a file"
        if st.st_size != size:
            return f"{name} has {st.st_size:,} bytes, its record says {size:,}"
        now = _stat_key(st)
        want = digests.get(name) if digests is not None else None
        seen = memo.get(name) if isinstance(memo.get(name), dict) else {}
        known = next((e for e in (in_process.get(name), seen) if isinstance(e, dict) and e.get("stat") == now
                      and e.get("sha256") is not None and (want is None or e["sha256"] == want)), None)
        if known is not None:  # unchanged since it was found intact
            found[name] = known
            continue
        got = file_sha256(path)
        reference = want if want is not None else seen.get("sha256")
        if reference is not None and got != reference:
            whose = "its record holds" if want is not None else "it had when first checked"
            return f"{name} has other bytes than the sha256 {whose} ({got[:12]}... not {reference[:12]}...)"
        found[name] = {"sha256": got, "stat": now}
        hashed = True
    if remember:
        if hashed or memo != found:
            _write_memo(folder, found)
        _CHECKED[key] = found
    return None
