"""Loading a target/drafter pair through the standard ``from_pretrained`` path.

``load_pair("qwen2.5-coder")`` gives Qwen2.5-Coder-1.5B-Instruct with Qwen2.5-Coder-0.5B-Instruct
as its drafter and ``load_pair("smollm2")`` SmolLM2-135M-Instruct with the drafter this project
distilled for it: real instruct LLMs whose weights come from the package index
(:mod:`companion.models.weights.convert`); ``load_pair("closed-world")`` (also called
``"default"``, its former name) the embedded tiny Qwen3 pair trained on a closed world, which ships
with the package. The same function loads hub ids or local folders
(``load_pair("Qwen/Qwen3-4B", "Qwen/Qwen3-0.6B")``), so every experiment runs the same code on
these and on the paper's models. Presets are the registry of :mod:`companion.models.presets`; a preset whose files must
first be made (a conversion from the package index, a distilled drafter) is made when it is
loaded.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any, Literal

import torch
from huggingface_hub.errors import HFValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from companion.models import shortlist_llama  # noqa: F401  (registers SmolLM2's drafter class with the Auto classes)
from companion.models.devices import cpu_has_bf16, resolve_device
from companion.models.presets import PRESETS, Source, preset_names
from companion.models.weights import WeightsUnavailableError, ensure_converted
from companion.models.weights.convert import RECORD as CONVERSION_RECORD
from companion.models.weights.distilled_drafter import drafter_dir
from companion.models.weights.integrity import folder_problem

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class PairSpec:
    """Where a named pair's parts come from: hub ids or local folders; ``tokenizer`` None means the target's.

    ``dtype``: the dtype the pair loads in on the CPU when none is asked for (None: float32);
    on CUDA every pair loads in bfloat16.
    """

    target: str
    drafter: str | None = None
    tokenizer: str | None = None
    dtype: str | None = None


def _made(part: Source, target_folder: str | None = None) -> str | None:
    """The folder (or hub id) of one part of a preset, made first where it must be."""
    if part.kind == "pretrained":
        return part.name
    if part.kind == "asset":
        return str(part.folder)
    if part.kind == "package_index":
        return str(ensure_converted(part.name))
    # distilled: the committed drafter, put together with the target's converted folder
    folder = Path(target_folder or "")
    drafter = drafter_dir(part.folder, folder, vocabulary_sha256(load_tokenizer(folder)))
    return str(drafter) if drafter else None


def resolve_preset(name: str, *, with_drafter: bool = True) -> PairSpec | None:
    """The parts of the preset ``name`` (:mod:`companion.models.presets`), or None if it is no preset.

    A part from the package index is fetched and converted first, and a distilled drafter put
    together with its target; such a pair loads on a CPU in its target's registry dtype.
    ``with_drafter=False``: the drafter is neither made nor checked (its ``drafter`` is then None),
    for callers that load the target alone. Raises :class:`WeightsUnavailableError` when a part
    cannot be made here.
    """
    preset = PRESETS.get(name)
    if preset is None:
        return None
    target = _made(preset.target_source)
    drafter = _made(preset.drafter_source, target) if with_drafter and preset.drafter_source is not None else None
    tokenizer = _made(preset.tokenizer_source) if preset.tokenizer_source is not None else None
    dtype = None
    if preset.target_source.kind == "package_index":
        from companion.models.weights import source

        tokenizer = tokenizer or target
        dtype = source(preset.target_source.name).dtype
    return PairSpec(target=target, drafter=drafter, tokenizer=tokenizer, dtype=dtype)


MODEL_DTYPES: tuple[str, ...] = ("bfloat16", "float16", "float32", "float64")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device, *, cpu_default: str | None = None,
                  say: Callable[[str], None] | None = None) -> torch.dtype:
    """``None`` means bfloat16 on CUDA (the paper's models' native dtype) and ``cpu_default`` (None:
    float32) on the CPU. A CPU default of bfloat16 becomes float32 on a CPU without native bf16
    (:func:`companion.models.devices.cpu_has_bf16`), and ``say`` is told so in one line.

    A name must be one of :data:`MODEL_DTYPES` (the floating dtypes a model computes in).
    """
    if dtype is None:
        if device.type == "cuda":
            return torch.bfloat16
        if cpu_default == "bfloat16" and not cpu_has_bf16():
            if say is not None:
                say("this CPU has no native bfloat16 (no avx512_bf16, amx_bf16 or bf16 flag): the models load in "
                    "float32 instead, slower and with other rounding than a bf16 run")
            return torch.float32
        dtype = cpu_default or "float32"
    if isinstance(dtype, str):
        if dtype not in MODEL_DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(MODEL_DTYPES)}")
        return getattr(torch, dtype)
    return dtype


def looks_like_local_path(name: PathLike) -> bool:
    """Whether ``name`` means a folder on this machine rather than a hub id.

    An existing path is local; so is anything a hub id cannot be: an absolute path, one starting
    with ``.`` or ``~``, or one with more than one ``/`` (hub ids are ``org/name``). A name such
    as ``models/target`` that does not exist is ambiguous and counts as a hub id, as
    ``from_pretrained`` treats it.
    """
    text = os.fspath(name)
    return (Path(text).expanduser().exists() or os.path.isabs(text) or text.startswith((".", "~"))
            or text.count("/") > 1 or "\\" in text)


def local_folder_problem(name: PathLike, kind: str) -> str | None:
    """Why the local folder ``name`` cannot hold a ``kind`` ("model" or "tokenizer"); None if it can.

    A model folder needs ``config.json``; a tokenizer folder ``tokenizer.json`` or
    ``tokenizer_config.json`` (what ``save_pretrained`` writes).
    """
    path = Path(os.fspath(name)).expanduser()
    if not path.exists():
        return "no such folder"
    if not path.is_dir():
        return "not a folder"
    needed = ("config.json",) if kind == "model" else ("tokenizer.json", "tokenizer_config.json")
    if not any((path / f).is_file() for f in needed):
        return f"not a {kind} folder saved with save_pretrained (no {' or '.join(needed)} in it)"
    return None


def is_bare_name(name: PathLike) -> bool:
    """A name with no ``/`` that is no local path: a preset, a cached legacy id (``gpt2``) or a typo.

    Only ``org/name`` is worth a trip to the hub: a bare name is looked up in the local cache
    alone, so that a mistyped preset fails at once instead of after the hub's retries.
    """
    text = os.fspath(name)
    return "/" not in text and not looks_like_local_path(text)


def _bare_name_error(kind: str, name: str) -> WeightsUnavailableError:
    close = difflib.get_close_matches(name, preset_names(), n=1)
    hint = f" Did you mean the preset {close[0]!r}?" if close else ""
    return WeightsUnavailableError(
        f"Could not load the {kind} {name!r}: it is not a preset ({', '.join(preset_names())}), not a local folder, "
        f"and not in the local Hugging Face cache; a name without '/' is not looked up on the hub (hub ids look "
        f"like org/name, e.g. Qwen/Qwen3-1.7B).{hint}")


def _unavailable(kind: str, name: str, err: Exception) -> WeightsUnavailableError:
    """One line: what could not be loaded and what to do (a local path is never sent to the hub)."""
    first = str(err).splitlines()[0] if str(err) else ""
    if is_bare_name(name):
        return _bare_name_error(kind, name)
    if looks_like_local_path(name):
        problem = local_folder_problem(name, kind) or f"{type(err).__name__}: {first}"
        return WeightsUnavailableError(
            f"Could not load the {kind} {name!r}: {problem}. Pass a folder written by save_pretrained "
            f"(with its config.json and tokenizer files), or a hub id such as Qwen/Qwen3-1.7B.")
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE", "") not in ("", "0")
    return WeightsUnavailableError(
        f"Could not load the {kind} {name!r}: it is neither a local folder saved with save_pretrained nor in the "
        f"local Hugging Face cache{' (HF_HUB_OFFLINE is set)' if offline else ''}, and it cannot be downloaded here. "
        f"To fix: download it with `huggingface-cli download {name}` on a machine with network (then copy the cache, "
        f"see HF_HOME, to this machine), or pass a local path to a folder containing it; "
        f"without large models, use the embedded CPU pair (load_pair(\"default\")). "
        f"Underlying error: {type(err).__name__}: {first}"
    )


def _check_local(kind: str, name: str) -> None:
    """A local path must be a folder holding a ``kind`` before ``from_pretrained`` sees it (its errors
    for an empty or wrong folder range from a hub lookup to a request to install protobuf)."""
    if looks_like_local_path(name) and (problem := local_folder_problem(name, kind)) is not None:
        raise WeightsUnavailableError(
            f"Could not load the {kind} {name!r}: {problem}. Pass a folder written by save_pretrained "
            f"(with its config.json and tokenizer files), or a hub id such as Qwen/Qwen3-1.7B.")


def _check_intact(kind: str, name: str) -> None:
    """A local folder the companion wrote (it holds a record) is loaded only when its files are the ones the record
    lists, sha256 included (:func:`~companion.models.weights.integrity.folder_problem`: read only when a file
    changed since its last check); a damaged one is refused in one line."""
    path = Path(name).expanduser()
    if not looks_like_local_path(name) or not (path / CONVERSION_RECORD).is_file():
        return
    try:
        problem = folder_problem(path)
    except OSError as err:
        problem = f"a file cannot be read ({type(err).__name__}: {err})"
    if problem is not None:
        raise WeightsUnavailableError(
            f"Could not load the {kind} {name!r}: the folder is damaged ({problem}), so it is not loaded: delete it "
            f"and load its preset again (or run `companion fetch-weights`), which makes it afresh")


def damaged_file(folder: Path, kind: str) -> str | None:
    """The first file of a ``save_pretrained`` folder that a ``kind`` ("model" or "tokenizer") loads and that cannot
    be what its name says (one phrase), or None.

    Each JSON file must parse and each ``*.safetensors`` must have a readable header: what a load
    that failed is explained by, rather than by the message of the step that tripped on it (a
    garbage ``tokenizer.json`` makes transformers ask for the protobuf library).
    """
    import json

    from safetensors import safe_open

    if kind == "model":
        jsons = [folder / n for n in ("config.json", "generation_config.json", "model.safetensors.index.json")]
        weights = sorted(folder.glob("*.safetensors"))
    else:
        jsons = sorted(p for p in folder.glob("*.json") if p.name.startswith(("tokenizer", "special_tokens", "vocab",
                                                                              "added_tokens")))
        weights = []
    for path in jsons:
        if not path.is_file():
            continue
        try:
            json.loads(path.read_bytes())
        except (OSError, ValueError) as err:
            return f"{path.name} is damaged (not JSON: {' '.join(str(err).split())[:80]})"
    for path in weights:
        try:
            with safe_open(str(path), framework="pt") as f:
                list(f.keys())
        except Exception as err:  # SafetensorError, OSError: a header that cannot be read
            return f"{path.name} is damaged ({' '.join(str(err).split())[:80]})"
    return None


def _load_failure(kind: str, name: str, err: Exception) -> WeightsUnavailableError:
    """One line for a load of the local folder ``name`` that failed: the damaged file when one is found."""
    first = " ".join(str(err).split())[:200] or type(err).__name__
    cause = damaged_file(Path(name).expanduser(), kind)
    problem = cause if cause is not None else f"{type(err).__name__}: {first}"
    return WeightsUnavailableError(
        f"Could not load the {kind} {name!r}: {problem}. Restore the folder, or write it again with save_pretrained "
        f"(a folder of the weights cache: delete it and run `companion fetch-weights`).")


def _say(line: str) -> None:
    import sys

    print(f"note: {line}", file=sys.stderr, flush=True)


def load_tokenizer(name_or_path: PathLike, **kwargs: Any) -> PreTrainedTokenizerBase:
    """``AutoTokenizer.from_pretrained`` with a helpful error when it is not available offline."""
    name = os.fspath(name_or_path)
    _check_local("tokenizer", name)
    if is_bare_name(name):
        kwargs.setdefault("local_files_only", True)  # see is_bare_name
    if (Path(name).expanduser() / CONVERSION_RECORD).is_file():
        # A folder this companion converted from a GGUF file. transformers 4.57.3 to 4.57.x take
        # any local folder whose config names a transformers version in that range for a Mistral
        # tokenizer with a broken regex and warn; ours are Qwen's or SmolLM2's own pattern, checked
        # by tests/test_weights.py, so the warning is a misfire: say the regex is right.
        kwargs.setdefault("fix_mistral_regex", False)
    _check_intact("tokenizer", name)
    try:
        return AutoTokenizer.from_pretrained(name, **kwargs)
    except WeightsUnavailableError:
        raise
    except Exception as err:  # noqa: BLE001  a local folder's files can fail transformers in any way
        if looks_like_local_path(name) and Path(name).expanduser().is_dir():
            raise _load_failure("tokenizer", name, err) from err
        if isinstance(err, (OSError, HFValidationError)):  # HFValidationError: neither a folder nor a hub id
            raise _unavailable("tokenizer", name, err) from err
        raise


def load_model(
    name_or_path: PathLike, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` on ``device`` in ``dtype`` (auto as documented), in eval mode."""
    name = os.fspath(name_or_path)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev, say=_say)
    _check_local("model", name)
    if is_bare_name(name):
        kwargs.setdefault("local_files_only", True)  # see is_bare_name
    _check_intact("model", name)
    try:
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dt, **kwargs)
    except WeightsUnavailableError:
        raise
    except Exception as err:  # noqa: BLE001  a local folder's files can fail transformers in any way
        if looks_like_local_path(name) and Path(name).expanduser().is_dir():
            raise _load_failure("model", name, err) from err
        if isinstance(err, (OSError, HFValidationError)):
            raise _unavailable("model", name, err) from err
        raise
    return model.to(dev).eval()


