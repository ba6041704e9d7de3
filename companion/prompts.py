"""Prompt sets: the default held-out prompts of the embedded pair, or any JSONL file of the same shape.

A prompt file has one JSON object a line with fields ``prompt_id``, ``text``, ``n_tokens`` (length in
the tokenizer the set was built for), ``source`` (file the text comes from) and ``line`` (1-based
start line in it). The canonical serialisation (:func:`dumps_prompts`) is what the default file
contains byte for byte, so :func:`prompt_set_digest` equals that file's sha256.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from companion.tiny_pair import ASSET_DIR

PRESET_PROMPT_FILES: dict[str, Path] = {"default": ASSET_DIR / "prompts.jsonl"}


@dataclass(frozen=True)
class Prompt:
    """One prompt: id, text, its token count in the set's tokenizer, and where it comes from."""

    prompt_id: str
    text: str
    n_tokens: int
    source: str
    line: int = 0


def dumps_prompts(prompts: list[Prompt]) -> str:
    """Canonical JSONL text of a prompt list (ASCII-escaped, fixed field order, one trailing newline per line)."""
    return "".join(json.dumps(asdict(p), ensure_ascii=True) + "\n" for p in prompts)


def prompt_set_digest(prompts: list[Prompt]) -> str:
    """sha256 (hex) of the canonical JSONL serialisation of ``prompts``: identifies a prompt set exactly."""
    return hashlib.sha256(dumps_prompts(prompts).encode("utf-8")).hexdigest()


def load_prompts(name_or_path: str | Path = "default") -> list[Prompt]:
    """Load a prompt set: a preset name (``"default"``: the embedded pair's held-out prompts) or a JSONL path."""
    key = str(name_or_path)
    path = PRESET_PROMPT_FILES.get(key, Path(name_or_path))
    if not path.is_file():
        known = ", ".join(sorted(PRESET_PROMPT_FILES))
        raise FileNotFoundError(f"no prompt set {key!r}: not a preset ({known}) nor an existing JSONL file")
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
                prompts.append(Prompt(obj["prompt_id"], obj["text"], int(obj["n_tokens"]), obj["source"],
                                      int(obj.get("line", 0))))
            except (KeyError, ValueError, TypeError) as err:
                raise ValueError(f"{path}:{n}: not a prompt record ({err})") from err
    ids = [p.prompt_id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate prompt_id values")
    return prompts
