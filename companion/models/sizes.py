"""A model's size as model cards give it: parameters less the embeddings (:func:`non_embedding_parameters`)."""
from __future__ import annotations

import json
from pathlib import Path


def non_embedding_parameters(model_dir: str | Path, parameters: int) -> int:
    """``parameters`` less the input embedding and, when it is a tensor of its own, the output head.

    Read from the model's ``config.json`` (``vocab_size``, ``hidden_size``, ``tie_word_embeddings``).
    """
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    embedding = int(config["vocab_size"]) * int(config["hidden_size"])
    tied = bool(config.get("tie_word_embeddings", False))
    return int(parameters) - embedding * (1 if tied else 2)
