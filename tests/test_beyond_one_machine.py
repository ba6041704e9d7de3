"""The book's "Beyond one machine" page: its memory arithmetic is the Qwen3 configurations', and its
two-node command is the shape ``tests/test_rank_failure.py`` rehearses."""
from __future__ import annotations

import re

import torch

from tests.conftest import ROOT

PAGE = ROOT / "book" / "beyond_one_machine.md"


def _text() -> str:
    return " ".join(PAGE.read_text(encoding="utf-8").split())


def test_the_memory_table_is_the_models_configurations() -> None:
    """Parameters counted on a model built on the meta device; bf16 weights and KV cache per token
    (2 x layers x KV heads x head dim x 2 bytes) computed from the same configuration."""
    from transformers import Qwen3ForCausalLM

    from companion.harvest.shapes import QWEN3_SHAPES, qwen3_config

    text = _text()
    for name in QWEN3_SHAPES:
        config = qwen3_config(name)
        with torch.device("meta"):
            n = sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())
        kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2
        cells = r" \| ([\d,]+) \| ([\d.]+) GiB \| (\d+) \| (\d+) x (\d+) \| (\d+) KiB \|"
        row = re.search(rf"\| {re.escape(name)}[^|]*" + cells, text)
        assert row is not None, f"no row for {name}"
        assert int(row[1].replace(",", "")) == n
        assert float(row[2]) == round(n * 2 / 2**30, 2)
        assert (int(row[3]), int(row[4]), int(row[5])) == (config.num_hidden_layers, config.num_key_value_heads,
                                                          config.head_dim)
        assert int(row[6]) * 1024 == kv


def test_the_worked_example_is_its_arithmetic() -> None:
    text = _text()
    kib = 2**10
    assert f"$32 \\times 1{{,}}152 \\times 224$ KiB = {32 * 1152 * 224 * kib / 2**30:.1f} GiB" in text
    assert f"$32 \\times 1{{,}}152 \\times 256$ KiB = {32 * 1152 * 256 * kib / 2**30:.1f} GiB" in text
    assert f"({256 * 151_936 * 2 / 2**20:.0f} MiB each)" in text
    assert f"({256 * 151_936 * 8 / 2**20:.0f} MiB per copy)" in text


def test_the_two_node_command_is_the_rehearsed_shape() -> None:
    """The SLURM example's torchrun options are those the rehearsal passes (bar the numbers)."""
    from tests.test_rank_failure import two_node_torchrun

    rehearsed = two_node_torchrun(ROOT / "out", 29500)
    options = {w for w in rehearsed if w.startswith("--") and w in ("--nnodes", "--nproc-per-node", "--rdzv-backend",
                                                                   "--rdzv-endpoint", "--rdzv-id")}
    text = _text()
    srun = text[text.index("srun torchrun"):]
    srun = srun[:srun.index("```")]
    assert all(o in srun for o in options) and "--rdzv-backend c10d" in srun and "--nnodes 2" in srun
