"""A model's size, counted one way everywhere: :func:`parameter_count`.

A model card gives two numbers: the parameters (every weight, an output head tied to the input
embedding counted once) and the non-embedding parameters (those less the input embedding and an
untied output head). A converted model can hold its head as a tensor of its own even where the
release ties it: Qwen's GGUF files store the tied head a second time, quantised differently, so
the converted Qwen2.5-Coder-1.5B holds 1.78B weights where its card says 1.54B. Counting the
tensors of the file would count that embedding twice; :func:`parameter_count` counts it once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: A head whose first rows differ from the embedding's by less than this (relative Frobenius norm)
#: repeats the embedding: quantisation noise is a few percent, two independent matrices ~1.4.
SAME_MATRIX = 0.25
_ROWS = 256


@dataclass(frozen=True)
class ParameterCount:
    """One model's size. ``total``: every parameter, an output head that repeats the input embedding
    counted once (the model card's count); ``embedding``: the input embedding (vocab x hidden);
    ``head``: an output head of its own (0 when it repeats the embedding)."""

    total: int
    embedding: int
    head: int

    @property
    def non_embedding(self) -> int:
        """``total - embedding - head``: the parameters of the layers between the embedding and the head."""
        return self.total - self.embedding - self.head


def _tensor_sizes(model_dir: Path) -> dict[str, int]:
    from safetensors import safe_open

    sizes: dict[str, int] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for key in s.keys():
                n = 1
                for d in s.get_slice(key).get_shape():
                    n *= int(d)
                sizes[key] = n
    return sizes


def _head_repeats_embedding(model_dir: Path, embed: str, head: str) -> bool:
    """Whether the stored head is the embedding again (compared on its first rows)."""
    import torch
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    where = {}
    for f in files:
        with safe_open(str(f), "pt") as s:
            for key in (embed, head):
                if key in s.keys():
                    where[key] = s.get_slice(key)[:_ROWS].to(torch.float32)
    e, h = where[embed], where[head]
    if e.shape != h.shape:
        return False
    return bool((e - h).norm() <= SAME_MATRIX * e.norm())


def parameter_count(model_dir: str | Path, parameters: int | None = None) -> ParameterCount:
    """The model's :class:`ParameterCount`, from its ``config.json`` and its safetensors files.

    ``embedding = vocab_size * hidden_size``. A stored ``lm_head.weight`` counts as a head of its
    own unless ``tie_word_embeddings`` is set or its rows equal the embedding's up to quantisation
    noise (:data:`SAME_MATRIX`). Without weight files (a folder holding the config alone),
    ``parameters`` is taken as the count of stored weights, with the head untied unless the
    config ties it.
    """
    folder = Path(model_dir)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    embedding = int(config["vocab_size"]) * int(config["hidden_size"])
    tied = bool(config.get("tie_word_embeddings", False))
    sizes = _tensor_sizes(folder)
    if not sizes:
        if parameters is None:
            raise ValueError(f"{folder}: no safetensors file and no parameter count given")
        return ParameterCount(int(parameters), embedding, 0 if tied else embedding)
    stored = sum(sizes.values())
    embed_key = next((k for k in sizes if k.endswith("embed_tokens.weight")), None)
    head_key = "lm_head.weight" if "lm_head.weight" in sizes else None
    if head_key is None or tied:
        return ParameterCount(stored - (sizes[head_key] if head_key else 0), embedding, 0)
    if embed_key is not None and _head_repeats_embedding(folder, embed_key, head_key):
        return ParameterCount(stored - sizes[head_key], embedding, 0)
    return ParameterCount(stored, embedding, sizes[head_key])


def non_embedding_parameters(model_dir: str | Path, parameters: int | None = None) -> int:
    """:attr:`ParameterCount.non_embedding` of :func:`parameter_count` (the size axis's count)."""
    return parameter_count(model_dir, parameters).non_embedding


def card_parameters(ident: dict) -> int:
    """A harvested model's parameters as its card counts them, from its manifest entry (``name``: its folder,
    ``parameters``: the stored weights): :func:`parameter_count` when the folder is on this machine (a head
    that repeats the embedding counted once), else the manifest's count."""
    n = int(ident.get("parameters", 0) or 0)
    folder = Path(str(ident.get("name") or ""))
    if ident.get("name") and (folder / "config.json").is_file():
        try:
            return parameter_count(folder, n or None).total
        except (OSError, ValueError, KeyError):
            return n
    return n
