"""Sphinx settings for the companion book that ``_config.yml`` cannot express."""
from __future__ import annotations

from typing import Any


def setup(app: Any) -> dict[str, Any]:
    # Chapter titles contain math and appear in every page's navigation, so MathJax must be
    # loaded on every page, not only on pages whose body has an equation.
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
