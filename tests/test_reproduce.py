"""`companion reproduce` / `build-book`: chapter list, profiles, parameters, runs, failures."""
from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import nbformat
import pytest

from companion import cli
from companion.book.layout import Layout, ReproduceError
from companion.book.offline import find_remote_resources
from companion.book.parameters import Profile, load_profile, parse_value, plan_parameters
from companion.book.run import reproduce
from companion.book.toc import Chapter, read_chapters, select_chapters
from companion.book.record import ChapterExecution, RunRecord, load_record, render_status_markdown, save_record
from tests.conftest import ROOT, write_notebook

PLANNED = [
    "01_criteria_level_sets", "02_exact_certificate", "03_strict_greedy", "04_relaxed_criteria",
    "05_tree_decoding", "06_stochastic_contrast", "07_paper_evaluation", "08_real_drafter",
    "09_your_own_models", "10_decode_time", "11_on_the_clock", "12_precision_and_ties", "13_draft_trees",
]

QUIET = dict(log=lambda *_: None)


def _chapters(*names: str) -> list[Chapter]:
    return [Chapter(n, f"notebooks/{n}", Path(f"/x/notebooks/{n}.ipynb")) for n in names]


# --- table of contents and chapter selection ------------------------------------------------

def test_chapters_come_from_the_toc_in_order() -> None:
    chapters = read_chapters(ROOT)
    assert [c.name for c in chapters] == PLANNED
    assert all(c.path == ROOT / "notebooks" / f"{c.name}.ipynb" for c in chapters)


def test_select_by_name_prefix_and_path() -> None:
    chapters = _chapters("01_a", "02_b", "03_c")
    assert [c.name for c in select_chapters(chapters, ["03"])] == ["03_c"]
    assert [c.name for c in select_chapters(chapters, ["notebooks/02_b.ipynb", "01_a"])] == ["01_a", "02_b"]
    assert select_chapters(chapters, []) == chapters


def test_select_rejects_unknown_and_ambiguous() -> None:
    chapters = _chapters("01_a", "01_b")
    with pytest.raises(ReproduceError, match="not a chapter.*01_a, 01_b"):
        select_chapters(chapters, ["07"])
    with pytest.raises(ReproduceError, match="several"):
        select_chapters(chapters, ["01"])


# --- profiles and parameters ----------------------------------------------------------------

def test_shipped_profiles_load() -> None:
    cpu, gpu = load_profile(ROOT, "cpu"), load_profile(ROOT, "gpu")
    # The cpu profile leaves each chapter on its own default preset (chapter 7: the Qwen2.5-Coder pair).
    assert cpu.parameters["device"] == "cpu" and "preset" not in cpu.parameters
    assert gpu.parameters["device"] == "cuda" and gpu.parameters["preset"].startswith("paper-qwen3")
    assert gpu.parameters["n_prompts"] == 500 and gpu.parameters["n_steps"] == 128


def test_full_profile_is_the_cpu_profile_at_full_size() -> None:
    """Chapter 10 at its larger size; chapter 7's paper-sized run is committed data (companion full-profile),
    which no profile harvests."""
    cpu, full = load_profile(ROOT, "cpu"), load_profile(ROOT, "full")
    assert full.parameters == {**cpu.parameters, "n_eval_prompts": 32, "n_live_prompts": 2, "record_new_tokens": 128}
    assert full.notebooks == {}
    assert load_profile(ROOT, "gpu").parameters["n_eval_prompts"] == 96
    # the default build trims chapter 10 to 14 answers: the notebook's own default
    from companion.book.parameters import notebook_parameters

    declared = notebook_parameters(ROOT / "notebooks" / "10_decode_time.ipynb")
    assert declared["n_eval_prompts"].value == 14
    # and records the first 96 tokens of each answer (the full profile: whole answers of up to 128)
    assert declared["record_new_tokens"].value == 96 < 128 == declared["max_new_tokens"].value


