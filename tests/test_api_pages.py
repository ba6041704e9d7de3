"""The API reference as a reader sees it: an index page and one page per subpackage, no raw reST.

The pages are staged as the book stages them (:func:`companion.book.api_page.render_api_pages`:
every listed module's autodoc) and built alone with Sphinx, with the book's own autodoc and
MyST settings read from ``_config.yml``, its theme and its extension (``book/_ext``: short
values, field comments, folded details); no notebook runs. The text of every built page, code
excluded, must hold no reStructuredText that a docstring left unparsed (issue 56 found
"gid``s (" on the page of ``companion.figures.sizes``). Every entry shows a description (issue 65
found 119 of 217 entries of the speculative page without one), no value prints kilobytes
(``PASSAGES`` printed 8,215 characters), and no page is taller than :data:`MAX_HEIGHT_PX` at
1280 px in headless Chromium (the certify page was about 70,000 px).
"""
from __future__ import annotations

import importlib
import inspect
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from companion.book.api_page import API_MARKER, api_pages, render_api_pages
from tests.test_book_browser import CHROMIUM, CHROMIUM_ARGS, serve  # noqa: F401 - serve is a fixture

ROOT = Path(__file__).resolve().parents[1]
#: reStructuredText that shows as text when a docstring's markup was not parsed.
RAW_REST = (".. py:", ".. auto", ":func:`", ":class:`", ":mod:`", ":data:`", ":meth:`", ":attr:`", ":exc:`", "``")
#: The subpackages that have a page of their own (``certify`` has five: by what a reader looks for).
SUBPACKAGES = ("certify", "drafter", "models", "prompts", "harvest", "speculative", "analysis", "figures", "book")
CERTIFY_PAGES = ("certify_criteria", "certify", "certify_bounds", "certify_server", "certify_precision")
#: The tallest an API page may be at 1280 px (CSS pixels, headless Chromium).
MAX_HEIGHT_PX = 15_000
#: The longest header an entry of a constant or an attribute may print (name, type and a short value).
MAX_DATA_HEADER = 200
EXT = ROOT / "book" / "_ext"


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
    assert set(SUBPACKAGES) <= pages and set(CERTIFY_PAGES) <= pages
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
    """The API pages staged and built alone with Sphinx (HTML), the book's settings, theme and
    extension, nitpicky as the book's build (``-n``); the built folder and the build's warnings."""
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
                if k.startswith(("autodoc", "napoleon", "myst", "add_module", "nitpick", "suppress", "mathjax"))}
    if str(EXT) not in sys.path:
        sys.path.insert(0, str(EXT))   # the book's local extension, as _config.yml's local_extensions
    settings.update(extensions=["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax",
                                "sphinx-mathjax-offline", "sphinx_book_theme", "companion_book"],
                    myst_enable_extensions=book["parse"]["myst_enable_extensions"], root_doc="index",
                    html_theme="sphinx_book_theme", nitpicky=True)
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
    found = [line for line in warnings.splitlines()
             if any(w in line for w in ("WARNING", "ERROR", "CRITICAL", "SEVERE")) and "undefined label" not in line]
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


# -- every entry described, no long values, no tall page -------------------------------------------

def entries(html: str) -> dict[str, str]:
    """Each entry of a built API page (its id: the object's dotted name) and its description: the
    text its body shows before the folded details and the nested entries."""
    from bs4 import BeautifulSoup

    found = {}
    for dt in BeautifulSoup(html, "html.parser").select("dl.py > dt[id]"):
        dd = dt.find_next_sibling("dd")
        kids = [] if dd is None else [k for k in dd.find_all(recursive=False) if k.name not in ("dl", "details")
                                      and not k.get_text(" ", strip=True).startswith("Bases:")]
        found[str(dt["id"])] = " ".join(k.get_text(" ", strip=True) for k in kids).strip()
    return found


def test_entries_read_the_description_before_the_details() -> None:
    page = ("<dl class='py function'><dt id='m.f'>f()</dt><dd><p>Adds.</p><details>more</details></dd></dl>"
            "<dl class='py class'><dt id='m.C'>C</dt><dd><p>Bases: object</p><details><p>Only folded.</p></details>"
            "<dl class='py attribute'><dt id='m.C.x'>x</dt><dd></dd></dl></dd></dl>")
    assert entries(page) == {"m.f": "Adds.", "m.C": "", "m.C.x": ""}


def test_every_entry_on_the_api_pages_has_a_description(built_api: tuple[Path, str]) -> None:
    """A reader finds each entry's one-line purpose on its page. Names a new entry without one: give
    it a docstring (a field: a comment beside it, ``name: int  # what it counts``)."""
    html = built_api[0]
    empty = {}
    total = 0
    for page in sorted(html.glob("api/*.html")):
        found = entries(page.read_text(encoding="utf-8"))
        total += len(found)
        if [k for k, v in found.items() if not v]:
            empty[page.name] = [k for k, v in found.items() if not v]
    assert total > 500, f"only {total} entries on the API pages"
    assert not empty, "entries without a description:\n" + "\n".join(f"{p}: {', '.join(v)}" for p, v in empty.items())


