"""The built book, as a reader's browser sees it (headless Debian Chromium via Playwright).

Each page is served from 127.0.0.1 and checked for: equations typeset by MathJax (output
elements present, no raw TeX left in the text), every image loaded, no failed request and no
request to any other host, figures and tables numbered and captioned, and no sideways scroll
at a desktop width (1280 px) or a phone's (390 px): ``document.scrollingElement.scrollWidth``
stays within the window, tables and long formulas scrolling inside their own boxes. A
full-page screenshot of each page at each width goes to ``_build/screenshots/`` for a person to
look at; CI, where nobody does, skips them (``COMPANION_SCREENSHOTS=1`` takes them there too,
``=0`` skips them anywhere).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from tests.conftest import write_notebook

pytestmark = pytest.mark.book

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
LOCAL_HOSTS = {"127.0.0.1"}

# Runs in the page once MathJax is done: math elements, how many were typeset, TeX left over
# in the visible text (code blocks excluded), and images that did not load.
PAGE_PROBE = """
async () => {
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  const math = Array.from(document.querySelectorAll('.math'));
  const body = document.body.cloneNode(true);
  body.querySelectorAll('pre, code, script, style, mjx-container, .highlight').forEach(e => e.remove());
  const text = body.textContent;
  const leftovers = ['$$', '\\\\(', '\\\\[', '\\\\frac', '\\\\rho'].filter(s => text.includes(s));
  // reStructuredText that was not parsed (docstrings read as Markdown show these as text). Inline
  // code stays in this text: a docstring's broken literal (``gid``s) renders as inline code that
  // holds the raw markup.
  const prose = document.body.cloneNode(true);
  prose.querySelectorAll('pre, script, style, mjx-container, .highlight').forEach(e => e.remove());
  const rst = ['.. py:', '.. automodule', '.. auto', ':func:`', ':class:`', ':mod:`', ':data:`', ':meth:`', '``',
               '====='].filter(s => prose.textContent.includes(s));
  // Tables and display equations that run past the text column (or are clipped inside it) at
  // this viewport width.
  const article = document.querySelector('article.bd-article') || document.querySelector('article') || document.body;
  const right = article.getBoundingClientRect().right;
  const overflow = [];
  article.querySelectorAll('table, mjx-container[display="true"], div.math, .pst-scrollable-table-container')
    .forEach(e => {
      const r = e.getBoundingClientRect();
      if (r.right > right + 1 || (e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1)) {
        overflow.push(e.tagName.toLowerCase() + ' ' + Math.round(Math.max(r.right - right, e.scrollWidth - e.clientWidth))
                      + 'px: ' + (e.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 60));
      }
    });
  // Tables in the article without a numbered caption (the parameters box, the generated
  // indexes and the tables of docstrings on the API page are not the book's tables).
  const untitled = Array.from(article.querySelectorAll('table'))
    .filter(t => !t.closest('.companion-parameters, dl.py') && !t.matches('.genindextable, .indextable, .modindextable'))
    .filter(t => !t.querySelector('caption .caption-number'))
    .map(t => (t.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 60));
  // Sideways scroll of the whole page, and the element that reaches furthest right.
  const pageWidth = document.scrollingElement.scrollWidth;
  let widest = '';
  if (pageWidth > window.innerWidth + 1) {
    let best = null, bestRight = window.innerWidth + 1;
    // an element inside a box that scrolls or clips sideways does not widen the page
    const clipped = e => {
      for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== 'visible' && a.getBoundingClientRect().right <= window.innerWidth + 1) {
          return true;
        }
      }
      return false;
    };
    document.body.querySelectorAll('*').forEach(e => {
      const r = e.getBoundingClientRect();
      if (r.width > 0 && r.right > bestRight && !clipped(e)) { best = e; bestRight = r.right; }
    });
    if (best) {
      widest = best.tagName.toLowerCase() + (best.className && typeof best.className === 'string' ? '.' + best.className.trim().split(/\\s+/).join('.') : '')
               + ' right edge ' + Math.round(bestRight) + 'px: ' + (best.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 80);
    }
  }
  // Figures: images in the article outside a numbered, captioned <figure>.
  const uncaptioned = Array.from(article.querySelectorAll('img'))
    .filter(i => { const f = i.closest('figure'); return !(f && f.querySelector('figcaption .caption-number')); })
    .map(i => i.src);
  return {
    overflow: overflow,
    uncaptioned: uncaptioned,
    untitled: untitled,
    page_width: pageWidth,
    window_width: window.innerWidth,
    widest: widest,
    full_size_links: Array.from(article.querySelectorAll('figure img'))
      .filter(i => { const a = i.closest('a'); return a && a.getAttribute('href'); }).length,
    figure_images: article.querySelectorAll('figure img').length,
    math: math.length,
    typeset: math.filter(e => e.querySelector('mjx-container')).length,
    containers: document.querySelectorAll('mjx-container').length,
    leftovers: leftovers,
    rst: rst,
    autodoc: document.querySelectorAll('dl.py').length,
    images: document.images.length,
    broken: Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src),
  };
}
"""


@dataclass
class PageReport:
    path: str
    math: int
    typeset: int
    containers: int
    leftovers: list[str]
    rst: list[str]
    autodoc: int
    images: int
    broken: list[str]
    overflow: list[str] = field(default_factory=list)
    uncaptioned: list[str] = field(default_factory=list)
    untitled: list[str] = field(default_factory=list)
    page_width: int = 0
    window_width: int = 0
    widest: str = ""
    full_size_links: int = 0
    figure_images: int = 0


@dataclass
class BrowserReport:
    pages: dict[str, PageReport] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


@pytest.fixture
def serve() -> Iterator:
    """Serve a directory on 127.0.0.1 (a free port); yields a function dir -> base URL."""
    servers = []

    def start(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def book_pages(html: Path) -> list[str]:
    """Every page of the book (relative paths), the generated index/search pages included."""
    return sorted(
        p.relative_to(html).as_posix() for p in html.rglob("*.html")
        if not p.relative_to(html).parts[0].startswith("_")
    )


WIDTHS = (1280, 390)   # a desktop window and a phone (iPhone 12 to 15 width, in CSS pixels)
# Full-page screenshots of the whole book: for people, so not in CI (see the module docstring).
SCREENSHOTS = os.environ.get("COMPANION_SCREENSHOTS", "0" if os.environ.get("CI") else "1") == "1"


def check_in_browser(html: Path, base_url: str, screenshots: Path, width: int = 1280, *,
                     shots: bool = True) -> BrowserReport:
    """Open every page of the book at ``base_url`` in headless Chromium, ``width`` CSS pixels
    wide, and report; with ``shots``, save a full-page screenshot of each in ``screenshots``."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    report = BrowserReport()
    screenshots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": 900 if width > 600 else 844})
            context.on("request", lambda r: report.requests.append(r.url))
            context.on("requestfailed", lambda r: report.failures.append(f"{r.url}: {r.failure}"))
            context.on("response", lambda r: r.status >= 400 and report.failures.append(f"{r.url}: HTTP {r.status}"))
            page = context.new_page()
            for rel in book_pages(html):
                page.goto(base_url + rel, wait_until="load")
                # Not "networkidle": Chromium sometimes never reports it on long pages even with
                # every request finished. Wait for what the checks need instead.
                page.wait_for_function("() => Array.from(document.images).every(i => i.complete)")
                result = page.evaluate(PAGE_PROBE)
                report.pages[rel] = PageReport(rel, **result)
                if shots:
                    suffix = "" if width == 1280 else f"@{width}"
                    shot = screenshots / (rel.replace("/", "__").removesuffix(".html") + f"{suffix}.png")
                    page.screenshot(path=str(shot), full_page=True, timeout=120_000)   # the API page is long
        finally:
            browser.close()
    return report


