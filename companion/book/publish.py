"""What only the published book has: launch and repository buttons, and pinned install cells.

The offline build (``companion reproduce``, ``companion build-book``, CI) uses ``_config.yml`` as
it is: no launch buttons, no repository or issue buttons, nothing loaded from another host.
The Pages workflow (``.github/workflows/book.yml``) knows which repository and commit it
builds, and before ``companion reproduce`` it runs

1. ``python -m companion.book.publish stamp --repository OWNER/NAME --commit SHA notebooks/*.ipynb``:
   every chapter's first cell (the hidden install cell) now installs the companion from that
   commit when a kernel lacks it;
2. ``python -m companion.book.publish config --repository OWNER/NAME``: ``_config.yml`` is rewritten
   with the repository URL, the repository and issue buttons, and Binder and Colab launch
   buttons that open ``notebooks/<chapter>.ipynb`` on the *launch branch*;

and after the build it commits the stamped notebooks (and ``python -m companion.book.publish binder``'s
Binder environment) on top of the built commit and force-pushes that to the launch branch
(``book-launch``). So the notebook a reader launches from a page is the one that page was built
from, and its install cell pins the very commit that built it.

The install cell installs only when ``import companion`` fails; the environment variable
``COMPANION_INSTALL_SOURCE`` replaces the pinned requirement (any ``pip install`` argument: a
path, a wheel, ``companion @ git+https://...``). In the repository itself the cells carry the
placeholder ``OWNER/companion``, which the stamp replaces; an unstamped cell refuses to install.
"""
from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PLACEHOLDER_REPOSITORY = "OWNER/companion"
"""The repository named in the sources (``_config.yml``, ``pyproject.toml``, the install cells)
until the Pages workflow substitutes the real one."""

LAUNCH_BRANCH = "book-launch"
"""The branch the published launch buttons open: the built commit plus its stamped notebooks."""

INSTALL_SOURCE_ENV = "COMPANION_INSTALL_SOURCE"
INSTALL_CELL_ID = "install"
INSTALL_CELL_TAGS = ["remove-input", "remove-output"]
BINDERHUB_URL = "https://mybinder.org"
COLAB_URL = "https://colab.research.google.com"

_PIN_LINE = re.compile(r'^COMPANION_PIN = "(?P<requirement>[^"\n]*)"$', re.MULTILINE)
_REPOSITORY = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

_CELL_TEMPLATE = '''\
# Installs the companion library when this kernel lacks it (Colab, Binder), from the commit the
# book was built from. Hidden in the book. COMPANION_INSTALL_SOURCE overrides what is installed.
import importlib
import os
import subprocess
import sys

COMPANION_PIN = "{requirement}"
try:
    import companion  # noqa: F401
except ImportError:
    source = os.environ.get("{env}", COMPANION_PIN)
    if "github.com/{placeholder_owner}/" in source:
        raise RuntimeError("this copy of the chapter is not pinned to a commit: open it with a launch button of "
                           "the published book, or set {env} to a pip requirement") from None
    print(f"installing {{source}}")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", source], check=True)
    importlib.invalidate_caches()
    import companion  # noqa: F401'''


def install_requirement(repository: str = PLACEHOLDER_REPOSITORY, commit: str = "main") -> str:
    """The pip requirement an install cell pins: ``companion[notebooks] @ git+https://github.com/R@C``."""
    return f"companion[notebooks] @ git+https://github.com/{repository}@{commit}"


def install_cell_source(requirement: str | None = None) -> str:
    """The source of every chapter's first cell, pinned to ``requirement`` (default: the placeholder)."""
    return _CELL_TEMPLATE.format(requirement=requirement or install_requirement(), env=INSTALL_SOURCE_ENV,
                                 placeholder_owner=PLACEHOLDER_REPOSITORY.split("/")[0])


def pinned_requirement(source: str) -> str | None:
    """The requirement an install cell's source pins, or ``None`` if it is not an install cell."""
    match = _PIN_LINE.search(source)
    if match is None or source != install_cell_source(match.group("requirement")):
        return None
    return match.group("requirement")


def check_repository(repository: str) -> str:
    if not _REPOSITORY.match(repository or ""):
        raise ValueError(f"repository must look like OWNER/NAME (GitHub's), got {repository!r}")
    return repository