def test_ci_profile_is_the_cpu_profile_at_smaller_sizes_with_one_shared_harvest() -> None:
    """The test suite's book (profiles/ci.yml) runs what the main job runs, only smaller: the cpu
    profile's parameters, sizes that only shrink, and chapters 7, 8 and 10 on one harvest."""
    from companion.book.parameters import notebook_parameters

    cpu, ci = load_profile(ROOT, "cpu"), load_profile(ROOT, "ci")
    assert ci.parameters == cpu.parameters
    declared = {name: notebook_parameters(ROOT / "notebooks" / f"{name}.ipynb") for name in ci.notebooks}
    for name, values in ci.notebooks.items():
        for key, value in values.items():
            assert 0 < value < declared[name][key].value, (name, key, value, declared[name][key].value)
    ch10 = {**{k: v.value for k, v in declared["10_decode_time"].items()}, **ci.notebooks["10_decode_time"]}
    shared = ch10["n_eval_prompts"] + ch10["n_calibration_prompts"]
    assert ci.notebooks["07_paper_evaluation"]["n_prompts"] == ci.notebooks["08_real_drafter"]["n_prompts"] == shared
    assert ci.notebooks["07_paper_evaluation"]["n_steps"] == ci.notebooks["08_real_drafter"]["n_steps"] \
        == ch10["max_new_tokens"]


def test_unknown_profile_lists_the_known_ones() -> None:
    with pytest.raises(ReproduceError, match=r"unknown profile 'tpu'.*ci, cpu, full, gpu"):
        load_profile(ROOT, "tpu")


def test_profile_with_unknown_keys_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("parameters: {seed: 1}\nparams: {}\n")
    with pytest.raises(ReproduceError, match="unknown keys"):
        load_profile(tmp_path, str(bad))


def test_parse_value_reads_yaml_scalars() -> None:
    assert parse_value("8") == 8 and parse_value("0.3") == 0.3 and parse_value("true") is True
    assert parse_value("cuda") == "cuda" and parse_value("[1, 2]") == [1, 2]


def test_declared_parameters_come_from_the_tagged_cell(tmp_path: Path) -> None:
    from companion.book.parameters import declared_parameters

    path = write_notebook(tmp_path / "n.ipynb",
                          "vocab = 12   # top-k with k = 10 needs V >= 10\nseed: int = 0\na, (b, c) = 1, (2, 3)",
                          "not_a_parameter = 1")
    assert declared_parameters(path) == {"vocab", "seed", "a", "b", "c"}
    bare = write_notebook(tmp_path / "bare.ipynb", "x = 1")
    nb = nbformat.read(bare, as_version=4)
    nb.cells[1].metadata["tags"] = []
    nbformat.write(nb, bare)
    assert declared_parameters(bare) == set()


def test_only_declared_parameters_are_injected() -> None:
    chapters = _chapters("01_theory", "07_eval")
    declared = {"01_theory": {"seed"}, "07_eval": {"seed", "device", "preset", "n_prompts"}}
    profile = Profile("t", parameters={"seed": 3, "device": "cpu", "preset": "default"},
                      notebooks={"07_eval": {"n_prompts": 5}})
    plans = plan_parameters(chapters, declared, profile, {"device": "auto"}, [c.name for c in chapters])
    assert plans == {"01_theory": {"seed": 3},
                     "07_eval": {"seed": 3, "device": "auto", "preset": "default", "n_prompts": 5}}


def test_parameters_named_explicitly_must_be_declared() -> None:
    chapters = _chapters("01_theory")
    declared = {"01_theory": {"seed"}}
    with pytest.raises(ReproduceError, match="-p n_steps: no selected chapter declares"):
        plan_parameters(chapters, declared, Profile("t"), {"n_steps": 4}, ["01_theory"])
    with pytest.raises(ReproduceError, match=r"sets \['batch_size'\] for 01_theory"):
        plan_parameters(chapters, declared, Profile("t", notebooks={"01_theory": {"batch_size": 2}}), {},
                        ["01_theory"])
    with pytest.raises(ReproduceError, match="unknown chapters"):
        plan_parameters(chapters, declared, Profile("t", notebooks={"99_x": {}}), {}, ["01_theory"])


def test_device_values_are_checked() -> None:
    chapters = _chapters("07_eval")
    with pytest.raises(ReproduceError, match="device must be one of"):
        plan_parameters(chapters, {"07_eval": {"device"}}, Profile("t"), {"device": "tpu"}, ["07_eval"])


# --- the remote-resource scan ---------------------------------------------------------------

