"""The gpu profile rehearsed on the CPU: chapters 7 and 8, unmodified, on bfloat16 harvests of
stand-ins with the Qwen3 vocabulary, a Qwen3-style chat template and UltraChat-format prompts.

Everything the paper-scale run does except the device and the weights: the paper preset's
command line, the UltraChat selection, bfloat16 logits over 151,936 tokens (with exact top-2
ties and very peaked steps), the certificate engine on those rows, and both chapters' analyses
and assertions, on a harvest with a drafter and on a target-only one (the paper's setting).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pytest

from companion.harvest import load_traces, read_manifest
from companion.harvest.rehearsal import PRESET, rehearse
from companion.harvest.shapes import QWEN3_VOCAB
from companion.book.layout import Layout
from companion.book.run import reproduce
from companion.book.toc import read_chapters
from companion.book.record import load_record, render_status_markdown

ROOT = Path(__file__).resolve().parents[1]
CH7, CH8 = "07_paper_evaluation", "08_real_drafter"

pytestmark = pytest.mark.book


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    return rehearse(tmp_path_factory.mktemp("rehearsal"), n_prompts=16, n_steps=24)


def _glued(path: Path) -> dict[str, object]:
    """``{name: plain-text value}`` of every glue call in an executed notebook."""
    out = {}
    for cell in nbformat.read(path, as_version=4).cells:
        for o in cell.get("outputs", []):
            scrap = o.get("metadata", {}).get("scrapbook", {})
            if scrap.get("name"):
                data = o.get("data", {})
                prefix = scrap.get("mime_prefix", "")
                out[scrap["name"]] = data.get(prefix + "text/markdown") or data.get(prefix + "text/plain")
    return out


def test_the_harvests_look_like_the_paper_runs(rehearsal) -> None:
    manifest = read_manifest(rehearsal.traces)
    cfg = manifest["config"]
    assert (cfg["dtype"], manifest["extra"]["preset"]) == ("bfloat16", PRESET)
    assert manifest["prompt_set_name"].startswith("HuggingFaceH4/ultrachat_200k")
    assert read_manifest(rehearsal.traces_no_drafter)["config"]["drafter"] is None
    table = load_traces(rehearsal.traces)
    assert json.loads((rehearsal.pair["target"] / "config.json").read_text())["vocab_size"] == QWEN3_VOCAB
    ties = int(np.sum(table.column("top2_tie")))
    top = np.array(table.column("top_probs").to_pylist())
    gaps = np.log(top[:, 0]) - np.log(np.maximum(top[:, 1], 1e-300))
    assert ties > 0, "the rehearsal must contain exact bfloat16 ties"
    assert gaps.max() > 25, f"the rehearsal must contain very peaked steps; largest top-2 gap {gaps.max():.1f} nats"
    # Prompts went through the chat template and the length filter of the paper preset.
    assert all(n >= 64 for n in np.asarray(table.column("prompt_tokens")))


def test_chapters_7_and_8_run_unmodified_on_the_rehearsal(rehearsal, make_project) -> None:
    root = make_project(CH7, CH8)
    (root / "notebooks").mkdir(exist_ok=True)
    for name in (CH7, CH8):
        shutil.copy2(ROOT / "notebooks" / f"{name}.ipynb", root / "notebooks" / f"{name}.ipynb")
    layout = Layout.at(root)
    log: list[str] = []
    # The gpu profile itself, with only the device swapped for the CPU.
    reproduce(layout, "gpu", {"device": "cpu", "traces_dir": str(rehearsal.traces)}, only=[CH7, CH8],
              build=False, log=log.append)
    glued = _glued(layout.executed / f"{CH7}.ipynb")
    ties = read_manifest(rehearsal.traces)["totals"]["top2_tie_steps"]
    assert int(glued["ch7_ties"]) == ties > 0, (glued.get("ch7_ties"), ties)
    assert "bfloat16" in glued["ch7_run"] and "standins/target" in glued["ch7_run"], glued["ch7_run"]

    # The status page describes the run from the harvest's manifest, not from the preset table.
    record = load_record(layout.record)
    chapters = [(c.name, "", None) for c in read_chapters(root)]
    status = render_status_markdown(record, chapters)
    row7 = " ".join(line for line in status.splitlines() if line.startswith(f"| {CH7}"))
    assert "standins/target" in row7 and "bfloat16" in row7 and str(rehearsal.traces) in row7, row7

    # Chapter 7 on the target-only harvest, as the paper runs no drafter.
    reproduce(layout, "gpu", {"device": "cpu", "traces_dir": str(rehearsal.traces_no_drafter)}, only=[CH7],
              build=False, log=log.append)
    glued = _glued(layout.executed / f"{CH7}.ipynb")
    assert "drafter none" in glued["ch7_run"], glued["ch7_run"]
