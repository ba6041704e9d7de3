"""Figures and the reproduction-status page on a phone (390 px), in headless Chromium.

* Every figure's text is at least 9 px high as displayed: the figure's scale on the page (its
  shown width over the served PNG's width) times its smallest font in PNG pixels (the font size
  and dpi ``save_figure`` writes into each PNG). Below 720 px the book serves a figure's phone
  variant (``book/_ext/companion_figures.py``), the figure as drawn above it.
* A table wider than the screen scrolls inside its box and says so (a hint and a shadow).
* The pages outside the numbered chapters number their tables from 1.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest

from tests.test_book_browser import CHROMIUM, CHROMIUM_ARGS, serve  # noqa: F401 - serve is a fixture

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "book" / "_ext"
STATIC = EXT / "static"

# Each figure image of the page: the file served (currentSrc), its shown and natural widths.
FIGURES_PROBE = """
async () => {
  await Promise.all(Array.from(document.images).map(i => i.decode().catch(() => null)));
  return Array.from(document.querySelectorAll('article figure img')).map(i => ({
    src: i.currentSrc, shown: i.getBoundingClientRect().width, natural: i.naturalWidth}));
}
"""


def _ext():
    sys.path.insert(0, str(EXT))
    try:
        import companion_figures
    finally:
        sys.path.remove(str(EXT))
    return companion_figures


def text_px(png: Path, shown: float) -> float:
    """Height (CSS px) of the smallest font of ``png`` shown ``shown`` px wide."""
    from PIL import Image

    from companion.figures import DPI_KEY, MIN_FONT_KEY

    with Image.open(png) as im:
        return float(im.info[MIN_FONT_KEY]) / 72 * float(im.info[DPI_KEY]) * shown / im.size[0]


def figure_text_px(html: Path, base_url: str, pages: list[str], width: int) -> dict[str, list[tuple[str, float]]]:
    """For each page, ``(served file, smallest text in CSS px)`` of every figure at ``width`` px."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    found: dict[str, list[tuple[str, float]]] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": width, "height": 844}).new_page()
            for rel in pages:
                page.goto(base_url + rel, wait_until="load")
                found[rel] = []
                for img in page.evaluate(FIGURES_PROBE):
                    path = html / unquote(urlsplit(img["src"]).path).lstrip("/")
                    found[rel].append((path.name, round(text_px(path, img["shown"]), 2)))
        finally:
            browser.close()
    return found


# -- the pieces ----------------------------------------------------------------------------------

def test_a_figure_with_a_phone_variant_is_served_in_a_picture() -> None:
    ext = _ext()
    body = ('<figure><img alt="a" src="../_images/wide_one.png" style="width: 100%;" /></figure>'
            '<img src="../_images/other.png" /><img src="../_static/logo.png" />')
    out = ext.with_phone_sources(body, {"wide_one"})
    assert out.count("<picture") == 1 and out.count("<img") == 3
    assert ('<picture class="companion-picture"><source media="(max-width: 720px)" '
            'srcset="../_images/wide_one.phone.png"><img alt="a" src="../_images/wide_one.png"') in out
    assert ext.with_phone_sources(body, set()) == body


def test_breakpoint_and_suffix_match_the_library() -> None:
    from companion.figures import PHONE_BREAKPOINT_PX, PHONE_SUFFIX

    ext = _ext()
    assert (ext.PHONE_BREAKPOINT_PX, ext.PHONE_SUFFIX) == (PHONE_BREAKPOINT_PX, PHONE_SUFFIX)


def test_unnumbered_pages_number_their_tables_from_one() -> None:
    """Sphinx's one counter across unnumbered pages gave the status page "Table 3"; each such page
    now counts from 1, and a numbered chapter's "7.2" is left alone."""
    numbers = {"book/claims": {"table": {"t-a": (1,), "t-b": (2,)}},
               "book/reproduction_status": {"table": {"runs": (3,), "setup": (5,), "cells": (4,)},
                                            "figure": {"f": (1,)}},
               "notebooks/07": {"table": {"x": (7, 1), "y": (7, 2)}}}
    changed = _ext().renumber_unnumbered_pages(numbers)
    assert changed == ["book/reproduction_status"]
    assert numbers["book/reproduction_status"]["table"] == {"runs": (1,), "cells": (2,), "setup": (3,)}
    assert numbers["book/claims"]["table"] == {"t-a": (1,), "t-b": (2,)}
    assert numbers["notebooks/07"]["table"] == {"x": (7, 1), "y": (7, 2)}


def _wide_figure(tmp_path: Path) -> None:
    from companion.figures import palette as P
    from companion.figures import save_figure

    fig = P.new_figure(4.0)
    axes = fig.subplots(1, 2, sharey=True)
    for i, ax in enumerate(axes):
        ax.plot(np.arange(5), np.arange(5) * (i + 1), label=f"line {i}")
        ax.set_xlabel("x")
        ax.legend(fontsize=P.LEGEND_SIZE)
    save_figure(P.set_sizes(fig), "wide_one", tmp_path / "_images")


def _page(tmp_path: Path, body: str) -> None:
    """A page with the book's stylesheet and script around ``body`` (in the theme's article)."""
    for name in ("companion.css", "companion-fit.js"):
        shutil.copy(STATIC / name, tmp_path / name)
    (tmp_path / "page.html").write_text(
        "<html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
        "<link rel='stylesheet' href='companion.css'><script src='companion-fit.js'></script>"
        "<style>figure { margin: 0 }</style></head>"   # as the book's theme sets it
        f"<body style='margin:0;padding:0 24px'><article class='bd-article'>{body}</article></body></html>",
        encoding="utf-8")


