"""``companion reproduce`` and ``companion build-book``: run every chapter, then build the book.

``reproduce`` reads the chapter list from ``_toc.yml`` (every entry under ``notebooks/``),
executes each notebook with papermill on the current interpreter, with parameters from a
profile (``profiles/<name>.yml``) plus ``-p NAME VALUE`` overrides, and then builds the HTML
book from the executed copies. Nothing is written over the sources:

- executed notebooks go to ``_build/executed/<chapter>.ipynb`` (a failed run's partial
  notebook to ``_build/failed/``),
- figures (``companion.figures.save_figure``) to ``figures/``,
- one entry per chapter to the run record ``_build/run-record.json``,
- the book to ``_build/html``.

Every output is written under a temporary name and renamed into place only when complete,
so a failure never leaves a half-written notebook, figure, record or book behind.
``build-book`` only does the last step, from whatever is in ``_build/executed``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import html.parser
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from companion.figures import FIGURE_MARKER, FIGURES_ENV
from companion.status import (
    ChapterRun,
    RunRecord,
    harvest_description,
    load_record,
    render_status_markdown,
    save_record,
)

NOTEBOOK_DIR = "notebooks"
KERNEL_NAME = "python3"
STATUS_MARKER = "% companion-run-record"
API_MARKER = re.compile(r"^% companion-api:\s*(\S+)\s*$", re.MULTILINE)
DEVICES = ("cpu", "cuda", "auto")


class ReproduceError(Exception):
    """A problem the user can fix, found before anything ran: bad options, profile, table of contents.

    The command line prints it as one line and exits with status 2, having written nothing.
    """

    exit_code = 2


class RunFailure(ReproduceError):
    """Something failed while running: a notebook, the book build. Exit status 1."""

    exit_code = 1


def _yaml() -> Any:
    """PyYAML, imported on use: `companion` loads this module for its command list, and the
    library itself must import without the book's dependencies (requirements.txt)."""
    try:
        import yaml
    except ImportError:
        raise ReproduceError("PyYAML is missing: install the book's dependencies (pip install -r requirements.txt)") from None
    return yaml


# --------------------------------------------------------------------------------------------
# Project layout


@dataclass(frozen=True)
class Layout:
    """Where everything lives for one project root."""

    root: Path
    figures: Path

    @property
    def build(self) -> Path:
        return self.root / "_build"

    @property
    def executed(self) -> Path:
        return self.build / "executed"

    @property
    def failed(self) -> Path:
        return self.build / "failed"

    @property
    def record(self) -> Path:
        return self.build / "run-record.json"

    @property
    def html(self) -> Path:
        return self.build / "html"

    @property
    def work(self) -> Path:
        return self.build / "work"

    @classmethod
    def at(cls, root: Path, figures: Path | None = None) -> "Layout":
        root = root.resolve()
        return cls(root=root, figures=(figures or root / "figures").resolve())


def find_root(start: Path | None = None) -> Path:
    """The project root: ``start`` (default: the working directory) or a parent of it that
    holds ``_toc.yml`` and ``_config.yml``, else the checkout this package was imported from."""
    candidates = []
    here = (start or Path.cwd()).resolve()
    candidates.extend([here, *here.parents])
    candidates.append(Path(__file__).resolve().parents[1])
    for path in candidates:
        if (path / "_toc.yml").is_file() and (path / "_config.yml").is_file():
            return path
    raise ReproduceError(
        f"no book here: neither {here} nor its parents hold _toc.yml and _config.yml "
        "(run from the companion checkout, or pass --root)"
    )


# --------------------------------------------------------------------------------------------
# Chapters (from _toc.yml)


@dataclass(frozen=True)
class Chapter:
    """One executable chapter: a notebook listed in the table of contents."""

    name: str        # "03_strict_greedy"
    toc_file: str    # "notebooks/03_strict_greedy", as written in _toc.yml
    path: Path       # <root>/notebooks/03_strict_greedy.ipynb

    @property
    def exists(self) -> bool:
        return self.path.is_file()


