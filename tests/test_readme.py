"""README.md answers a newcomer's questions with commands that work (issue 56).

Every ``companion`` command in the README's shell blocks is parsed by the real command line (and
each ``--only`` names a chapter); the cheap ones run: ``reproduce --list``, and the "Your own
pair" harvest with its Python block, on a tiny random pair in place of your checkpoints. The
table of which chapter draws which figure is compared with the notebooks' ``save_figure`` calls;
the paper is cited with one author list everywhere; no link and no file a tool reads holds the
``OWNER`` placeholder, and the one setting that replaces it (``_config.yml``) reaches every page.
"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str, text: str = README) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"README has no '## {title}' section"
    return match.group(1)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def commands(text: str = README) -> list[list[str]]:
    """The argument lists of every ``companion`` command in ``text``'s bash blocks (continuation lines
    joined, ``&&`` chains split, ``#`` comments dropped)."""
    found = []
    for block in blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                for i, word in enumerate(words):
                    if word == "companion" and i and words[i - 1] == "-m" or word.endswith("bin/companion") \
                            or (word == "companion" and i == 0):
                        found.append(words[i + 1:])
                        break
    return found


def inline_commands(text: str = README) -> list[list[str]]:
    """The argument lists of the ``companion ...`` commands quoted inline in ``text``'s prose."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [shlex.split(m) for m in re.findall(r"`(?:\.venv/bin/)?companion ([a-z][^`]*)`", prose)]


def test_the_readme_commands_are_found() -> None:
    found = commands()
    assert ["reproduce", "--only", "07", "--no-build"] in found
    assert any(c[:1] == ["harvest"] and "--target" in c and "--drafter" in c for c in found)
    assert len(found) >= 7, found
    assert ["cache", "--prune"] in inline_commands()


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a)[:60])
def test_every_companion_command_in_the_readme_parses(argv: list[str]) -> None:
    from companion.book.toc import read_chapters, select_chapters
    from companion.cli import build_parser

    parser = build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
        except SystemExit as stop:
            pytest.fail(f"companion {' '.join(argv)}: {err.getvalue().strip() or stop}")
    assert getattr(args, "func", None), argv
    if getattr(args, "only", None):
        assert select_chapters(read_chapters(ROOT), args.only), argv   # raises for a name that is no chapter


def test_every_command_the_prose_names_exists_with_its_options() -> None:
    """Inline mentions (`companion cache --prune`, `companion harvest --help`) name a command and options
    that exist; they need not be complete command lines."""
    import argparse

    from companion.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for argv in inline_commands():
        assert argv[0] in sub.choices, f"README names `companion {argv[0]}`, which is no command"
        options = {o for action in sub.choices[argv[0]]._actions for o in action.option_strings}
        unknown = [w for w in argv[1:] if w.startswith("-") and w.split("=")[0] not in options]
        assert not unknown, f"`companion {' '.join(argv)}`: no option {unknown}"


def test_reproduce_list_runs_as_shown(capsys, monkeypatch) -> None:
    from companion.cli import main

    assert ["reproduce", "--list"] in commands()
    monkeypatch.chdir(ROOT)
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "07_paper_evaluation" in out and "09_your_own_models" in out


def test_harvest_defaults_to_the_closed_world_preset_by_its_name() -> None:
    """README says `default` was renamed `closed-world`: the command's default is the new name."""
    from companion.cli import build_parser

    assert build_parser().parse_args(["harvest", "--out", "x"]).preset == "closed-world"
    assert "`closed-world` (formerly `default`)" in README


