"""Every chapter's hidden first cell installs the companion when a kernel lacks it.

The cell is run as a script in a fresh virtual environment that has the pinned dependencies
(through a ``.pth`` to this interpreter's site-packages, whose own ``.pth`` files, among them the
editable install of the companion, are not processed) but no companion. With
``COMPANION_INSTALL_SOURCE`` pointing at a copy of this checkout and pip kept off the network
(``--no-index --no-deps --no-build-isolation`` through pip's environment variables), the cell
must install it there, and ``import companion`` must then come from that install.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

from companion.book.publish import (
    INSTALL_CELL_ID,
    INSTALL_CELL_TAGS,
    INSTALL_SOURCE_ENV,
    install_cell_source,
    install_requirement,
    pinned_requirement,
    stamp_install_cells,
)
from companion.book.toc import read_chapters
from tests.conftest import ROOT

CHAPTERS = [c.path for c in read_chapters(ROOT)]


def _first_cell(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4).cells[0]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_every_chapter_starts_with_the_hidden_install_cell(path: Path) -> None:
    cell = _first_cell(path)
    assert cell.cell_type == "code" and cell.get("id") == INSTALL_CELL_ID
    assert cell.metadata.get("tags") == INSTALL_CELL_TAGS
    assert cell.source == install_cell_source(), "the install cell differs from companion.book.publish's"
    assert pinned_requirement(cell.source) == install_requirement()   # the placeholder, until stamped
    assert not cell.outputs and cell.execution_count is None


def test_stamping_changes_only_the_pin(tmp_path: Path) -> None:
    copies = []
    for path in CHAPTERS[:3]:
        copies.append(tmp_path / path.name)
        shutil.copy2(path, copies[-1])
    commit = "0123456789abcdef0123456789abcdef01234567"
    stamp_install_cells(copies, "some-org/some-book", commit)
    for path, copy in zip(CHAPTERS, copies):
        before, after = nbformat.read(path, as_version=4), nbformat.read(copy, as_version=4)
        assert pinned_requirement(after.cells[0].source) == \
            f"companion[notebooks] @ git+https://github.com/some-org/some-book@{commit}"
        assert after.cells[0].source.count("\n") == before.cells[0].source.count("\n")
        assert after.cells[1:] == before.cells[1:] and after.metadata == before.metadata
        # only the pin line differs in the file itself
        old, new = path.read_text().splitlines(), copy.read_text().splitlines()
        assert len(old) == len(new) and sum(a != b for a, b in zip(old, new)) == 1
    # a stamped cell can be stamped again (a rebuild); a notebook without the cell is refused
    stamp_install_cells([copies[0]], "a/b", "abcdef1")
    assert pinned_requirement(_first_cell(copies[0]).source) == install_requirement("a/b", "abcdef1")
    with pytest.raises(ValueError, match="not the companion's install cell"):
        stamp_install_cells([_without_install_cell(copies[1], tmp_path)], "a/b", commit)
    with pytest.raises(ValueError, match="OWNER/NAME"):
        stamp_install_cells(copies, "not a repository", commit)
    with pytest.raises(ValueError, match="commit"):
        stamp_install_cells(copies, "a/b", "main; rm -rf /")


def _without_install_cell(path: Path, tmp_path: Path) -> Path:
    nb = nbformat.read(path, as_version=4)
    nb.cells = nb.cells[1:]
    out = tmp_path / "no-install.ipynb"
    nbformat.write(nb, out)
    return out


def _cell_script(tmp_path: Path) -> Path:
    script = tmp_path / "install_cell.py"
    script.write_text(_first_cell(CHAPTERS[0]).source + "\nprint('companion from', companion.__file__)\n")
    return script


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", INSTALL_SOURCE_ENV) and not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def test_the_cell_does_nothing_when_the_companion_is_there(tmp_path: Path) -> None:
    env = _clean_env(PYTHONPATH=str(ROOT), **{INSTALL_SOURCE_ENV: str(tmp_path / "nothing-here")})
    done = subprocess.run([sys.executable, str(_cell_script(tmp_path))], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "installing" not in done.stdout
    assert f"companion from {ROOT / 'companion' / '__init__.py'}" in done.stdout


@pytest.mark.slow
def test_the_cell_installs_into_a_fresh_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    fresh_site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                     capture_output=True, text=True, check=True).stdout.strip())
    # The pinned dependencies (and pip, setuptools), but not this interpreter's .pth files.
    (fresh_site / "pinned-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = tmp_path / "checkout"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "companion", source / "companion", ignore=shutil.ignore_patterns("__pycache__"))
    script = _cell_script(tmp_path)
    probe = [str(python), "-c", "import companion"]

    before = subprocess.run(probe, cwd=tmp_path, env=_clean_env(), capture_output=True, text=True)
    assert before.returncode != 0 and "No module named 'companion'" in before.stderr, "the venv must lack it"

    unpinned = subprocess.run([str(python), str(script)], cwd=tmp_path, env=_clean_env(), capture_output=True,
                              text=True, timeout=300)
    assert unpinned.returncode != 0 and "not pinned to a commit" in unpinned.stderr

    offline = _clean_env(PIP_NO_INDEX="1", PIP_NO_DEPS="1", PIP_NO_BUILD_ISOLATION="0",
                         **{INSTALL_SOURCE_ENV: f"companion[notebooks] @ {source.as_uri()}"})
    done = subprocess.run([str(python), str(script)], cwd=tmp_path, env=offline, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "installing companion[notebooks] @ file://" in done.stdout
    installed = fresh_site / "companion" / "__init__.py"
    assert f"companion from {installed}" in done.stdout        # imported in the same kernel, after the install
    after = subprocess.run([str(python), "-c", "import companion, companion.certify.verdicts; print(companion.__file__)"],
                           cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr
    assert after.stdout.strip() == str(installed)
    assert (fresh_site / "companion" / "assets").is_dir(), "package data must be installed too"
