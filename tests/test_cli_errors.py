"""Every mistake a user can make on the command line: one line on stderr, exit status 2, nothing written.

The harvest cases are checked before any model loads (the ones that need a tokenizer or an existing
harvest use the tiny random pair of ``companion.harvest.toy``); ``companion reproduce -p`` is checked
against the type of the notebook's default before any notebook runs, and ``--root``, ``--cell-timeout``,
``--figures-dir`` and parameter ranges too; ``pair-report`` checks ``--pair`` before any model load,
and the retired ``retrain`` is an unknown command. Each case runs ``companion``
in this process (``companion.cli.main``), so the whole table takes seconds; Ctrl-C is checked on a
real process, with a real SIGINT.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from companion.cli import main
from companion.harvest import load_traces, read_manifest
from companion.harvest.toy import byte_tokenizer, save_pair, toy_pair
from companion.prompts.sets import Prompt, dumps_prompts
from tests.conftest import write_notebook

ROOT = Path(__file__).resolve().parents[1]
HELP = " (see `companion harvest --help`)"
FIELDS = "'text' (a non-empty string; optional: 'prompt_id', 'n_tokens', 'source', 'line')"
VOCAB_RULE = "the target, the drafter and the tokenizer must share one vocabulary"


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict[str, Path]:
    """The tiny pair saved as folders, a drafter and a tokenizer with one token more, and a prompt file."""
    root = tmp_path_factory.mktemp("pair")
    target, drafter, tok = toy_pair(vocab=512, hidden=32, layers=1)
    paths = save_pair(root, target, drafter, tok)
    other = byte_tokenizer()
    other.add_tokens(["<|extra|>"])
    paths["other_tok"] = root / "other-tokenizer"
    other.save_pretrained(paths["other_tok"])
    paths["other_drafter"] = root / "other-drafter"
    drafter.save_pretrained(paths["other_drafter"])
    other.save_pretrained(paths["other_drafter"])
    paths["prompts"] = root / "prompts.jsonl"
    texts = ["def f(x):\n    return x\n", "hello world", "import os\n", "x = 1\n"]
    paths["prompts"].write_text(dumps_prompts([Prompt(f"p{i}", t, -1, "test") for i, t in enumerate(texts)]),
                                encoding="utf-8")
    return paths


def _snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder under ``folder``: size, modification time, mode."""
    out = {}
    for path in sorted(folder.rglob("*")):
        st = path.stat()
        out[str(path.relative_to(folder))] = (st.st_size if path.is_file() else 0, st.st_mtime_ns, st.st_mode)
    return out


# -------------------------------------------------------------------------------------------------
# Setups: what is on disk before the command (called with the work folder and the context)


def _write(name: str, content: bytes):
    def setup(work: Path, ctx: dict, monkeypatch) -> None:
        (work / name).write_bytes(content)
    return setup


def _read_only_out(work: Path, ctx: dict, monkeypatch) -> None:
    ro = work / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: emulate what a user without write permission sees
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == ro and mode & os.W_OK
                            else real(p, mode, **kw))


def _not_empty(work: Path, ctx: dict, monkeypatch) -> None:
    (work / "out").mkdir()
    (work / "out" / "notes.txt").write_text("mine")


def _truncated_manifest(work: Path, ctx: dict, monkeypatch) -> None:
    (work / "out").mkdir()
    (work / "out" / "manifest.json").write_text('{"format": "companion-harvest/1", "status": "comp')


