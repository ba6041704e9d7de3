"""Staging and building the book: sources, executed chapters, figures and generated pages, then jupyter-book."""
from __future__ import annotations


import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from companion.book.record import (
    load_record,
    render_status_markdown,
)
from companion.book.api_page import API_MARKER, probe_modules, render_api_section
from companion.book.execute import file_sha256, strip_ansi
from companion.book.figure_files import link_figures
from companion.book.layout import Layout, NOTEBOOK_DIR, RunFailure, yaml_module
from companion.book.offline import find_remote_resources
from companion.book.parameters import notebook_parameters
from companion.book.toc import filter_toc, read_chapters, read_toc

STATUS_MARKER = "% companion-run-record"


def stage_book(layout: Layout, stage: Path, log: Any = print) -> dict[str, Any]:
    """Lay out the book sources in ``stage``: config, pages, executed notebooks, figures, and the
    generated status and API pages. Returns a summary (chapters staged and missing)."""
    root = layout.root
    chapters = read_chapters(root)
    record = load_record(layout.record)
    stage.mkdir(parents=True)
    shutil.copy2(root / "_config.yml", stage / "_config.yml")
    shutil.copytree(root / "book", stage / "book", ignore=shutil.ignore_patterns("__pycache__", ".*"))

    staged, missing = [], []
    (stage / NOTEBOOK_DIR).mkdir()
    for chapter in chapters:
        executed = layout.executed / f"{chapter.name}.ipynb"
        if executed.is_file():
            shutil.copy2(executed, stage / NOTEBOOK_DIR / executed.name)
            staged.append(chapter)
        else:
            missing.append(chapter)
    unlink_chapters(stage / "book", {c.name for c in staged})
    toc = filter_toc(read_toc(root), {c.toc_file for c in staged})
    (stage / "_toc.yml").write_text(yaml_module().safe_dump(toc, sort_keys=False), encoding="utf-8")

    figures = []
    (stage / "figures").mkdir()
    for name, run in sorted(record.chapters.items()):
        for figure in run.figures:
            files = [layout.figures / f"{figure}.{ext}" for ext in ("png", "pdf")]
            if all(f.is_file() for f in files):
                for f in files:
                    shutil.copy2(f, stage / "figures" / f.name)
                figures.append(figure)

    for chapter in staged:
        staged_nb = stage / NOTEBOOK_DIR / f"{chapter.name}.ipynb"
        link_figures(staged_nb, set(figures))
        run = record.chapters.get(chapter.name)
        present_parameters(staged_nb, chapter.path, run.profile if run else None)

    status_page = stage / "book" / "reproduction_status.md"
    if status_page.is_file():
        staged_names = {c.name for c in staged}
        rows = [
            (c.name, f"../{c.toc_file}.ipynb" if c.name in staged_names else "",
             file_sha256(c.path) if c.exists else None)
            for c in chapters
        ]
        text = status_page.read_text(encoding="utf-8")
        generated = render_status_markdown(record, rows, figures)
        status_page.write_text(text.replace(STATUS_MARKER, generated), encoding="utf-8")

    api_page = stage / "book" / "api.md"
    if api_page.is_file():
        text = api_page.read_text(encoding="utf-8")
        modules = API_MARKER.findall(text)
        probed = probe_modules(modules, root) if modules else {}
        for module, (status, detail) in probed.items():
            if status == "error":
                log(f"warning: API reference: {module} does not import ({detail})")
        api_page.write_text(API_MARKER.sub(lambda m: render_api_section(m.group(1), *probed[m.group(1)]), text),
                            encoding="utf-8")
    return {"staged": [c.name for c in staged], "missing": [c.name for c in missing], "figures": figures}


def unlink_chapters(pages: Path, staged: set[str]) -> None:
    """In the book's Markdown pages, turn links to chapters that are not in this build into text.

    A partial build (``--only``) stages only the executed chapters, and a project may not have
    every chapter a page links to; such a link would be a broken cross-reference, which the
    build treats as an error. Links to the ``staged`` chapters are kept.
    """
    link = re.compile(r"\[([^\]]+)\]\(\.\./" + NOTEBOOK_DIR + r"/([^)#/]+)\.(?:ipynb|md)(?:#[^)]*)?\)")

    def keep_or_unlink(m: re.Match[str]) -> str:
        return m.group(0) if m.group(2) in staged else f"{m.group(1)} (not in this build)"

    for page in pages.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        new = link.sub(keep_or_unlink, text)
        if new != text:
            page.write_text(new, encoding="utf-8")


