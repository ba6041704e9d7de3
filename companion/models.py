"""Loading a target/drafter pair through the standard ``from_pretrained`` path.

``load_pair("default")`` gives the embedded tiny Qwen3 pair that ships with the package; the same
function loads hub ids or local folders (``load_pair("Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B")``), so
every experiment runs the same code on the tiny pair and on the paper's models. Presets are a
plain name -> (target, drafter) table that other modules may extend via :func:`register_preset`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from huggingface_hub.errors import HFValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from companion.tiny_pair import ASSET_DIR

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class PairSpec:
    """Where a named pair's parts come from: hub ids or local folders; ``tokenizer`` None means the target's."""

    target: str
    drafter: str | None = None
    tokenizer: str | None = None


_PRESETS: dict[str, PairSpec] = {
    "default": PairSpec(
        target=str(ASSET_DIR / "target"),
        drafter=str(ASSET_DIR / "drafter"),
        tokenizer=str(ASSET_DIR / "tokenizer"),
    ),
}


class WeightsUnavailableError(OSError):
    """A model or tokenizer could not be loaded (typically: not in the local cache and no network)."""


def register_preset(name: str, target: str, drafter: str | None = None, tokenizer: str | None = None) -> None:
    """Make ``load_pair(name)`` load the given parts. Re-registering a name with a different spec is an error."""
    spec = PairSpec(target, drafter, tokenizer)
    if name in _PRESETS and _PRESETS[name] != spec:
        raise ValueError(f"preset {name!r} already registered as {_PRESETS[name]}")
    _PRESETS[name] = spec


def preset_names() -> list[str]:
    """Names accepted by ``load_pair`` as presets."""
    return sorted(_PRESETS)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` means CUDA when available, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None`` means bfloat16 on CUDA (the paper's models' native dtype) and float32 on CPU."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}")
        return resolved
    return dtype


def _unavailable(kind: str, name: str, err: Exception) -> WeightsUnavailableError:
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE", "") not in ("", "0")
    return WeightsUnavailableError(
        f"Could not load the {kind} {name!r}: it is neither a local folder saved with save_pretrained nor in the "
        f"local Hugging Face cache{' (HF_HUB_OFFLINE is set)' if offline else ''}, and it cannot be downloaded here.\n"
        f"To fix: download it with `huggingface-cli download {name}` on a machine with network (then copy the cache, "
        f"see HF_HOME, to this machine), or pass a local path to a folder containing it. "
        f"Without large models, use load_pair(\"default\"), the embedded CPU pair.\n"
        f"Underlying error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    )


def load_tokenizer(name_or_path: PathLike, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with a helpful error when it is not available offline."""
    name = os.fspath(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except (OSError, HFValidationError) as err:  # HFValidationError: neither a folder nor a well-formed hub id
        raise _unavailable("tokenizer", name, err) from err


def load_model(
    name_or_path: PathLike, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` on ``device`` in ``dtype`` (auto as documented), in eval mode."""
    name = os.fspath(name_or_path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dt, **kwargs)
    except (OSError, HFValidationError) as err:
        raise _unavailable("model", name, err) from err
    return model.to(dev).eval()


def check_same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase, names: tuple[str, str]) -> None:
    """Raise ``ValueError`` unless both tokenizers have the same size and the same token -> id map.

    Speculative decoding compares the two models' distributions id by id, which is meaningless
    when an id denotes different strings in the two models.
    """
    if len(a) != len(b):
        raise ValueError(
            f"tokenizers differ: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}; "
            "a drafter must share the target's vocabulary")
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()), key=lambda kv: kv[1])[:5]
        raise ValueError(
            f"tokenizers differ: {names[0]} and {names[1]} map tokens to different ids "
            f"(first differences: {diff}); a drafter must share the target's vocabulary")


def load_pair(
    target: PathLike = "default",
    drafter: PathLike | None = None,
    tokenizer: PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    **model_kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedModel | None, PreTrainedTokenizerBase]:
    """Load ``(target, drafter, tokenizer)``; models in eval mode on ``device`` in ``dtype``.

    ``target`` is a preset name (see :func:`preset_names`; ``"default"`` is the embedded pair and
    brings its drafter), a hub id or a local folder. ``drafter`` None means no drafter (None is
    returned in its place) unless the preset has one. The tokenizer comes from ``tokenizer`` if
    given, else from the target; when there is a drafter, its own tokenizer must have the same
    vocabulary (``ValueError`` otherwise). ``WeightsUnavailableError`` (an ``OSError``) says what to
    do when something is not available offline.
    """
    target_name = os.fspath(target)
    if target_name in _PRESETS:
        spec = _PRESETS[target_name]
        target_name = spec.target
        drafter = drafter if drafter is not None else spec.drafter
        tokenizer = tokenizer if tokenizer is not None else spec.tokenizer
    tok = load_tokenizer(tokenizer if tokenizer is not None else target_name)
    draft_model = None
    if drafter is not None:
        drafter_name = os.fspath(drafter)
        drafter_tok = load_tokenizer(drafter_name)
        check_same_vocabulary(tok, drafter_tok, (target_name, drafter_name))
        draft_model = load_model(drafter_name, device=device, dtype=dtype, **model_kwargs)
    target_model = load_model(target_name, device=device, dtype=dtype, **model_kwargs)
    return target_model, draft_model, tok


def is_local_model_dir(path: PathLike) -> bool:
    """Whether ``path`` is a folder with a model config (i.e. loads without any hub access)."""
    return (Path(path) / "config.json").is_file()
