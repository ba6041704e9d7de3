"""Numbered, captioned tables in the book, the way figures are numbered and captioned.

A chapter displays a table as Markdown (``display(Markdown(markdown_table(...)))``); the book
parses displayed Markdown as MyST (``nb_render_markdown_format: myst``), so wrapping the table in
a MyST ``table`` directive with a ``:name:`` makes Sphinx number it ("Table 10.2") and set the
caption above it, exactly as the ``figure`` directive does for figures (``numfig``). Without a
name Sphinx gives a table no number, so the name is required.
"""
from __future__ import annotations

import re
from typing import Any

NAME = re.compile(r"^[a-z][a-z0-9-]*$")


def table_directive(markdown: str, caption: str, name: str) -> str:
    """``markdown`` (a pipe table) inside a MyST ``table`` directive with ``caption`` and the
    cross-reference label ``name`` (lower case, digits and hyphens: ``tbl-ch10-policies``)."""
    if not NAME.match(name):
        raise ValueError(f"name must be lower case letters, digits and hyphens, starting with a letter; got {name!r}")
    caption = " ".join(str(caption).split())
    if not caption:
        raise ValueError("caption must be a non-empty sentence; got an empty string")
    body = markdown.strip()
    if not body.startswith("|"):
        raise ValueError(f"markdown must be a pipe table starting with '|'; got {body[:40]!r}")
    # four colons, so that a caption or cell may itself hold a three-colon fence
    return f"::::{{table}} {caption}\n:name: {name}\n:align: left\n\n{body}\n::::\n"


def captioned_table(markdown: str, caption: str, name: str) -> Any:
    """:func:`table_directive` as a displayable ``IPython.display.Markdown`` object:
    ``display(captioned_table(...))``."""
    from IPython.display import Markdown   # only a notebook needs it

    return Markdown(table_directive(markdown, caption, name))
