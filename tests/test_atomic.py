"""companion.atomic.replace_dir: the one directory replace that the book, the harvest cache and the weights use."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from companion import atomic


def _folder(path: Path, **files: str) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _contents(path: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(path.iterdir())}


def test_replace_dir_moves_a_new_folder_in_and_removes_the_old(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", a="old", gone="old")
    staging = _folder(tmp_path / ".out.partial", a="new")
    atomic.replace_dir(staging, out)
    assert _contents(out) == {"a": "new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging, no .old-* left beside it


def test_replace_dir_creates_the_parent_when_nothing_was_there(tmp_path: Path) -> None:
    staging = _folder(tmp_path / "staging", a="new")
    atomic.replace_dir(staging, tmp_path / "deep" / "out")
    assert _contents(tmp_path / "deep" / "out") == {"a": "new"}
    assert not staging.exists()


def test_replace_dir_puts_the_previous_folder_aside_where_asked(tmp_path: Path, monkeypatch) -> None:
    out = _folder(tmp_path / "html", page="old")
    work = _folder(tmp_path / "work")
    staging = _folder(work / "built", page="new")
    seen: list[tuple[str, str]] = []
    real = os.replace

    def spy(src, dst) -> None:
        seen.append((Path(src).name, Path(dst).name))
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", spy)
    atomic.replace_dir(staging, out, aside=work / "previous-html")
    assert seen == [("html", "previous-html"), ("built", "html")]
    assert _contents(out) == {"page": "new"}
    assert not (work / "previous-html").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["html", "work"]


def test_replace_dir_puts_the_previous_folder_back_when_the_new_one_cannot_move_in(tmp_path: Path) -> None:
    out = _folder(tmp_path / "out", a="old")
    with pytest.raises(FileNotFoundError):
        atomic.replace_dir(tmp_path / "no-such-staging", out)
    assert _contents(out) == {"a": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_replace_dir_succeeds_when_the_previous_folder_cannot_be_removed(tmp_path: Path, monkeypatch) -> None:
    out = _folder(tmp_path / "out", a="old")
    staging = _folder(tmp_path / "staging", a="new")

    def refuse(path, ignore_errors: bool = False, **_) -> None:
        if not ignore_errors:
            raise PermissionError(f"cannot remove {path}")

    monkeypatch.setattr(atomic.shutil, "rmtree", refuse)
    atomic.replace_dir(staging, out)
    assert _contents(out) == {"a": "new"}
    left = [p.name for p in tmp_path.iterdir() if p.name != "out"]
    assert left == [f"out.old-{os.getpid()}"]  # left aside, not reported as a failure


def test_book_swap_uses_the_work_folder_for_the_previous_book(tmp_path: Path) -> None:
    from companion.book.stage import _swap_into_place

    final = _folder(tmp_path / "_build" / "html", **{"index.html": "old"})
    work = _folder(tmp_path / "_build" / "work" / "book-1")
    built = _folder(work / "out" / "_build" / "html", **{"index.html": "new"})
    _swap_into_place(built, final, work)
    assert _contents(final) == {"index.html": "new"}
    assert sorted(p.name for p in (tmp_path / "_build").iterdir()) == ["html", "work"]
    assert not (work / "previous-html").exists() and not built.exists()
