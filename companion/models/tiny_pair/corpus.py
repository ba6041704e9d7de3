"""The training corpus of the embedded pair: the running interpreter's standard library source.

Every Python installation carries it, so the pair can be rebuilt offline on any machine. The
selection is a fixed, documented rule applied to the sorted list of ``.py`` files under
``sysconfig.get_paths()["stdlib"]``:

* excluded top-level folders: ``site-packages`` (third-party code), ``idlelib`` and
  ``turtledemo`` (applications/demos), ``encodings`` (generated codec tables), ``pydoc_data``
  (one 750 kB string literal of documentation), ``lib-dynload`` and ``config-*`` (build output);
* excluded anywhere: any path with a folder named ``test`` or ``tests`` (test suites are huge,
  full of deliberately malformed code, and some distributions strip them);
* excluded files: ``_sysconfigdata*.py`` (machine-specific build settings) and ``__hello__.py``,
  ``__phello__`` (freeze-test stubs).

The held-out split is decided by the file's relative path alone (sha256 bucket), so a file stays on
the same side across Python patch releases. The corpus digest is a sha256 over the selected
files' relative paths and contents in sorted order, recorded in the manifest so a rebuild on a
different Python can tell that it trained on different text.
"""
from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

EXCLUDED_TOP_LEVEL: frozenset[str] = frozenset(
    {"site-packages", "dist-packages", "idlelib", "turtledemo", "encodings", "pydoc_data",
     "lib-dynload", "__phello__"}
)
EXCLUDED_ANY_LEVEL: frozenset[str] = frozenset({"test", "tests"})
EXCLUDED_FILE_PREFIXES: tuple[str, ...] = ("_sysconfigdata", "__hello__")
HELD_OUT_PERCENT: int = 5  # about 5% of files (by path hash) are never trained on


@dataclass(frozen=True)
class SourceFile:
    """One selected stdlib file: its path relative to the stdlib root and its text."""

    relpath: str
    text: str

    @property
    def held_out(self) -> bool:
        """Whether the file belongs to the held-out split."""
        return is_held_out(self.relpath)


def stdlib_root() -> Path:
    """The running interpreter's pure-Python standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def is_held_out(relpath: str) -> bool:
    """Whether a file belongs to the held-out split: sha256 of its POSIX relative path, bucketed mod 100."""
    bucket = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16) % 100
    return bucket < HELD_OUT_PERCENT


def _selected(rel: Path) -> bool:
    parts = rel.parts
    if parts[0] in EXCLUDED_TOP_LEVEL or parts[0].startswith("config-"):
        return False
    if any(p in EXCLUDED_ANY_LEVEL for p in parts[:-1]):
        return False
    return not rel.name.startswith(EXCLUDED_FILE_PREFIXES)


def list_stdlib_files(root: Path | None = None) -> list[str]:
    """Sorted POSIX relative paths of the selected ``.py`` files under ``root`` (default: this stdlib)."""
    root = stdlib_root() if root is None else root
    rels = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if path.is_file() and _selected(rel):
            rels.append(rel.as_posix())
    return sorted(rels)


def read_source(path: Path) -> str:
    """File text as UTF-8 with newlines normalised to ``\\n`` (undecodable bytes replaced, never dropped)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def load_corpus(root: Path | None = None, max_files: int | None = None) -> list[SourceFile]:
    """The selected files in sorted order; ``max_files`` keeps an evenly spaced subset (for quick builds)."""
    root = stdlib_root() if root is None else root
    rels = list_stdlib_files(root)
    if max_files is not None and max_files < len(rels):
        # Even spacing within each split keeps a mix of packages and both splits (1 in 8 held out).
        held = [r for r in rels if is_held_out(r)]
        train = [r for r in rels if not is_held_out(r)]
        n_held = min(len(held), max(1, max_files // 8))
        rels = sorted(_evenly(held, n_held) + _evenly(train, max_files - n_held))
    return [SourceFile(rel, read_source(root / rel)) for rel in rels]


def _evenly(items: list[str], k: int) -> list[str]:
    if k >= len(items):
        return list(items)
    step = len(items) / k
    return [items[int(i * step)] for i in range(k)]


def split_corpus(files: list[SourceFile]) -> tuple[list[SourceFile], list[SourceFile]]:
    """(train, held_out) lists, each keeping the sorted order."""
    train = [f for f in files if not f.held_out]
    held = [f for f in files if f.held_out]
    return train, held


def corpus_digest(files: list[SourceFile]) -> str:
    """sha256 over every file's relative path and normalised text, in order (length-prefixed, unambiguous)."""
    h = hashlib.sha256()
    for f in files:
        for chunk in (f.relpath.encode("utf-8"), f.text.encode("utf-8")):
            h.update(len(chunk).to_bytes(8, "little"))
            h.update(chunk)
    return h.hexdigest()
