"""One writer per harvest folder: a marker file beside it, created exclusively, that also works on NFS.

``companion harvest`` and the book's chapter harvests (:mod:`companion.book.harvest_cache`) both
hold :func:`exclusive` while they write shards and the manifest of a folder, so two of them never
write one folder at once; the second waits, then resumes what the first wrote.

The lock is a file, ``<out>.lock`` (``<out>.rank<r>.lock`` for rank ``r > 0`` of a distributed
harvest), created with ``O_CREAT | O_EXCL``: of two processes creating it, exactly one succeeds.
Local filesystems, NFS from version 3 on and Lustre make that creation atomic on the server, so
the lock holds between processes of different nodes sharing one folder, where an advisory
``flock`` may be local to each node or unsupported. Its content names the holder (machine,
process id, a random token); while held, a thread touches it every :data:`HEARTBEAT_S` seconds.

A holder that dies leaves its file behind; a waiter takes it over when it is *stale*:

* the holder ran on this machine (same boot id and process namespace) and its process is gone, or
* its modification time has not changed for ``stale_after`` seconds (:data:`STALE_AFTER_S`,
  five minutes) of the waiter's own clock: the holder stopped its heartbeat, on whatever node.
  The waiter compares the file's time with itself, never with its own clock, so clocks that
  disagree between nodes do not matter; five minutes leaves room for NFS attribute caching
  (a minute at most by default) and a busy server.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HEARTBEAT_S = 15.0
"""Seconds between two touches of a held lock file."""

STALE_AFTER_S = 300.0
"""Seconds a lock file may go untouched, as a waiter watches it, before the waiter takes it over."""

_POLL_S = 0.25  # a waiter looks again this often


def lock_path(out: Path, rank: int = 0) -> Path:
    """The lock file of harvest folder ``out`` for process ``rank``: ``<out>.lock`` beside it (rank 0, and
    every single-process harvest), ``<out>.rank<r>.lock`` for the other processes of a distributed one."""
    return out.with_name(out.name + (".lock" if rank == 0 else f".rank{rank}.lock"))


def machine_id() -> str:
    """What tells this machine's processes from another's: the kernel's boot id and this process's pid
    namespace (two containers on one host share the boot id, not the namespace); the host name where
    ``/proc`` does not say."""
    parts = []
    for source in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(source) if source.endswith("/pid") else Path(source).read_text().strip())
        except OSError:
            parts.append("")
    return ":".join(parts) if any(parts) else socket.gethostname()


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder a lock file names (``host``, ``machine``, ``pid``, ``token``, ``since``); None if the
    file is gone, or unreadable (being written: its creator writes it right after creating it)."""
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def _process_gone(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def holder_is_gone(holder: dict[str, Any] | None) -> bool:
    """True when ``holder`` ran on this machine and its process no longer exists."""
    return holder is not None and holder.get("machine") == machine_id() and _process_gone(holder.get("pid"))


def _try_create(path: Path, token: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    record = {"host": socket.gethostname(), "machine": machine_id(), "pid": os.getpid(), "token": token,
              "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return True


def _take_over(path: Path, stale: dict[str, Any] | None) -> None:
    """Remove the stale lock file ``path`` whose holder was ``stale``, unless another waiter replaced it
    meanwhile: it is renamed aside first (atomic), and put back if what was renamed is not the stale one."""
    aside = path.with_name(f"{path.name}.stale-{secrets.token_hex(4)}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:  # another waiter took it over first
        return
    moved = read_holder(aside)
    if stale is not None and moved is not None and moved.get("token") != stale.get("token"):
        with contextlib.suppress(FileExistsError, OSError):
            os.link(aside, path)  # a fresh holder's file: back where it was (link fails if taken again)
    aside.unlink(missing_ok=True)


def _heartbeat(path: Path, token: str, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        holder = read_holder(path)
        if holder is None or holder.get("token") != token:
            return  # taken over (this process was thought dead): nothing of ours to touch
        with contextlib.suppress(OSError):
            os.utime(path)


@contextlib.contextmanager
def exclusive(out: Path, *, rank: int = 0, on_wait: Callable[[Path], None] | None = None,
              stale_after: float = STALE_AFTER_S, heartbeat: float = HEARTBEAT_S) -> Iterator[None]:
    """Hold the lock :func:`lock_path` ``(out, rank)`` while harvesting into ``out``: one writer per folder.

    Creates the lock file exclusively, or waits until it can: until its holder's block ends, or the
    holder is found dead (see the module docstring: on this machine at once, elsewhere after
    ``stale_after`` seconds without a heartbeat). ``on_wait(lock file)`` is called once, before
    waiting. Every writer takes it, ``chapter_traces`` and ``companion harvest`` alike, so two of
    them never write shards or the manifest of one folder at once; the second then resumes the
    first's harvest (its complete shards are reused). Each process of a distributed harvest locks
    its own rank's file, so ranks of one run never wait on each other, and rank ``r`` of a second
    run waits for rank ``r`` of the first. The file is removed when the block ends.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(out, rank)
    token = secrets.token_hex(16)
    told = False
    seen: tuple[Any, float] | None = None  # (the file's mtime, when this waiter first saw it so)
    while not _try_create(path, token):
        holder = read_holder(path)
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            continue  # released between our attempt and the stat: try again at once
        now = time.monotonic()
        if seen is None or seen[0] != mtime:
            seen = (mtime, now)
        if holder_is_gone(holder) or now - seen[1] >= stale_after:
            _take_over(path, holder)
            seen = None
            continue
        if not told and on_wait is not None:
            on_wait(path)
        told = True
        time.sleep(_POLL_S)
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(path, token, stop, heartbeat), daemon=True,
                            name=f"lock heartbeat {path.name}")
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        holder = read_holder(path)
        if holder is not None and holder.get("token") == token:
            path.unlink(missing_ok=True)