def assert_book_ok(report: BrowserReport, expect_math_on: list[str], expect_images_on: list[str],
                   width: int = 1280) -> None:
    """The checks every built book must pass in the browser, at ``width`` CSS pixels."""
    remote = [u for u in report.requests
              if urlsplit(u).scheme not in ("data", "blob", "about") and urlsplit(u).hostname not in LOCAL_HOSTS]
    assert not remote, f"requests left localhost: {remote}"
    assert not report.failures, f"failed requests: {report.failures}"
    for rel, page in report.pages.items():
        assert page.typeset == page.math, f"{rel}: {page.math - page.typeset} equation(s) not typeset"
        assert not page.leftovers, f"{rel}: raw TeX left in the page: {page.leftovers}"
        assert not page.rst, f"{rel}: raw reStructuredText left in the page: {page.rst}"
        assert not page.broken, f"{rel}: images not loaded: {page.broken}"
        if width >= 1280:   # at a phone's width tables and formulas scroll inside their boxes
            assert not page.overflow, f"{rel}: wider than the text column at 1280 px: {page.overflow}"
        assert page.page_width <= page.window_width + 1, \
            (f"{rel} scrolls sideways at {width} px: the page is {page.page_width} px wide in a "
             f"{page.window_width} px window; widest element: {page.widest}")
        assert page.full_size_links == page.figure_images, \
            f"{rel}: {page.figure_images - page.full_size_links} figure image(s) do not open at full size"
    for rel in expect_math_on:
        assert report.pages[rel].containers > 0, f"{rel}: no MathJax output"
    for rel in expect_images_on:
        assert report.pages[rel].images > 0, f"{rel}: no image"