def test_your_own_pair_runs_as_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """The section's harvest and its Python block, on a tiny random pair saved where the paths point."""
    from companion.cli import main
    from companion.harvest.toy import save_pair, toy_pair

    text = section("Your own pair")
    (harvest,) = [c for c in commands(text) if c[:1] == ["harvest"]]
    (code,) = blocks(text, "python")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target, drafter, tokenizer = toy_pair(vocab=300, hidden=32, layers=1, seed=1)
    paths = save_pair(tmp_path / "models", target, drafter, tokenizer)
    swap = {"path/to/target": str(paths["target"]), "path/to/drafter": str(paths["drafter"])}
    Path("my_prompts.txt").write_text("def add(a, b):\nThe quick brown fox\nOnce upon a time\n", encoding="utf-8")
    argv = [swap.get(a, a) for a in harvest] + ["--no-progress", "--threads", "1"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    out_dir = Path(harvest[harvest.index("--out") + 1])
    assert (out_dir / "manifest.json").is_file()
    capsys.readouterr()
    namespace: dict = {}
    exec(compile(code, "<README: your own pair>", "exec"), namespace)
    traces = namespace["traces"]
    assert namespace["DIR"] == str(out_dir) and traces.n_trajectories == 3 and traces.n_rows > 3
    printed = capsys.readouterr().out
    assert "greedy" in printed and "|" in printed, printed


def _figure_names(notebook: Path) -> list[str]:
    """The figure names a chapter saves: ``save_figure(fig, MAPPING["key"])`` resolved through the
    notebook's own imports of the figure modules' ``FIGURE_NAMES``."""
    import importlib

    import nbformat

    source = "\n".join(c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code")
    mappings = {}
    for module, name, alias in re.findall(r"from (companion\.figures(?:\.\w+)?) import (\w+)(?: as (\w+))?", source):
        if name == "FIGURE_NAMES":
            mappings[alias or name] = importlib.import_module(module).FIGURE_NAMES
        elif name != "save_figure":   # a figure module: `from companion.figures import theory as figs`
            mappings[f"{alias or name}.FIGURE_NAMES"] = getattr(importlib.import_module(f"{module}.{name}"),
                                                                 "FIGURE_NAMES", {})
    names = []
    for mapping, key in re.findall(r"save_figure\(\w+,\s*([\w.]+)\[(\"[^\"]*\"|'[^']*')\]", source):
        names.append(mappings[mapping][key[1:-1]])
    return names


def test_the_figure_table_names_what_each_chapter_draws() -> None:
    from companion.book.toc import read_chapters

    rows = re.findall(r"^\| `(\d\d_\w+)` \| (.*) \|$", section("Regenerating the figures"), re.M)
    table = {name: re.findall(r"`(\w+)`", cell) for name, cell in rows}
    chapters = read_chapters(ROOT)
    assert sorted(table) == sorted(c.name for c in chapters), "one row per chapter of _toc.yml"
    for chapter in chapters:
        assert table[chapter.name] == _figure_names(chapter.path), chapter.name


def _paper_bibtex(text: str) -> str:
    (entry,) = [b for b in blocks(text, "bibtex") if b.startswith("@misc")]
    return entry


def test_the_paper_is_cited_with_one_author_list_everywhere() -> None:
    import yaml

    readme = _paper_bibtex(section("Cite"))
    intro = _paper_bibtex((ROOT / "book" / "intro.md").read_text(encoding="utf-8"))
    assert readme == intro, "README and the book's first page cite the paper differently"
    author = re.search(r"author\s*=\s*\{(.*)\},", readme).group(1)
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    (paper,) = [r for r in cff["references"] if "2606.30265" in r["url"]]
    assert " and ".join(f"{a['family-names']}, {a['given-names']}" for a in paper["authors"]) == author


def _outside_code(text: str) -> str:
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def test_no_link_a_reader_clicks_holds_the_owner_placeholder() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "book").rglob("*.md"))]
    for page in pages:
        prose = _outside_code(page.read_text(encoding="utf-8"))
        assert "OWNER" not in prose, f"{page.relative_to(ROOT)}: the placeholder outside code: " + \
            prose[max(0, prose.index("OWNER") - 80):prose.index("OWNER") + 40]


def _strings(node: object) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (str(k), *_strings(v))]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [str(node)]


def test_no_file_a_tool_reads_holds_the_owner_placeholder() -> None:
    """GitHub's citation box reads CITATION.cff, pip and the package index read pyproject.toml, a
    reference manager reads the README's BibTeX: none of them may take the placeholder for an address."""
    import tomllib

    import yaml

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for name, data in (("CITATION.cff", cff), ("pyproject.toml", project)):
        held = [s for s in _strings(data) if "OWNER" in s]
        assert not held, f"{name} holds the placeholder: {held}"
    assert project["project"]["urls"], "pyproject.toml lost its URLs (the paper's)"
    for bib in blocks(README, "bibtex"):
        assert "OWNER" not in bib, bib


