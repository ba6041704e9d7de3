"""Shared fixtures: the built book (once per session) and throwaway book projects."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import settings

# CI draws the same hypothesis examples on every run (derandomize), so that a red CI is a bug in
# the code and not a draw; developers keep random draws, which explore more.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]

#: ``COMPANION_FULL_SWEEPS=1`` runs the oracle sweeps (the SLSQP and exhaustive-search comparisons
#: over many random rows) at their full sizes, as ``scripts/portability.sh --all`` does; otherwise
#: (CI, a developer's run) at half size: at full size the two oracle files took 692 s of a 1,763 s
#: one-process run of the suite.
FULL_SWEEPS = os.environ.get("COMPANION_FULL_SWEEPS") == "1"


def sweep_size(full: int) -> int:
    """How many random cases an oracle sweep draws: ``full`` under ``COMPANION_FULL_SWEEPS=1``, half otherwise."""
    return full if FULL_SWEEPS else max(1, full // 2)


if os.environ.get("PYTEST_XDIST_WORKER"):
    # Under pytest-xdist (CI runs one worker per core) each worker and the notebook kernels it
    # starts use one thread: two workers with two OpenMP threads each on two cores wait on each
    # other far more than they gain. Set before torch is imported by any test module.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _mpmath_precision(request: pytest.FixtureRequest):
    """Every test runs its mpmath oracle at its module's ``MP_DPS`` digits (60 when it names none).

    A module-level ``mpmath.mp.dps = N`` is global: under pytest-xdist every module of a worker is
    imported before any test runs, so the last one imported set the precision for all of them (an
    oracle at 40 digits lost 8 of the 33 it needs at a one-ulp gap, and a correct certificate failed
    against it)."""
    import mpmath

    with mpmath.workdps(getattr(request.module, "MP_DPS", 60)):
        yield


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (CPU float reductions depend on the count; subprocesses use one)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_notebook(path: Path, parameters: str, *cells: str, title: str | None = "") -> Path:
    """A notebook: a Markdown title (default: the file name; None: none, when a cell brings its
    own), a papermill ``parameters`` cell, then code cells (a cell starting with ``# md`` becomes
    a Markdown cell, without that first line)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    if title is not None:
        nb.cells.append(nbformat.v4.new_markdown_cell(f"# {title or path.stem}"))
    params = nbformat.v4.new_code_cell(parameters)
    params.metadata["tags"] = ["parameters"]
    nb.cells.append(params)
    for source in cells:
        if source.startswith("# md\n"):
            nb.cells.append(nbformat.v4.new_markdown_cell(source[len("# md\n"):]))
        else:
            nb.cells.append(nbformat.v4.new_code_cell(source))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# The longest test files, longest first (measured with --durations): pytest-xdist hands out whole
# files in the order the scheduler below keeps (collection order), so starting these first keeps
# one long file from running alone at the end while the other worker idles.
LONGEST_FILES = ("test_book_browser.py", "test_harvest.py", "test_drafter_side.py", "test_certificates_oracle.py",
                 "test_reproduce.py", "test_paper_rehearsal.py", "test_peaked_rows.py",
                 "test_certificate_properties.py", "test_speculative.py", "test_qwen_pair.py")

# The files that read the built book (``built_book``). They form one unit of work under
# pytest-xdist, so one worker builds the book and then reads it while the other runs everything
# else; as separate files, a second worker reached one of them early and waited on the build's
# lock for minutes (measured: 432 s idle in a 1,243 s run).
BOOK_FILES = ("test_book_browser.py", "test_glued_verdicts.py", "test_book_links.py", "test_phone_pages.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    rank.update({name: rank["test_book_browser.py"] for name in BOOK_FILES})
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))  # stable: order within files kept


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    """Under ``--dist loadfile``: whole files as units of work, the book's files as one unit, handed
    out in collection order (longest first, above) rather than xdist's default of most tests first."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BookFirstFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "the built book's files" if Path(path).name in BOOK_FILES else path

    config.option.loadscopereorder = False
    return BookFirstFileScheduling(config, log)


@pytest.fixture
def make_project(tmp_path: Path) -> Callable[..., Path]:
    """Build a small book project in a temporary directory with the real _config.yml, book/
    pages and profiles, and a _toc.yml listing ``chapters`` (notebooks you then write).

    The API reference is a one-line stub unless ``api=True`` (then its index and its page per
    subpackage are built): its autodoc of the whole library is ~90 % of a small book's build time, and the full book (``built_book``) builds and
    checks the real one."""

    def make(*chapters: str, api: bool = False) -> Path:
        root = tmp_path / "project"
        root.mkdir()
        shutil.copy2(ROOT / "_config.yml", root)
        shutil.copytree(ROOT / "book", root / "book", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(ROOT / "profiles", root / "profiles")
        if not api:
            shutil.rmtree(root / "book" / "api")  # the pages per subpackage: not in this toc, not probed
            (root / "book" / "api.md").write_text(
                "# API reference\n\nThis test project leaves the library's reference out.\n", encoding="utf-8")
        entries = "\n".join(f"      - file: notebooks/{c}" for c in chapters)
        (root / "_toc.yml").write_text(
            "format: jb-book\nroot: book/intro\nparts:\n"
            "  - caption: Reading\n    chapters:\n      - file: book/how_to_read\n      - file: book/claims\n"
            f"  - caption: Chapters\n    chapters:\n{entries}\n"
            "  - caption: Reference\n    chapters:\n      - file: book/glossary\n"
            "      - file: book/reproduction_status\n      - file: book/beyond_one_machine\n      - file: book/references\n"
            "      - file: book/api\n"
            + ("        sections:\n" + "".join(f"          - file: book/api/{p.stem}\n"
                                          for p in sorted((root / "book" / "api").glob("*.md"))) if api else ""),
            encoding="utf-8",
        )
        return root

    return make


@pytest.fixture(scope="session")
def built_book() -> Path:
    """``_build/html`` of this repository, built once per test run by the real pipeline on the
    ci profile (every notebook executed with papermill), or reused when
    ``COMPANION_BOOK_BUILT=1`` says a build is already there."""
    from companion.book.layout import Layout
    from companion.book.run import reproduce

    layout = Layout.at(ROOT)
    if os.environ.get("COMPANION_BOOK_BUILT") == "1":
        if not (layout.html / "index.html").is_file():
            pytest.fail("COMPANION_BOOK_BUILT=1 but _build/html/index.html does not exist")
        return layout.html
    # Under pytest-xdist each worker has its own session, so each would build the book (measured:
    # two 6-minute builds side by side). The first worker to get here builds it under a lock; the
    # others wait for the lock and reuse that build, which the run's id marks as this run's.
    import fcntl

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID", "")
    marker = layout.html / ".built-for-test-run"
    layout.html.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.html.parent / ".built-book.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if run_id and marker.is_file() and marker.read_text(encoding="utf-8") == run_id:
                return layout.html
            # every chapter of _toc.yml must exist and execute: CI is the check that they do. The
            # ci profile is the cpu profile at smaller sizes (profiles/ci.yml): the same code paths
            # and models; chapters 7, 8 and 10 measured 77, 34 and 130 s there against 277, 33 and
            # 633 s in the main job.
            reproduce(layout, "ci", require_all=True)
            if run_id:
                marker.write_text(run_id, encoding="utf-8")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return layout.html
