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

from companion.atomic import replace_dir
from companion.book.record import (
    load_record,
    render_status_markdown,
)
from companion.book.api_page import render_api_pages
from companion.book.execute import file_sha256, strip_ansi
from companion.book.figure_files import link_figures, phone_variant
from companion.book.layout import Layout, NOTEBOOK_DIR, RunFailure, yaml_module
from companion.book.measured import StalePage, fill_measured_pages
from companion.book.offline import find_remote_resources
from companion.book.page_checks import check_pages
from companion.book.parameters import notebook_parameters
from companion.book.toc import filter_toc, read_chapters, read_toc

STATUS_MARKER = "% companion-run-record"


def run_note(run: Any) -> str:
    """Which run drew a chapter's figures, for their captions."""
    if run is None:
        return "Drawn by this chapter's run."
    when = str(run.started)[:16].replace("T", " ")
    return (f"Drawn by this chapter's run of {when} UTC on the `{run.profile}` profile ({run.device_name}); "
            f"its parameters are on the [reproduction status page](../book/reproduction_status.md).")


def caption_figures(path: Path, available: set[str], note: str, source: Path | None = None) -> int:
    """Number and caption the figures of a staged notebook.

    A code cell that saves a figure (its output holds the ``save_figure`` marker) and carries
    ``{"mystnb": {"figure": {"caption": ..., "name": ...}}}`` in its metadata keeps its source
    and its other outputs; its image output is replaced by a Markdown cell after it holding a
    ``{figure}`` directive on the staged ``figures/NAME.png``, with the caption, ``note`` (which
    run drew it) and the PNG and PDF download links (and the metadata's ``figclass``, if any). Sphinx numbers such figures. The metadata
    is removed, so that myst-nb does not wrap the cell's other outputs in figures as well.
    With ``source`` (the chapter's source notebook), a caption there, matched by cell id, wins
    over the executed copy's, so that captions can be edited without rerunning the chapter.
    Returns how many figures were captioned.
    """
    import nbformat

    from companion.figures import FIGURE_MARKER

    nb = nbformat.read(path, as_version=4)
    if source is not None and Path(source).is_file():
        captions = {c.get("id"): c.metadata["mystnb"]["figure"]
                    for c in nbformat.read(source, as_version=4).cells
                    if c.get("id") and c.get("metadata", {}).get("mystnb", {}).get("figure")}
        for cell in nb.cells:
            if cell.get("id") in captions:
                cell.metadata.setdefault("mystnb", {})["figure"] = captions[cell["id"]]
    cells, done = [], 0
    for cell in nb.cells:
        cells.append(cell)
        options = cell.get("metadata", {}).get("mystnb", {}).get("figure") if cell.cell_type == "code" else None
        if not options:
            continue
        del cell.metadata["mystnb"]["figure"]
        if not cell.metadata["mystnb"]:
            del cell.metadata["mystnb"]
        names = [m.group(1) for out in cell.get("outputs", [])
                 if out.get("output_type") == "display_data"
                 for m in [FIGURE_MARKER.match(str(out.get("data", {}).get("text/markdown", "")).strip())] if m]
        names = [n for n in names if n in available]
        if len(names) != 1:
            continue   # no staged figure file (or several): the inline image stays, uncaptioned
        name = names[0]
        cell["outputs"] = [out for out in cell.get("outputs", [])
                           if "image/png" not in out.get("data", {})
                           and not FIGURE_MARKER.match(str(out.get("data", {}).get("text/markdown", "")).strip())]
        label = options.get("name") or f"fig-{name}"
        caption = " ".join(str(options["caption"]).split())
        # a figure drawn for a phone (companion.figures.palette.PHONE_FIGCLASS) keeps its class, for the stylesheet
        figclass = f":figclass: {options['figclass']}\n" if options.get("figclass") else ""
        cells.append(nbformat.v4.new_markdown_cell(
            f"```{{figure}} ../figures/{name}.png\n:name: {label}\n:width: 100%\n{figclass}\n"
            f"{caption} {note} Download: {{download}}`{name}.png <../figures/{name}.png>` · "
            f"{{download}}`{name}.pdf <../figures/{name}.pdf>`\n```"))
        done += 1
    nb.cells = cells
    nbformat.write(nb, path)
    return done


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
    resolve_repository(stage / "book", repository_url(root / "_config.yml"))
    toc = filter_toc(read_toc(root), {c.toc_file for c in staged})
    if missing:
        # Sphinx numbers the chapters it is given: with some left out, chapter 10 would read "4."
        toc = without_numbering(toc)
        log(f"book: chapters are not numbered in a partial build ({len(missing)} chapter(s) left out)")
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
                phone = phone_variant(layout.figures, figure)   # served on phones (book/_ext/companion_figures.py)
                if phone is not None:
                    shutil.copy2(phone, stage / "figures" / phone.name)

    for chapter in staged:
        staged_nb = stage / NOTEBOOK_DIR / f"{chapter.name}.ipynb"
        run = record.chapters.get(chapter.name)
        caption_figures(staged_nb, set(figures), run_note(run), source=chapter.path)
        link_figures(staged_nb, set(figures))
        present_parameters(staged_nb, chapter.path, run.profile if run else None)

    fill_measured_results(stage / "book", stage / NOTEBOOK_DIR)

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

    render_api_pages(stage / "book", root, log)
    return {"staged": [c.name for c in staged], "missing": [c.name for c in missing], "figures": figures}


