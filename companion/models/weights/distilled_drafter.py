"""A committed drafter that shares its target's embedding, assembled into a loadable cache folder.

SmolLM2-135M-Instruct's drafter (``companion build-drafter``, committed in
``companion/assets/smollm2_drafter``) stores every weight but its input embedding, which is the
target's: the asset stays small. :func:`drafter_dir` checks the committed files against their
manifest and builds, once, a cache folder holding the drafter's config, its weights with the
target's embedding added (in the drafter's dtype) and the target's tokenizer files, so that it
loads like any ``save_pretrained`` folder.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from companion.atomic import replace_dir
from companion.models.weights.convert import as_one_line, cache_root, locked, remove_leftovers, safetensors_errors
from companion.models.weights.errors import WeightsUnavailableError
from companion.models.weights.integrity import file_sha256, folder_problem, seal


def drafter_dir(asset: Path, target_folder: Path, vocabulary_sha256: str, *, root: Path | None = None) -> Path | None:
    """A loadable folder of the drafter committed in ``asset`` for ``target_folder``; None if none is committed.

    The manifest (``asset/manifest.json``) records the sha256 of the vocabulary the drafter was
    trained on, which must be ``vocabulary_sha256`` (the converted target tokenizer's), and the
    sha256 of each of its files, which are checked. The folder is named after the drafter's
    weights and the target's conversion folder, so a new conversion of the target makes a new one.
    Its record lists each of its files with its size and sha256: a folder whose files are not
    those (checked once per change, :func:`~companion.models.weights.integrity.folder_problem`),
    or whose record predates the digests, is built again before it is used.
    """
    manifest_path = asset / "manifest.json"
    if not manifest_path.is_file():
        return None
    try:
        manifest = json.loads(manifest_path.read_text())
        files = dict(manifest["files_sha256"])
        trained_on = str(manifest["vocabulary_sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise WeightsUnavailableError(f"{manifest_path} is not a drafter manifest ({type(err).__name__}: {err}); rebuild "
                                      f"it with `companion build-drafter --out {asset}`") from None
    if trained_on != vocabulary_sha256:
        raise WeightsUnavailableError(
            f"the drafter in {asset} was trained on another vocabulary (sha256 {trained_on[:16]}...) than the converted "
            f"target's ({vocabulary_sha256[:16]}...); rebuild it with `companion build-drafter`")
    weights = files.get("model.safetensors")
    if not weights:
        raise WeightsUnavailableError(f"{manifest_path} lists no model.safetensors")
    root = root or cache_root()
    folder = root / f"{asset.name}-{weights[:16]}-{target_folder.name}"
    try:
        return _built(asset, files, manifest_path, target_folder, root, folder)
    except (OSError, *safetensors_errors()) as err:
        raise as_one_line(err, root, f"assembling the drafter {folder.name}") from err


def _built(asset: Path, files: dict, manifest_path: Path, target_folder: Path, root: Path, folder: Path) -> Path:
    """``folder``, built first unless it is intact (see :func:`drafter_dir`)."""
    if folder_problem(folder) is None:
        return folder
    for name, digest in files.items():
        path = asset / name
        if not path.is_file() or file_sha256(path) != digest:
            raise WeightsUnavailableError(f"{path} is missing or damaged (its sha256 is not the {digest[:16]}... that "
                                          f"{manifest_path.name} records); restore it from the repository")
    with locked(root, folder.name):
        if folder_problem(folder) is None:
            return folder
        remove_leftovers(root, folder)  # what a killed build left, and a damaged build (replaced below)
        tmp = root / f".{folder.name}.partial-{os.getpid()}"
        try:
            tmp.mkdir(parents=True)
            for name in files:
                if name != "model.safetensors":
                    shutil.copyfile(asset / name, tmp / name)
            _assemble_weights(asset / "model.safetensors", target_folder / "model.safetensors",
                              tmp / "model.safetensors")
            for f in sorted(target_folder.iterdir()):
                if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab", "merges")):
                    shutil.copyfile(f, tmp / f.name)
            seal(tmp, {"drafter_files_sha256": files, "target": target_folder.name})
            replace_dir(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _assemble_weights(own: Path, target_weights: Path, out: Path) -> None:
    """``own``'s tensors plus the target's input embedding (cast to their dtype), as one safetensors file."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from companion.models.shortlist_llama import SHARED_EMBEDDING_KEY

    tensors = load_file(own)
    if SHARED_EMBEDDING_KEY in tensors:
        raise WeightsUnavailableError(f"{own} holds its own {SHARED_EMBEDDING_KEY}; the drafter shares the target's")
    dtypes = {t.dtype for t in tensors.values()}
    if len(dtypes) != 1:
        raise WeightsUnavailableError(f"{own} mixes dtypes {sorted(map(str, dtypes))}; a drafter is saved in one")
    with safe_open(str(target_weights), framework="pt") as f:
        tensors[SHARED_EMBEDDING_KEY] = f.get_tensor(SHARED_EMBEDDING_KEY).to(dtypes.pop()).contiguous()
    save_file(tensors, str(out), metadata={"format": "pt"})
