"""Run the ``companion`` command line from Python and show the errors it is meant to give.

Chapter 9 walks through the command line the way a reader would type it; these two helpers keep
that plumbing out of the notebook.
"""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path
from typing import Callable


def run_cli(*args: str, cwd: str | Path) -> subprocess.CompletedProcess:
    """Run ``companion ARGS`` in ``cwd`` with this interpreter; print the command first."""
    print("$ " + shlex.join(["companion", *args]))
    return subprocess.run([sys.executable, "-m", "companion", *args], cwd=cwd,
                          capture_output=True, text=True)


def show_error(action: Callable[[], object]) -> Exception:
    """Run ``action``, print the error it raises (type and message) and return it.

    Raises ``AssertionError`` when ``action`` raises nothing: the caller expected a mistake.
    """
    try:
        action()
    except Exception as err:  # the point is to look at it
        print(f"{type(err).__name__}: {err}")
        return err
    raise AssertionError("expected an error, got none")