def stamp_install_cells(paths: Iterable[Path], repository: str, commit: str) -> list[Path]:
    """Pin the install cell (the first cell) of each notebook to ``repository@commit``, in place.

    Only that cell's source changes; every other byte of the notebook is written back as read.
    Raises ``ValueError`` for a notebook whose first cell is not an install cell.
    """
    import nbformat

    check_repository(repository)
    if not _COMMIT.match(commit or ""):
        raise ValueError(f"commit must be a hexadecimal git commit id, got {commit!r}")
    requirement = install_requirement(repository, commit)
    done = []
    for path in map(Path, paths):
        nb = nbformat.read(path, as_version=4)
        first = nb.cells[0] if nb.cells else None
        if first is None or first.cell_type != "code" or pinned_requirement(first.source) is None:
            raise ValueError(f"{path}: the first cell is not the companion's install cell")
        first.source = install_cell_source(requirement)
        nbformat.write(nb, path)
        done.append(path)
    return done


def published_config(config: dict[str, Any], repository: str, *, branch: str = LAUNCH_BRANCH) -> dict[str, Any]:
    """A copy of the book's ``_config.yml`` settings with the published build's buttons turned on.

    Sets the repository URL and the launch ``branch``, turns on the repository and issue buttons,
    and points Binder and Colab launch buttons at ``notebooks/<chapter>.ipynb`` on ``branch``.
    Everything else (offline MathJax, no Thebe, no edit button) is kept.
    """
    check_repository(repository)
    out = copy.deepcopy(config)
    out.setdefault("repository", {}).update({"url": f"https://github.com/{repository}", "path_to_book": "",
                                             "branch": branch})
    out.setdefault("html", {}).update({"use_repository_button": True, "use_issues_button": True,
                                       "use_edit_page_button": False})
    out.setdefault("launch_buttons", {}).update({"notebook_interface": "jupyterlab", "binderhub_url": BINDERHUB_URL,
                                                 "colab_url": COLAB_URL, "thebe": False})
    return out


def binder_files(torch_version: str = "2.13.0") -> dict[str, str]:
    """Binder's environment for the launch branch: CPU torch, then the pins of ``requirements.txt``."""
    return {
        "requirements.txt": (
            "# Binder's environment for this launch branch (python -m companion.book.publish binder).\n"
            "# The CPU build of torch, then the repository's pins; each chapter's first cell installs\n"
            "# the companion itself, from the commit the book was built from.\n"
            "--extra-index-url https://download.pytorch.org/whl/cpu\n"
            f"torch=={torch_version}+cpu\n"
            "-r ../requirements.txt\n"
        ),
        "runtime.txt": "python-3.11\n",
    }


def _cmd_config(args: argparse.Namespace) -> None:
    import yaml

    path = Path(args.config)
    text = path.read_text(encoding="utf-8")
    config = published_config(yaml.safe_load(text), args.repository, branch=args.launch_branch)
    header = (f"# Written by `python -m companion.book.publish config` for the published build of {args.repository};\n"
              "# the repository's own _config.yml is the offline one.\n")
    path.write_text(header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    print(f"{path}: repository, issue and launch buttons on ({args.repository}, branch {args.launch_branch})")


def _cmd_stamp(args: argparse.Namespace) -> None:
    done = stamp_install_cells([Path(p) for p in args.notebooks], args.repository, args.commit)
    print(f"stamped {len(done)} notebook(s): {install_requirement(args.repository, args.commit)}")


def _cmd_binder(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in binder_files().items():
        (out / name).write_text(text, encoding="utf-8")
    print(f"{out}: {', '.join(binder_files())}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m companion.book.publish", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    config = sub.add_parser("config", help="rewrite _config.yml with the published build's buttons")
    config.add_argument("--repository", required=True, help="OWNER/NAME on GitHub")
    config.add_argument("--launch-branch", default=LAUNCH_BRANCH, help=f"branch the launch buttons open ({LAUNCH_BRANCH})")
    config.add_argument("--config", default="_config.yml", help="the file to rewrite (_config.yml)")
    config.set_defaults(run=_cmd_config)
    stamp = sub.add_parser("stamp", help="pin every chapter's install cell to a commit")
    stamp.add_argument("--repository", required=True, help="OWNER/NAME on GitHub")
    stamp.add_argument("--commit", required=True, help="the commit id the book is built from")
    stamp.add_argument("notebooks", nargs="+", help="the chapters (notebooks/*.ipynb)")
    stamp.set_defaults(run=_cmd_stamp)
    binder = sub.add_parser("binder", help="write Binder's environment files")
    binder.add_argument("--out", default="binder", help="folder to write them to (binder)")
    binder.set_defaults(run=_cmd_binder)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
