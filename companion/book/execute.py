"""Executing one chapter with papermill on this interpreter, and the facts recorded about the run."""
from __future__ import annotations


import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from companion.figures import FIGURES_ENV
from companion.book.layout import KERNEL_NAME, Layout, RunFailure
from companion.book.toc import Chapter

#: Where a chapter run by ``companion reproduce`` notes the harvests it analysed (a file, one folder a line):
#: :func:`note_harvest` appends, :func:`noted_harvests` reads.
HARVEST_NOTES_ENV = "COMPANION_HARVEST_NOTES"


def note_harvest(traces_dir: str | os.PathLike[str]) -> None:
    """Note that this chapter analysed the harvest in ``traces_dir`` (its absolute path), when the run sets
    :data:`HARVEST_NOTES_ENV`; otherwise (a notebook opened by hand) do nothing."""
    notes = os.environ.get(HARVEST_NOTES_ENV)
    if not notes:
        return
    path = Path(notes)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(str(Path(traces_dir).resolve()) + "\n")


#: Where the kernel of a chapter run by ``companion reproduce`` notes its torch threads (a JSON file):
#: the run's kernelspec loads this module as an IPython extension (:func:`load_ipython_extension`).
THREAD_NOTES_ENV = "COMPANION_THREAD_NOTES"


def load_ipython_extension(shell: Any) -> None:
    """In a chapter's kernel: after every cell, note ``torch.get_num_threads()`` (once the chapter has
    imported torch) in the file :data:`THREAD_NOTES_ENV` names, as ``{"torch_threads": [each count
    seen, in order], "last": the count after the last cell}``, for the run record. Threads a cell
    sets and restores within itself (a harvest's ``cpu_threads``) are recorded by its manifest."""
    notes = os.environ.get(THREAD_NOTES_ENV)
    if not notes:
        return
    seen: list[int] = []

    def note(*_: Any) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        n = int(torch.get_num_threads())
        if seen and seen[-1] == n:
            return
        seen.append(n)
        Path(notes).parent.mkdir(parents=True, exist_ok=True)
        Path(notes).write_text(json.dumps({"torch_threads": sorted(set(seen)), "last": n}), encoding="utf-8")

    shell.events.register("post_run_cell", note)


def noted_threads(path: Path) -> dict[str, Any]:
    """What :func:`load_ipython_extension` noted (empty if the chapter never imported torch)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def noted_harvests(path: Path) -> list[str]:
    """The harvest folders noted in ``path`` (:func:`note_harvest`), each once, in the order first noted."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))


# --------------------------------------------------------------------------------------------
# Executing one chapter


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def git_commit(root: Path) -> str | None:
    """Short commit of the checkout, with ``+dirty`` when tracked files are modified."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def torch_version() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return str(torch.__version__)


def write_kernelspec(directory: Path) -> Path:
    """A kernelspec named ``python3`` that runs *this* interpreter, under ``directory``.

    Putting ``directory`` first on JUPYTER_PATH makes papermill pick it over any ``python3``
    kernel of the user's, so notebooks always run with the packages of the running venv.
    """
    spec = directory / "kernels" / KERNEL_NAME
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        # the extension notes the kernel's torch threads for the run record (load_ipython_extension)
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 f"--IPKernelApp.extensions={__name__}"],
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }, indent=1), encoding="utf-8")
    return directory


@contextlib.contextmanager
def patched_environ(set_: dict[str, str], unset: tuple[str, ...] = ()) -> Iterator[None]:
    """Temporarily change os.environ (which the kernel process inherits)."""
    saved = {k: os.environ.get(k) for k in (*set_, *unset)}
    try:
        for k in unset:
            os.environ.pop(k, None)
        os.environ.update(set_)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _muted_logger(name: str) -> Iterator[None]:
    """Raise a logger's level to ERROR for the duration."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _error_summary(err: BaseException) -> str:
    """One line for a notebook failure: the cell and the exception, without ANSI colours."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(err, PapermillExecutionError):
        text = f"cell {err.exec_count} raised {err.ename}: {err.evalue}"
    else:
        text = f"{type(err).__name__}: {err}"
    # Exception texts may span lines (a cell timeout quotes the cell): the summary stays one line.
    return " ".join(strip_ansi(text).split())


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@dataclass(frozen=True)
class ExecutedChapter:
    """What one successful execution gives back: its wall time, the figure files it wrote, its
    slowest cells (:func:`slowest_cells`), the harvest folders it analysed (:func:`note_harvest`),
    the torch threads its kernel ran with (:func:`noted_threads`) and the ``OMP_NUM_THREADS`` the
    run started it with (None: torch's default)."""

    seconds: float
    figures: list[Path]
    slowest_cells: list[dict[str, Any]]
    harvests: list[str] = field(default_factory=list)
    kernel_threads: dict[str, Any] = field(default_factory=dict)
    start_threads: int | None = None


def cell_label(source: str) -> str:
    """What a code cell does, in one line: its first comment when the cell opens with one (a cell's
    title), else the first line of its first statement that is not an import (magics such as
    ``%matplotlib inline`` skipped); else its first line."""
    lines = source.splitlines()
    text = [ln.strip() for ln in lines if ln.strip()]
    if not text:
        return ""
    if text[0].startswith("#") and text[0].lstrip("#").strip():
        return text[0].lstrip("#").strip()
    import ast

    # magics and shell lines are not Python: blank them (keeping the line numbers) before parsing
    python = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in lines)
    try:
        body = ast.parse(python).body
    except SyntaxError:
        body = []
    for node in body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            return lines[node.lineno - 1].strip()
    return text[0]


