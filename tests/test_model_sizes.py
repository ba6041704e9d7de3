"""One parameter count per model (companion.models.sizes), against a count done by hand."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from companion.models.sizes import parameter_count

V, H, LAYER = 300, 8, 8 * 8 + 8


def _model(tmp: Path, head: str, tied: bool = False) -> Path:
    (tmp / "config.json").write_text(json.dumps({"vocab_size": V, "hidden_size": H, "tie_word_embeddings": tied}))
    g = torch.Generator().manual_seed(0)
    embed = torch.randn(V, H, generator=g)
    tensors = {"model.embed_tokens.weight": embed, "model.layers.0.w": torch.randn(H, H, generator=g),
               "model.layers.0.b": torch.randn(H, generator=g)}
    if head == "copy":  # the release ties it; the converted file stores it again, quantised differently
        tensors["lm_head.weight"] = embed + 0.05 * torch.randn(V, H, generator=g)
    elif head == "own":
        tensors["lm_head.weight"] = torch.randn(V, H, generator=g)
    save_file(tensors, str(tmp / "model.safetensors"))
    return tmp


@pytest.mark.parametrize("head, tied, total, own_head", [
    ("none", True, V * H + LAYER, 0),          # tied, stored once
    ("copy", False, V * H + LAYER, 0),         # a stored copy of the embedding: counted once
    ("own", False, 2 * V * H + LAYER, V * H),  # a head of its own
])
def test_parameter_count_counts_a_tied_embedding_once(tmp_path: Path, head: str, tied: bool, total: int,
                                                      own_head: int) -> None:
    c = parameter_count(_model(tmp_path, head, tied))
    assert (c.total, c.embedding, c.head) == (total, V * H, own_head)
    assert c.non_embedding == LAYER


def test_the_book_models_match_their_cards() -> None:
    """Qwen2.5-Coder's cards: 1.54B and 0.49B parameters, 1.31B and 0.36B without embeddings."""
    cache = Path.home() / ".cache" / "companion"
    found = {p.name.split("-instruct")[0]: p for p in cache.glob("qwen2.5-coder-*-instruct-*") if
             (p / "model.safetensors").is_file()}
    if not found:
        pytest.skip("the Qwen models are not converted on this machine")
    cards = {"qwen2.5-coder-1.5b": (1.54e9, 1.31e9), "qwen2.5-coder-0.5b": (0.49e9, 0.36e9)}
    for name, folder in found.items():
        c = parameter_count(folder)
        total, non_embedding = cards[name]
        assert c.total == pytest.approx(total, rel=0.01) and c.non_embedding == pytest.approx(non_embedding, rel=0.01)
