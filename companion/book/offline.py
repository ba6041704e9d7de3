"""The offline check: a built page must load nothing from another host."""
from __future__ import annotations


import html.parser
import re
from pathlib import Path


# --------------------------------------------------------------------------------------------
# Building the book


class _ResourceFinder(html.parser.HTMLParser):
    """Collects the URLs an HTML page *loads* (scripts, styles, fonts, images, frames)."""

    LOADING_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut",
                    "apple-touch-icon", "manifest", "preconnect", "dns-prefetch"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed", "track") and a.get("src"):
            self.urls.append(a["src"])
        elif tag == "link" and set(a.get("rel", "").lower().split()) & self.LOADING_RELS:
            self.urls.append(a.get("href", ""))
        elif tag == "object" and a.get("data"):
            self.urls.append(a["data"])
        self._in_style = tag == "style"
        if "style" in a:
            self.urls.extend(_css_urls(a["style"]))

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls.extend(_css_urls(data))


def _css_urls(css: str) -> list[str]:
    found = re.findall(r"url\(\s*['\"]?([^'\")\s]+)", css)
    found += re.findall(r"@import\s+['\"]([^'\"]+)", css)
    return found


def _is_remote(url: str) -> bool:
    return bool(re.match(r"^\s*(https?:)?//", url, re.IGNORECASE))


def find_remote_resources(html_dir: Path) -> list[str]:
    """``"file: url"`` for every script, style, font, image or frame a built page would load from
    another host. Links a reader may click (``<a href>``) are fine and not listed."""
    problems = []
    for page in sorted(html_dir.rglob("*.html")):
        finder = _ResourceFinder()
        finder.feed(page.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{page.relative_to(html_dir)}: {u}" for u in finder.urls if _is_remote(u)]
    for sheet in sorted(html_dir.rglob("*.css")):
        urls = _css_urls(sheet.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{sheet.relative_to(html_dir)}: {u}" for u in urls if _is_remote(u)]
    return problems