def test_one_setting_decides_the_books_home(tmp_path: Path) -> None:
    """The placeholder lives only where _config.yml's repository URL replaces it: the config itself, the
    book's pages (staging swaps it for the published URL, or drops the line offline), the install cells
    (stamped from the same repository), the README's code, and the code that does the replacing."""
    from companion.book.stage import PLACEHOLDER_URL, repository_url, resolve_repository

    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    holders = set()
    for name in tracked:
        path = ROOT / name
        if path.is_file() and path.suffix in {".md", ".yml", ".yaml", ".cff", ".toml", ".py", ".ipynb", ".cfg", ".txt", ".json"}:
            if re.search(r"OWNER[/.]", path.read_text(encoding="utf-8", errors="replace")):
                holders.add(name)
    allowed = {"_config.yml", "README.md", "companion/book/stage.py", "companion/book/publish.py"}
    stray = {h for h in holders if h not in allowed and not h.startswith(("book/", "notebooks/", "tests/"))}
    assert not stray, f"the placeholder outside what the book's home setting replaces: {sorted(stray)}"

    config = tmp_path / "_config.yml"
    config.write_text((ROOT / "_config.yml").read_text(encoding="utf-8"), encoding="utf-8")
    assert repository_url(config) is None, "the sources' _config.yml should hold the placeholder"
    for home in (None, "https://github.com/me/my-companion"):
        pages = tmp_path / ("offline" if home is None else "published")
        shutil.copytree(ROOT / "book", pages)
        resolve_repository(pages, home)
        for page in pages.rglob("*.md"):
            assert "OWNER" not in page.read_text(encoding="utf-8"), page.relative_to(pages)
    published = (tmp_path / "published" / "intro.md").read_text(encoding="utf-8")
    assert "url     = {https://github.com/me/my-companion}" in published
    assert PLACEHOLDER_URL not in published


def test_the_full_profiles_time_is_the_manifests() -> None:
    """README and the command's help say how long the committed run took as its manifest records it
    (issue 56: "about an hour" beside "41 minutes"; the manifest says 2,446 s)."""
    import json

    from companion.harvest import full_profile

    manifest = json.loads(full_profile.MANIFEST_FILE.read_text(encoding="utf-8"))
    minutes = round(float(manifest["wall_s"]) / 60)
    assert full_profile.recorded_time() == f"{minutes} minutes on {manifest['threads']} threads"
    assert f"That run took {minutes} minutes" in " ".join(section("The full profile (chapter 7 at the paper's size)").split())
    assert "about an hour" not in README


PAGE = ROOT / "book" / "beyond_one_machine.md"


def test_the_beyond_one_machine_rate_is_the_full_profiles() -> None:
    """The page's measured rate (steps, seconds, minutes, steps a second) is the committed run's manifest."""
    import json

    from companion.harvest import full_profile

    m = json.loads(full_profile.MANIFEST_FILE.read_text(encoding="utf-8"))
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    wall, rows = float(m["wall_s"]), int(m["rows"])
    assert (f"harvested {rows:,} steps in {wall:,.0f} s ({round(wall / 60)} minutes), "
            f"{rows / wall:.1f} steps a second") in text


@pytest.mark.parametrize("argv", commands(PAGE.read_text(encoding="utf-8")), ids=lambda a: " ".join(a)[:60])
def test_the_beyond_one_machine_commands_parse(argv: list[str]) -> None:
    """The page's commands parse: its torchrun / accelerate / srun harvests and its prefetch on the paper
    preset, and the status and reproduce steps after them."""
    from companion.cli import build_parser

    args = build_parser().parse_args(argv)
    assert args.command in ("harvest", "prefetch", "harvest-status", "reproduce"), argv
    if args.command in ("harvest", "prefetch"):
        assert args.preset == "paper-qwen3-1.7b", argv


def test_the_beyond_one_machine_page_measures_what_the_manifest_says() -> None:
    """Its one measured rate is the full profile's manifest's; the launchers and the rank test it names exist."""
    import json

    from companion.harvest import full_profile

    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    m = json.loads(full_profile.MANIFEST_FILE.read_text(encoding="utf-8"))
    wall = float(m["wall_s"])
    assert (f"harvested {m['rows']:,} steps in {wall:,.0f} s ({wall / 60:.0f} minutes), "
            f"{m['rows'] / wall:.1f} steps a second") in text
    assert f"batches of {m['batch_size']}" in text and m["dtype"] in text
    launchers = [c for c in commands(PAGE.read_text(encoding="utf-8"))]
    assert len(launchers) >= 4
    assert (ROOT / "tests" / "test_rank_failure.py").is_file() and "tests/test_rank_failure.py" in text
    assert "book/beyond_one_machine" in (ROOT / "_toc.yml").read_text(encoding="utf-8")
