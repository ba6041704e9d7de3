"""Every internal link of the built book resolves: to a file of the build and, for ``#anchor``, to
an element with that id on the page it names.

A link is internal when it has no scheme and no host (``href="../book/glossary.html#margin"``,
``href="#witness"``); the check reads every HTML page of the build (the generated index and
search pages included) and reports each broken link with the page that holds it. Sphinx checks
its own cross-references, but not a Markdown link written into a notebook's output or a raw
``href``: chapter 7 linked "How to read this book" to ``../book/how_to_read.md``, a file the
build does not have. The book's test run builds the book once (``built_book``); this module reads
that build.
"""
from __future__ import annotations

from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

#: Schemes of links that leave the book (or do not load a page).
EXTERNAL_SCHEMES = {"http", "https", "mailto", "ftp", "javascript", "data", "tel"}


class _Links(HTMLParser):
    """The ``href`` of every ``<a>`` and ``<area>``, and every ``id`` (and ``<a name>``) of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "a" and found.get("name"):
            self.ids.add(str(found["name"]))
        if tag in ("a", "area") and found.get("href") is not None:
            self.hrefs.append(str(found["href"]).strip())


@lru_cache(maxsize=None)
def _parse(page: Path) -> _Links:
    parser = _Links()
    parser.feed(page.read_text(encoding="utf-8", errors="replace"))
    return parser


def internal(href: str) -> bool:
    """Whether ``href`` points inside the book (no scheme, no host; not an empty ``#``)."""
    parts = urlsplit(href)
    if parts.scheme.lower() in EXTERNAL_SCHEMES or parts.scheme or parts.netloc:
        return False
    return bool(parts.path or parts.fragment)


def html_pages(html: Path) -> list[Path]:
    """Every page of a build: the chapters, the book's pages and the generated ones, not ``_static``'s files."""
    return sorted(p for p in html.rglob("*.html") if not p.relative_to(html).parts[0].startswith("_"))


def broken_links(html: Path) -> list[str]:
    """``PAGE: HREF (why)`` for every internal link of the build in ``html`` that does not resolve."""
    html = html.resolve()
    _parse.cache_clear()
    broken = []
    for page in html_pages(html):
        rel = page.relative_to(html).as_posix()
        for href in _parse(page).hrefs:
            if not internal(href):
                continue
            parts = urlsplit(href)
            path = unquote(parts.path)
            target = page if not path else (page.parent / path).resolve()
            if target.is_dir():
                target = target / "index.html"
            if html != target and html not in target.parents:
                broken.append(f"{rel}: {href} (leaves the build)")
                continue
            if not target.is_file():
                broken.append(f"{rel}: {href} (no file {target.relative_to(html).as_posix()})")
                continue
            anchor = unquote(parts.fragment)
            ids = _parse(target).ids if target.suffix == ".html" else set()
            if anchor and target.suffix == ".html" and anchor not in ids and parts.fragment not in ids:
                broken.append(f"{rel}: {href} (no id {anchor!r} on {target.relative_to(html).as_posix()})")
    return broken


def test_the_checker_reports_each_broken_link_with_its_page(tmp_path: Path) -> None:
    (tmp_path / "book").mkdir()
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "x.css").write_text("", encoding="utf-8")
    (tmp_path / "book" / "intro.html").write_text(
        "<h1 id='top'>Intro</h1><a name='old'></a><p id='résumé'>x</p>", encoding="utf-8")
    (tmp_path / "book" / "dir").mkdir()
    (tmp_path / "book" / "dir" / "index.html").write_text("<p>index</p>", encoding="utf-8")
    (tmp_path / "chapter.html").write_text(
        "<a href='book/intro.html'>ok</a> <a href='book/intro.html#top'>ok</a> <a href='#here'>ok</a>"
        "<a href='book/intro.html#old'>ok</a> <a href='book/dir/'>ok</a> <a href='_static/x.css'>ok</a>"
        "<a href='book/intro.html?highlight=x#top'>ok</a> <a href='#'>ok</a> <a href='https://example.org/x.md'>ok</a>"
        "<a href='mailto:a@b.c'>ok</a> <a href='book/intro.html#r%C3%A9sum%C3%A9'>ok</a>"
        "<span id='here'></span>"
        "<a href='../book/how_to_read.md'>bad</a> <a href='book/how_to_read.md'>bad</a>"
        "<a href='book/intro.html#nowhere'>bad</a> <a href='#missing'>bad</a>", encoding="utf-8")
    assert broken_links(tmp_path) == [
        "chapter.html: ../book/how_to_read.md (leaves the build)",
        "chapter.html: book/how_to_read.md (no file book/how_to_read.md)",
        "chapter.html: book/intro.html#nowhere (no id 'nowhere' on book/intro.html)",
        "chapter.html: #missing (no id 'missing' on chapter.html)",
    ]


@pytest.mark.book
def test_every_internal_link_of_the_built_book_resolves(built_book: Path) -> None:
    """The book the suite builds (every chapter, the ci profile): 0 broken internal links."""
    pages = html_pages(built_book)
    assert len(pages) > 20, f"only {len(pages)} pages in {built_book}"
    broken = broken_links(built_book)
    assert not broken, f"{len(broken)} broken internal link(s):\n" + "\n".join(broken)