def test_remote_resources_are_found_and_links_are_not(tmp_path: Path) -> None:
    (tmp_path / "a.html").write_text(
        '<html><head><script src="https://cdn.example/mathjax.js"></script>'
        '<link rel="stylesheet" href="//fonts.example/css"><link rel="canonical" href="https://x.example/">'
        '<style>@font-face { src: url("https://fonts.example/f.woff2") }</style></head>'
        '<body><a href="https://arxiv.org/abs/2606.30265">paper</a><img src="_images/local.png"></body></html>')
    (tmp_path / "s.css").write_text("body { background: url(https://img.example/bg.png) }")
    found = find_remote_resources(tmp_path)
    assert found == ["a.html: https://cdn.example/mathjax.js", "a.html: //fonts.example/css",
                     "a.html: https://fonts.example/f.woff2", "s.css: https://img.example/bg.png"]


# --- the status page --------------------------------------------------------------------------

def _run(name: str, **kw) -> ChapterExecution:
    base = dict(chapter=name, source=f"notebooks/{name}.ipynb", source_sha256="abc", profile="gpu",
                parameters={"device": "cuda", "preset": "paper-qwen3-4b", "n_prompts": 500},
                device="cuda", device_name="NVIDIA H200", started="2026-01-02T03:04:05Z", seconds=125.0,
                figures=["fig_a"], python="3.11.7", torch="2.13.0", commit="abc1234")
    base.update(kw)
    return ChapterExecution(**base)


def test_status_page_reports_runs_missing_and_stale_chapters() -> None:
    record = RunRecord({"07_eval": _run("07_eval"), "08_real": _run("08_real", figures=[], source_sha256="old")})
    md = render_status_markdown(
        record,
        [("01_theory", "", None), ("02_more", "", "h"), ("07_eval", "../notebooks/07_eval.ipynb", "abc"),
         ("08_real", "../notebooks/08_real.ipynb", "new")],
        staged_figures=["fig_a"],
    )
    assert "2 of 4 chapters executed" in md
    assert "| 01_theory | notebook not written yet |" in md
    assert "| 02_more | not executed yet |" in md
    when, setup = [line for line in md.splitlines() if line.startswith("| [07_eval]")]
    assert "2 min 05 s" in when and "cuda (NVIDIA H200)" in when and "source changed" not in when
    assert "Qwen3-4B setting" in setup and "`n_prompts=500`" in setup
    assert all(line.count(" | ") <= 4 for line in md.splitlines() if line.startswith("| ["))  # narrow tables
    assert "source changed since" in next(line for line in md.splitlines() if line.startswith("| [08_real]"))
    assert "| `fig_a` | [07_eval](../notebooks/07_eval.ipynb) | {download}`PNG <../figures/fig_a.png>`" in md


def test_status_page_lists_every_parameter_and_the_threads_used() -> None:
    """Each chapter's row names the values the run changed (with the notebook's default), the
    defaults it kept, and the threads of its kernel and of each harvest; no "one thread each"."""
    run = _run("07_eval", parameters={"device": "cpu", "n_prompts": 4, "seed": 0}, jobs=2,
               defaults=[["preset", '"qwen2.5-coder"'], ["device", '"auto"'], ["seed", "0"], ["n_prompts", "16"],
                         ["batch_size", "16"], ["harvest_threads", "2"]],
               start_threads=1, kernel_threads=[1, 2], harvest_threads=["qwen2.5-coder: 1 process x 2 torch threads"])
    theory = _run("01_theory", parameters={"device": "cpu", "seed": 0}, jobs=2,
                  defaults=[["seed", "0"], ["device", '"cpu"'], ["vocab", "12"]], start_threads=1, kernel_threads=[1])
    old = _run("02_old", parameters={"device": "cpu", "seed": 0})   # recorded before defaults were
    md = render_status_markdown(RunRecord({"07_eval": run, "01_theory": theory, "02_old": old}),
                                [("01_theory", "", "abc"), ("02_old", "", "abc"), ("07_eval", "", "abc")])
    rows = {line.split(" | ")[0][2:]: line for line in md.splitlines()
            if line.startswith("| ") and line.count(" | ") == 3 and "Chapter" not in line}
    seven = rows["07_eval"]
    assert "**changed:** `device='cpu'` (notebook: `\"auto\"`), `n_prompts=4` (notebook: `16`)." in seven, seven
    assert ("**as in the notebook:** `preset=\"qwen2.5-coder\"`, `seed=0`, `batch_size=16`, "
            "`harvest_threads=2`.") in seven, seven
    assert "kernel: 1 to 2 torch threads (the run started it with 1); harvest qwen2.5-coder: " \
           "1 process x 2 torch threads" in seven, seven
    one = rows["01_theory"]
    assert "**changed:**" not in one and "`device='cpu'`, `vocab=12`" in one and "kernel: 1 torch thread (" in one
    assert "`device='cpu'`, `seed=0`" in rows["02_old"]
    assert "one thread each" not in md and "Threads column" in md
    assert md.count("| Chapter | Preset and models | Parameters | Threads |") == 1


