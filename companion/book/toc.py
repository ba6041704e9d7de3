"""The chapters, read from ``_toc.yml`` (every entry under ``notebooks/``), in order."""
from __future__ import annotations


from dataclasses import dataclass
from pathlib import Path
from typing import Any

from companion.book.layout import NOTEBOOK_DIR, ReproduceError, yaml_module

# --------------------------------------------------------------------------------------------
# Chapters (from _toc.yml)


@dataclass(frozen=True)
class Chapter:
    """One executable chapter: a notebook listed in the table of contents."""

    name: str        # "03_strict_greedy"
    toc_file: str    # "notebooks/03_strict_greedy", as written in _toc.yml
    path: Path       # <root>/notebooks/03_strict_greedy.ipynb

    @property
    def exists(self) -> bool:
        return self.path.is_file()


def toc_files(toc: dict[str, Any]) -> list[str]:
    """Every ``file``/``root`` entry of a jb-book table of contents, in reading order."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    found.append(node[key])
            for key in ("parts", "chapters", "sections", "subtrees", "entries"):
                if key in node:
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return found


def read_toc(root: Path) -> dict[str, Any]:
    path = root / "_toc.yml"
    yaml = yaml_module()
    try:
        toc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReproduceError(f"missing table of contents {path}") from None
    except yaml.YAMLError as err:
        raise ReproduceError(f"cannot parse {path}: {err}") from err
    if not isinstance(toc, dict):
        raise ReproduceError(f"{path} is not a jb-book table of contents")
    return toc


def read_chapters(root: Path) -> list[Chapter]:
    """The executable chapters, in the order of ``_toc.yml`` (whether written yet or not)."""
    chapters = []
    for entry in toc_files(read_toc(root)):
        stem = entry[:-len(".ipynb")] if entry.endswith(".ipynb") else entry
        if stem.startswith(NOTEBOOK_DIR + "/"):
            chapters.append(Chapter(Path(stem).name, entry, root / f"{stem}.ipynb"))
    return chapters


def select_chapters(chapters: list[Chapter], only: list[str]) -> list[Chapter]:
    """The chapters named by ``--only`` (a full name, a notebook path, or a unique prefix such
    as ``03``), in table-of-contents order; all of them when ``only`` is empty."""
    if not only:
        return list(chapters)
    wanted: set[str] = set()
    names = [c.name for c in chapters]
    for raw in only:
        key = Path(raw).name
        key = key[:-len(".ipynb")] if key.endswith(".ipynb") else key
        matches = [n for n in names if n == key] or [n for n in names if n.startswith(key)]
        if len(matches) != 1:
            why = "matches several chapters" if matches else "is not a chapter in _toc.yml"
            raise ReproduceError(f"--only {raw!r} {why}; chapters: {', '.join(names)}")
        wanted.add(matches[0])
    return [c for c in chapters if c.name in wanted]


def filter_toc(node: Any, keep: set[str]) -> Any:
    """A copy of the toc without the notebook entries not in ``keep`` (and parts left empty)."""
    if isinstance(node, list):
        items = [filter_toc(x, keep) for x in node]
        return [x for x in items if x is not None]
    if isinstance(node, dict):
        entry = node.get("file")
        if isinstance(entry, str) and entry.startswith(NOTEBOOK_DIR + "/") and entry not in keep:
            return None
        out = {k: filter_toc(v, keep) if k in ("parts", "chapters", "sections") else v for k, v in node.items()}
        if "chapters" in node and not out["chapters"] and "file" not in node:
            return None
        return out
    return node