def _parameter_value(source: str) -> str:
    """The value papermill injected for one line ``name = value`` (as written), else the line."""
    return source.split("=", 1)[1].strip() if "=" in source else source.strip()


def present_parameters(path: Path, source: Path, profile: str | None) -> bool:
    """Fold a chapter's two parameter cells into one visible "Parameters of this run" box.

    papermill leaves the notebook's ``parameters`` cell (the defaults, with comments) and adds an
    ``injected-parameters`` cell after it (the values of this run); shown as they are, a reader
    sees two blocks of assignments. Here the injected cell becomes a table of every declared
    parameter: its value in this run, its default and its comment, and both code cells are
    removed from the page (the code still runs as executed). Returns whether a box was made.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    declared = notebook_parameters(source)
    injected_at = next((i for i, c in enumerate(nb.cells)
                        if "injected-parameters" in c.get("metadata", {}).get("tags", [])), None)
    if not declared:
        return False
    injected: dict[str, str] = {}
    if injected_at is not None:
        for line in str(nb.cells[injected_at].source).splitlines():
            name = line.split("=", 1)[0].strip()
            if "=" in line and name.isidentifier():
                injected[name] = _parameter_value(line)

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    rows = ["| parameter | this run | default | meaning |", "|---|---|---|---|"]
    for name, param in declared.items():
        value = injected.get(name, param.source)
        changed = " (changed)" if name in injected and value != param.source else ""
        rows.append(f"| `{name}` | `{cell(value)}`{changed} | `{cell(param.source)}` | {cell(param.comment)} |")
    where = f" (profile `{profile}`)" if profile else ""
    box = nbformat.v4.new_markdown_cell(
        f":::{{admonition}} Parameters of this run{where}\n:class: note\n\n" + "\n".join(rows)
        + "\n\nRerun the chapter with other values: `companion reproduce --only NAME -p PARAMETER VALUE`.\n:::\n")
    box.id = "parameters-of-this-run"
    for c in nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        if "parameters" in tags and "remove-cell" not in tags:
            c.metadata["tags"] = tags + ["remove-cell"]
    if injected_at is not None:
        nb.cells[injected_at] = box
    else:
        at = next((i + 1 for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])), 0)
        nb.cells.insert(at, box)
    nbformat.write(nb, path)
    return True


def _swap_into_place(new: Path, final: Path, work: Path) -> None:
    """Replace directory ``final`` by ``new`` with renames only (no half-copied book)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    old = work / "previous-html"
    if final.exists():
        os.replace(final, old)
    os.replace(new, final)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)


def build_book(layout: Layout, log: Any = print, keep_work: bool = False) -> Path:
    """Build ``_build/html`` from the executed notebooks; raise ReproduceError on any warning."""
    layout.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="book-", dir=layout.work))
    stage = work / "stage"
    summary = stage_book(layout, stage, log)
    if summary["missing"]:
        log(f"book: {len(summary['missing'])} chapter(s) not executed, left out: {', '.join(summary['missing'])}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(layout.root), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(stage), "--path-output", str(work / "out"), "--builder", "html",
           "-W", "-n", "--keep-going"]
    log(f"book: building {len(summary['staged'])} chapter(s) with jupyter-book (-W -n --keep-going) ...")
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=stage, env=env, capture_output=True, text=True)
    output = strip_ansi(done.stdout + "\n" + done.stderr)
    logfile = layout.build / "book-build.log"
    logfile.write_text(output, encoding="utf-8")
    built = work / "out" / "_build" / "html"
    if done.returncode != 0 or not (built / "index.html").is_file():
        issues = [ln for ln in output.splitlines() if re.search(r"WARNING|ERROR|Error", ln)]
        detail = "\n".join(issues[-30:]) or output[-3000:]
        raise RunFailure(f"book build failed (full log: {logfile}, sources: {stage}):\n{detail}")
    remote = find_remote_resources(built)
    if remote:
        raise RunFailure("built pages load resources from other hosts:\n" + "\n".join(remote[:30]))
    if not (built / "_static" / "mathjax" / "tex-chtml.js").is_file():
        raise RunFailure("offline MathJax was not copied into the build (is sphinx-mathjax-offline installed?)")
    _swap_into_place(built, layout.html, work)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    log(f"book: {layout.html / 'index.html'} ({time.perf_counter() - start:.0f} s)")
    return layout.html
