"""Chapters 7 and 12 as a reader meets them: prose by hand, numbers glued by name, claims checked.

These read the notebooks' sources (no execution): every table sits in the section whose prose
refers to it, no glued value is a sentence (so no "$...$" math is left raw in glued Markdown and
no "from X to X" can be assembled), each chapter ends with its claims summary, code cells stay
short, and chapter 12 reads chapter 7's shared harvest at the same sizes in every profile.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from companion.book.parameters import notebook_parameters

ROOT = Path(__file__).resolve().parents[1]
NB = {"07": ROOT / "notebooks" / "07_paper_evaluation.ipynb", "12": ROOT / "notebooks" / "12_precision_and_ties.ipynb"}
HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)
GLUE_MD = re.compile(r"\{glue:md\}`([^`]+)`")
GLUE_ANY = re.compile(r"\{glue(?::\w+)?\}`([^`:]+)")


def _cells(ch: str) -> list[dict]:
    return json.loads(NB[ch].read_text(encoding="utf-8"))["cells"]


def _src(c: dict) -> str:
    return "".join(c["source"])


def sections(cells: list[dict]) -> list[tuple[str, list[dict]]]:
    """The notebook cut at every markdown heading: (heading, cells from it to the next heading)."""
    out: list[tuple[str, list[dict]]] = [("(top)", [])]
    for c in cells:
        if c["cell_type"] == "markdown" and HEADING.search(_src(c)):
            # a markdown cell may hold several headings: the table follows the last one
            out.append((HEADING.split(_src(c))[-1].splitlines()[0], [c]))
        else:
            out[-1][1].append(c)
    return out


@pytest.mark.parametrize("ch", sorted(NB))
def test_every_table_sits_under_the_section_that_refers_to_it(ch: str) -> None:
    for heading, cells in sections(_cells(ch)):
        text = "\n".join(_src(c) for c in cells if c["cell_type"] == "markdown")
        for c in cells:
            if c["cell_type"] != "code":
                continue
            for label in re.findall(r'"(tbl-ch\d+-[a-z0-9-]+)"', _src(c)):
                assert f"{{numref}}`{label}`" in text, f"chapter {ch}: {label} is not referred to in {heading!r}"


@pytest.mark.parametrize("ch", sorted(NB))
def test_numbers_are_glued_not_sentences(ch: str) -> None:
    """Only the harvest's description is glued as Markdown; everything else the prose reads is a number
    or a name, so no sentence (and no raw "$" math) is assembled in code."""
    md = "\n".join(_src(c) for c in _cells(ch) if c["cell_type"] == "markdown")
    assert set(GLUE_MD.findall(md)) <= {"ch7_run"}, GLUE_MD.findall(md)
    code = "\n".join(_src(c) for c in _cells(ch) if c["cell_type"] == "code")
    assert "glue(" in code and "Markdown(f" not in code and ".join(parts)" not in code
    # every key the prose reads is glued by this chapter (a number's name says what it is)
    glued = set(re.findall(r'glue\(f?"(ch\d+_[a-z0-9_{}]+)', code))
    patterns = [re.compile("^" + re.sub(r"\\\{[^}]*\\\}", "[a-z0-9_]+", re.escape(g)) + "$") for g in glued]
    for key in set(GLUE_ANY.findall(md)):
        assert key.startswith(f"ch{int(ch)}_"), key
        assert any(p.match(key) for p in patterns), f"chapter {ch} reads {key} but never glues it"


@pytest.mark.parametrize("ch", sorted(NB))
def test_the_chapter_opens_with_its_result_and_ends_with_its_claims(ch: str) -> None:
    cells = _cells(ch)
    first_md = next(c for c in cells if c["cell_type"] == "markdown")
    assert _src(first_md).startswith("# ") and ":::{admonition}" in _src(first_md).split("\n\n")[1]
    last = cells[-1]
    assert last["cell_type"] == "code" and "claims.summary()" in _src(last)
    assert "hide-input" in last["metadata"].get("tags", [])
    code = "\n".join(_src(c) for c in cells if c["cell_type"] == "code")
    assert f'claims = Claims("{ch}")' in code and code.count("claims.check(") >= 5


@pytest.mark.parametrize("ch", sorted(NB))
def test_short_cells_short_lines_and_no_interpolated_quantiles(ch: str) -> None:
    for c in _cells(ch):
        src = _src(c)
        if c["cell_type"] == "code" and c.get("id") != "install":
            assert len(src.splitlines()) <= 30, src[:80]
            assert "np.percentile" not in src and "np.median" not in src
        for line in src.splitlines():
            assert len(line) <= 100 or "https://" in line or c.get("id") == "install", line[:60]
    md = "\n".join(_src(c) for c in _cells(ch) if c["cell_type"] == "markdown")
    assert "../book/how_to_read.md" not in md and "](../" not in md
    other = "12_precision_and_ties" if ch == "07" else "07_paper_evaluation"
    assert f"{{doc}}`{other}`" in md


def test_chapter_12_reads_chapter_7s_harvest_at_its_sizes_in_every_profile() -> None:
    p7, p12 = notebook_parameters(NB["07"]), notebook_parameters(NB["12"])
    shared = ("preset", "device", "seed", "n_prompts", "n_steps", "batch_size", "harvest_processes",
              "harvest_threads", "traces_dir", "n_boot")
    for key in shared:
        assert p12[key].value == p7[key].value, key
    for path in sorted((ROOT / "profiles").glob("*.yml")):
        notebooks = yaml.safe_load(path.read_text(encoding="utf-8")).get("notebooks") or {}
        a, b = notebooks.get("07_paper_evaluation", {}), notebooks.get("12_precision_and_ties", {})
        assert {k: v for k, v in a.items() if k in shared} == {k: v for k, v in b.items() if k in shared}, path.name


def test_the_quantile_is_the_lower_order_statistic() -> None:
    """One convention, stated once: Q(q) is the ceil(qN)-th smallest value (numpy's interpolation differs)."""
    import numpy as np

    from companion.analysis.traces import quantile, summarize_values

    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 20, 101):
        x = rng.random(n)
        s = np.sort(x)
        for q in (0.05, 0.25, 0.5, 0.99):
            assert quantile(x, q) == s[max(int(np.ceil(q * n)), 1) - 1]
        assert summarize_values(x).median == s[max(int(np.ceil(0.5 * n)), 1) - 1]
    assert quantile(np.array([1.0, 2.0]), 0.5) == 1.0 != np.median([1.0, 2.0])