def test_harvest_threads_are_read_from_the_manifests(tmp_path: Path) -> None:
    from companion.book.record import harvest_threads

    for name, world, cfg in (("a", 2, {"device_type": "cpu", "numerics": {"torch_threads": 1}}),
                             ("b", 1, {"device_type": "cuda", "numerics": {"gpu": "H100"}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps(
            {"extra": {"preset": f"p{name}"}, "config": cfg, "environment": {"world_size": world}}))
    assert harvest_threads([tmp_path / "a", tmp_path / "b", tmp_path / "missing"]) == \
        ["pa: 2 processes x 1 torch thread", "pb: 1 process on cuda"]
    assert harvest_threads(None) == []


def test_status_page_says_whether_the_paper_presets_ran() -> None:
    chapters = [("07_eval", "../notebooks/07_eval.ipynb", "abc")]
    ran = render_status_markdown(RunRecord({"07_eval": _run("07_eval")}), chapters)
    assert "The paper's presets (Qwen3 targets on a GPU): run by 07_eval (`paper-qwen3-4b`)." in ran
    small = _run("07_eval", parameters={"device": "cpu", "preset": "default"})
    not_ran = render_status_markdown(RunRecord({"07_eval": small}), chapters)
    assert "not run in this build" in not_ran
    assert "`transformers` in the environment that built the book:" in not_ran



def test_status_page_names_a_converted_models_weights_by_the_gguf_sha256() -> None:
    from companion.book.record import describe_harvest, weights_id

    gguf = "ab" * 32
    manifest = {"extra": {"preset": "qwen2.5-coder"}, "prompt_set_name": "chat-and-stdlib",
                "config": {"target": {"name": "/c/qwen", "parameters": 1_543_714_304,
                                      "converted_from": {"display_name": "Qwen2.5-Coder-1.5B-Instruct",
                                                         "quantization": "Q8_0", "gguf_sha256": gguf},
                                      "weights_sha256": {"model.safetensors": "cd" * 32}},
                           "drafter": {"name": "/x/tiny", "parameters": 2_000_000,
                                       "weights_sha256": {"model.safetensors": "ef" * 32}},
                           "dtype": "float32", "device_type": "cpu", "prompt_set": {"n_prompts": 16}, "n_steps": 64},
                "totals": {"rows": 900, "top2_tie_steps": 0}}
    line = describe_harvest(manifest, weights=True)
    assert f"Qwen2.5-Coder-1.5B-Instruct (Q8_0 GGUF; 1.54B parameters; GGUF sha256 {'ab' * 8}…)" in line, line
    assert f"`x/tiny` (2M parameters; sha256 {'ef' * 8}…)" in line, line
    assert "sha256" not in describe_harvest(manifest)   # the chapters' own line stays short
    assert weights_id({"revision": "0123456789abcdef0123"}) == "revision 0123456789abcdef…"
    assert weights_id({}) is None


def test_a_slow_cell_is_labelled_by_what_it_does() -> None:
    from companion.book.execute import cell_label

    assert cell_label("%matplotlib inline\nimport json\nfrom x import (\n    y,\n)\n\nharvest = chapter_traces(p)\n") \
        == "harvest = chapter_traces(p)"
    assert cell_label("# Harvest (or reuse) this chapter's traces\n%matplotlib inline\nimport json\n") \
        == "Harvest (or reuse) this chapter's traces"
    assert cell_label("%matplotlib inline\n") == "%matplotlib inline"


def test_record_round_trips_and_writes_atomically(tmp_path: Path) -> None:
    path = tmp_path / "rec" / "run-record.json"
    record = RunRecord({"07_eval": _run("07_eval")})
    save_record(record, path)
    assert load_record(path) == record
    assert [p.name for p in path.parent.iterdir()] == ["run-record.json"]
    path.write_text(json.dumps({"schema": 99}))
    with pytest.raises(ValueError, match="schema"):
        load_record(path)


# --- whole runs on a throwaway project (these execute notebooks and build a book) -------------

FIGURE_CELL = (
    "import matplotlib.pyplot as plt\nfrom companion.figures import save_figure\n"
    "fig, ax = plt.subplots()\nax.plot([0, 1], [seed, n_points])\nsave_figure(fig, 'ok_line')\nprint(device, seed)\n"
    "import sys\nprint('interpreter', sys.executable)"
)


@pytest.mark.book
def test_reproduce_executes_records_and_builds(make_project, monkeypatch, tmp_path: Path) -> None:
    # A user-level "python3" kernel pointing elsewhere must not be used.
    bogus = tmp_path / "jupyter-data" / "kernels" / "python3"
    bogus.mkdir(parents=True)
    (bogus / "kernel.json").write_text(json.dumps(
        {"argv": ["/nonexistent/python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
         "display_name": "elsewhere", "language": "python"}))
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "0")   # so that the user's kernel would win
    monkeypatch.setenv("MPLBACKEND", "Agg")       # must not stop figures from being embedded
    root = make_project("01_ok", "02_not_written")
    source = write_notebook(root / "notebooks" / "01_ok.ipynb", "device = 'auto'\nseed = 0\nn_points = 3",
                            FIGURE_CELL)
    before = source.read_bytes()
    messages: list[str] = []
    layout = Layout.at(root)
    reproduce(layout, "cpu", {"seed": 7}, log=messages.append)

    assert source.read_bytes() == before, "the source notebook must not be modified"
    executed = nbformat.read(layout.executed / "01_ok.ipynb", as_version=4)
    outputs = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
    assert "cpu 7" in outputs                      # profile device + -p override reached the kernel
    assert f"interpreter {sys.executable}" in outputs   # the kernel runs this venv's Python
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in executed.cells for o in c.get("outputs", [])), "figure not embedded inline"
    # pyplot's default figure (6.4 in, 10 pt) reads under 9 px on a phone: it gets a phone variant
    assert sorted(p.name for p in layout.figures.iterdir()) == ["ok_line.pdf", "ok_line.phone.png", "ok_line.png"]
    run = load_record(layout.record).chapters["01_ok"]
    assert run.parameters == {"device": "cpu", "seed": 7} and run.figures == ["ok_line"]
    assert run.defaults == [["device", "'auto'"], ["seed", "0"], ["n_points", "3"]]
    assert run.profile == "cpu" and run.seconds > 0
    assert any("02_not_written" in m and "does not exist" in m for m in messages)
    status = (layout.html / "book" / "reproduction_status.html").read_text()
    assert "ok_line" in status and "not written yet" in status
    assert (layout.html / "notebooks" / "01_ok.html").is_file()
    assert (layout.html / "_static" / "mathjax" / "tex-chtml.js").is_file()
    assert find_remote_resources(layout.html) == []
    assert not list(layout.work.iterdir()), "temporary work directories must be cleaned up"


@pytest.mark.book
def test_parallel_run_records_the_same_as_one_at_a_time(make_project, monkeypatch) -> None:
    """``jobs=2``: two kernels at once (each started with one thread), the longest chapter first; the
    record, the figures and the executed notebooks are those of a run one chapter at a time; the
    record notes the torch threads each kernel had (one, then torch's default one at a time)."""
    root = make_project("01_a", "02_b")
    for name in ("01_a", "02_b"):
        write_notebook(root / "notebooks" / f"{name}.ipynb", "device = 'cpu'\nseed = 0\nn_points = 3",
                       FIGURE_CELL.replace("'ok_line'", f"'{name}_line'"),
                       "import os, torch\nprint('threads', os.environ.get('OMP_NUM_THREADS'))")
    layout = Layout.at(root)
    messages: list[str] = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # set by the test workers themselves
    reproduce(layout, "cpu", jobs=2, build=False, log=messages.append)
    assert "running 2 chapters at a time (each kernel started with OMP_NUM_THREADS=1)" in messages
    parallel = load_record(layout.record)
    for run in parallel.chapters.values():
        assert run.jobs == 2 and 1 <= len(run.slowest_cells) <= 3, run
        assert run.start_threads == 1 and run.kernel_threads == [1], run
        assert run.slowest_cells[0]["seconds"] >= run.slowest_cells[-1]["seconds"]
        assert run.slowest_cells[0]["source"] and not run.slowest_cells[0]["source"].startswith("#")
    status = render_status_markdown(parallel, [(n, "", None) for n in parallel.chapters])
    assert "Chapters ran up to 2 at a time" in status and "### Where the time goes" in status
    outputs = {n: "".join(o.get("text", "") for c in nbformat.read(layout.executed / f"{n}.ipynb", as_version=4).cells
                          for o in c.get("outputs", [])) for n in ("01_a", "02_b")}
    assert all("threads 1" in text for text in outputs.values()), outputs
    figures = sorted(p.name for p in layout.figures.iterdir())
    assert figures == sorted(f"{n}_line.{ext}" for n in ("01_a", "02_b") for ext in ("pdf", "phone.png", "png"))

    reproduce(layout, "cpu", jobs=1, build=False, log=messages.append)
    serial = load_record(layout.record)
    text = nbformat.read(layout.executed / "01_a.ipynb", as_version=4)
    assert "threads None" in "".join(o.get("text", "") for c in text.cells for o in c.get("outputs", []))
    assert list(parallel.chapters) == list(serial.chapters) == ["01_a", "02_b"]
    assert serial.chapters["01_a"].start_threads is None   # torch's default: one count, noted by the kernel
    assert len(serial.chapters["01_a"].kernel_threads) == 1 and serial.chapters["01_a"].kernel_threads[0] >= 1
    for name in serial.chapters:
        a, b = parallel.chapters[name], serial.chapters[name]
        assert (a.parameters, a.figures, a.source_sha256) == (b.parameters, b.figures, b.source_sha256), name


def test_jobs_must_be_a_positive_count(make_project) -> None:
    root = make_project("01_a")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ReproduceError, match="jobs must be a positive number"):
            reproduce(Layout.at(root), "cpu", jobs=bad, **QUIET)