def _no_cuda(work: Path, ctx: dict, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def _harvested_with_one_thread(work: Path, ctx: dict, monkeypatch, capsys) -> None:
    assert main(_harvest_args(ctx, work / "out") + ["--threads", "1"]) == 0
    capsys.readouterr()


def _harvest_args(ctx: dict, out: Path) -> list[str]:
    return ["harvest", "--out", str(out), "--target", ctx["t"], "--drafter", ctx["d"], "--prompts", ctx["p"],
            "--steps", "2", "--n-prompts", "2", "--no-progress"]


def _project(work: Path, ctx: dict, monkeypatch) -> None:
    import shutil

    root = work / "project"
    root.mkdir()
    shutil.copy2(ROOT / "_config.yml", root)
    shutil.copytree(ROOT / "profiles", root / "profiles")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: notebooks/07_eval\n")
    write_notebook(root / "notebooks" / "07_eval.ipynb",
                   'device = "auto"\nseed = 0\npreset = "default"\nn_prompts = 64  # the paper: 500',
                   "raise RuntimeError('must not run')")


def _project_with_vocab(work: Path, ctx: dict, monkeypatch) -> None:
    _project(work, ctx, monkeypatch)
    write_notebook(work / "project" / "notebooks" / "03_greedy.ipynb", "vocab = 32  # their vocabulary",
                   "raise RuntimeError('must not run')")
    (work / "project" / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                               "  - file: notebooks/03_greedy\n  - file: notebooks/07_eval\n")


def _not_a_project(work: Path, ctx: dict, monkeypatch) -> None:
    (work / "plain").mkdir()
    (work / "plain" / "notes.txt").write_text("mine")


def _read_only_figures(work: Path, ctx: dict, monkeypatch) -> None:
    _project(work, ctx, monkeypatch)
    _read_only_out(work, ctx, monkeypatch)


def _profile_file(content: bytes):
    """The test project, and a profile file ``bad.yml`` holding ``content``."""
    def setup(work: Path, ctx: dict, monkeypatch) -> None:
        _project(work, ctx, monkeypatch)
        (work / "bad.yml").write_bytes(content)
    return setup


def _pair_folder(change=None, prompts: bytes | None = None):
    """A folder with every part of a pair (the committed manifest, empty model configs), then ``change``
    applied to its manifest (a dict) or ``prompts`` written as its prompts.jsonl."""
    def setup(work: Path, ctx: dict, monkeypatch) -> None:
        from companion.models.tiny_pair import ASSET_DIR

        pair = work / "pair"
        for part in ("target", "drafter"):
            (pair / part).mkdir(parents=True)
            (pair / part / "config.json").write_text("{}")
        manifest = json.loads((ASSET_DIR / "manifest.json").read_text())
        if change is not None:
            manifest = change(manifest)
        (pair / "manifest.json").write_text(json.dumps(manifest))
        (pair / "prompts.jsonl").write_bytes(prompts if prompts is not None else
                                             (ASSET_DIR / "prompts.jsonl").read_bytes())
    return setup


def _with(key: str, value):
    def change(m: dict) -> dict:
        m[key] = value
        return m
    return change


def _with_config(key: str, value):
    def change(m: dict) -> dict:
        m["config"][key] = value
        return m
    return change


RHELP = " (see `companion reproduce --help`)"
PAIR_PARTS = ("a pair folder holds manifest.json, target/config.json, drafter/config.json, prompts.jsonl "
              "(as companion/assets/default_pair does)")


def _folders(work: Path, ctx: dict, monkeypatch) -> None:
    """An empty folder, a single model folder (config.json, no manifest) and a plain file."""
    (work / "empty").mkdir()
    (work / "model").mkdir()
    (work / "model" / "config.json").write_text("{}")
    (work / "file.txt").write_text("mine")

# (id, arguments after `companion`, the one line expected on stderr, setup or None). Placeholders:
# {work} the test's folder, {t} {d} {tok} the pair, {other_tok} {other_drafter} one token more,
# {p} a prompt file, {torch} torch's version.
CASES = [
    ("steps-0", ["harvest", "--out", "{work}/out", "--steps", "0"],
     "companion harvest: argument --steps: expected a positive integer, got '0'" + HELP, None),
    ("steps-negative", ["harvest", "--out", "{work}/out", "--steps", "-3"],
     "companion harvest: argument --steps: expected a positive integer, got '-3'" + HELP, None),
    ("n-prompts-0", ["harvest", "--out", "{work}/out", "--n-prompts", "0"],
     "companion harvest: argument --n-prompts: expected a positive integer, got '0'" + HELP, None),
    ("n-prompts-negative", ["harvest", "--out", "{work}/out", "--n-prompts", "-1"],
     "companion harvest: argument --n-prompts: expected a positive integer, got '-1'" + HELP, None),
    ("n-prompts-too-many", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}",
                            "--n-prompts", "9"],
     "companion harvest: --n-prompts 9: the prompt set {p} has only 4 prompts", None),
    ("batch-size-0", ["harvest", "--out", "{work}/out", "--batch-size", "0"],
     "companion harvest: argument --batch-size: expected a positive integer, got '0'" + HELP, None),
    ("top-k-text", ["harvest", "--out", "{work}/out", "--top-k", "many"],
     "companion harvest: argument --top-k: expected a positive integer, got 'many'" + HELP, None),
    ("threads-negative", ["harvest", "--out", "{work}/out", "--threads", "-1"],
     "companion harvest: argument --threads: expected a positive integer, got '-1'" + HELP, None),
    ("tree-widths-empty", ["harvest", "--out", "{work}/out", "--tree-widths", ""],
     "companion harvest: argument --tree-widths: expected comma-separated positive integers such as 1,2,4,8, "
     "got ''" + HELP, None),
    ("tree-widths-zero", ["harvest", "--out", "{work}/out", "--tree-widths", "1,0"],
     "companion harvest: argument --tree-widths: expected comma-separated positive integers such as 1,2,4,8, "
     "got '1,0'" + HELP, None),
    ("criteria-empty", ["harvest", "--out", "{work}/out", "--criteria", ""],
     "companion harvest: argument --criteria: expected criterion specs separated by ';' such as "
     "greedy;additive:0.3, got ''" + HELP, None),
    ("criteria-out-of-range", ["harvest", "--out", "{work}/out", "--criteria", "greedy;multiplicative:1.5"],
     "companion harvest: argument --criteria: criterion spec 'multiplicative:1.5': multiplicative alpha must be <= 1.0, "
     "got 1.5" + HELP, None),
    ("dtype-float8", ["harvest", "--out", "{work}/out", "--dtype", "float8"],
     "companion harvest: argument --dtype: invalid choice: 'float8' (choose from 'bfloat16', 'float16', "
     "'float32')" + HELP, None),
    ("device-cuda-without-gpu", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}",
                                 "--device", "cuda"],
     "companion harvest: --device cuda: torch {torch} sees no CUDA device; use --device cpu, or a CUDA build of "
     "torch on a machine with a GPU", _no_cuda),
    ("device-unknown", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}", "--device", "gpu"],
     "companion harvest: --device gpu: expected cpu, cuda, cuda:N or mps", None),
    ("out-is-a-file", ["harvest", "--out", "{work}/taken", "--target", "{t}", "--prompts", "{p}"],
     "companion harvest: --out {work}/taken is a file; pass a folder (it is created if missing)",
     _write("taken", b"mine")),
    ("out-under-a-file", ["harvest", "--out", "{work}/taken/out", "--target", "{t}", "--prompts", "{p}"],
     "companion harvest: --out {work}/taken/out: cannot create it, {work}/taken is a file",
     _write("taken", b"mine")),
    ("out-read-only", ["harvest", "--out", "{work}/ro", "--target", "{t}", "--prompts", "{p}"],
     "companion harvest: --out {work}/ro is not writable; pass a folder you can write to", _read_only_out),
    ("out-not-empty", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}"],
     "companion harvest: --out {work}/out is not empty and holds no manifest.json: refusing to write into it; "
     "pass a new or empty folder", _not_empty),
    ("manifest-truncated", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}"],
     "companion harvest: {work}/out/manifest.json is damaged (not valid JSON: Unterminated string starting at, line 1 column 45): "
     "restore it, or delete {work}/out and rerun to start the harvest over", _truncated_manifest),
    ("target-missing-folder", ["harvest", "--out", "{work}/out", "--target", "{work}/models/target", "--prompts", "{p}"],
     "companion harvest: --target {work}/models/target: no such folder; pass a folder written by save_pretrained, "
     "or a hub id such as Qwen/Qwen3-1.7B", None),
    ("target-not-a-model", ["harvest", "--out", "{work}/out", "--target", "{tok}", "--prompts", "{p}"],
     "companion harvest: --target {tok}: not a model folder saved with save_pretrained (no config.json in it); "
     "pass a folder written by save_pretrained, or a hub id such as Qwen/Qwen3-1.7B", None),
    ("drafter-and-no-drafter", ["harvest", "--out", "{work}/out", "--drafter", "{d}", "--no-drafter"],
     "companion harvest: --drafter {d} and --no-drafter contradict each other: give one", None),
    ("tokenizer-mismatch", ["harvest", "--out", "{work}/out", "--target", "{t}", "--drafter", "{d}",
                            "--tokenizer", "{other_tok}", "--prompts", "{p}"],
     "companion harvest: tokenizers differ: tokenizer '{other_tok}' has 259 tokens, target '{t}' has 258; "
     + VOCAB_RULE, None),
    ("drafter-tokenizer-mismatch", ["harvest", "--out", "{work}/out", "--target", "{t}", "--drafter",
                                    "{other_drafter}", "--prompts", "{p}"],
     "companion harvest: tokenizers differ: target '{t}' has 258 tokens, drafter '{other_drafter}' has 259; "
     + VOCAB_RULE, None),
    ("prompts-missing", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/nope.jsonl"],
     "companion harvest: --prompts {work}/nope.jsonl: no such file (nor a prompt set name: chat-and-stdlib, chat-requests, chat-requests-train, default, stdlib-requests)", None),
    ("prompts-malformed", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/bad.jsonl"],
     "companion harvest: {work}/bad.jsonl:2: not valid JSON (Expecting value at column 1); each line must be one "
     "JSON object with " + FIELDS, _write("bad.jsonl", b'{"text": "a"}\nnot json\n')),
    ("prompts-missing-text", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/bad.jsonl"],
     "companion harvest: {work}/bad.jsonl:1: not a prompt record: needs " + FIELDS + ", got keys ['prompt', "
     "'prompt_id']", _write("bad.jsonl", b'{"prompt_id": "a", "prompt": "hi"}\n')),
    ("prompts-duplicate-id", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/dup.jsonl"],
     "companion harvest: {work}/dup.jsonl:3: duplicate prompt_id 'a' (first on line 1)",
     _write("dup.jsonl", b'{"prompt_id": "a", "text": "x"}\n{"prompt_id": "b", "text": "y"}\n'
                         b'{"prompt_id": "a", "text": "z"}\n')),
    ("prompts-not-utf8", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/latin1.txt"],
     "companion harvest: {work}/latin1.txt:1: not UTF-8 text (byte 0xe9 at column 4); save the file as UTF-8",
     _write("latin1.txt", "caf\u00e9 au lait\n".encode("latin-1"))),
    ("prompts-empty", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{work}/empty.txt"],
     "companion harvest: {work}/empty.txt: no prompts (the file has no non-blank line)", _write("empty.txt", b"\n")),
    ("write-prompts-is-a-folder", ["harvest", "--out", "{work}/out", "--target", "{t}", "--prompts", "{p}",
                                   "--write-prompts", "{work}"],
     "companion harvest: --write-prompts {work} is a folder; pass a file name", None),
    ("resume-with-other-threads", ["harvest", "--out", "{work}/out", "--target", "{t}", "--drafter", "{d}",
                                   "--prompts", "{p}", "--steps", "2", "--n-prompts", "2", "--no-progress",
                                   "--threads", "2"],
     "companion harvest: {work}/out already holds a harvest with a different configuration "
     "(numerics.torch_threads: existing 1, now 2): use another output directory, or delete {work}/out to start over",
     _harvested_with_one_thread),
    ("reproduce-mistyped-parameter", ["reproduce", "--root", "{work}/project", "-p", "n_prompts", "abc"],
     "companion reproduce: error: -p n_prompts 'abc': 07_eval expects an integer for n_prompts (its default is 64), "
     "got 'abc'", _project),
    ("reproduce-root-missing", ["reproduce", "--root", "{work}/nonexistent", "--no-build"],
     "companion reproduce: error: --root {work}/nonexistent: no such folder", None),
    ("reproduce-list-root-missing", ["reproduce", "--list", "--root", "{work}/nonexistent"],
     "companion reproduce: error: --root {work}/nonexistent: no such folder", None),
    ("reproduce-root-not-a-project", ["reproduce", "--root", "{work}/plain"],
     "companion reproduce: error: --root {work}/plain: not a book project (no _toc.yml or _config.yml in it)",
     _not_a_project),
    ("reproduce-list-root-not-a-project", ["reproduce", "--list", "--root", "{work}/plain"],
     "companion reproduce: error: --root {work}/plain: not a book project (no _toc.yml or _config.yml in it)",
     _not_a_project),
    ("reproduce-root-is-a-file", ["reproduce", "--root", "{work}/taken"],
     "companion reproduce: error: --root {work}/taken is a file; pass the project folder (the one holding _toc.yml)",
     _write("taken", b"mine")),
    ("reproduce-cell-timeout-0", ["reproduce", "--root", "{work}/project", "--cell-timeout", "0"],
     "companion reproduce: argument --cell-timeout: expected a positive integer (seconds), got '0'" + RHELP, _project),
    ("reproduce-cell-timeout-negative", ["reproduce", "--root", "{work}/project", "--cell-timeout", "-1"],
     "companion reproduce: argument --cell-timeout: expected a positive integer (seconds), got '-1'" + RHELP,
     _project),
    ("reproduce-cell-timeout-text", ["reproduce", "--root", "{work}/project", "--cell-timeout", "1m"],
     "companion reproduce: argument --cell-timeout: expected a positive integer (seconds), got '1m'" + RHELP,
     _project),
    ("reproduce-vocab-1", ["reproduce", "--root", "{work}/project", "--only", "03", "-p", "vocab", "1"],
     "companion reproduce: error: -p vocab 1: 03_greedy needs vocab >= 2 (a vocabulary needs at least 2 tokens), "
     "got 1", _project_with_vocab),
    ("reproduce-count-0", ["reproduce", "--root", "{work}/project", "-p", "n_prompts", "0"],
     "companion reproduce: error: -p n_prompts 0: 07_eval needs n_prompts >= 1 (a count must be at least 1), got 0",
     _project),
    ("reproduce-figures-dir-proc", ["reproduce", "--root", "{work}/project", "--figures-dir", "/proc/x"],
     "companion reproduce: error: --figures-dir /proc/x is not writable (cannot create it in /proc); "
     "pass a folder you can write to", _project),
    ("reproduce-figures-dir-read-only", ["reproduce", "--root", "{work}/project", "--figures-dir", "{work}/ro/figs"],
     "companion reproduce: error: --figures-dir {work}/ro/figs is not writable (cannot create it in {work}/ro); "
     "pass a folder you can write to", _read_only_figures),
    ("reproduce-figures-dir-is-a-file", ["reproduce", "--root", "{work}/project", "--figures-dir", "{work}/taken"],
     "companion reproduce: error: --figures-dir {work}/taken is a file; pass a folder",
     lambda work, ctx, mp: (_project(work, ctx, mp), _write("taken", b"mine")(work, ctx, mp))),
    ("pair-report-missing", ["pair-report", "--pair", "{work}/nonexistent"],
     "companion pair-report: --pair {work}/nonexistent: no such folder; " + PAIR_PARTS, None),
    ("pair-report-empty-folder", ["pair-report", "--pair", "{work}/empty"],
     "companion pair-report: --pair {work}/empty: not a pair folder (no manifest.json, target/config.json, "
     "drafter/config.json, prompts.jsonl); " + PAIR_PARTS, _folders),
    ("pair-report-model-folder", ["pair-report", "--pair", "{work}/model"],
     "companion pair-report: --pair {work}/model is a single model folder, not a pair; " + PAIR_PARTS, _folders),
    ("pair-report-harvest-model", ["pair-report", "--pair", "{t}"],
     "companion pair-report: --pair {t} is a single model folder, not a pair; " + PAIR_PARTS, None),
    ("pair-report-file", ["pair-report", "--pair", "{work}/file.txt"],
     "companion pair-report: --pair {work}/file.txt is a file; " + PAIR_PARTS, _folders),
    ("reproduce-unknown-option", ["reproduce", "--root", "{work}/project", "--profiles", "gpu"],
     "companion reproduce: unrecognized arguments: --profiles gpu (see `companion reproduce --help`)", _project),
    # issue 34: profiles of every shape, --jobs, pair-report on damaged or foreign pairs, retrain --set ranges
    ("reproduce-profile-list", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: profile {work}/bad.yml must be a YAML mapping with the keys description, "
     "parameters and notebooks, got a list of 1 item", _profile_file(b"- parameters: {}\n")),
    ("reproduce-profile-number", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: profile {work}/bad.yml must be a YAML mapping with the keys description, "
     "parameters and notebooks, got the int 42", _profile_file(b"42\n")),
    ("reproduce-profile-word", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: profile {work}/bad.yml must be a YAML mapping with the keys description, "
     "parameters and notebooks, got the str 'hello'", _profile_file(b"hello\n")),
    ("reproduce-profile-not-utf8", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: profile {work}/bad.yml: not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8",
     _profile_file("parameters:\n  device: caf\u00e9\n".encode("latin-1"))),
    ("reproduce-profile-bad-yaml", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: cannot parse profile {work}/bad.yml: expected ',' or ']', but got '<stream end>' "
     "(line 2, column 1)", _profile_file(b"parameters: [1, 2\n")),
    ("reproduce-profile-wide-typo", ["reproduce", "--root", "{work}/project", "--profile", "{work}/bad.yml"],
     "companion reproduce: error: profile 'bad' sets sed in 'parameters', which no chapter declares; did you mean "
     "seed? (declared: device, n_prompts, preset, seed)", _profile_file(b"parameters: {sed: 1}\n")),
    ("reproduce-jobs-0", ["reproduce", "--root", "{work}/project", "--jobs", "0"],
     "companion reproduce: argument --jobs/-j: expected a positive integer (chapters run at once), got '0'" + RHELP,
     _project),
    ("reproduce-jobs-negative", ["reproduce", "--root", "{work}/project", "-j", "-1"],
     "companion reproduce: argument --jobs/-j: expected a positive integer (chapters run at once), got '-1'" + RHELP,
     _project),
    ("reproduce-jobs-text", ["reproduce", "--root", "{work}/project", "--jobs", "abc"],
     "companion reproduce: argument --jobs/-j: expected a positive integer (chapters run at once), got 'abc'" + RHELP,
     _project),
    ("reproduce-jobs-fraction", ["reproduce", "--root", "{work}/project", "--jobs", "1.5"],
     "companion reproduce: argument --jobs/-j: expected a positive integer (chapters run at once), got '1.5'" + RHELP,
     _project),
    ("reproduce-jobs-empty", ["reproduce", "--root", "{work}/project", "--jobs", ""],
     "companion reproduce: argument --jobs/-j: expected a positive integer (chapters run at once), got ''" + RHELP,
     _project),
    ("pair-report-task-set", ["pair-report", "--pair", "{work}/pair"],
     "companion pair-report: --pair {work}/pair/manifest.json: its config's task_set 'bogus' is not one this "
     "version generates (closed)",
     _pair_folder(_with_config("task_set", "bogus"))),
    ("pair-report-digests-list", ["pair-report", "--pair", "{work}/pair"],
     "companion pair-report: --pair {work}/pair/manifest.json is damaged: 'files_sha256' must map file paths to "
     "sha256 digests, got list", _pair_folder(_with("files_sha256", ["a", "b"]))),
    ("pair-report-no-corpus", ["pair-report", "--pair", "{work}/pair"],
     "companion pair-report: --pair {work}/pair/manifest.json is not a pair manifest (no 'corpus' record with its "
     "digest_sha256)", _pair_folder(_with("corpus", None))),
    ("pair-report-training-list", ["pair-report", "--pair", "{work}/pair"],
     "companion pair-report: --pair {work}/pair/manifest.json is damaged: 'training' must be a mapping, got list",
     _pair_folder(_with("training", [1]))),
    ("pair-report-prompts-not-json", ["pair-report", "--pair", "{work}/pair"],
     "companion pair-report: --pair {work}/pair/prompts.jsonl:1: not valid JSON (Expecting value at column 1); "
     "each line must be one JSON object with " + FIELDS, _pair_folder(prompts=b"not json\n")),
]


