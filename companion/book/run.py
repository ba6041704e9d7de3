"""``reproduce``: execute the selected chapters, record each run, then build the book."""
from __future__ import annotations

import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from companion.book.record import (
    ChapterExecution,
    RunRecord,
    harvest_description,
    harvest_threads,
    load_record,
    save_record,
)
from companion.book.execute import (
    ExecutedChapter,
    _utc_now,
    execute_chapter,
    file_sha256,
    git_commit,
    torch_version,
    write_kernelspec,
)
from companion.book.claims import ENV as CLAIMS_ENV
from companion.book.figure_files import publish_figures
from companion.book.layout import Layout, NOTEBOOK_DIR, ReproduceError, RunFailure
from companion.book.parameters import (declared_parameters, describe_device, load_profile, notebook_parameters,
                                       plan_parameters)
from companion.book.stage import build_book
from companion.book.toc import Chapter, read_chapters, select_chapters

# At most this many chapters at once by default: each kernel holds its own model pair in memory.
MAX_DEFAULT_JOBS = 4

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


def default_jobs(devices: list[str | None]) -> int:
    """Chapters run at once by default: one per CPU core available (at most ``MAX_DEFAULT_JOBS``)
    on the CPU, one at a time as soon as any chapter runs on an accelerator (two kernels would
    share its memory)."""
    if any(d is not None and d != "cpu" for d in devices):
        return 1
    from companion.models.devices import usable_cores

    return max(1, min(usable_cores(), MAX_DEFAULT_JOBS))