# Chapters whose tables are not yet numbered and captioned (their owners apply
# companion.book.tables.captioned_table; remove a chapter from here when its tables have captions).
TABLES_PENDING: set[str] = set()   # chapters whose tables are not captioned yet: none


@pytest.mark.parametrize("width", WIDTHS)
def test_built_book_in_browser(built_book: Path, serve, width: int) -> None:
    """The repository's book at a desktop and a phone width: every page typesets, loads every
    image, stays on localhost, never scrolls sideways, and numbers its figures and tables."""
    from companion.book.record import load_record

    report = check_in_browser(built_book, serve(built_book), built_book.parent / "screenshots", width,
                              shots=SCREENSHOTS)
    assert "book/intro.html" in report.pages and "book/api.html" in report.pages
    record = load_record(built_book.parent / "run-record.json")
    notebook_pages = [f"notebooks/{name}.html" for name in record.chapters
                      if (built_book / "notebooks" / f"{name}.html").is_file()]
    with_figures = [f"notebooks/{name}.html" for name, run in record.chapters.items()
                    if run.figures and f"notebooks/{name}.html" in report.pages]
    (built_book.parent / "screenshots" / f"report@{width}.json").write_text(
        json.dumps({k: vars(v) for k, v in report.pages.items()}, indent=1), encoding="utf-8")
    assert_book_ok(report, expect_math_on=["book/intro.html"], expect_images_on=with_figures, width=width)
    # the API page's other tables come from the library's docstrings (module docstrings included)
    untitled = {rel: p.untitled for rel, p in report.pages.items()
                if p.untitled and rel not in TABLES_PENDING and not rel.startswith("book/api")}
    assert not untitled, f"tables without a number and caption: {untitled}"
    assert "book/references.html" in report.pages, "the references page is not in the book"
    api = {rel: p.autodoc for rel, p in report.pages.items() if rel.startswith("book/api/")}
    assert len(api) >= 9 and sum(api.values()) > 100, \
        f"the API pages document only {api} objects: autodoc output not rendered?"
    for rel in notebook_pages:
        assert rel in report.pages
        assert not report.pages[rel].uncaptioned, \
            f"{rel}: figures without a number and caption: {report.pages[rel].uncaptioned}"


