"""Checks of the built HTML pages that a reader would otherwise catch: raw math, non-changes, stray tables.

* :func:`raw_math` -- ``$...$`` left as text (MathJax typesets only what MyST turned into a math
  node: math inside a glued string or a generated Markdown value is shown raw).
* :func:`non_changes` -- ``from 0.5011 to 0.5011``: a sentence that states a change between two
  equal numbers.
* :func:`misplaced_tables` -- a numbered table that sits in another section than the text that
  refers to it (a notebook's output cell placed above the heading of the section it belongs to).

Each returns ``page: what`` lines; :func:`check_pages` runs them on every page of a build.
"""
from __future__ import annotations

import re
from pathlib import Path

SKIP = {"script", "style", "code", "pre", "kbd", "samp", "tt", "textarea"}
MATH_CLASSES = {"math", "MathJax", "MathJax_Preview", "mjx-container"}
RAW_MATH = re.compile(r"(?<![\\$\w])\$(?=[^\s$])[^$\n]{1,120}?(?<=[^\s$])\$(?![\w$])")
NON_CHANGE = re.compile(r"\bfrom\s+(?P<a>[-+]?(?:\d[\d,]*\.?\d*(?:e[-+]?\d+)?)%?)(?:\s+(?P<unit>nats|tokens|steps|%))?"
                        r"\s+to\s+(?P=a)(?![\d.])", re.IGNORECASE)


def _soup(path: Path):
    from bs4 import BeautifulSoup

    return BeautifulSoup(path.read_text(encoding="utf-8"), "html.parser")


def _visible_text(soup) -> list[str]:
    """The page's text nodes a reader sees as prose: not code, scripts, styles or typeset math."""
    out = []
    main = soup.find("main") or soup
    for node in main.find_all(string=True):
        skip = False
        for parent in node.parents:
            if parent.name in SKIP or set(parent.get("class") or ()) & MATH_CLASSES:
                skip = True
                break
        if not skip:
            out.append(str(node))
    return out


def raw_math(path: Path, soup=None) -> list[str]:
    """``$...$`` spans left as text on the page."""
    soup = soup or _soup(path)
    found = []
    for text in _visible_text(soup):
        for m in RAW_MATH.finditer(text):
            found.append(f"{path.name}: raw math {m.group(0)!r}")
    return found


def non_changes(path: Path, soup=None) -> list[str]:
    """Sentences that state a change from a number to the same number."""
    soup = soup or _soup(path)
    text = " ".join(" ".join(_visible_text(soup)).split())
    return [f"{path.name}: non-change {m.group(0)!r}" for m in NON_CHANGE.finditer(text)]


def _section_of(node):
    return node.find_parent("section")


def misplaced_tables(path: Path, soup=None) -> list[str]:
    """Numbered tables whose references all sit in other sections, none in the table's own or one around it."""
    soup = soup or _soup(path)
    found = []
    for table in soup.find_all("table"):
        ident = table.get("id")
        if not ident or not str(ident).startswith("tbl-"):
            continue
        home = _section_of(table)
        refs = [a for a in soup.find_all("a", href=True) if a["href"].endswith(f"#{ident}") and table not in a.parents]
        if not refs or home is None:
            continue
        around = {id(s) for s in [home, *home.find_parents("section")]}
        inside = {id(s) for s in home.find_all("section")}
        if not any((_section_of(a) is not None and (id(_section_of(a)) in around or id(_section_of(a)) in inside))
                   for a in refs):
            where = _section_of(refs[0])
            heading = where.find(re.compile("^h[1-6]$")) if where is not None else None
            found.append(f"{path.name}: table {ident} sits in section {home.get('id')!r}, but the text that refers "
                         f"to it is in {heading.get_text(' ', strip=True) if heading else 'another section'!r}")
    return found


def check_pages(html: Path) -> list[str]:
    """Every problem of every built page (the chapters and the book's own pages)."""
    problems = []
    for page in sorted(html.rglob("*.html")):
        hidden = any(part.startswith(("_", ".")) for part in page.relative_to(html).parts)
        if hidden or page.name in ("genindex.html", "search.html"):
            continue
        soup = _soup(page)
        problems += raw_math(page, soup) + non_changes(page, soup) + misplaced_tables(page, soup)
    return problems