def test_default_jobs_is_one_on_an_accelerator() -> None:
    from companion.book.run import MAX_DEFAULT_JOBS, default_jobs

    assert default_jobs(["cuda", "cpu"]) == 1
    assert 1 <= default_jobs(["cpu", None]) <= MAX_DEFAULT_JOBS


@pytest.mark.book
def test_a_failing_notebook_fails_the_command_and_leaves_outputs_alone(make_project, capsys) -> None:
    root = make_project("01_ok", "02_boom")
    write_notebook(root / "notebooks" / "01_ok.ipynb", "device = 'cpu'\nseed = 0\nn_points = 3", FIGURE_CELL)
    boom = write_notebook(root / "notebooks" / "02_boom.ipynb", "seed = 0", "x = 1")
    layout = Layout.at(root)
    reproduce(layout, "cpu", **QUIET)
    html_before = (layout.html / "index.html").stat().st_mtime_ns
    record_before = layout.record.read_text()
    executed_before = (layout.executed / "02_boom.ipynb").read_bytes()

    write_notebook(boom, "seed = 0", "raise ValueError('margin went negative')")
    code = cli.main(["reproduce", "--root", str(root)])
    err = capsys.readouterr().err
    assert code == 1
    assert "02_boom" in err and "ValueError: margin went negative" in err
    assert (layout.executed / "02_boom.ipynb").read_bytes() == executed_before
    assert (layout.failed / "02_boom.ipynb").is_file()
    assert (layout.html / "index.html").stat().st_mtime_ns == html_before, "book must not be rebuilt"
    assert json.loads(layout.record.read_text())["chapters"]["02_boom"] == \
        json.loads(record_before)["chapters"]["02_boom"]