def test_overflow_probe_flags_a_wide_table_and_equation(serve, tmp_path: Path) -> None:
    """The overflow check itself: a page whose table and display equation are wider than its
    text column is reported, and a page that fits is not."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    cells = "".join(f"<td>column{i}_with_a_long_unbreakable_value</td>" for i in range(8))
    wide = (f"<article class='bd-article' style='width:600px'><table><tr>{cells}</tr></table>"
            "<div class='math' style='overflow-x:auto'><div style='width:900px'>x</div></div></article>")
    narrow = "<article class='bd-article' style='width:600px'><table><tr><td>a</td></tr></table></article>"
    (tmp_path / "wide.html").write_text(f"<html><body>{wide}</body></html>", encoding="utf-8")
    (tmp_path / "narrow.html").write_text(f"<html><body>{narrow}</body></html>", encoding="utf-8")
    base = serve(tmp_path)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            found = {}
            for name in ("wide", "narrow"):
                page.goto(f"{base}{name}.html", wait_until="load")
                found[name] = page.evaluate(PAGE_PROBE)["overflow"]
        finally:
            browser.close()
    assert any(o.startswith("table") for o in found["wide"]), found
    assert any(o.startswith("div") for o in found["wide"]), found
    assert found["narrow"] == [], found


def test_sideways_scroll_probe_names_the_widest_element(serve, tmp_path: Path) -> None:
    """The phone check itself: at 390 px a page holding an unbreakable 700 px line scrolls
    sideways and the probe names that element; the same content in a scrolling box does not."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    wide = "<article class='bd-article'><p><span class='culprit' style='display:inline-block;width:700px'>x</span></p></article>"
    boxed = ("<article class='bd-article'><div style='max-width:100%;overflow-x:auto'>"
             "<span style='display:inline-block;width:700px'>x</span></div></article>")
    (tmp_path / "wide.html").write_text(f"<html><body style='margin:0'>{wide}</body></html>", encoding="utf-8")
    (tmp_path / "boxed.html").write_text(f"<html><body style='margin:0'>{boxed}</body></html>", encoding="utf-8")
    base = serve(tmp_path)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
            found = {}
            for name in ("wide", "boxed"):
                page.goto(f"{base}{name}.html", wait_until="load")
                found[name] = page.evaluate(PAGE_PROBE)
        finally:
            browser.close()
    assert found["wide"]["page_width"] > found["wide"]["window_width"] + 1, found["wide"]
    assert found["wide"]["widest"].startswith("span.culprit"), found["wide"]["widest"]
    assert found["boxed"]["page_width"] <= found["boxed"]["window_width"] + 1, found["boxed"]
    assert found["boxed"]["widest"] == "", found["boxed"]


def test_notebook_chapter_in_browser(make_project, serve, tmp_path: Path) -> None:
    """A throwaway chapter with math, a glued value and a figure renders fully offline."""
    from companion.book.layout import Layout
    from companion.book.run import reproduce

    root = make_project("01_demo")
    write_notebook(
        root / "notebooks" / "01_demo.ipynb",
        "seed = 0\nn_points = 20",
        "# md\n# Demo\n\nThe bound $\\rho^* \\ge \\Delta^2/(2s)$ and\n\n$$\\phi_1(\\gamma) \\ge \\frac{\\gamma^2}{2}.$$",
        "import numpy as np, matplotlib.pyplot as plt\nfrom companion.figures import save_figure\n"
        "from myst_nb import glue\nfig, ax = plt.subplots()\n"
        "ax.plot(np.random.default_rng(seed).normal(size=n_points))\nsave_figure(fig, 'demo_walk')\n"
        "glue('points', n_points)",
        "# md\nWe drew {glue:}`points` points.",
        title=None,
    )
    layout = Layout.at(root)
    reproduce(layout, "cpu", {"n_points": 30}, log=lambda *_: None)
    report = check_in_browser(layout.html, serve(layout.html), tmp_path / "screenshots")
    assert_book_ok(report, expect_math_on=["book/intro.html", "notebooks/01_demo.html"],
                   expect_images_on=["notebooks/01_demo.html"])
    chapter = (layout.html / "notebooks" / "01_demo.html").read_text(encoding="utf-8")
    assert "We drew" in chapter and ">30<" in chapter.replace(" ", ""), "glued value not rendered"
    status = (layout.html / "book" / "reproduction_status.html").read_text(encoding="utf-8")
    assert "demo_walk" in status and "01_demo" in status
    assert (tmp_path / "screenshots" / "notebooks__01_demo.png").stat().st_size > 10_000


# -- search results: math reads as text, never as raw TeX ---------------------------------------

SEARCH_JS = Path(__file__).resolve().parents[1] / "book" / "_ext" / "static" / "companion-search.js"
TEX_MARKS = ["\\(", "\\)", "\\[", "$", "\\log", "\\rho", "\\frac", "\\gamma", "\\mathrm", "\\varphi", "^{", "_{"]


