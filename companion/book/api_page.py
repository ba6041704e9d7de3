"""The API reference: an index page (``book/api.md``) and one page per subpackage (``book/api/*.md``).

A page lists its modules with ``% companion-api: MODULE`` lines; :func:`render_api_pages` imports
every listed module in a fresh interpreter and replaces each line with the module's autodoc.
"""
from __future__ import annotations


import json
import os
import re
import subprocess
import sys
from pathlib import Path

from collections.abc import Callable

from companion.book.layout import RunFailure

API_MARKER = re.compile(r"^% companion-api:\s*(\S+)\s*$", re.MULTILINE)


_PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = ["ok", ""]
    except Exception as err:
        out[name] = ["error", f"{type(err).__name__}: {err}"]
print(json.dumps(out))
"""


def probe_modules(modules: list[str], root: Path) -> dict[str, tuple[str, str]]:
    """Import each module in a fresh interpreter: ``ok`` or ``error``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _PROBE, *modules], capture_output=True, text=True,
                          env=env, cwd=root)
    if done.returncode != 0:
        raise RunFailure(f"probing the API modules failed:\n{done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    return {k: (v[0], v[1]) for k, v in json.loads(lines[-1]).items()}


def render_api_section(module: str, status: str, detail: str) -> str:
    """The MyST for one module of the API reference page."""
    head = f"## `{module}`\n\n"
    if status == "ok":
        # autodoc emits reStructuredText: parse it as such (inside MyST it would show as raw text).
        return head + f"```{{eval-rst}}\n.. automodule:: {module}\n```\n"
    return head + f"```{{warning}}\nThis module failed to import, so it is not documented here:\n`{detail}`\n```\n"


def api_pages(book_dir: Path) -> list[Path]:
    """The API reference's pages under a book's page folder: ``api.md`` (the index) and ``api/*.md``."""
    pages = [book_dir / "api.md"] + sorted((book_dir / "api").glob("*.md"))
    return [p for p in pages if p.is_file()]


def render_api_pages(book_dir: Path, root: Path, log: Callable[[str], None] = print) -> dict[str, tuple[str, str]]:
    """Replace every ``% companion-api: MODULE`` line of the API pages in ``book_dir`` (a staged copy:
    the pages are rewritten) with that module's autodoc; return each module's import status.

    The modules of every page are imported together in one fresh interpreter (:func:`probe_modules`,
    with ``root`` on the path); a module that fails to import gets a warning box instead, and ``log``
    says so.
    """
    pages = {page: page.read_text(encoding="utf-8") for page in api_pages(book_dir)}
    modules = list(dict.fromkeys(m for text in pages.values() for m in API_MARKER.findall(text)))
    probed = probe_modules(modules, root) if modules else {}
    for module, (status, detail) in probed.items():
        if status == "error":
            log(f"warning: API reference: {module} does not import ({detail})")
    for page, text in pages.items():
        new = API_MARKER.sub(lambda m: render_api_section(m.group(1), *probed[m.group(1)]), text)
        if new != text:
            page.write_text(new, encoding="utf-8")
    return probed
