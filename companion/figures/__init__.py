"""Figure code shared by the notebooks, and the one switch that writes figures to disk.

``save_figure(fig, name)`` writes ``<dir>/<name>.png`` and ``<dir>/<name>.pdf`` when a figure
directory is set (``COMPANION_FIGURES_DIR`` in the environment, which ``companion reproduce`` sets,
or the ``directory`` argument); otherwise it does nothing, so notebooks run read-only by default.
Names are stable so that the reproduction-status page can list what produced each figure.
Inside a notebook kernel, a saved figure also leaves an invisible marker in the cell's output
(:data:`FIGURE_MARKER`); when the book is built, the marker becomes the figure's PNG and PDF
download links, placed under the figure.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

FIGURES_ENV = "COMPANION_FIGURES_DIR"
FIGURE_MARKER = re.compile(r"^<!-- companion-figure: ([a-z0-9][a-z0-9_\-]*) -->$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


def figures_dir(directory: str | os.PathLike[str] | None = None) -> Path | None:
    """The directory figures go to, or ``None`` when saving is switched off."""
    chosen = directory if directory is not None else os.environ.get(FIGURES_ENV)
    return Path(chosen) if chosen else None


def save_figure(fig, name: str, directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Write ``fig`` as PNG (150 dpi) and PDF under a stable ``name``; return the paths written.

    Files are written to a temporary name and renamed, so an interrupted run never leaves a
    half-written figure behind.
    """
    if not _NAME.match(name):
        raise ValueError(f"figure name {name!r} must be lower-case letters, digits, '_' or '-'")
    target = figures_dir(directory)
    if target is None:
        return []
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for ext, kwargs in (("png", {"dpi": 150}), ("pdf", {})):
        final = target / f"{name}.{ext}"
        tmp = target / f".{name}.{ext}.tmp"
        fig.savefig(tmp, format=ext, bbox_inches="tight", **kwargs)
        os.replace(tmp, final)
        written.append(final)
    _mark_in_notebook(name)
    return written


def _mark_in_notebook(name: str) -> None:
    """Leave ``<!-- companion-figure: name -->`` in the running cell's output (kernels only)."""
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or not hasattr(shell, "kernel"):
        return
    display({"text/markdown": f"<!-- companion-figure: {name} -->"}, raw=True)
