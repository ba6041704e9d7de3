"""Figure download links: save_figure's marker becomes PNG/PDF links under the figure when staged."""
from __future__ import annotations

import nbformat
import pytest

from companion.book.figure_files import link_figures


def _cell_with(outputs: list) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell("fig = draw(); save_figure(fig, 'x'); fig")
    cell.outputs = outputs
    return cell


def _marker(name: str):
    return nbformat.v4.new_output("display_data", data={"text/markdown": f"<!-- companion-figure: {name} -->"})


def _image():
    return nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})


def test_marker_becomes_links_under_the_last_image(tmp_path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell_with([_marker("exp_a"), _marker("gone"), _image()]), _cell_with([_image()])]
    path = tmp_path / "ch.ipynb"
    nbformat.write(nb, path)
    assert link_figures(path, {"exp_a"}) == 1
    cells = nbformat.read(path, as_version=4).cells
    first = cells[0].outputs
    assert [("image/png" in o.data) for o in first] == [True, False]
    text = first[1].data["text/markdown"]
    assert "{download}`exp_a.png <../figures/exp_a.png>`" in text and "exp_a.pdf" in text
    assert "gone" not in text and "companion-figure" not in text
    assert len(cells[1].outputs) == 1  # a figure that was not saved gets no links


def test_interactive_saves_leave_no_marker(tmp_path, monkeypatch) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from companion.figures import save_figure

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    written = save_figure(fig, "demo", directory=tmp_path)  # outside a kernel: files only
    assert sorted(p.name for p in written) == ["demo.pdf", "demo.png"]
    plt.close(fig)


def test_links_to_chapters_left_out_become_text(tmp_path) -> None:
    from companion.book.stage import unlink_chapters

    page = tmp_path / "claims.md"
    page.write_text("See [Chapter 3](../notebooks/03_strict_greedy.ipynb) and "
                    "[chapter 7](../notebooks/07_paper_evaluation.ipynb#certified-runs).\n")
    unlink_chapters(tmp_path, {"07_paper_evaluation"})
    assert page.read_text() == ("See Chapter 3 (not in this build) and "
                                "[chapter 7](../notebooks/07_paper_evaluation.ipynb#certified-runs).\n")


def test_parameter_cells_fold_into_one_box(tmp_path) -> None:
    from companion.book.stage import present_parameters
    from tests.conftest import write_notebook

    source = write_notebook(tmp_path / "src.ipynb", "seed = 0  # random seed\nn = 4   # rows | per batch", "print(seed)")
    nb = nbformat.read(source, as_version=4)
    injected = nbformat.v4.new_code_cell("# Parameters\nseed = 7\n")
    injected.metadata["tags"] = ["injected-parameters"]
    nb.cells.insert(2, injected)
    staged = tmp_path / "staged.ipynb"
    nbformat.write(nb, staged)
    assert present_parameters(staged, source, "cpu")
    cells = nbformat.read(staged, as_version=4).cells
    assert "remove-cell" in cells[1].metadata["tags"]                      # the defaults cell is hidden
    box = cells[2]
    assert box.cell_type == "markdown" and "Parameters of this run (profile `cpu`)" in box.source
    assert "| `seed` | `7` (changed) | `0` | random seed |" in box.source
    assert "| `n` | `4` | `4` | rows \\| per batch |" in box.source
    assert not any("injected-parameters" in c.metadata.get("tags", []) for c in cells)


def test_throwaway_projects_list_every_page_of_the_real_book(make_project) -> None:
    """The test projects must hold every book page the real table of contents has (pages link to each other)."""
    import yaml

    from tests.conftest import ROOT

    def files(node):
        if isinstance(node, dict):
            return ([node["file"]] if "file" in node else []) + [f for v in node.values() for f in files(v)]
        if isinstance(node, list):
            return [f for x in node for f in files(x)]
        return []

    real = {f for f in files(yaml.safe_load((ROOT / "_toc.yml").read_text())) if f.startswith("book/")}
    project = make_project("01_x", api=True)
    theirs = set(files(yaml.safe_load((project / "_toc.yml").read_text()))) | {"book/intro"}
    assert real <= theirs | {"book/intro"}, f"add to tests/conftest.py make_project: {sorted(real - theirs)}"