def vocabulary_sha256(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of a tokenizer's token -> id map (sorted by id): what a drafter must share with its target."""
    import hashlib
    import json

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=True).encode()).hexdigest()


def check_same_vocabulary(a: PreTrainedTokenizerBase, b: PreTrainedTokenizerBase, names: tuple[str, str]) -> None:
    """Raise ``ValueError`` unless both tokenizers have the same size and the same token -> id map.

    Speculative decoding compares the two models' distributions id by id, which is meaningless
    when an id denotes different strings in the two models.
    """
    if len(a) != len(b):
        raise ValueError(
            f"tokenizers differ: {names[0]} has {len(a)} tokens, {names[1]} has {len(b)}; "
            "the target, the drafter and the tokenizer must share one vocabulary")
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        diff = sorted(set(va.items()) ^ set(vb.items()), key=lambda kv: kv[1])[:5]
        raise ValueError(
            f"tokenizers differ: {names[0]} and {names[1]} map tokens to different ids "
            f"(first differences: {diff}); the target, the drafter and the tokenizer must share one vocabulary")


def load_pair(
    target: PathLike = "default",
    drafter: PathLike | None | Literal[False] = None,
    tokenizer: PathLike | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    **model_kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedModel | None, PreTrainedTokenizerBase]:
    """Load ``(target, drafter, tokenizer)``; models in eval mode on ``device`` in ``dtype``.

    ``target`` is a preset name (see :func:`preset_names`; ``"closed-world"``, also ``"default"``,
    is the embedded pair and brings its drafter; ``"smollm2"`` is SmolLM2-135M-Instruct), a hub id or a local folder. ``drafter`` None means the preset's drafter
    (none for a hub id or folder); ``False`` means no drafter even when the preset has one (None
    is then returned in its place). The tokenizer comes from ``tokenizer`` if given, else from
    the target. Every tokenizer involved must have the same vocabulary: the drafter's own, and
    the target folder's own when ``tokenizer`` names another one (``ValueError`` naming both
    otherwise). Tokenizers are loaded and compared before any weights.
    ``WeightsUnavailableError`` (an ``OSError``) says what to do when something is not available
    offline.
    """
    target_name = os.fspath(target)
    # The preset's drafter is made (and its files checked) only when it is the one asked for.
    spec = resolve_preset(target_name, with_drafter=drafter is None)
    if spec is not None and dtype is None and spec.dtype is not None:
        dtype = resolve_dtype(None, resolve_device(device), cpu_default=spec.dtype, say=_say)
    if spec is not None:
        target_name = spec.target
        drafter = drafter if drafter is not None else spec.drafter
        tokenizer = tokenizer if tokenizer is not None else spec.tokenizer
    tok_name = os.fspath(tokenizer) if tokenizer is not None else target_name
    tok = load_tokenizer(tok_name)
    tok_label = f"target {target_name!r}" if tok_name == target_name else f"tokenizer {tok_name!r}"
    if tok_name != target_name and local_folder_problem(target_name, "tokenizer") is None:
        check_same_vocabulary(tok, load_tokenizer(target_name), (tok_label, f"target {target_name!r}"))
    draft_model = None
    if drafter is not None and drafter is not False:
        drafter_name = os.fspath(drafter)
        drafter_tok = load_tokenizer(drafter_name)
        check_same_vocabulary(tok, drafter_tok, (tok_label, f"drafter {drafter_name!r}"))
        draft_model = load_model(drafter_name, device=device, dtype=dtype, **model_kwargs)
    target_model = load_model(target_name, device=device, dtype=dtype, **model_kwargs)
    return target_model, draft_model, tok

