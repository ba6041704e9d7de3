"""The API reference as a reader sees it: an index page and one page per subpackage, no raw reST.

The pages are staged as the book stages them (:func:`companion.book.api_page.render_api_pages`:
every listed module's autodoc) and built alone with Sphinx, with the book's own autodoc and
MyST settings read from ``_config.yml``; no notebook runs. The text of every built page, code
excluded, must hold no reStructuredText that a docstring left unparsed (issue 56 found
"gid``s (" on the page of ``companion.figures.sizes``).
"""
from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from companion.book.api_page import API_MARKER, api_pages, render_api_pages

ROOT = Path(__file__).resolve().parents[1]
#: reStructuredText that shows as text when a docstring's markup was not parsed.
RAW_REST = (".. py:", ".. auto", ":func:`", ":class:`", ":mod:`", ":data:`", ":meth:`", ":attr:`", ":exc:`", "``")
#: The subpackages that have a page of their own.
SUBPACKAGES = ("certify", "drafter", "models", "prompts", "harvest", "speculative", "analysis", "figures", "book")


class _Text(HTMLParser):
    """A page's visible text, without code blocks, scripts, styles and the navigation.

    Inline code stays: a docstring's broken literal (``gid``s) is rendered as inline code that
    holds the raw markup, which a check skipping every ``code`` element never sees.
    """

    SKIP = {"pre", "script", "style", "nav", "head"}

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.parts: list[str] = []
        self.objects = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIP:
            self.depth += 1
        if tag == "dl" and "py" in (dict(attrs).get("class") or "").split():
            self.objects += 1

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.parts.append(data)


def page_text(html: str) -> tuple[str, int]:
    """The visible text of a built page (code blocks excluded) and how many Python objects it documents."""
    parser = _Text()
    parser.feed(html)
    return "".join(parser.parts), parser.objects


def raw_rest(text: str) -> list[str]:
    """Each piece of raw reST in ``text``, with a little context."""
    found = []
    for token in RAW_REST:
        for m in re.finditer(re.escape(token), text):
            found.append(text[max(0, m.start() - 30):m.end() + 30].replace("\n", " "))
    return found


def test_raw_rest_is_found_in_text_and_not_in_code() -> None:
    # what the page of companion.figures.sizes showed: the literal's markup inside inline code
    text, objects = page_text("<p>Artists carry <code><span>gid``s</span> (</code></p><pre>x = ``a``</pre>"
                              "<dl class='py function'><dt>f</dt></dl>")
    assert raw_rest(text) == ["Artists carry gid``s (f"] and objects == 1
    assert raw_rest(page_text("<p>a <code>b</code> c</p><pre>:func:`x`</pre>")[0]) == []


def test_every_subpackage_has_a_page_in_the_table_of_contents() -> None:
    import yaml

    pages = {p.stem for p in api_pages(ROOT / "book")}
    assert set(SUBPACKAGES) <= pages
    toc = (ROOT / "_toc.yml").read_text(encoding="utf-8")
    listed = re.findall(r"file: book/api/(\w+)", toc)
    assert sorted(listed) == sorted(pages - {"api"}), "every API page is in _toc.yml, under book/api"
    assert yaml.safe_load(toc)  # still a valid table of contents
    index = (ROOT / "book" / "api.md").read_text(encoding="utf-8")
    assert not API_MARKER.findall(index), "the index documents no module itself"
    for stem in pages - {"api"}:
        assert f"(api/{stem}.md)" in index, f"the index does not link to api/{stem}.md"
        assert API_MARKER.findall((ROOT / "book" / "api" / f"{stem}.md").read_text(encoding="utf-8")), stem


@pytest.fixture(scope="module")
def built_api(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The API pages staged and built alone with Sphinx (HTML), the book's settings, nitpicky as the
    book's build (``-n``); the built folder and the build's warnings."""
    import io

    import yaml
    from sphinx.application import Sphinx

    src = tmp_path_factory.mktemp("api-src")
    shutil.copy2(ROOT / "book" / "api.md", src / "api.md")
    shutil.copytree(ROOT / "book" / "api", src / "api")
    probed = render_api_pages(src, ROOT, log=lambda line: None)
    failed = {m: d for m, (status, d) in probed.items() if status != "ok"}
    assert not failed, f"modules that do not import: {failed}"
    book = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    settings = {k: v for k, v in book["sphinx"]["config"].items()
                if k.startswith(("autodoc", "napoleon", "myst", "add_module", "nitpick", "suppress"))}
    settings.update(extensions=["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"],
                    myst_enable_extensions=book["parse"]["myst_enable_extensions"], root_doc="index",
                    html_theme="basic", nitpicky=True)
    pages = sorted(p.stem for p in (src / "api").glob("*.md"))
    (src / "index.md").write_text("# Book\n\n```{toctree}\napi\n" + "".join(f"api/{p}\n" for p in pages) + "```\n",
                                  encoding="utf-8")
    (src / "conf.py").write_text("", encoding="utf-8")
    out = src.parent / "api-html"
    warnings = io.StringIO()
    app = Sphinx(str(src), str(src), str(out), str(src.parent / "api-doctrees"), "html",
                 confoverrides=settings, status=None, warning=warnings, freshenv=True)
    app.build()
    return out, warnings.getvalue()


def test_the_api_pages_build_without_a_warning(built_api: tuple[Path, str]) -> None:
    """The book builds with warnings as errors: a docstring's broken reference or markup shows here first."""
    _, warnings = built_api
    # labels of the book's other pages (the chapters) are not in this build; the book's own build checks them
    found = [line for line in warnings.splitlines() if "WARNING" in line and "undefined label" not in line]
    assert not found, "\n".join(found)[-3000:]


def test_no_raw_rest_on_the_built_api_pages(built_api: tuple[Path, str]) -> None:
    built_api = built_api[0]
    pages = sorted(built_api.glob("api/*.html")) + [built_api / "api.html"]
    assert len(pages) >= len(SUBPACKAGES) + 1
    found = {}
    documented = {}
    for page in pages:
        text, objects = page_text(page.read_text(encoding="utf-8"))
        documented[page.stem] = objects
        if raw_rest(text):
            found[page.name] = raw_rest(text)
    assert not found, f"raw reST on the API pages: {found}"
    assert documented["api"] == 0 and all(documented[s] > 0 for s in SUBPACKAGES), documented
    # one page per subpackage: no page holds most of the library any more
    assert max(documented.values()) < 0.5 * sum(documented.values()), documented
