"""The embedded default target/drafter pair: training recipe (``train``), corpus, tokenizer, CLI.

Importing this package is cheap; the heavy modules (torch, transformers) load only when used.
"""
from __future__ import annotations

from companion.assets import DEFAULT_PAIR_DIR

#: Folder of the committed pair (``companion.assets.DEFAULT_PAIR_DIR``), under the recipe's name for it.
ASSET_DIR = DEFAULT_PAIR_DIR