def test_no_private_helper_and_no_long_value_on_the_api_pages(built_api: tuple[Path, str]) -> None:
    from bs4 import BeautifulSoup

    html = built_api[0]
    private, long_values = [], []
    for page in sorted(html.glob("api/*.html")):
        soup = BeautifulSoup(page.read_text(encoding="utf-8"), "html.parser")
        for dt in soup.select("dl.py > dt[id]"):
            if any(part.startswith("_") and not part.startswith("__") for part in str(dt["id"]).split(".")):
                private.append(str(dt["id"]))
        for dt in soup.select("dl.py.data > dt[id], dl.py.attribute > dt[id]"):
            text = dt.get_text(" ", strip=True)
            if len(text) > MAX_DATA_HEADER:
                long_values.append(f"{dt['id']} ({len(text)} characters)")
    assert not private, f"private helpers on the API pages: {private}"
    assert not long_values, f"entries that print a long value: {long_values}"
    # the constants issue 65 found printed in full are there, by name, with a description
    named = {k: v for page in html.glob("api/*.html") for k, v in entries(page.read_text(encoding="utf-8")).items()}
    for name in ("companion.prompts.chat_requests.PASSAGES", "companion.models.presets.PRESETS",
                 "companion.analysis.size_axis.STATISTICS"):
        assert named.get(name), f"{name} is not on the API pages with a description"


def _listed_modules() -> list[str]:
    return list(dict.fromkeys(m for page in api_pages(ROOT / "book")
                              for m in API_MARKER.findall(page.read_text(encoding="utf-8"))))


def undocumented(module_name: str) -> list[str]:
    """The public functions, classes, methods and properties of a module (those in ``__all__``, else
    those it defines) without a docstring: autodoc leaves them off the page, so a reader cannot
    find them there."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None)
    missing = []
    for name in names if names is not None else [n for n in vars(module) if not n.startswith("_")]:
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if names is None and obj.__module__ != module_name:
            continue   # imported here, documented where it is defined
        own = obj.__dict__.get("__doc__") if inspect.isclass(obj) else obj.__doc__
        if not (own or "").strip():
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                method = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if attr.startswith("_") or not (inspect.isfunction(method) or isinstance(value, property)):
                    continue
                if not (inspect.getdoc(getattr(obj, attr)) or "").strip():   # a base class's docstring counts
                    missing.append(f"{module_name}.{name}.{attr}")
    return missing


def test_every_public_function_and_class_has_a_docstring() -> None:
    """Names each public function, class, method or property of a module on the API pages that has
    no docstring (a one-line docstring stating what it computes fixes it)."""
    missing = [name for module in _listed_modules() for name in undocumented(module)]
    assert not missing, f"{len(missing)} public object(s) without a docstring:\n" + "\n".join(missing)


def test_a_field_is_described_by_the_comment_beside_it() -> None:
    if str(EXT) not in sys.path:
        sys.path.insert(0, str(EXT))
    from companion_api import field_comments

    class Row:
        """A row."""

        rate: float  # share of steps accepted
        # the criterion's spec string,
        # as parsed
        spec: str = "greedy"
        bare: int = 0
        pair: tuple[int, int] = (0,
                                 1)  # a pair over two lines
        #: a doc comment
        documented: int = 1

    from companion_api import rest_text

    # a comment reads as written: literals kept, other markup escaped (kl_fwd is no link, x*y no emphasis)
    assert rest_text("before any ``where``: kl_fwd * 2, name_ | `x") == r"before any ``where``: kl_fwd \* 2, name\_ \| \`x"
    assert field_comments(Row) == {"rate": "share of steps accepted", "spec": "the criterion's spec string, as parsed",
                                   "pair": "a pair over two lines", "documented": "a doc comment"}


# The page's height once MathJax has typeset it and its fonts are in (right after "load" the book's
# pages measured up to 2,000 px taller than they settle at).
SETTLED_HEIGHT = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  return document.scrollingElement.scrollHeight;
}
"""


def test_no_api_page_is_taller_than_15000_px_at_1280(built_api: tuple[Path, str], serve) -> None:
    """Each API page, as headless Chromium lays it out 1280 px wide: at most :data:`MAX_HEIGHT_PX`."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    html = built_api[0]
    base = serve(html)
    heights = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            for rel in ["api.html"] + sorted(p.relative_to(html).as_posix() for p in html.glob("api/*.html")):
                page.goto(base + rel, wait_until="load")
                heights[rel] = page.evaluate(SETTLED_HEIGHT)
        finally:
            browser.close()
    print("API page heights at 1280 px:", heights)
    assert len(heights) >= len(SUBPACKAGES) + len(CERTIFY_PAGES)
    tall = {rel: h for rel, h in heights.items() if h > MAX_HEIGHT_PX}
    assert not tall, f"API pages taller than {MAX_HEIGHT_PX} px at 1280 px: {tall}"