def slowest_cells(notebook: Path, n: int = 3) -> list[dict[str, Any]]:
    """The ``n`` code cells of an executed notebook that took longest (papermill records each
    cell's duration): ``{"cell": index in the notebook, "seconds", "source": what it does}``
    (:func:`cell_label`)."""
    try:
        cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return []
    timed = []
    for i, cell in enumerate(cells):
        duration = cell.get("metadata", {}).get("papermill", {}).get("duration")
        if cell.get("cell_type") != "code" or not isinstance(duration, (int, float)):
            continue
        source = cell.get("source", [])
        source = source if isinstance(source, str) else "".join(source)
        timed.append({"cell": i, "seconds": round(float(duration), 2), "source": cell_label(source)})
    return sorted(timed, key=lambda c: -c["seconds"])[:n]


def execute_chapter(
    chapter: Chapter,
    params: dict[str, Any],
    layout: Layout,
    work: Path,
    *,
    show_cells: bool = False,
    cell_timeout: int | None = None,
    threads: int | None = None,
) -> ExecutedChapter:
    """Run one notebook with papermill; return its wall time, the figure files it wrote and its slowest cells.

    ``threads``: the kernel's thread-pool size (``OMP_NUM_THREADS``; None leaves torch's default).

    The executed notebook is moved to ``_build/executed`` only on success; on failure the partial
    notebook goes to ``_build/failed`` and ReproduceError names the chapter and the error.
    """
    import papermill

    figures = work / "figures" / chapter.name
    if figures.exists():
        shutil.rmtree(figures)
    figures.mkdir(parents=True)
    out = work / "executed" / f"{chapter.name}.ipynb"
    out.parent.mkdir(parents=True, exist_ok=True)
    notes = work / "harvests" / f"{chapter.name}.txt"
    notes.unlink(missing_ok=True)
    thread_notes = work / "threads" / f"{chapter.name}.json"
    thread_notes.unlink(missing_ok=True)
    pythonpath = os.pathsep.join(filter(None, [str(layout.root), os.environ.get("PYTHONPATH")]))
    jupyter_path = os.pathsep.join(filter(None, [str(work / "jupyter"), os.environ.get("JUPYTER_PATH")]))
    env = {
        FIGURES_ENV: str(figures),
        "JUPYTER_PATH": jupyter_path,
        "PYTHONPATH": pythonpath,
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",   # silences a debugger warning at kernel start
        HARVEST_NOTES_ENV: str(notes),            # the harvests the chapter analyses, for the record
        THREAD_NOTES_ENV: str(thread_notes),      # the kernel's torch threads, for the record
    }
    if threads is not None:
        env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    start = time.perf_counter()
    # MPLBACKEND is unset so the kernel uses the inline backend and figures land in the notebook.
    # papermill's own warnings are muted: its parameter-cell parser complains about valid lines
    # (see declared_parameters), and we only ever pass declared parameters.
    with patched_environ(env, unset=("MPLBACKEND",)), _muted_logger("papermill"):
        try:
            papermill.execute_notebook(
                str(chapter.path), str(out), parameters=params, kernel_name=KERNEL_NAME,
                cwd=str(chapter.path.parent), progress_bar=show_cells, log_output=False,
                request_save_on_cell_execute=False, execution_timeout=cell_timeout,
            )
        except Exception as err:  # papermill raises several types; all mean "this chapter failed"
            kept = ""
            if out.exists():
                layout.failed.mkdir(parents=True, exist_ok=True)
                os.replace(out, layout.failed / out.name)
                kept = f" (partial notebook: {(layout.failed / out.name).relative_to(layout.root)})"
            raise RunFailure(f"notebook {chapter.name} failed: {_error_summary(err)}{kept}") from err
    seconds = time.perf_counter() - start
    slowest = slowest_cells(out)
    layout.executed.mkdir(parents=True, exist_ok=True)
    os.replace(out, layout.executed / out.name)
    stale_failure = layout.failed / out.name
    if stale_failure.exists():
        stale_failure.unlink()
    return ExecutedChapter(seconds, sorted(p for p in figures.iterdir() if not p.name.startswith(".")), slowest,
                           noted_harvests(notes), noted_threads(thread_notes), threads)