def toc_files(toc: dict[str, Any]) -> list[str]:
    """Every ``file``/``root`` entry of a jb-book table of contents, in reading order."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key in ("root", "file"):
                if isinstance(node.get(key), str):
                    found.append(node[key])
            for key in ("parts", "chapters", "sections", "subtrees", "entries"):
                if key in node:
                    walk(node[key])
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(toc)
    return found


def read_toc(root: Path) -> dict[str, Any]:
    path = root / "_toc.yml"
    yaml = _yaml()
    try:
        toc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReproduceError(f"missing table of contents {path}") from None
    except yaml.YAMLError as err:
        raise ReproduceError(f"cannot parse {path}: {err}") from err
    if not isinstance(toc, dict):
        raise ReproduceError(f"{path} is not a jb-book table of contents")
    return toc


def read_chapters(root: Path) -> list[Chapter]:
    """The executable chapters, in the order of ``_toc.yml`` (whether written yet or not)."""
    chapters = []
    for entry in toc_files(read_toc(root)):
        stem = entry[:-len(".ipynb")] if entry.endswith(".ipynb") else entry
        if stem.startswith(NOTEBOOK_DIR + "/"):
            chapters.append(Chapter(Path(stem).name, entry, root / f"{stem}.ipynb"))
    return chapters


def select_chapters(chapters: list[Chapter], only: list[str]) -> list[Chapter]:
    """The chapters named by ``--only`` (a full name, a notebook path, or a unique prefix such
    as ``03``), in table-of-contents order; all of them when ``only`` is empty."""
    if not only:
        return list(chapters)
    wanted: set[str] = set()
    names = [c.name for c in chapters]
    for raw in only:
        key = Path(raw).name
        key = key[:-len(".ipynb")] if key.endswith(".ipynb") else key
        matches = [n for n in names if n == key] or [n for n in names if n.startswith(key)]
        if len(matches) != 1:
            why = "matches several chapters" if matches else "is not a chapter in _toc.yml"
            raise ReproduceError(f"--only {raw!r} {why}; chapters: {', '.join(names)}")
        wanted.add(matches[0])
    return [c for c in chapters if c.name in wanted]


# --------------------------------------------------------------------------------------------
# Profiles and parameters


@dataclass
class Profile:
    """Parameters for every notebook (``parameters``) and per chapter (``notebooks``)."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    notebooks: dict[str, dict[str, Any]] = field(default_factory=dict)


def available_profiles(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "profiles").glob("*.yml"))


def load_profile(root: Path, name: str) -> Profile:
    """Load ``profiles/<name>.yml`` (or a YAML file given by path) and check its shape."""
    path = Path(name) if name.endswith((".yml", ".yaml")) else root / "profiles" / f"{name}.yml"
    if not path.is_file():
        known = ", ".join(available_profiles(root)) or "none"
        raise ReproduceError(f"unknown profile {name!r} (no {path}); available: {known}")
    yaml = _yaml()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ReproduceError(f"cannot parse profile {path}: {err}") from err
    unknown = set(data) - {"description", "parameters", "notebooks"}
    if unknown:
        raise ReproduceError(f"profile {path}: unknown keys {sorted(unknown)}")
    parameters = data.get("parameters") or {}
    notebooks = data.get("notebooks") or {}
    if not isinstance(parameters, dict) or not isinstance(notebooks, dict) or not all(
        isinstance(v, dict) for v in notebooks.values()
    ):
        raise ReproduceError(f"profile {path}: 'parameters' and each 'notebooks' entry must be mappings")
    return Profile(Path(name).stem, str(data.get("description", "")), parameters,
                   {str(k): v for k, v in notebooks.items()})


