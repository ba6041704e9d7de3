"""The recipe of SmolLM2's drafter: one frozen dataclass, validated where it is made."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DrafterConfig:
    """Everything that determines the drafter, given the target, the prompt set and the package versions.

    Shape: a :class:`~companion.models.shortlist_llama.ShortlistLlamaForCausalLM` of the target's width,
    whose layers start as copies of the target's layers ``init_layers`` (in that order) and whose
    final norm starts as the target's. Its input embedding is the target's, frozen and not
    committed (it is read from the converted target when the drafter is loaded); its output head
    scores the first ``shortlist_size`` ids with that embedding and gives the other ids one
    learned logit. With SmolLM2 (width 576), two layers and 8,192 ids it owns 7.1M parameters,
    and a forward costs about 11.8M multiply-adds a token against the target's 134.5M.

    Data: the target's greedy answers (up to ``answer_steps`` tokens) to the first ``n_prompts``
    requests of the prompt set's training split, with its top-``64`` probabilities at every step
    (a harvest, resumable shard by shard). Training: ``epochs`` passes over those answers in a
    seeded order, ``batch_size`` answers a step, AdamW with a linear warm-up and a cosine decay;
    the loss is the forward KL from the target's distribution, coarsened to its top 64 tokens and
    one bucket for the rest, to the drafter's.
    """

    seed: int = 0
    init_layers: str = "0,1"
    shortlist_size: int = 8192
    n_prompts: int = 0  # 0: every request of the training split
    answer_steps: int = 128
    harvest_batch_size: int = 16
    epochs: int = 6
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    save_dtype: str = "bfloat16"
    num_threads: int = 1
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        problems = validate(self)
        if problems:
            raise ValueError("drafter recipe: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """The configuration as a plain dict (for JSON)."""
        return dataclasses.asdict(self)


#: (field, lowest allowed value) of the whole-number knobs.
_POSITIVE_INTS = {"shortlist_size": 1, "answer_steps": 1, "harvest_batch_size": 1, "epochs": 1, "batch_size": 1,
                  "num_threads": 1, "checkpoint_every": 1}
SAVE_DTYPES = ("bfloat16", "float16", "float32")


def validate(cfg: DrafterConfig) -> list[str]:
    """Every knob's problem, as ``name: what it must be, got value``; empty if the recipe is sound."""
    out = []
    for name, low in _POSITIVE_INTS.items():
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            out.append(f"{name} must be a whole number >= {low}, got {v!r}")
    for name in ("seed", "n_prompts", "warmup_steps"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (name == "seed" and v >= 2**63):
            out.append(f"{name} must be a whole number >= 0{' and < 2**63' if name == 'seed' else ''}, got {v!r}")
    for name, lo, hi in (("lr", 0.0, 1.0), ("min_lr_ratio", 0.0, 1.0), ("weight_decay", 0.0, 1.0),
                         ("grad_clip", 0.0, math.inf)):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not (lo <= v <= hi) \
                or (name in ("lr", "grad_clip") and v == 0):
            out.append(f"{name} must be a finite number in {'(' if name in ('lr', 'grad_clip') else '['}{lo:g}, "
                       f"{hi:g}], got {v!r}")
    if cfg.save_dtype not in SAVE_DTYPES:
        out.append(f"save_dtype must be one of {', '.join(SAVE_DTYPES)}, got {cfg.save_dtype!r}")
    if not isinstance(cfg.init_layers, str) or not _layer_list_ok(cfg.init_layers):
        out.append(f"init_layers must be distinct layer numbers >= 0 separated by commas, such as \"0,1,2\", "
                   f"got {cfg.init_layers!r}")
    return out


def _layer_list_ok(text: str) -> bool:
    parts = text.split(",")
    return all(p.strip().isascii() and p.strip().isdigit() for p in parts) and len({int(p) for p in parts}) == len(parts)


def init_layer_list(cfg: DrafterConfig) -> list[int]:
    """``cfg.init_layers`` as a list of layer numbers."""
    return [int(p) for p in cfg.init_layers.split(",")]


def apply_overrides(cfg: DrafterConfig, overrides: dict[str, str]) -> DrafterConfig:
    """``cfg`` with ``KEY=VALUE`` overrides (values parsed as the field's type); one ``ValueError`` line otherwise."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    changes: dict[str, Any] = {}
    for key, raw in overrides.items():
        if key not in fields:
            raise ValueError(f"--set {key}: no such knob; known: {', '.join(fields)}")
        old = getattr(cfg, key)
        try:
            if isinstance(old, bool):
                raise ValueError
            value: Any = int(raw) if isinstance(old, int) else float(raw) if isinstance(old, float) else raw
        except ValueError:
            raise ValueError(f"--set {key}={raw}: expected {type(old).__name__}, like the default {old!r}") from None
        changes[key] = value
    return dataclasses.replace(cfg, **changes)
