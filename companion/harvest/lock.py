"""One writer per harvest folder: the advisory lock every harvest takes on the folder it writes.

``companion harvest`` and the book's chapter harvests (:mod:`companion.book.harvest_cache`) both
hold :func:`exclusive` while they write shards and the manifest of a folder, so two of them never
write one folder at once; the second waits, then resumes what the first wrote.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path


def lock_path(out: Path, rank: int = 0) -> Path:
    """The lock file of harvest folder ``out`` for process ``rank``: ``<out>.lock`` beside it (rank 0, and
    every single-process harvest), ``<out>.rank<r>.lock`` for the other processes of a distributed one."""
    return out.with_name(out.name + (".lock" if rank == 0 else f".rank{rank}.lock"))


@contextlib.contextmanager
def exclusive(out: Path, *, rank: int = 0, on_wait: Callable[[Path], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock on :func:`lock_path` while harvesting into ``out``: one writer per folder.

    A POSIX advisory lock (``fcntl.flock``): another process that takes it waits until the holder's
    block ends or the holder dies (the kernel releases it then: no stale lock to clean up). Every
    writer takes it, ``chapter_traces`` and ``companion harvest`` alike, so two of them never write
    shards or the manifest of one folder at once; the second then resumes the first's harvest (its
    complete shards are reused). ``on_wait(lock file)`` is called once if the lock is held by
    another process, before waiting. Each process of a distributed harvest locks its own rank's
    file, so ranks of one run never wait on each other, and rank ``r`` of a second run waits for
    rank ``r`` of the first. Where ``fcntl`` does not exist (Windows), nothing is locked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not a POSIX system
        yield
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(out, rank)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
