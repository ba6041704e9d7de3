"""``reproduce``: execute the selected chapters, record each run, then build the book."""
from __future__ import annotations


import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from companion.book.record import (
    ChapterExecution,
    RunRecord,
    harvest_description,
    load_record,
    save_record,
)
from companion.book.execute import file_sha256, _utc_now, execute_chapter, git_commit, torch_version, write_kernelspec
from companion.book.figure_files import publish_figures
from companion.book.layout import Layout, NOTEBOOK_DIR, ReproduceError, RunFailure
from companion.book.parameters import describe_device, load_profile, notebook_parameters, plan_parameters
from companion.book.stage import build_book
from companion.book.toc import read_chapters, select_chapters

# --------------------------------------------------------------------------------------------
# The whole run


def check_figures_dir(layout: Layout, given: str | None) -> None:
    """Refuse a figures folder that cannot be written, before any chapter runs (writes nothing)."""
    name = f"--figures-dir {given}" if given else f"the figures folder {layout.figures}"
    path = layout.figures
    if path.exists() and not path.is_dir():
        raise ReproduceError(f"{name} is a file; pass a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ReproduceError(f"{name}: cannot create it, {existing} is a file")
    # os.access answers yes to root almost anywhere, including /proc and /sys where mkdir then
    # fails: refuse the kernel's pseudo file systems by name.
    pseudo = next((p for p in (Path("/proc"), Path("/sys")) if existing == p or p in existing.parents), None)
    if pseudo is not None or not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" (cannot create it in {existing})"
        raise ReproduceError(f"{name} is not writable{where}; pass a folder you can write to")


def reproduce(
    layout: Layout,
    profile_name: str = "cpu",
    overrides: dict[str, Any] | None = None,
    only: list[str] | None = None,
    *,
    build: bool = True,
    keep_going: bool = False,
    require_all: bool = False,
    cell_timeout: int | None = None,
    log: Any = print,
) -> RunRecord:
    """Execute the selected chapters, record them, then (optionally) build the book."""
    if cell_timeout is not None and (isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int)
                                     or cell_timeout < 1):
        raise ReproduceError(f"cell_timeout must be a positive number of seconds or None, got {cell_timeout!r}")
    overrides = overrides or {}
    chapters = read_chapters(layout.root)
    if not chapters:
        raise ReproduceError(f"{layout.root / '_toc.yml'} lists no notebooks under {NOTEBOOK_DIR}/")
    selected = select_chapters(chapters, only or [])
    profile = load_profile(layout.root, profile_name)
    absent = [c for c in selected if not c.exists]
    if absent and (require_all or only):
        raise ReproduceError("missing notebook(s): " + ", ".join(str(c.path.relative_to(layout.root)) for c in absent))
    for chapter in absent:
        log(f"skipping {chapter.name}: {chapter.path.relative_to(layout.root)} does not exist yet")
    runnable = [c for c in selected if c.exists]
    parameters = {c.name: notebook_parameters(c.path) for c in runnable}
    declared = {name: set(params) for name, params in parameters.items()}
    plans = plan_parameters(runnable, declared, profile, overrides, [c.name for c in chapters], parameters)
    devices = {c.name: describe_device(plans[c.name].get("device")) for c in runnable}  # refuse before running
    check_figures_dir(layout, None)  # a chapter's figures must have somewhere to go before it runs

    layout.work.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=layout.work))
    write_kernelspec(work / "jupyter")
    record = load_record(layout.record)
    commit, python, torch = git_commit(layout.root), platform.python_version(), torch_version()
    failures: list[str] = []
    show_cells = sys.stderr.isatty()
    log(f"profile {profile.name}: {profile.description}")
    try:
        for i, chapter in enumerate(runnable, 1):
            params = dict(plans[chapter.name])
            device, device_name = devices[chapter.name]
            if device is not None:
                params["device"] = device
            shown = ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) or "notebook defaults"
            log(f"[{i}/{len(runnable)}] {chapter.name}: running ({shown})")
            started = _utc_now()
            try:
                seconds, files = execute_chapter(chapter, params, layout, work, show_cells=show_cells,
                                                 cell_timeout=cell_timeout)
                names = publish_figures(chapter.name, files, record, layout.figures)
            except ReproduceError as err:
                log(f"[{i}/{len(runnable)}] {chapter.name}: FAILED: {err}")
                failures.append(str(err))
                if keep_going:
                    continue
                break
            record.chapters[chapter.name] = ChapterExecution(
                chapter=chapter.name, source=str(chapter.path.relative_to(layout.root)),
                source_sha256=file_sha256(chapter.path), profile=profile.name, parameters=params,
                device=device, device_name=device_name, started=started, seconds=round(seconds, 2),
                figures=names, python=python, torch=torch, commit=commit,
                harvest=harvest_description(params.get("traces_dir")),
            )
            save_record(record, layout.record)
            log(f"[{i}/{len(runnable)}] {chapter.name}: ok in {seconds:.1f} s, {len(names)} figure(s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        # One line, as every other error of the command: the log above has one line per chapter.
        raise RunFailure(failures[0] if len(failures) == 1 else f"{len(failures)} notebooks failed: " + "; ".join(failures))
    if build:
        build_book(layout, log)
    return record
