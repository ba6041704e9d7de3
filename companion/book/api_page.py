"""The API reference page: every listed module imported in a fresh interpreter, documented with autodoc."""
from __future__ import annotations


import json
import os
import re
import subprocess
import sys
from pathlib import Path

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
    head = f"### `{module}`\n\n"
    if status == "ok":
        # autodoc emits reStructuredText: parse it as such (inside MyST it would show as raw text).
        return head + f"```{{eval-rst}}\n.. automodule:: {module}\n```\n"
    return head + f"```{{warning}}\nThis module failed to import, so it is not documented here:\n`{detail}`\n```\n"
