"""The published build's settings (companion/book/publish.py and the Pages workflow) and the offline ones.

The offline `_config.yml` has no launch, repository or issue buttons; `python -m companion.book.publish
config` turns them on for the workflow's repository, with Binder and Colab opening each chapter
from the launch branch. The `book` tests build a small book both ways (no network: the links are
only written into the pages, never fetched) and read the generated HTML.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
import yaml

from companion.book import publish
from companion.book.layout import Layout
from companion.book.offline import find_remote_resources
from companion.book.stage import build_book
from tests.conftest import ROOT, write_notebook

REPO = "some-org/companion-book"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def test_the_offline_config_has_no_buttons_and_a_placeholder_repository() -> None:
    cfg = _config()
    assert not any(cfg["html"][b] for b in ("use_repository_button", "use_issues_button", "use_edit_page_button"))
    assert not any(cfg["launch_buttons"][k] for k in ("binderhub_url", "jupyterhub_url", "colab_url", "deepnote_url",
                                                      "thebe"))
    assert cfg["repository"]["url"] == f"https://github.com/{publish.PLACEHOLDER_REPOSITORY}"


def test_published_config_turns_the_buttons_on_and_keeps_the_rest() -> None:
    cfg = _config()
    out = publish.published_config(cfg, REPO)
    assert cfg == _config(), "the input must not be modified"
    assert out["repository"] == {"url": f"https://github.com/{REPO}", "path_to_book": "", "branch": "book-launch"}
    assert out["html"]["use_repository_button"] and out["html"]["use_issues_button"]
    assert not out["html"]["use_edit_page_button"]
    assert out["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert out["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert out["launch_buttons"]["thebe"] is False
    assert out["sphinx"] == cfg["sphinx"] and out["execute"] == cfg["execute"]   # offline MathJax etc. kept
    for bad in ("", "owner", "owner/name/extra", "-owner/name", "owner/na me"):
        with pytest.raises(ValueError, match="OWNER/NAME"):
            publish.published_config(cfg, bad)


def test_the_workflow_runs_publish_with_its_repository_and_commit() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    assert wf["permissions"]["contents"] == "write"
    assert wf["env"]["LAUNCH_BRANCH"] == publish.LAUNCH_BRANCH
    runs = [s.get("run", "") for s in wf["jobs"]["build"]["steps"]]
    stamp = next(i for i, r in enumerate(runs) if "companion.book.publish stamp" in r)
    config = next(i for i, r in enumerate(runs) if "companion.book.publish config" in r)
    build = next(i for i, r in enumerate(runs) if "companion reproduce" in r)
    push = next(i for i, r in enumerate(runs) if "git push" in r)
    assert stamp < build and config < build < push
    assert '--repository "${{ github.repository }}"' in runs[stamp] and '--commit "${{ github.sha }}"' in runs[stamp]
    assert '--repository "${{ github.repository }}"' in runs[config] and "$LAUNCH_BRANCH" in runs[config]
    assert "companion.book.publish binder" in runs[push] and 'HEAD:refs/heads/$LAUNCH_BRANCH' in runs[push]
    assert "git add notebooks binder" in runs[push]
    # the offline CI entry point never publishes
    assert "companion.book.publish" not in (ROOT / ".ci" / "run").read_text()


def test_cli(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "_config.yml"
    shutil.copy2(ROOT / "_config.yml", cfg)
    assert publish.main(["config", "--repository", REPO, "--config", str(cfg)]) == 0
    assert yaml.safe_load(cfg.read_text()) == publish.published_config(_config(), REPO)
    nb = tmp_path / "01.ipynb"
    shutil.copy2(ROOT / "notebooks" / "01_criteria_level_sets.ipynb", nb)
    assert publish.main(["stamp", "--repository", REPO, "--commit", COMMIT, str(nb)]) == 0
    assert publish.pinned_requirement(nbformat.read(nb, as_version=4).cells[0].source) == \
        publish.install_requirement(REPO, COMMIT)
    assert publish.main(["binder", "--out", str(tmp_path / "binder")]) == 0
    req = (tmp_path / "binder" / "requirements.txt").read_text()
    assert "torch==2.13.0+cpu" in req and "-r ../requirements.txt" in req
    assert (tmp_path / "binder" / "runtime.txt").read_text() == "python-3.11\n"
    capsys.readouterr()
    assert publish.main(["stamp", "--repository", REPO, "--commit", "HEAD", str(nb)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: commit must be") and err.count("\n") == 1


def _demo_project(make_project) -> Layout:
    """A one-chapter book whose notebook starts with the install cell, staged as if executed."""
    root = make_project("01_demo")
    path = write_notebook(root / "notebooks" / "01_demo.ipynb", "seed = 0", "print(seed)")
    nb = nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_code_cell(publish.install_cell_source(), id=publish.INSTALL_CELL_ID)
    cell.metadata["tags"] = list(publish.INSTALL_CELL_TAGS)
    nb.cells.insert(0, cell)
    nbformat.write(nb, path)
    layout = Layout.at(root)
    layout.executed.mkdir(parents=True)
    shutil.copy2(path, layout.executed / path.name)
    return layout


def _links(page: Path) -> list[str]:
    return re.findall(r'href="(https?://[^"]+)"', page.read_text(encoding="utf-8"))


@pytest.mark.book
def test_published_build_has_working_launch_and_repository_buttons(make_project) -> None:
    layout = _demo_project(make_project)
    publish.stamp_install_cells([layout.root / "notebooks" / "01_demo.ipynb"], REPO, COMMIT)
    shutil.copy2(layout.root / "notebooks" / "01_demo.ipynb", layout.executed / "01_demo.ipynb")
    assert publish.main(["config", "--repository", REPO, "--config", str(layout.root / "_config.yml")]) == 0
    html = build_book(layout, log=lambda *_: None)                   # -W: no warning either
    links = _links(html / "notebooks" / "01_demo.html")
    assert f"https://colab.research.google.com/github/{REPO}/blob/book-launch/notebooks/01_demo.ipynb" in links
    assert f"https://mybinder.org/v2/gh/{REPO}/book-launch?urlpath=lab/tree/notebooks/01_demo.ipynb" in links
    assert f"https://github.com/{REPO}" in links
    assert any(u.startswith(f"https://github.com/{REPO}/issues/new?") for u in links)
    intro = _links(html / "book" / "intro.html")
    assert f"https://github.com/{REPO}" in intro and not any("colab" in u for u in intro)   # no notebook, no launch
    assert find_remote_resources(html) == []                       # links only: nothing loaded from elsewhere
    page = (html / "notebooks" / "01_demo.html").read_text()
    assert "COMPANION_PIN" not in page and "pip install" not in page      # the install cell is hidden
    download = (html / "_sources" / "notebooks" / "01_demo.ipynb").read_text()
    assert COMMIT in download                                        # the .ipynb download carries the pin


@pytest.mark.book
def test_offline_build_has_no_launch_or_repository_links(make_project) -> None:
    layout = _demo_project(make_project)
    html = build_book(layout, log=lambda *_: None)
    for page in (html / "notebooks" / "01_demo.html", html / "book" / "intro.html"):
        links = _links(page)
        assert not any(h in u for u in links for h in ("github.com", "colab", "mybinder")), links
    assert find_remote_resources(html) == []