PLACEHOLDER_URL = "https://github.com/OWNER/companion"


def without_numbering(node: Any) -> Any:
    """A copy of a toc with every ``numbered`` key removed."""
    if isinstance(node, list):
        return [without_numbering(x) for x in node]
    if isinstance(node, dict):
        return {k: without_numbering(v) for k, v in node.items() if k != "numbered"}
    return node


def glued_values(path: Path) -> dict[str, Any]:
    """The values an executed notebook glued, by name (plain-text ones as Python literals)."""
    import ast

    import nbformat

    out: dict[str, Any] = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            data = o.get("data", {})
            md = data.get("application/papermill.record/text/markdown")
            text = data.get("application/papermill.record/text/plain")
            if md is not None:
                out[name] = str(md)
                continue
            try:
                out[name] = ast.literal_eval(text)
            except (ValueError, SyntaxError, TypeError):
                out[name] = text
    return out


def fill_measured_results(pages: Path, notebooks: Path) -> None:
    """Fill the pages' measured blocks (:mod:`companion.book.measured`) from the executed, staged notebooks;
    a page that quotes a value its chapter does not glue fails the build."""
    try:
        fill_measured_pages(pages, notebooks, glued_values)
    except StalePage as err:
        raise RunFailure(str(err)) from None


def repository_url(config: Path) -> str | None:
    """The repository URL of ``_config.yml``, or None while it is still the placeholder (offline builds)."""
    data = yaml_module().safe_load(config.read_text(encoding="utf-8")) or {}
    url = str((data.get("repository") or {}).get("url") or "").rstrip("/")
    return None if not url or url == PLACEHOLDER_URL or "/OWNER/" in url else url


def resolve_repository(pages: Path, url: str | None) -> None:
    """In the book's Markdown pages, the placeholder repository URL becomes ``url`` (the published
    build, whose workflow sets it in ``_config.yml``); in an offline build (``url`` None) every
    line holding it is dropped, so that no page shows a placeholder."""
    for page in pages.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        if PLACEHOLDER_URL not in text:
            continue
        if url is not None:
            new = text.replace(PLACEHOLDER_URL, url)
        else:
            new = "".join(line for line in text.splitlines(keepends=True) if PLACEHOLDER_URL not in line)
        page.write_text(new, encoding="utf-8")


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
        f":::{{admonition}} Parameters of this run{where}\n:class: note companion-parameters\n\n" + "\n".join(rows)
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
    """Replace directory ``final`` by ``new`` with renames only (no half-copied book); the previous
    book waits in ``work`` while the new one moves in (:func:`companion.atomic.replace_dir`)."""
    replace_dir(new, final, aside=work / "previous-html")


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
    problems = check_pages(built)
    if problems:
        raise RunFailure(f"{len(problems)} problem(s) on the built pages (raw math, a change between equal numbers, "
                         "a table outside the section that refers to it):\n" + "\n".join(problems[:30]))
    if not (built / "_static" / "mathjax" / "tex-chtml.js").is_file():
        raise RunFailure("offline MathJax was not copied into the build (is sphinx-mathjax-offline installed?)")
    _swap_into_place(built, layout.html, work)
    if not keep_work:
        shutil.rmtree(work, ignore_errors=True)
    log(f"book: {layout.html / 'index.html'} ({time.perf_counter() - start:.0f} s)")
    return layout.html
