"""Where a book project's files are, and the errors its commands report."""
from __future__ import annotations


from dataclasses import dataclass
from pathlib import Path
from typing import Any


NOTEBOOK_DIR = "notebooks"
KERNEL_NAME = "python3"


class ReproduceError(Exception):
    """A problem the user can fix, found before anything ran: bad options, profile, table of contents.

    The command line prints it as one line and exits with status 2, having written nothing.
    """

    exit_code = 2


class RunFailure(ReproduceError):
    """Something failed while running: a notebook, the book build. Exit status 1."""

    exit_code = 1


def yaml_module() -> Any:
    """PyYAML, imported on use: `companion` loads this module for its command list, and the
    library itself must import without the book's dependencies (requirements.txt)."""
    try:
        import yaml
    except ImportError:
        raise ReproduceError("PyYAML is missing: install the book's dependencies (pip install -r requirements.txt)") from None
    return yaml


# --------------------------------------------------------------------------------------------
# Project layout


@dataclass(frozen=True)
class Layout:
    """Where everything lives for one project root."""

    root: Path
    figures: Path

    @property
    def build(self) -> Path:
        return self.root / "_build"

    @property
    def executed(self) -> Path:
        return self.build / "executed"

    @property
    def failed(self) -> Path:
        return self.build / "failed"

    @property
    def record(self) -> Path:
        return self.build / "run-record.json"

    @property
    def html(self) -> Path:
        return self.build / "html"

    @property
    def work(self) -> Path:
        return self.build / "work"

    @classmethod
    def at(cls, root: Path, figures: Path | None = None) -> "Layout":
        root = root.resolve()
        return cls(root=root, figures=(figures or root / "figures").resolve())


def find_root(start: Path | None = None) -> Path:
    """The project root: ``start`` (default: the working directory) or a parent of it that
    holds ``_toc.yml`` and ``_config.yml``, else the checkout this package was imported from."""
    candidates = []
    here = (start or Path.cwd()).resolve()
    candidates.extend([here, *here.parents])
    candidates.append(Path(__file__).resolve().parents[2])  # companion/book/layout.py -> checkout
    for path in candidates:
        if (path / "_toc.yml").is_file() and (path / "_config.yml").is_file():
            return path
    raise ReproduceError(
        f"no book here: neither {here} nor its parents hold _toc.yml and _config.yml "
        "(run from the companion checkout, or pass --root)"
    )