def _run_one(chapter: Chapter, params: dict[str, Any], layout: Layout, work: Path, show_cells: bool,
             cell_timeout: int | None, threads: int | None) -> ExecutedChapter:
    """:func:`execute_chapter` in a worker process (a top-level function, so that it pickles)."""
    return execute_chapter(chapter, params, layout, work, show_cells=show_cells, cell_timeout=cell_timeout,
                           threads=threads)


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
    jobs: int | None = None,
    log: Any = print,
) -> RunRecord:
    """Execute the selected chapters, record them, then (optionally) build the book.

    ``jobs`` chapters run at once, each in its own kernel (default: :func:`default_jobs`); with
    more than one, each kernel starts with one thread (``OMP_NUM_THREADS=1``), so that the kernels do
    not wait on each other's thread pools (a chapter may set more for a step: the record notes the
    threads each kernel and harvest used). Chapters are recorded as they finish.
    """
    if cell_timeout is not None and (isinstance(cell_timeout, bool) or not isinstance(cell_timeout, int)
                                     or cell_timeout < 1):
        raise ReproduceError(f"cell_timeout must be a positive number of seconds or None, got {cell_timeout!r}")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise ReproduceError(f"jobs must be a positive number of chapters or None, got {jobs!r}")
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
    # every chapter's names, selected or not: a profile-wide name none declares is a typo (unknowable while
    # a chapter of the table of contents has no notebook yet: it may declare it)
    book_declared = None if not all(c.exists for c in chapters) else set().union(
        *declared.values(), *(declared_parameters(c.path) for c in chapters if c.name not in declared))
    plans = plan_parameters(runnable, declared, profile, overrides, [c.name for c in chapters], parameters,
                            book_declared)
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
    jobs = min(jobs or default_jobs([devices[c.name][0] for c in runnable]), max(1, len(runnable)))
    threads = 1 if jobs > 1 else None
    order = {c.name: i for i, c in enumerate(runnable, 1)}
    n = len(runnable)

    def finished(chapter: Chapter, params: dict[str, Any], started: str, result: ExecutedChapter) -> None:
        seconds = result.seconds
        device, device_name = devices[chapter.name]
        names = publish_figures(chapter.name, result.figures, record, layout.figures)
        record.chapters[chapter.name] = ChapterExecution(
            chapter=chapter.name, source=str(chapter.path.relative_to(layout.root)),
            source_sha256=file_sha256(chapter.path), profile=profile.name, parameters=params,
            device=device, device_name=device_name, started=started, seconds=round(seconds, 2),
            figures=names, python=python, torch=torch, commit=commit,
            harvest=harvest_description(result.harvests or params.get("traces_dir")),
            slowest_cells=result.slowest_cells, jobs=jobs,
            defaults=[[name, param.source] for name, param in parameters[chapter.name].items()],
            start_threads=result.start_threads,
            kernel_threads=list(result.kernel_threads.get("torch_threads", [])),
            harvest_threads=harvest_threads(result.harvests or params.get("traces_dir")),
        )
        save_record(record, layout.record)
        log(f"[{order[chapter.name]}/{n}] {chapter.name}: ok in {seconds:.1f} s, {len(names)} figure(s)")

    def params_of(chapter: Chapter) -> dict[str, Any]:
        params = dict(plans[chapter.name])
        if devices[chapter.name][0] is not None:
            params["device"] = devices[chapter.name][0]
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(params.items())) or "notebook defaults"
        log(f"[{order[chapter.name]}/{n}] {chapter.name}: running ({shown})")
        return params

    def failed(chapter: Chapter, err: ReproduceError) -> None:
        log(f"[{order[chapter.name]}/{n}] {chapter.name}: FAILED: {err}")
        failures.append(str(err))

    # The chapters' prose claims: the kernels (and the spawned workers) read the profile's mode.
    saved_claims = os.environ.get(CLAIMS_ENV)
    os.environ[CLAIMS_ENV] = profile.claims
    try:
        if jobs == 1:
            for chapter in runnable:
                params, started = params_of(chapter), _utc_now()
                try:
                    finished(chapter, params, started, execute_chapter(
                        chapter, params, layout, work, show_cells=show_cells, cell_timeout=cell_timeout))
                except ReproduceError as err:
                    failed(chapter, err)
                    if not keep_going:
                        break
        else:
            log(f"running {jobs} chapters at a time (each kernel started with OMP_NUM_THREADS={threads})")
            # spawn, not fork: this process may hold torch's thread pools, which do not survive a fork.
            pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
            pending: dict[Future, tuple[Chapter, dict[str, Any], str]] = {}
            # Longest first, so that the long chapter overlaps the short ones instead of running
            # alone at the end: by the previous run's times, or (a chapter never run, as in a
            # fresh clone) by the notebooks' sizes, a rough measure of how much each one does.
            previous = {name: ex.seconds for name, ex in record.chapters.items()}
            if all(c.name in previous for c in runnable):
                queue = sorted(runnable, key=lambda c: -previous[c.name])
            else:
                queue = sorted(runnable, key=lambda c: -c.path.stat().st_size)
            try:
                while queue or pending:
                    while queue and len(pending) < jobs and (keep_going or not failures):
                        chapter = queue.pop(0)
                        params, started = params_of(chapter), _utc_now()
                        fut = pool.submit(_run_one, chapter, params, layout, work, False, cell_timeout, threads)
                        pending[fut] = (chapter, params, started)
                    if not pending:
                        break
                    done, _ = wait(pending, return_when=FIRST_COMPLETED)
                    # in the order of the table of contents, so that the record is written the same way
                    for fut in sorted(done, key=lambda f: order[pending[f][0].name]):
                        chapter, params, started = pending.pop(fut)
                        try:
                            finished(chapter, params, started, fut.result())
                        except ReproduceError as err:
                            failed(chapter, err)
            finally:
                for fut in pending:
                    fut.cancel()
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if saved_claims is None:
            os.environ.pop(CLAIMS_ENV, None)
        else:
            os.environ[CLAIMS_ENV] = saved_claims
    if failures:
        # One line, as every other error of the command: the log above has one line per chapter.
        raise RunFailure(failures[0] if len(failures) == 1 else f"{len(failures)} notebooks failed: " + "; ".join(failures))
    if build:
        build_book(layout, log)
    return record