def test_phone_variant_is_served_on_a_phone_and_reads_at_9_px(serve, tmp_path: Path) -> None:
    """At 390 px the page shows the phone variant (its text >= 9 px); at 1280 px the figure as
    drawn; the figure as drawn, forced on the phone, reads under 9 px (the check can fail)."""
    _wide_figure(tmp_path)
    img = '<figure><img src="_images/wide_one.png" style="width: 100%;" /></figure>'
    _page(tmp_path, _ext().with_phone_sources(img, {"wide_one"}))
    phone = figure_text_px(tmp_path, serve(tmp_path), ["page.html"], 390)["page.html"]
    desk = figure_text_px(tmp_path, serve(tmp_path), ["page.html"], 1280)["page.html"]
    assert [f for f, _ in phone] == ["wide_one.phone.png"] and phone[0][1] >= 9, phone
    assert [f for f, _ in desk] == ["wide_one.png"] and desk[0][1] >= 9, desk
    _page(tmp_path, img)   # no variant served
    bare = figure_text_px(tmp_path, serve(tmp_path), ["page.html"], 390)["page.html"]
    assert bare[0][0] == "wide_one.png" and bare[0][1] < 9, bare


SCROLL_PROBE = """
() => Array.from(document.querySelectorAll('.pst-scrollable-table-container')).map(box => ({
  id: box.querySelector('table').id,
  hint: !!(box.previousElementSibling && box.previousElementSibling.classList.contains('companion-scroll-hint')),
  shadow: getComputedStyle(box).boxShadow !== 'none',
  scrolls: box.scrollWidth > box.clientWidth + 1,
  // lines of text in the widest-wrapped first-column cell (a chapter id must take one)
  first_cell_lines: Math.max(...Array.from(box.querySelectorAll('tr td:first-child')).map(td => {
    const range = document.createRange();
    range.selectNodeContents(td);
    const style = getComputedStyle(td);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.2;
    return Math.max(1, Math.round(range.getBoundingClientRect().height / line));
  })),
}))
"""


def _scroll_report(base: str, page_name: str) -> list[dict]:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
            page.goto(base + page_name, wait_until="load")
            page.wait_for_timeout(300)
            return page.evaluate(SCROLL_PROBE)
        finally:
            browser.close()


def test_a_table_wider_than_a_phone_says_it_scrolls(serve, tmp_path: Path) -> None:
    # cells hold paragraphs, as MyST writes them (the stylesheet lets links in paragraphs wrap anywhere)
    wide = "".join(f"<td><p>a_long_cell_value_{i} with words</p></td>" for i in range(6))
    _page(tmp_path, "<div class='pst-scrollable-table-container'><table id='tbl-status-setup'><tr>"
                    f"<td><p><a href='#'>01_criteria_level_sets</a></p></td>{wide}</tr></table></div>"
                    "<div class='pst-scrollable-table-container'><table id='narrow'><tr><td>a</td></tr></table></div>")
    wide_box, narrow_box = _scroll_report(serve(tmp_path), "page.html")
    assert wide_box["scrolls"] and wide_box["hint"] and wide_box["shadow"], wide_box
    assert not narrow_box["scrolls"] and not narrow_box["hint"] and not narrow_box["shadow"], narrow_box


# -- the built book --------------------------------------------------------------------------

@pytest.mark.book
def test_every_figure_of_the_built_book_reads_at_9_px_on_a_phone(built_book: Path, serve) -> None:
    from companion.book.record import load_record

    record = load_record(built_book.parent / "run-record.json")
    pages = [f"notebooks/{name}.html" for name, run in record.chapters.items()
             if run.figures and (built_book / "notebooks" / f"{name}.html").is_file()]
    assert pages, "no chapter with figures in the built book"
    base = serve(built_book)
    report = {}
    for width in (390, 1280):
        found = figure_text_px(built_book, base, pages, width)
        report[width] = found
        small = {rel: [(f, px) for f, px in figs if px < 9] for rel, figs in found.items()}
        assert not any(small.values()), f"figure text under 9 px at {width} px: {small}"
    shots = built_book.parent / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    (shots / "figure-text-px.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    assert sum(len(v) for v in report[390].values()) >= sum(len(r.figures) for r in record.chapters.values())


@pytest.mark.book
def test_status_page_on_a_phone(built_book: Path, serve) -> None:
    """The status page's tables are numbered from 1, its wide tables say they scroll, and chapter
    ids stay on one line."""
    from playwright.sync_api import sync_playwright

    base = serve(built_book)
    rows = _scroll_report(base, "book/reproduction_status.html")
    setup = next(r for r in rows if r["id"] == "tbl-status-setup")
    assert setup["scrolls"] and setup["hint"] and setup["shadow"], setup
    assert all(r["first_cell_lines"] == 1 for r in rows if r["id"].startswith("tbl-status-")), rows
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
            page.goto(base + "book/reproduction_status.html", wait_until="load")
            numbers = page.evaluate("() => Array.from(document.querySelectorAll('caption .caption-number'))"
                                    ".map(e => e.textContent.trim())")
        finally:
            browser.close()
    assert numbers and numbers[0] == "Table 1" and numbers == [f"Table {i}" for i in range(1, len(numbers) + 1)]
