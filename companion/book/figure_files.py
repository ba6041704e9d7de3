"""The figure files of a run: published to ``figures/``, linked under each figure in the book."""
from __future__ import annotations


import os
import shutil
from pathlib import Path

from companion.figures import FIGURE_MARKER, PHONE_SUFFIX
from companion.book.record import (
    RunRecord,
)
from companion.book.layout import RunFailure

def publish_figures(chapter: str, files: list[Path], record: RunRecord, target: Path) -> list[str]:
    """Move a chapter's new figure files into ``target`` and drop its figures that are gone.

    Two chapters may not write the same figure name: the status page must say which one
    produced each figure. A figure's phone variant (``NAME.phone.png``, written by
    ``save_figure`` when the figure reads too small on a phone) travels with it, and a variant the
    new run did not write is removed; the names returned are the figures' alone.
    """
    names = sorted({figure_name(p) for p in files})
    for name in names:
        owner = record.figure_owner(name)
        if owner is not None and owner != chapter:
            raise RunFailure(f"figure {name!r} written by {chapter} was already written by {owner}")
    target.mkdir(parents=True, exist_ok=True)
    old = record.chapters.get(chapter)
    for name in (old.figures if old else []):
        if name not in names:
            for ext in ("png", "pdf", PHONE_SUFFIX.lstrip(".") + ".png"):
                (target / f"{name}.{ext}").unlink(missing_ok=True)
    written = {p.name for p in files}
    for name in names:
        if f"{name}{PHONE_SUFFIX}.png" not in written:
            (target / f"{name}{PHONE_SUFFIX}.png").unlink(missing_ok=True)
    for path in files:
        try:
            os.replace(path, target / path.name)
        except OSError:  # another filesystem: copy to a temporary name, then rename
            tmp = target / f".{path.name}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, target / path.name)
    return names


def figure_name(path: Path) -> str:
    """The figure a file belongs to: ``a.png``, ``a.pdf`` and ``a.phone.png`` all to ``a``."""
    return path.name.split(".", 1)[0]   # figure names hold no dot (save_figure refuses one)


def phone_variant(figures: Path, name: str) -> Path | None:
    """The phone variant of figure ``name`` in ``figures``, if it has one."""
    path = figures / f"{name}{PHONE_SUFFIX}.png"
    return path if path.is_file() else None


def link_figures(path: Path, available: set[str]) -> int:
    """Replace each figure marker in a notebook's outputs by the figure's download links.

    ``save_figure`` leaves ``<!-- companion-figure: NAME -->`` in the cell that saved the figure,
    before the figure itself is displayed; here the marker is removed and the links to the
    staged ``figures/NAME.png`` and ``.pdf`` are appended after the cell's last image, so they
    sit under the figure. Markers of figures that are not staged are dropped. Returns how many
    links were added.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    added = 0
    for cell in nb.cells:
        names, kept = [], []
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/markdown", "") if out.get("output_type") == "display_data" else ""
            match = FIGURE_MARKER.match(text.strip()) if isinstance(text, str) else None
            if match:
                names.append(match.group(1))
            else:
                kept.append(out)
        if not names:
            continue
        links = [f"{{download}}`{name}.png <../figures/{name}.png>` · {{download}}`{name}.pdf <../figures/{name}.pdf>`"
                 for name in names if name in available]
        images = [i for i, out in enumerate(kept) if "image/png" in out.get("data", {})]
        at = images[-1] + 1 if images else len(kept)
        if links:
            kept.insert(at, nbformat.v4.new_output(
                "display_data", data={"text/markdown": "Download: " + "; ".join(links)}))
            added += len(links)
        cell["outputs"] = kept
    nbformat.write(nb, path)
    return added