@pytest.mark.parametrize("argv, message, setup", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistake_is_one_line_exit_2_and_writes_nothing(pair, tmp_path, monkeypatch, capsys, argv, message, setup):
    work = tmp_path / "work"
    work.mkdir()
    ctx = {"work": str(work), "t": str(pair["target"]), "d": str(pair["drafter"]), "tok": str(pair["tokenizer"]),
           "other_tok": str(pair["other_tok"]), "other_drafter": str(pair["other_drafter"]),
           "p": str(pair["prompts"]), "torch": torch.__version__}
    if setup is _harvested_with_one_thread:
        setup(work, ctx, monkeypatch, capsys)
    elif setup is not None:
        setup(work, ctx, monkeypatch)
    before, pair_before = _snapshot(work), _snapshot(pair["target"].parent)
    code = main([a.format(**ctx) for a in argv])
    err = capsys.readouterr().err
    assert (code, err) == (2, message.format(**ctx) + "\n")
    assert _snapshot(work) == before, "a refused command must write nothing"
    assert _snapshot(pair["target"].parent) == pair_before


def test_retrain_is_retired_an_unknown_command_in_one_line(tmp_path) -> None:
    """The closed-world pair is frozen (companion.models.tiny_pair): `companion retrain`, even with the --out that
    used to end in a FileNotFoundError traceback, is one line on stderr and exit status 2, nothing written."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for argv in (["retrain", "--shrink", "--out", "/proc/x/y"], ["retrain", "--out", str(tmp_path / "out")]):
        out = subprocess.run([sys.executable, "-m", "companion", *argv], capture_output=True, text=True, env=env,
                             cwd=tmp_path, timeout=300)
        assert out.returncode == 2 and out.stdout == "", (out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and out.stderr.startswith(
            "companion: argument COMMAND: invalid choice: 'retrain' (choose from "), out.stderr
        assert "pair-report" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------------------------------------
# Ctrl-C


def test_ctrl_c_before_the_harvest_starts(pair, tmp_path, monkeypatch, capsys) -> None:
    import companion.models.loading

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(companion.models.loading, "load_pair", interrupted)
    out = tmp_path / "out"
    code = main(["harvest", "--out", str(out), "--target", str(pair["target"]), "--prompts", str(pair["prompts"])])
    assert (code, capsys.readouterr().err) == (
        130, f"companion harvest: interrupted before the harvest wrote anything to {out}; "
             "rerun the same command to start it\n")
    assert not out.exists()


def test_ctrl_c_names_what_is_done_and_the_rerun_resumes(pair, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    prompts = tmp_path / "many.txt"  # a plain text file, one prompt a line
    prompts.write_text("".join(f"prompt number {i}: " + "abc " * i + "\n" for i in range(8)), encoding="utf-8")
    args = [sys.executable, "-m", "companion", "harvest", "--out", str(out), "--target", str(pair["target"]),
            "--drafter", str(pair["drafter"]), "--prompts", str(prompts), "--threads", "1", "--no-progress",
            "--steps", "40", "--batch-size", "1", "--prompts-per-shard", "1", "--no-stop-at-eos"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shards = out / "shards"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if shards.is_dir() and any(p.suffix == ".parquet" for p in shards.iterdir()):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the harvest ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    manifest = read_manifest(out)
    done = manifest["totals"]["shards"]
    assert proc.returncode == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (f"companion harvest: interrupted: {done} of 8 shards are complete in "
                                            f"{out}; rerun the same command to resume")
    assert manifest["status"] == "interrupted" and 1 <= done < 8
    assert manifest["missing_shards"] == sorted(set(range(8)) - {s["index"] for s in manifest["shards"]})
    assert all(len(s["sha256"]) == 64 for s in manifest["shards"])
    assert not list(shards.glob(".*tmp*"))
    assert load_traces(out, allow_incomplete=True).num_rows == 40 * done

    assert main(args[3:]) == 0  # the same command again, in this process (also on one thread)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "complete"
    table = load_traces(out)
    assert table.num_rows == 8 * 40
    pairs = list(zip(table.column("prompt_id").to_pylist(), table.column("step").to_pylist()))
    assert len(set(pairs)) == len(pairs)  # nothing lost, nothing twice
    assert {p for p, _ in pairs} == {f"line-{i:05d}" for i in range(1, 9)}


# -------------------------------------------------------------------------------------------------
# A pair whose manifest lacks sections a report prints: the report says so, no traceback


def test_pair_report_of_a_manifest_without_training_says_what_is_missing(tmp_path, monkeypatch, capsys) -> None:
    work = tmp_path / "work"
    work.mkdir()

    def without_training(m: dict) -> dict:
        del m["training"]
        del m["figures"]["regime"]
        return m

    _pair_folder(without_training)(work, {}, monkeypatch)
    code = main(["pair-report", "--pair", str(work / "pair"), "--no-load"])
    out, err = capsys.readouterr()
    assert code == 1  # the empty model configs differ from the manifest's digests
    assert "training target: not recorded in the manifest" in out and "Traceback" not in err, (out, err)
    assert "MISMATCH: " in out


# -------------------------------------------------------------------------------------------------
# Two `companion harvest --out SAME` at once: one writer at a time, never a manifest that lies


def _harvest_process(pair: dict[str, Path], out: Path, prompts: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "companion", "harvest", "--out", str(out), "--target", str(pair["target"]),
            "--drafter", str(pair["drafter"]), "--prompts", str(prompts), "--threads", "1", "--no-progress",
            "--steps", "12", "--batch-size", "1", "--prompts-per-shard", "1", "--no-stop-at-eos"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), TOKENIZERS_PARALLELISM="false")
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _many_prompts(tmp_path: Path) -> Path:
    prompts = tmp_path / "many.txt"
    prompts.write_text("".join(f"prompt number {i}: " + "abc " * i + "\n" for i in range(6)), encoding="utf-8")
    return prompts


def test_a_second_harvest_of_the_same_folder_waits_for_the_first(pair, tmp_path) -> None:
    """Forced interleaving: the lock is held (as a first harvest holds it) while a second one starts. It says
    it waits, in one line, writes nothing meanwhile, then finishes the harvest; the manifest matches the shards."""
    from companion.harvest.lock import exclusive, lock_path

    out = tmp_path / "out"
    with exclusive(out):
        proc = _harvest_process(pair, out, _many_prompts(tmp_path))
        line = proc.stderr.readline()  # blocks until the child reaches the lock (after loading the models)
        assert line == (f"companion harvest: --out {out}: another process is harvesting into it (it holds "
                        f"{lock_path(out)}); waiting for it to finish, then this harvest resumes from what it wrote\n")
        time.sleep(1.0)  # time for a harvest that ignored the lock to write its first shard
        assert proc.poll() is None and not out.exists(), "the second harvest wrote while another one held the lock"
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and err == "", err
    assert json.loads(stdout.strip().splitlines()[-1])["status"] == "complete"
    assert load_traces(out).num_rows == 6 * 12  # every shard's sha256 matches the manifest


def test_two_harvests_of_the_same_folder_at_once_leave_a_true_manifest(pair, tmp_path) -> None:
    """The issue's probe: both started together, both exit 0, and the traces load (checksums match)."""
    out = tmp_path / "out"
    prompts = _many_prompts(tmp_path)
    first, second = _harvest_process(pair, out, prompts), _harvest_process(pair, out, prompts)
    results = [(p.wait(timeout=400), p.communicate()) for p in (first, second)]
    for code, (stdout, stderr) in results:
        assert code == 0 and "Traceback" not in stderr, stderr
        assert json.loads(stdout.strip().splitlines()[-1])["status"] == "complete"
    manifest = read_manifest(out)
    table = load_traces(out)
    assert table.num_rows == 6 * 12 and manifest["totals"]["shards"] == 6
    rows_computed = sum(int(r["rows"]) for r in manifest["runs"])
    assert rows_computed == 6 * 12, manifest["runs"]  # the second harvest reused the first's shards
