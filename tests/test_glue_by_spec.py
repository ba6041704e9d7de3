"""Per-criterion numbers on the pages are looked up by spec, never by position.

Chapter 1 once glued "the typical threshold" from ``criteria[5]``; when ``PAPER_CRITERIA`` was
reordered that became ``topm:4`` and the page printed 0.0944 for a threshold capped at 0.09.
Two checks guard against that: no notebook indexes a list of criteria, specs or widths by a
literal position, and chapter 1, executed with ``PAPER_CRITERIA`` reversed, still glues each
criterion's own threshold as the library computes it.
"""
from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import nbformat
import pytest
import torch

from companion import PAPER_CRITERIA, parse_criterion
from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# a list of criteria, specs, widths (or anything named so) indexed by a literal integer
POSITIONAL = re.compile(
    r"\b(?:\w*criteria|PAPER_CRITERIA|\w*specs|\w*widths|DEFAULTS|builtins)\s*\[\s*-?\d+\s*\]")


def _code(nb_path: Path) -> list[tuple[int, str]]:
    nb = nbformat.read(nb_path, as_version=4)
    return [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def test_positional_pattern_catches_the_old_chapter_1_glue() -> None:
    assert POSITIONAL.search('glue("ch1_tau_typical", float(criteria[5].threshold(p)))')
    assert POSITIONAL.search("d0 = DEFAULTS[0]")
    assert POSITIONAL.search("w = widths[-1]")
    assert not POSITIONAL.search('by_spec["typical:0.09,0.3"]')
    assert not POSITIONAL.search("p[0]")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_chapter_indexes_criteria_or_widths_by_position(path: Path) -> None:
    hits = [f"cell {i}: {m.group(0)}" for i, src in _code(path) for m in POSITIONAL.finditer(src)]
    assert not hits, f"{path.name} looks values up by position, not by spec: {hits}"


def _glued(nb: nbformat.NotebookNode) -> dict[str, object]:
    """Every value a notebook glued, by name (myst_nb writes them as scrapbook display data)."""
    out: dict[str, object] = {}
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            name = o.get("metadata", {}).get("scrapbook", {}).get("name")
            if name is None:
                continue
            text = o["data"].get("application/papermill.record/text/plain")
            try:
                out[name] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                out[name] = text
    return out


def _run_with_criteria(chapter: str, order: tuple[str, ...], tmp_path: Path) -> dict[str, object]:
    """Execute a chapter with ``companion.PAPER_CRITERIA`` replaced by ``order``; its glued values."""
    import papermill

    from companion.book.execute import KERNEL_NAME, patched_environ, write_kernelspec

    nb = nbformat.read(ROOT / "notebooks" / f"{chapter}.ipynb", as_version=4)
    patch = nbformat.v4.new_code_cell(
        "import companion, companion.certify.criteria\n"
        f"companion.PAPER_CRITERIA = companion.certify.criteria.PAPER_CRITERIA = {order!r}\n")
    nb.cells.insert(1, patch)  # after the install cell, before the chapter imports PAPER_CRITERIA
    src, out = tmp_path / f"{chapter}.ipynb", tmp_path / f"{chapter}.out.ipynb"
    nbformat.write(nb, src)
    jupyter = write_kernelspec(tmp_path / "jupyter")
    with patched_environ({"JUPYTER_PATH": str(jupyter), "PYTHONPATH": str(ROOT),
                          "COMPANION_FIGURES_DIR": str(tmp_path / "figures")}, unset=("MPLBACKEND",)):
        papermill.execute_notebook(str(src), str(out), kernel_name=KERNEL_NAME, cwd=str(tmp_path),
                                   progress_bar=False, log_output=False)
    return _glued(nbformat.read(out, as_version=4))


def test_chapter_1_glues_each_criterion_by_spec_whatever_the_order(tmp_path: Path) -> None:
    reordered = tuple(reversed(PAPER_CRITERIA))
    assert reordered != PAPER_CRITERIA
    glued = _run_with_criteria("01_criteria_level_sets", reordered, tmp_path)
    # the chapter's defaults (its parameters cell): vocab 12, decay 0.45
    vocab, decay = 12, 0.45
    p = torch.softmax(-decay * torch.arange(vocab, dtype=torch.float64), dim=0)
    additive, typical = parse_criterion("additive:0.3"), parse_criterion("typical:0.09,0.3")
    expected = {
        "ch1_tau_additive": float(additive.threshold(p)),
        "ch1_additive_delta": additive.delta,
        "ch1_tau_typical": float(typical.threshold(p)),
        "ch1_typical_eps": typical.eps,
        "ch1_typical_delta": typical.delta,
    }
    wrong = {k: (glued.get(k), v) for k, v in expected.items()
             if not isinstance(glued.get(k), float) or not math.isclose(glued[k], v, rel_tol=1e-12)}
    assert not wrong, f"chapter 1 run with PAPER_CRITERIA = {reordered}: glued vs library {wrong}"
    # the typical threshold is capped at eps, whatever the order
    assert glued["ch1_tau_typical"] <= typical.eps, glued["ch1_tau_typical"]