@pytest.mark.book
def test_only_reruns_one_chapter_and_keeps_the_others(make_project) -> None:
    root = make_project("01_ok", "02_other")
    write_notebook(root / "notebooks" / "01_ok.ipynb", "device = 'cpu'\nseed = 0\nn_points = 3", FIGURE_CELL)
    write_notebook(root / "notebooks" / "02_other.ipynb", "seed = 0", "print(seed)")
    layout = Layout.at(root)
    reproduce(layout, "cpu", build=False, **QUIET)
    first = load_record(layout.record)
    reproduce(layout, "cpu", {"seed": 5}, only=["02"], **QUIET)
    second = load_record(layout.record)
    assert second.chapters["01_ok"] == first.chapters["01_ok"]
    assert second.chapters["02_other"].parameters == {"seed": 5}
    assert (layout.html / "notebooks" / "01_ok.html").is_file()
    with pytest.raises(ReproduceError, match="-p n_points: no selected chapter declares"):
        reproduce(layout, "cpu", {"n_points": 2}, only=["02"], **QUIET)


def test_cli_errors_are_clear(make_project, capsys) -> None:
    # Refusals (nothing ran) exit with 2, as argparse's own; a failed run exits with 1 (above).
    root = make_project("01_missing")
    assert cli.main(["reproduce", "--root", str(root), "--profile", "nope"]) == 2
    assert "unknown profile 'nope'" in capsys.readouterr().err
    assert cli.main(["reproduce", "--root", str(root), "--only", "01"]) == 2
    assert "missing notebook(s): notebooks/01_missing.ipynb" in capsys.readouterr().err
    assert cli.main(["reproduce", "--root", str(root), "--only", "05"]) == 2
    assert "not a chapter in _toc.yml" in capsys.readouterr().err


