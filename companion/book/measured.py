"""Measured numbers on the book's Markdown pages (the landing page, the results page).

A page quotes a chapter's result in a sentence written by hand, inside a block that names the
chapter and the claims of that chapter the sentence rests on::

    % companion-measured: 11_on_the_clock needs: drafting-pays, rule-vs-best-slower
    On this CPU drafting pays: the certificate rule decodes [[ch11_rule_vs_plain:.2f]]x as fast as ...
    % companion-end

When the book is staged, each ``[[key:format]]`` inside the block is replaced by the value the
chapter's executed notebook glued under ``key`` (formatted with ``format``), and the block's
marker lines are dropped. The sentence is guarded by the same checks as the chapter's own prose:
each claim named after ``needs:`` must have held in that run (a chapter's
:class:`companion.book.claims.Claims` glues the names of the claims that failed as
``claims_failed``). A block whose claims failed, or whose chapter is not in this build, is
replaced by a note saying so instead of a sentence its data do not support; a placeholder naming
a value the chapter did not glue fails the build (the page is stale).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

BLOCK = re.compile(r"^(?P<indent>[ \t]*)% companion-measured: (?P<chapter>\S+)(?:[ \t]+needs:(?P<needs>[^\n]*))?\n"
                   r"(?P<body>.*?)^[ \t]*% companion-end[ \t]*$\n?", re.MULTILINE | re.DOTALL)
PLACEHOLDER = re.compile(r"\[\[(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<fmt>[^\]]*))?\]\]")
FAILED_KEY = "claims_failed"


class StalePage(Exception):
    """A page quotes a value its chapter does not glue."""


def fill_block(chapter: str, body: str, needs: list[str], values: dict[str, Any] | None, page: str) -> str:
    """The text that replaces one measured block (see the module's docstring)."""
    if values is None:
        return f"*Measured in this build:* nothing, since chapter {chapter} is not in this build.\n"
    failed = set(values.get(FAILED_KEY) or [])
    broken = [n for n in needs if n in failed]
    if broken:
        return (f"*Measured in this build:* chapter {chapter}'s data do not support the sentence written here for "
                f"the book's own run (claims {', '.join(broken)} do not hold); see that chapter.\n")

    def number(m: re.Match[str]) -> str:
        key, fmt = m.group("key"), m.group("fmt") or ""
        if key not in values:
            raise StalePage(f"{page}: chapter {chapter} glues no value {key!r} (quoted as [[{key}]])")
        value = values[key]
        try:
            return format(value, fmt)
        except (TypeError, ValueError) as err:
            raise StalePage(f"{page}: {key} = {value!r} cannot be formatted as {fmt!r} ({err})") from None

    return PLACEHOLDER.sub(number, body)


def fill_page(text: str, load: Callable[[str], dict[str, Any] | None], page: str = "page") -> str:
    """Every measured block of ``text`` filled; ``load(chapter)`` gives its glued values (None: not built)."""

    def fill(m: re.Match[str]) -> str:
        needs = [n.strip() for n in (m.group("needs") or "").split(",") if n.strip()]
        indent = m.group("indent")
        body = fill_block(m.group("chapter"), m.group("body"), needs, load(m.group("chapter")), page)
        if indent and not body.startswith(indent):
            body = indent + body
        return body

    return BLOCK.sub(fill, text)


def fill_measured_pages(pages: Path, notebooks: Path, glued: Callable[[Path], dict[str, Any]]) -> None:
    """Fill the measured blocks of every Markdown page under ``pages`` from the executed ``notebooks``."""
    cache: dict[str, dict[str, Any] | None] = {}

    def load(chapter: str) -> dict[str, Any] | None:
        if chapter not in cache:
            executed = notebooks / f"{chapter}.ipynb"
            cache[chapter] = glued(executed) if executed.is_file() else None
        return cache[chapter]

    for page in sorted(pages.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        if "% companion-measured:" not in text:
            continue
        page.write_text(fill_page(text, load, page.name), encoding="utf-8")