def search_results(html: Path, base_url: str, query: str, screenshot: Path | None = None) -> list[str]:
    """The text of each hit (title and snippet) that the book's search page lists for ``query``,
    once every snippet has arrived."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(f"{base_url}search.html?q={query}", wait_until="load")
            page.wait_for_function("() => /finished/.test(document.querySelector('#search-results .search-summary, "
                                   "#search-results p')?.textContent || '')", timeout=30_000)
            # snippets are fetched page by page after the list: wait until no hit is still without one
            page.wait_for_function("() => Array.from(document.querySelectorAll('#search-results li'))"
                                   ".every(li => li.querySelector('.context') || li.querySelector('span'))",
                                   timeout=30_000)
            if screenshot is not None:
                page.screenshot(path=str(screenshot), full_page=True)
            return [li.inner_text() for li in page.query_selector_all("#search-results li")]
        finally:
            browser.close()


def test_search_snippets_and_titles_show_no_tex(built_book: Path, serve) -> None:
    """Searching the built book for a word next to math ("ceiling": the log 2 and log(m+1)
    ceilings of chapters 2, 3 and 5) lists titles and snippets with the math as text."""
    hits = search_results(built_book, serve(built_book), "ceiling",
                          built_book.parent / "screenshots" / "search_ceiling.png")
    chapters = [h for h in hits if "\n" in h.strip()]  # page hits carry a snippet under the title
    assert len(chapters) >= 2, hits
    for hit in hits:
        assert not [m for m in TEX_MARKS if m in hit], f"raw TeX in a search result: {hit[:300]!r}"
    assert any("log 2" in h for h in chapters), chapters


def test_tex_to_text_reads_math_plainly(serve, tmp_path: Path) -> None:
    """The conversion the search page applies: common TeX as Unicode text, delimiters dropped,
    and a page's math elements converted in place (typeset ones left alone)."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    (tmp_path / "companion-search.js").write_text(SEARCH_JS.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "probe.html").write_text(
        "<html><head><meta charset='utf-8'><script src='companion-search.js'></script></head><body><div id='r'>"
        "<span class='math'>\\(\\log 2\\)</span> and <div class='math'>\\[\\rho^* \\ge \\frac{\\Delta^2}{2s}\\]</div>"
        "<span class='math'><mjx-container>typeset</mjx-container></span></div></body></html>", encoding="utf-8")
    cases = {
        "\\(\\rho^* \\ge \\Delta^2/(2s)\\)": "\u03c1* \u2265 \u0394\u00b2/(2s)",
        "\\(\\frac{\\gamma^2}{2}\\)": "\u03b3\u00b2/2",
        "\\(\\frac{a+b}{m+1}\\)": "(a+b)/(m+1)",
        "\\(p_{(1)} - p_{(2)}\\)": "p\u208d\u2081\u208e \u2212 p\u208d\u2082\u208e",
        "\\(\\mathrm{KL}(p\\|q) < \\rho^*_c\\)": "KL(p\u2016q) < \u03c1*_c",
        "\\((m+1)\\gamma^2/4\\)": "(m+1)\u03b3\u00b2/4",
        "\\(\\log(m+1)\\)": "log(m+1)",
        "\\(\\varphi_m(\\gamma)\\)": "\u03c6\u2098(\u03b3)",
        "$\\min(0.09, 0.3 e^{-H})$": "min(0.09, 0.3 e^(\u2212H))",
        "\\(\\left( \\sqrt{s} \\right)\\)": "( \u221as )",
    }
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_context().new_page()
            page.goto(f"{serve(tmp_path)}probe.html", wait_until="load")
            got = {tex: page.evaluate("t => window.companionTexToText(t)", tex) for tex in cases}
            page.evaluate("() => window.companionUntex(document.getElementById('r'))")
            untexed = page.evaluate("() => document.getElementById('r').textContent")
        finally:
            browser.close()
    assert got == cases
    assert untexed == "log 2 and \u03c1* \u2265 \u0394\u00b2/(2s)typeset", untexed