# --- parameter defaults: listed with their comments, and the type every value must fit ------

def test_notebook_parameters_read_defaults_and_comments(tmp_path: Path) -> None:
    from companion.book.parameters import notebook_parameters

    path = write_notebook(tmp_path / "n.ipynb",
                          "seed = 0\n"
                          "# the vocabulary of the random targets\n"
                          "vocab = 12   # top-k with k = 10 needs V >= 10\n"
                          "# two lines\n# of comment\nrate: float = 0.5\n"
                          "widths = [1, 2, 4]\n"
                          "where = None  # a folder, or None\n"
                          "n = 2 * 8\n"
                          "a, (b, c) = 1, (2, 3)")
    params = notebook_parameters(path)
    assert list(params) == ["seed", "vocab", "rate", "widths", "where", "n", "a", "b", "c"]
    assert (params["seed"].source, params["seed"].value, params["seed"].comment) == ("0", 0, "")
    assert (params["vocab"].value, params["vocab"].comment) == (12, "top-k with k = 10 needs V >= 10")
    assert (params["rate"].value, params["rate"].comment) == (0.5, "two lines of comment")
    assert params["widths"].value == [1, 2, 4] and params["where"].value is None
    assert params["where"].comment == "a folder, or None"
    assert params["n"].source == "2 * 8" and not params["n"].has_literal_default
    assert not params["b"].has_literal_default and params["b"].source == "(set by: a, (b, c) = 1, (2, 3))"


@pytest.mark.parametrize("default, value, fits", [
    (64, 8, True), (64, "abc", False), (64, 8.0, False), (64, True, False),
    (0.3, 1, True), (0.3, 0.5, True), (0.3, "x", False), (0.3, False, False),
    (True, False, True), (True, 1, False), (True, "yes", False),
    ("cpu", "cuda", True), ("", 5, False), ("x", None, False),
    ([1, 2], [4], True), ([1, 2], [], True), ([1, 2], ["a"], False), ([1, 2], 3, False),
    ([0.5, 1.0], [1, 2], True), (["greedy"], ["topm:2"], True), (["greedy"], [1], False),
    ([1, "a"], ["b", 2, 3.0], True), ({"a": 1}, {"b": 2}, True), ({"a": 1}, [1], False),
    (None, "anything", True), (None, 3, True), (None, [1], True),
])
def test_value_fits_default(default, value, fits) -> None:
    from companion.book.parameters import value_fits_default

    assert value_fits_default(value, default) is fits