def parse_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value: YAML scalars (``8``, ``0.3``, ``true``, ``[1, 2]``), else the text."""
    yaml = _yaml()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


_NO_DEFAULT = object()


@dataclass(frozen=True)
class NotebookParameter:
    """One name assigned in a notebook's ``parameters`` cell: its default as written and as a value.

    ``value`` is the default evaluated as a Python literal, or ``_NO_DEFAULT`` when it is not a
    literal (an expression, or one name of a tuple unpacking); ``comment`` is the comment at the
    end of the assignment's line, else the comment lines right above it ("" if none).
    """

    name: str
    source: str
    value: Any
    comment: str

    @property
    def has_literal_default(self) -> bool:
        return self.value is not _NO_DEFAULT


def _parameters_cell(path: Path) -> str | None:
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and "parameters" in cell.get("metadata", {}).get("tags", []):
            return str(cell.source)
    return None


def notebook_parameters(path: Path) -> dict[str, NotebookParameter]:
    """The parameters a notebook declares in its papermill ``parameters`` cell, in order (empty if none).

    Read with ``ast`` rather than ``papermill.inspect_notebook``: papermill's line parser skips
    valid assignments whose comment contains ``=`` (e.g. ``vocab = 12  # needs V >= 10``),
    which would make a declared parameter look undeclared.
    """
    import ast
    import io
    import tokenize

    source = _parameters_cell(path)
    if source is None:
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        raise ReproduceError(f"{path.name}: the parameters cell is not valid Python: {err}") from err
    comments: dict[int, str] = {}
    full_line: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
                if not tok.line[:tok.start[1]].strip():
                    full_line.add(tok.start[0])
    except (tokenize.TokenError, SyntaxError):
        pass
    found: dict[str, NotebookParameter] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets, value = [node.target], node.value
        else:
            continue
        comment = comments.get(node.end_lineno, "") if node.end_lineno not in full_line else ""
        if not comment:
            above, line = [], node.lineno - 1
            while line in full_line:
                above.insert(0, comments[line])
                line -= 1
            comment = " ".join(above)
        text = ast.get_source_segment(source, value) if value is not None else ""
        for target in targets:
            single = isinstance(target, ast.Name) and value is not None and not isinstance(node, ast.AugAssign)
            literal: Any = _NO_DEFAULT
            if single:
                try:
                    literal = ast.literal_eval(value)
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    literal = _NO_DEFAULT
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Name):
                    shown = (text or "") if single else f"(set by: {ast.get_source_segment(source, node)})"
                    found[leaf.id] = NotebookParameter(leaf.id, shown, literal, comment)
    return found


def declared_parameters(path: Path) -> set[str]:
    """Names assigned in the notebook's papermill ``parameters`` cell (empty if it has none)."""
    return set(notebook_parameters(path))


_TYPE_NAMES = {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string",
               list: "a list", dict: "a mapping"}


def _kind(value: Any) -> type | None:
    """The parameter type a value belongs to: bool, int, float, str, list (lists and tuples), dict; else None."""
    for t in (bool, int, float, str, dict):
        if isinstance(value, t):
            return t
    if isinstance(value, (list, tuple)):
        return list
    return None


def value_fits_default(value: Any, default: Any) -> bool:
    """Whether ``value`` may replace a parameter whose default is ``default``.

    The rule: same kind as the default among bool, int, float, str, list, dict, except that an
    integer fits a float default; a None default (or one of another type) accepts anything;
    a list whose default's items are all of one kind must have items of that kind.
    """
    want = _kind(default)
    if default is None or want is None:
        return True
    got = _kind(value)
    if want is float and got is int:
        return True
    if got is not want:
        return False
    if want is list and default:
        kinds = {_kind(x) for x in default}
        if len(kinds) == 1:
            (item,) = kinds
            return all(value_fits_default(x, default[0]) for x in value) if item is not None else True
    return True


def _type_error(value: Any, param: NotebookParameter, chapter: str) -> str:
    want = _TYPE_NAMES.get(_kind(param.value) or object, type(param.value).__name__)
    if _kind(param.value) is list and param.value and _kind(value) is list:
        want = f"a list of {_TYPE_NAMES[_kind(param.value[0])].split(' (')[0].removeprefix('an ').removeprefix('a ')}s"
    hint = ' (quote it to pass a string: \'"..."\')' if isinstance(param.value, str) else ""
    return (f"{chapter} expects {want} for {param.name} (its default is {param.source}), "
            f"got {value!r}{hint}")


def plan_parameters(
    chapters: list[Chapter],
    declared: dict[str, set[str]],
    profile: Profile,
    overrides: dict[str, Any],
    all_names: list[str],
    defaults: dict[str, dict[str, NotebookParameter]] | None = None,
) -> dict[str, dict[str, Any]]:
    """The parameters to inject into each chapter: profile-wide values the notebook declares,
    then the profile's values for that chapter, then the command-line overrides.

    Profile-wide values a notebook does not declare are skipped silently (chapters share one
    profile); anything named explicitly for a chapter, or on the command line, must be declared.
    With ``defaults`` (:func:`notebook_parameters` of each chapter), every value must fit the
    type of the notebook's default (:func:`value_fits_default`), so a mistyped value is refused
    before any notebook runs.
    """
    unknown = set(profile.notebooks) - set(all_names)
    if unknown:
        raise ReproduceError(f"profile {profile.name!r} names unknown chapters: {sorted(unknown)}")
    plans: dict[str, dict[str, Any]] = {}
    for chapter in chapters:
        names = declared[chapter.name]
        params = {k: v for k, v in profile.parameters.items() if k in names}
        specific = profile.notebooks.get(chapter.name, {})
        undeclared = set(specific) - names
        if undeclared:
            raise ReproduceError(
                f"profile {profile.name!r} sets {sorted(undeclared)} for {chapter.name}, which declares "
                f"only {sorted(names)}"
            )
        params.update(specific)
        params.update({k: v for k, v in overrides.items() if k in names})
        if "device" in params and params["device"] not in DEVICES:
            raise ReproduceError(f"{chapter.name}: device must be one of {DEVICES}, got {params['device']!r}")
        for name, value in params.items():
            param = (defaults or {}).get(chapter.name, {}).get(name)
            if param is not None and param.has_literal_default and not value_fits_default(value, param.value):
                origin = (f"-p {name} {value!r}" if name in overrides else
                          f"profile {profile.name!r} sets {name} to {value!r}")
                raise ReproduceError(f"{origin}: {_type_error(value, param, chapter.name)}")
        plans[chapter.name] = params
    for key in overrides:
        if not any(key in declared[c.name] for c in chapters):
            declared_any = sorted(set().union(*(declared[c.name] for c in chapters))) if chapters else []
            raise ReproduceError(
                f"-p {key}: no selected chapter declares this parameter (declared: {', '.join(declared_any)})"
            )
    return plans


def describe_device(device: str | None) -> tuple[str | None, str]:
    """Resolve ``auto`` and describe the hardware: ``(device, description)``."""
    cpu = f"{platform.machine() or 'CPU'}, {os.cpu_count()} cores"
    if device is None or device == "cpu":
        return device, cpu
    try:
        import torch
    except ImportError:
        if device == "auto":
            return "cpu", cpu
        raise ReproduceError("device 'cuda' requested but torch is not installed") from None
    available = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if available else "cpu"
    if device == "cuda":
        if not available:
            raise ReproduceError(
                "device 'cuda' requested but torch sees no CUDA device "
                f"(torch {torch.__version__}); install a CUDA build of torch or use the cpu profile"
            )
        return device, torch.cuda.get_device_name(0)
    return device, cpu


# --------------------------------------------------------------------------------------------
# Executing one chapter


def _sha256(path: Path) -> str:
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
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
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
    return _strip_ansi(text)


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def execute_chapter(
    chapter: Chapter,
    params: dict[str, Any],
    layout: Layout,
    work: Path,
    *,
    show_cells: bool = False,
    cell_timeout: int | None = None,
) -> tuple[float, list[Path]]:
    """Run one notebook with papermill; return its wall time and the figure files it wrote.

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
    pythonpath = os.pathsep.join(filter(None, [str(layout.root), os.environ.get("PYTHONPATH")]))
    jupyter_path = os.pathsep.join(filter(None, [str(work / "jupyter"), os.environ.get("JUPYTER_PATH")]))
    env = {
        FIGURES_ENV: str(figures),
        "JUPYTER_PATH": jupyter_path,
        "PYTHONPATH": pythonpath,
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",   # silences a debugger warning at kernel start
    }
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
    layout.executed.mkdir(parents=True, exist_ok=True)
    os.replace(out, layout.executed / out.name)
    stale_failure = layout.failed / out.name
    if stale_failure.exists():
        stale_failure.unlink()
    return seconds, sorted(p for p in figures.iterdir() if not p.name.startswith("."))


def publish_figures(chapter: str, files: list[Path], record: RunRecord, target: Path) -> list[str]:
    """Move a chapter's new figure files into ``target`` and drop its figures that are gone.

    Two chapters may not write the same figure name: the status page must say which one
    produced each figure.
    """
    names = sorted({p.stem for p in files})
    for name in names:
        owner = record.figure_owner(name)
        if owner is not None and owner != chapter:
            raise RunFailure(f"figure {name!r} written by {chapter} was already written by {owner}")
    target.mkdir(parents=True, exist_ok=True)
    old = record.chapters.get(chapter)
    for name in (old.figures if old else []):
        if name not in names:
            for ext in ("png", "pdf"):
                (target / f"{name}.{ext}").unlink(missing_ok=True)
    for path in files:
        try:
            os.replace(path, target / path.name)
        except OSError:  # another filesystem: copy to a temporary name, then rename
            tmp = target / f".{path.name}.tmp"
            shutil.copyfile(path, tmp)
            os.replace(tmp, target / path.name)
    return names


# --------------------------------------------------------------------------------------------
# Building the book


class _ResourceFinder(html.parser.HTMLParser):
    """Collects the URLs an HTML page *loads* (scripts, styles, fonts, images, frames)."""

    LOADING_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut",
                    "apple-touch-icon", "manifest", "preconnect", "dns-prefetch"}

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed", "track") and a.get("src"):
            self.urls.append(a["src"])
        elif tag == "link" and set(a.get("rel", "").lower().split()) & self.LOADING_RELS:
            self.urls.append(a.get("href", ""))
        elif tag == "object" and a.get("data"):
            self.urls.append(a["data"])
        self._in_style = tag == "style"
        if "style" in a:
            self.urls.extend(_css_urls(a["style"]))

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.urls.extend(_css_urls(data))


def _css_urls(css: str) -> list[str]:
    found = re.findall(r"url\(\s*['\"]?([^'\")\s]+)", css)
    found += re.findall(r"@import\s+['\"]([^'\"]+)", css)
    return found


def _is_remote(url: str) -> bool:
    return bool(re.match(r"^\s*(https?:)?//", url, re.IGNORECASE))


def find_remote_resources(html_dir: Path) -> list[str]:
    """``"file: url"`` for every script, style, font, image or frame a built page would load from
    another host. Links a reader may click (``<a href>``) are fine and not listed."""
    problems = []
    for page in sorted(html_dir.rglob("*.html")):
        finder = _ResourceFinder()
        finder.feed(page.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{page.relative_to(html_dir)}: {u}" for u in finder.urls if _is_remote(u)]
    for sheet in sorted(html_dir.rglob("*.css")):
        urls = _css_urls(sheet.read_text(encoding="utf-8", errors="replace"))
        problems += [f"{sheet.relative_to(html_dir)}: {u}" for u in urls if _is_remote(u)]
    return problems


_PROBE = """
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out[name] = ["ok", ""]
    except ModuleNotFoundError as err:
        missing = err.name and (name == err.name or name.startswith(err.name + "."))
        out[name] = ["missing" if missing else "error", f"{type(err).__name__}: {err}"]
    except Exception as err:
        out[name] = ["error", f"{type(err).__name__}: {err}"]
print(json.dumps(out))
"""


def probe_modules(modules: list[str], root: Path) -> dict[str, tuple[str, str]]:
    """Import each module in a fresh interpreter: ``ok``, ``missing`` (not written yet) or ``error``."""
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
    head = f"## `{module}`\n\n"
    if status == "ok":
        # autodoc emits reStructuredText: parse it as such (inside MyST it would show as raw text).
        return head + f"```{{eval-rst}}\n.. automodule:: {module}\n```\n"
    if status == "missing":
        return head + "```{note}\nThis module is not part of this build yet.\n```\n"
    return head + f"```{{warning}}\nThis module failed to import, so it is not documented here:\n`{detail}`\n```\n"


def _filter_toc(node: Any, keep: set[str]) -> Any:
    """A copy of the toc without the notebook entries not in ``keep`` (and parts left empty)."""
    if isinstance(node, list):
        items = [_filter_toc(x, keep) for x in node]
        return [x for x in items if x is not None]
    if isinstance(node, dict):
        entry = node.get("file")
        if isinstance(entry, str) and entry.startswith(NOTEBOOK_DIR + "/") and entry not in keep:
            return None
        out = {k: _filter_toc(v, keep) if k in ("parts", "chapters", "sections") else v for k, v in node.items()}
        if "chapters" in node and not out["chapters"] and "file" not in node:
            return None
        return out
    return node


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
    if missing:
        unlink_chapters(stage / "book", [c.name for c in missing])
    toc = _filter_toc(read_toc(root), {c.toc_file for c in staged})
    (stage / "_toc.yml").write_text(_yaml().safe_dump(toc, sort_keys=False), encoding="utf-8")

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
             _sha256(c.path) if c.exists else None)
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


def unlink_chapters(pages: Path, chapters: list[str]) -> None:
    """In the book's Markdown pages, turn links to chapters left out of this build into plain text.

    A partial build (``--only``) stages only the executed chapters; a link to another one
    would be a broken cross-reference, which the build treats as an error.
    """
    names = "|".join(re.escape(c) for c in chapters)
    link = re.compile(r"\[([^\]]+)\]\(\.\./" + NOTEBOOK_DIR + r"/(?:" + names + r")\.(?:ipynb|md)(?:#[^)]*)?\)")
    for page in pages.rglob("*.md"):
        text = page.read_text(encoding="utf-8")
        new = link.sub(lambda m: f"{m.group(1)} (not in this build)", text)
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


def link_figures(path: Path, available: set[str]) -> int:
    """Replace each figure marker in a notebook's outputs by the figure's download links.

    ``save_figure`` leaves ``<!-- companion-figure: NAME -->`` in the cell that saved the figure,
    before the figure itself is displayed; here the marker is removed and the links to the
    staged ``figures/NAME.png`` and ``.pdf`` are appended after the cell's last image, so they
    sit under the figure. Markers of figures that are not staged are dropped. Returns how many
    links were added.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    added = 0
    for cell in nb.cells:
        names, kept = [], []
        for out in cell.get("outputs", []):
            text = out.get("data", {}).get("text/markdown", "") if out.get("output_type") == "display_data" else ""
            match = FIGURE_MARKER.match(text.strip()) if isinstance(text, str) else None
            if match:
                names.append(match.group(1))
            else:
                kept.append(out)
        if not names:
            continue
        links = [f"{{download}}`{name}.png <../figures/{name}.png>` · {{download}}`{name}.pdf <../figures/{name}.pdf>`"
                 for name in names if name in available]
        images = [i for i, out in enumerate(kept) if "image/png" in out.get("data", {})]
        at = images[-1] + 1 if images else len(kept)
        if links:
            kept.insert(at, nbformat.v4.new_output(
                "display_data", data={"text/markdown": "Download: " + "; ".join(links)}))
            added += len(links)
        cell["outputs"] = kept
    nbformat.write(nb, path)
    return added


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
    output = _strip_ansi(done.stdout + "\n" + done.stderr)
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


# --------------------------------------------------------------------------------------------
# The whole run


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
            record.chapters[chapter.name] = ChapterRun(
                chapter=chapter.name, source=str(chapter.path.relative_to(layout.root)),
                source_sha256=_sha256(chapter.path), profile=profile.name, parameters=params,
                device=device, device_name=device_name, started=started, seconds=round(seconds, 2),
                figures=names, python=python, torch=torch, commit=commit,
                harvest=harvest_description(params.get("traces_dir")),
            )
            save_record(record, layout.record)
            log(f"[{i}/{len(runnable)}] {chapter.name}: ok in {seconds:.1f} s, {len(names)} figure(s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        raise RunFailure(f"{len(failures)} notebook(s) failed:\n" + "\n".join(failures))
    if build:
        build_book(layout, log)
    return record


# --------------------------------------------------------------------------------------------
# Command line


def _layout_from_args(args: argparse.Namespace) -> Layout:
    root = find_root(Path(args.root) if args.root else None)
    figures = Path(args.figures_dir) if getattr(args, "figures_dir", None) else None
    return Layout.at(root, figures)


def _list_chapters(layout: Layout) -> int:
    """Every chapter with its parameters: name, default as written, and the comment beside it."""
    for chapter in read_chapters(layout.root):
        if not chapter.exists:
            print(f"{chapter.name}  (notebook not written yet)")
            continue
        params = notebook_parameters(chapter.path)
        if not params:
            print(f"{chapter.name}  (no parameters cell)")
            continue
        print(chapter.name)
        width = max((len(f"{p.name} = {p.source}") for p in params.values() if p.comment), default=0)
        for p in params.values():
            line = f"{p.name} = {p.source}"
            print(f"    {line:{width}s}  # {p.comment}" if p.comment else f"    {line}")
    print("profiles: " + ", ".join(available_profiles(layout.root)))
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    try:
        layout = _layout_from_args(args)
        if args.list:
            return _list_chapters(layout)
        overrides = {name: parse_value(value) for name, value in args.param}
        reproduce(layout, args.profile, overrides, args.only, build=not args.no_build,
                  keep_going=args.keep_going, require_all=args.require_all, cell_timeout=args.cell_timeout)
    except ReproduceError as err:
        print(f"companion reproduce: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def _cmd_build_book(args: argparse.Namespace) -> int:
    try:
        build_book(_layout_from_args(args), keep_work=args.keep_stage)
    except ReproduceError as err:
        print(f"companion build-book: error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``reproduce`` and ``build-book`` to the ``companion`` command line."""
    p = subparsers.add_parser(
        "reproduce", help="execute every notebook (papermill) and build the book",
        description="Execute the chapters listed in _toc.yml with papermill, record the runs, "
                    "write figures to figures/, then build the HTML book into _build/html.",
    )
    p.add_argument("--profile", default="cpu", help="profile name in profiles/ or a YAML path (default: cpu)")
    p.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="override a notebook parameter (VALUE is read as YAML: 8, 0.3, true, cuda)")
    p.add_argument("--only", action="append", default=[], metavar="CHAPTER",
                   help="run only this chapter (name or unique prefix, e.g. 03_strict_greedy or 03); repeatable")
    p.add_argument("--no-build", action="store_true", help="execute notebooks but do not build the book")
    p.add_argument("--keep-going", action="store_true", help="run the remaining notebooks after a failure")
    p.add_argument("--require-all", action="store_true", help="fail if a chapter's notebook does not exist")
    p.add_argument("--cell-timeout", type=int, default=None, metavar="SECONDS", help="limit per cell")
    p.add_argument("--figures-dir", default=None, help="where figures go (default: figures/ at the root)")
    p.add_argument("--root", default=None, help="project root (default: found from the working directory)")
    p.add_argument("--list", action="store_true",
                   help="list chapters, their parameters (default and comment) and the profiles")
    p.set_defaults(func=_cmd_reproduce)

    b = subparsers.add_parser(
        "build-book", help="build the HTML book from the executed notebooks",
        description="Build _build/html from _build/executed (see `companion reproduce`), with warnings as errors.",
    )
    b.add_argument("--root", default=None, help="project root (default: found from the working directory)")
    b.add_argument("--keep-stage", action="store_true", help="keep the staged sources under _build/work")
    b.set_defaults(func=_cmd_build_book)
