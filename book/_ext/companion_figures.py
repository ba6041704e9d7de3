"""Figures on a phone, and table and figure numbers on the pages outside the numbered chapters.

* A figure saved with a phone variant (``companion.figures.save_figure`` writes
  ``figures/NAME.phone.png`` beside ``figures/NAME.png`` when the figure's text would read under
  9 px on a phone) is served in a ``<picture>``: the phone variant below
  ``companion.figures.PHONE_BREAKPOINT_PX``, the figure as drawn above it. The variant is copied
  next to the figure's image in ``_images/``.
* Sphinx numbers the figures and tables of every unnumbered page with one counter, so the
  reproduction-status page's first table read "Table 3" (two tables on pages before it); here
  each unnumbered page numbers its own from 1. Numbered chapters ("Table 7.2") are left alone.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

PHONE_SUFFIX = ".phone"          # companion.figures.PHONE_SUFFIX (the book's build imports no companion code here)
PHONE_BREAKPOINT_PX = 720        # companion.figures.PHONE_BREAKPOINT_PX

_IMG = re.compile(r'<img\b[^>]*\bsrc="(?P<src>[^"]*?_images/(?P<name>[a-z0-9][a-z0-9_\-]*)\.png)"[^>]*>')


def phone_variants(srcdir: Path) -> dict[str, Path]:
    """Figure name -> its phone variant, for every ``figures/NAME.phone.png`` of the staged book."""
    return {p.name[: -len(PHONE_SUFFIX + ".png")]: p
            for p in sorted((srcdir / "figures").glob(f"*{PHONE_SUFFIX}.png"))}


def with_phone_sources(body: str, names: set[str]) -> str:
    """``body`` (a page's HTML) with each ``<img>`` of a figure that has a phone variant wrapped in a
    ``<picture>`` whose ``<source>`` serves ``NAME.phone.png`` below :data:`PHONE_BREAKPOINT_PX`."""
    def wrap(m: re.Match[str]) -> str:
        if m.group("name") not in names:
            return m.group(0)
        phone = m.group("src")[: -len(".png")] + PHONE_SUFFIX + ".png"
        return (f'<picture class="companion-picture"><source media="(max-width: {PHONE_BREAKPOINT_PX}px)" '
                f'srcset="{phone}">{m.group(0)}</picture>')

    return _IMG.sub(wrap, body)


def _serve_phone_variants(app: Any, pagename: str, templatename: str, context: dict, doctree: Any) -> None:
    names = set(getattr(app.env, "companion_phone_variants", {}))
    if names and "body" in context:
        context["body"] = with_phone_sources(context["body"], names)


def _find_variants(app: Any) -> None:
    app.env.companion_phone_variants = phone_variants(Path(app.srcdir))


def _copy_variants(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    images = Path(app.outdir) / "_images"
    for name, path in getattr(app.env, "companion_phone_variants", {}).items():
        if (images / f"{name}.png").is_file():   # the figure is on a page: its variant goes beside it
            shutil.copyfile(path, images / path.name)


def renumber_unnumbered_pages(fignumbers: dict[str, dict[str, dict[str, tuple[int, ...]]]]) -> list[str]:
    """Number the figures, tables and code blocks of each page without a section number from 1, in
    the order Sphinx numbered them (one counter across those pages); returns the pages changed."""
    changed = []
    for docname, kinds in fignumbers.items():
        for numbers in kinds.values():
            if not numbers or any(len(n) != 1 for n in numbers.values()):
                continue   # a numbered chapter's (7, 2), or a page mixing both: left alone
            order = sorted(numbers, key=lambda ident: numbers[ident])
            renumbered = {ident: (i,) for i, ident in enumerate(order, 1)}
            if renumbered != numbers:
                numbers.update(renumbered)
                changed.append(docname)
    return sorted(set(changed))


def _renumber(app: Any, env: Any) -> list[str]:
    return renumber_unnumbered_pages(env.toc_fignumbers)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _find_variants)
    app.connect("html-page-context", _serve_phone_variants)
    app.connect("build-finished", _copy_variants)
    # after Sphinx's own numbering (TocTreeCollector, priority 500)
    app.connect("env-get-updated", _renumber, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