def test_captioned_figure_becomes_a_numbered_figure_directive(tmp_path) -> None:
    from companion.book.stage import caption_figures

    text = nbformat.v4.new_output("display_data", data={"text/markdown": "| a table |"})
    captioned = _cell_with([text, _marker("exp_a"), _image()])
    captioned.metadata["mystnb"] = {"figure": {"caption": "What is drawn.", "name": "fig-exp-a"}}
    plain = _cell_with([_marker("exp_b"), _image()])
    nb = nbformat.v4.new_notebook()
    nb.cells = [captioned, plain]
    path = tmp_path / "ch.ipynb"
    nbformat.write(nb, path)
    assert caption_figures(path, {"exp_a", "exp_b"}, "Drawn by run X.") == 1
    cells = nbformat.read(path, as_version=4).cells
    assert [c.cell_type for c in cells] == ["code", "markdown", "code"]
    # the code cell keeps its other outputs, loses the image and the caption metadata
    assert [o.data.get("text/markdown") for o in cells[0].outputs] == ["| a table |"]
    assert "mystnb" not in cells[0].metadata
    figure = cells[1].source
    assert figure.startswith("```{figure} ../figures/exp_a.png\n:name: fig-exp-a\n")
    assert "What is drawn. Drawn by run X." in figure and "exp_a.pdf <../figures/exp_a.pdf>" in figure
    # a figure without a caption is left to link_figures, as before
    assert [("image/png" in o.data) for o in cells[2].outputs] == [False, True]



def test_a_figure_drawn_for_a_phone_keeps_its_class(tmp_path) -> None:
    """The size figures of chapter 7 (issue 56) carry figclass companion-phone; the stylesheet caps them."""
    from companion.book.stage import caption_figures
    from companion.figures.palette import PHONE_DESKTOP_PX, PHONE_FIGCLASS
    from tests.conftest import ROOT

    cell = _cell_with([_marker("exp_a"), _image()])
    cell.metadata["mystnb"] = {"figure": {"caption": "Small.", "name": "fig-a", "figclass": PHONE_FIGCLASS}}
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell]
    nbformat.write(nb, tmp_path / "ch.ipynb")
    assert caption_figures(tmp_path / "ch.ipynb", {"exp_a"}, "") == 1
    figure = nbformat.read(tmp_path / "ch.ipynb", as_version=4).cells[1].source
    assert f":width: 100%\n:figclass: {PHONE_FIGCLASS}\n\nSmall." in figure
    css = (ROOT / "book" / "_ext" / "static" / "companion.css").read_text()
    assert f"figure.{PHONE_FIGCLASS} img {{\n  max-width: {PHONE_DESKTOP_PX}px;" in css
    chapter = nbformat.read(ROOT / "notebooks" / "07_paper_evaluation.ipynb", as_version=4)
    phone = [c.id for c in chapter.cells if c.metadata.get("mystnb", {}).get("figure", {}).get("figclass") == PHONE_FIGCLASS]
    assert len(phone) == 5, phone


def test_caption_from_the_source_notebook_wins(tmp_path) -> None:
    from companion.book.stage import caption_figures

    executed = _cell_with([_marker("exp_a"), _image()])
    executed["id"] = "fig-cell"
    source = nbformat.v4.new_code_cell("fig")
    source["id"] = "fig-cell"
    source.metadata["mystnb"] = {"figure": {"caption": "Edited caption.", "name": "fig-a"}}
    for name, cells in (("run.ipynb", [executed]), ("src.ipynb", [source])):
        nb = nbformat.v4.new_notebook()
        nb.cells = cells
        nbformat.write(nb, tmp_path / name)
    assert caption_figures(tmp_path / "run.ipynb", {"exp_a"}, "", source=tmp_path / "src.ipynb") == 1
    assert "Edited caption." in nbformat.read(tmp_path / "run.ipynb", as_version=4).cells[1].source


def test_offline_build_shows_no_placeholder_repository(tmp_path) -> None:
    from companion.book.stage import PLACEHOLDER_URL, repository_url, resolve_repository

    page = tmp_path / "intro.md"
    body = f"@software{{companion,\n  title = {{x}},\n  url     = {{{PLACEHOLDER_URL}}},\n}}\n"
    config = tmp_path / "_config.yml"
    config.write_text(f"repository:\n  url: {PLACEHOLDER_URL}\n", encoding="utf-8")
    assert repository_url(config) is None
    page.write_text(body, encoding="utf-8")
    resolve_repository(tmp_path, repository_url(config))
    assert "OWNER" not in page.read_text(encoding="utf-8") and "title = {x}" in page.read_text(encoding="utf-8")
    config.write_text("repository:\n  url: https://github.com/someone/companion\n", encoding="utf-8")
    page.write_text(body, encoding="utf-8")
    resolve_repository(tmp_path, repository_url(config))
    assert "url     = {https://github.com/someone/companion}," in page.read_text(encoding="utf-8")


