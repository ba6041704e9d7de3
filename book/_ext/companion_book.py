"""Sphinx settings for the companion book that ``_config.yml`` cannot express."""
from __future__ import annotations

from pathlib import Path
from typing import Any

STATIC = Path(__file__).parent / "static"


def _add_static(app: Any) -> None:
    app.config.html_static_path.append(str(STATIC))


def setup(app: Any) -> dict[str, Any]:
    # Chapter titles contain math and appear in every page's navigation, so MathJax must be
    # loaded on every page, not only on pages whose body has an equation.
    app.set_html_assets_policy("always")
    # companion.css: tables wrap inside the text column (no horizontal overflow at 1280 px).
    app.connect("builder-inited", _add_static)
    app.add_css_file("companion.css")
    # companion-fit.js: a display equation or table slightly too wide is set smaller (>= 9 pt).
    app.add_js_file("companion-fit.js")
    # companion-search.js: search results (titles and snippets) show math as text, not raw TeX.
    app.add_js_file("companion-search.js")
    # companion_api: the API reference's entries (short values, field comments, folded details).
    app.setup_extension("companion_api")
    # companion_figures: phone variants of figures (<picture>), tables numbered from 1 on every page.
    app.setup_extension("companion_figures")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