def test_mistyped_values_are_refused_before_running(make_project, capsys) -> None:
    root = make_project("07_eval")
    write_notebook(root / "notebooks" / "07_eval.ipynb",
                   'device = "cpu"\nn_prompts = 64  # the paper: 500\nwidths = [1, 2]\nbudget = 0.02\ntraces_dir = ""',
                   "raise RuntimeError('must not run')")
    layout = Layout.at(root)
    cases = {
        ("n_prompts", "abc"): "-p n_prompts 'abc': 07_eval expects an integer for n_prompts (its default is 64), "
                              "got 'abc'",
        ("widths", "[a]"): "-p widths ['a']: 07_eval expects a list of integers for widths (its default is [1, 2]), "
                           "got ['a']",
        ("traces_dir", "5"): "-p traces_dir 5: 07_eval expects a string for traces_dir (its default is \"\"), got 5 "
                             "(quote it to pass a string: '\"...\"')",
    }
    for (name, value), message in cases.items():
        with pytest.raises(ReproduceError) as info:
            reproduce(layout, "cpu", {name: parse_value(value)}, build=False, **QUIET)
        assert str(info.value) == message
    assert not layout.build.exists()
    # An integer where a float is expected, and the profile's own values, pass the check.
    from companion.book.parameters import notebook_parameters

    chapter = read_chapters(root)
    params = {"07_eval": notebook_parameters(chapter[0].path)}
    plans = plan_parameters(chapter, {"07_eval": set(params["07_eval"])}, load_profile(root, "cpu"),
                            {"budget": 1, "n_prompts": 3}, ["07_eval"], params)
    assert plans == {"07_eval": {"device": "cpu", "budget": 1, "n_prompts": 3}}
    # A profile's value is checked too, and named as the profile's.
    bad = Profile("mine", parameters={"n_prompts": "many"})
    with pytest.raises(ReproduceError, match="^profile 'mine' sets n_prompts to 'many': 07_eval expects an integer"):
        plan_parameters(chapter, {"07_eval": set(params["07_eval"])}, bad, {}, ["07_eval"], params)


def test_shipped_profiles_fit_the_notebooks_defaults() -> None:
    from companion.book.parameters import notebook_parameters

    chapters = [c for c in read_chapters(ROOT) if c.exists]
    params = {c.name: notebook_parameters(c.path) for c in chapters}
    for name in ("cpu", "gpu"):
        plan_parameters(chapters, {k: set(v) for k, v in params.items()}, load_profile(ROOT, name), {},
                        [c.name for c in chapters], params)


def test_list_shows_defaults_and_comments(make_project, capsys) -> None:
    root = make_project("01_a", "02_not_written")
    write_notebook(root / "notebooks" / "01_a.ipynb", "seed = 0\nn_points = 3   # points on the curve")
    assert cli.main(["reproduce", "--root", str(root), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["01_a", "    seed = 0", "    n_points = 3  # points on the curve",
                       "02_not_written  (notebook not written yet)"]
    assert out[-1] == "profiles: ci, cpu, full, gpu"


# --- README, environment.yml and requirements.txt stay in sync with the code -----------------

def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip().lstrip("- ").strip()
        if "==" in line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_environment_yml_pins_match_requirements() -> None:
    import yaml

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "python=3.11" in env["dependencies"]
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    required = _pins((ROOT / "requirements.txt").read_text().splitlines())
    in_env = _pins(pip_section)
    assert in_env.pop("torch") == "2.13.0"
    assert in_env == required


def test_readme_commands_match_the_code() -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
    # a command continued on the next line (a trailing backslash) is one command
    commands = [line.strip() for b in blocks for line in b.replace("\\\n", " ").splitlines()
                if line.strip() and not line.startswith("#")]
    assert commands[:2] == ["bash scripts/setup.sh && .venv/bin/companion reproduce", "bash .ci/run"]
    assert (ROOT / "scripts" / "setup.sh").is_file() and (ROOT / ".ci" / "run").is_file()
    parser = cli.build_parser()
    companion_calls = [c for c in commands if ".venv/bin/companion " in c]
    assert len(companion_calls) >= 4
    for command in companion_calls:
        words = shlex.split(command.split(".venv/bin/companion ", 1)[1].split("&&")[0].split("#")[0])
        args = parser.parse_args(words)                    # raises SystemExit on a stale flag
        if getattr(args, "profile", "cpu") != "cpu":
            load_profile(ROOT, args.profile)
        for only in getattr(args, "only", []):
            select_chapters(read_chapters(ROOT), [only])