def test_partial_builds_drop_chapter_numbering() -> None:
    from companion.book.stage import without_numbering

    toc = {"root": "intro", "parts": [{"caption": "Theory", "numbered": True, "chapters": [{"file": "a"}]}]}
    assert without_numbering(toc) == {"root": "intro", "parts": [{"caption": "Theory", "chapters": [{"file": "a"}]}]}
    assert toc["parts"][0]["numbered"] is True  # the original is left alone


def _write_glued(path, values) -> None:
    """A notebook whose one cell glued ``values`` (str as Markdown, others as plain text)."""
    cell = nbformat.v4.new_code_cell("glue(...)")
    cell.outputs = [nbformat.v4.new_output(
        "display_data", metadata={"scrapbook": {"name": k, "mime_prefix": "application/papermill.record/"}},
        data={"application/papermill.record/text/markdown" if isinstance(v, str) else
              "application/papermill.record/text/plain": v if isinstance(v, str) else repr(v)})
        for k, v in values.items()]
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell]
    nbformat.write(nb, path)


PAGE = ("8. The claim.\n\n"
        "   % companion-measured: 07_paper_evaluation needs: p5-falls, tree-above\n"
        "   Strict greedy's 5th percentile is [[ch7_greedy_p5:.2g]] nats, [[ch7_share:.1%]] of steps.\n"
        "   % companion-end\n"
        "\nNext.\n")


def _pages(tmp_path):
    pages, notebooks = tmp_path / "book", tmp_path / "notebooks"
    pages.mkdir()
    notebooks.mkdir()
    page = pages / "claims.md"
    page.write_text(PAGE, encoding="utf-8")
    return pages, notebooks, page


def test_a_measured_block_is_filled_from_the_chapters_glued_numbers(tmp_path) -> None:
    from companion.book.stage import fill_measured_results

    pages, notebooks, page = _pages(tmp_path)
    _write_glued(notebooks / "07_paper_evaluation.ipynb",
                 {"ch7_greedy_p5": 5.3e-05, "ch7_share": 0.1334, "claims_failed": []})
    fill_measured_results(pages, notebooks)
    text = page.read_text(encoding="utf-8")
    assert "   Strict greedy's 5th percentile is 5.3e-05 nats, 13.3% of steps.\n\nNext." in text, text
    assert "companion-measured" not in text and "companion-end" not in text and "[[" not in text


def test_a_chapter_not_in_this_build_is_said_so(tmp_path) -> None:
    from companion.book.stage import fill_measured_results

    pages, notebooks, page = _pages(tmp_path)
    fill_measured_results(pages, notebooks)
    text = page.read_text(encoding="utf-8")
    assert "   *Measured in this build:* nothing, since chapter 07_paper_evaluation is not in this build." in text
    assert "5th percentile" not in text


def test_a_sentence_whose_claims_failed_is_replaced_by_a_note(tmp_path) -> None:
    from companion.book.stage import fill_measured_results

    pages, notebooks, page = _pages(tmp_path)
    _write_glued(notebooks / "07_paper_evaluation.ipynb",
                 {"ch7_greedy_p5": 5.3e-05, "ch7_share": 0.1334, "claims_failed": ["tree-above"]})
    fill_measured_results(pages, notebooks)
    text = page.read_text(encoding="utf-8")
    assert "do not support the sentence" in text and "tree-above" in text and "5th percentile" not in text


def test_a_page_quoting_a_value_its_chapter_does_not_glue_fails_the_build(tmp_path) -> None:
    from companion.book.layout import RunFailure
    from companion.book.stage import fill_measured_results

    pages, notebooks, page = _pages(tmp_path)
    _write_glued(notebooks / "07_paper_evaluation.ipynb", {"ch7_greedy_p5": 5.3e-05, "claims_failed": []})
    with pytest.raises(RunFailure, match="glues no value 'ch7_share'"):
        fill_measured_results(pages, notebooks)
