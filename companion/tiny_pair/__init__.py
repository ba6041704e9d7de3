"""The embedded default target/drafter pair: training recipe (``train``), corpus, tokenizer, CLI.

Importing this package is cheap; the heavy modules (torch, transformers) load only when used.
"""
from __future__ import annotations

from pathlib import Path

#: Folder of the committed pair: ``tokenizer/``, ``target/``, ``drafter/``, ``prompts.jsonl``, ``manifest.json``.
ASSET_DIR: Path = Path(__file__).resolve().parent.parent / "assets" / "default_pair"
