"""``build_drafter``: SmolLM2's drafter from scratch, resumable, written all at once.

Stages: (1) the target's greedy answers to the training split of the chat requests (a harvest
in ``<checkpoint-dir>/answers``, resumed shard by shard); (2) training (a checkpoint every
``checkpoint_every`` steps in ``<checkpoint-dir>/train.pt``); (3) the drafter's folder:
``config.json``, ``generation_config.json``, ``model.safetensors`` (in ``save_dtype``, every
weight but the input embedding, which is the target's) and ``manifest.json`` (recipe, data,
training curve, agreement on a validation share of the training split, package versions,
sha256 of every file). The folder is written beside ``out``
and renamed into place at the end, so an interrupted build leaves the previous one intact.

The held-out split is never read here: the book measures the drafter on it.

The folder holds no tokenizer (3.5 MB) and no embedding (57 MB in bfloat16): its manifest
records the sha256 of the vocabulary it was trained on, and :func:`companion.models.weights.distilled_drafter.drafter_dir`
refuses it unless the converted target's tokenizer has that very vocabulary; it then assembles
a loadable folder from these files, the target's embedding and the target's tokenizer.
"""
from __future__ import annotations

import copy
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from companion import atomic
from companion.models.distill.config import DrafterConfig, init_layer_list
from companion.models.distill.data import harvest_answers, load_examples
from companion.models.devices import torch_threads
from companion.models.distill.train import agreement, make_drafter, train
from companion.models.shortlist_llama import SHARED_EMBEDDING_KEY

MANIFEST_NAME = "manifest.json"
#: Share of the training split's requests (the last ones, in the set's order) kept out of training
#: to report agreement on answers the drafter did not fit.
VALIDATION_SHARE = 0.1


def split_validation(items: list) -> tuple[list, list]:
    """``(fit, validation)``: the last ``VALIDATION_SHARE`` of ``items`` (at least one) held out, in order."""
    n_val = max(1, round(VALIDATION_SHARE * len(items)))
    return items[:-n_val], items[-n_val:]


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file in ``root`` but the manifest."""
    from companion.models.weights.fetch import file_sha256

    return {p.name: file_sha256(p) for p in sorted(root.iterdir()) if p.is_file() and p.name != MANIFEST_NAME}


def package_versions() -> dict[str, str]:
    """The versions of Python, torch, transformers and safetensors, by name."""
    import safetensors
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "safetensors": safetensors.__version__}


def build_drafter(cfg: DrafterConfig, out: str | os.PathLike[str], *, checkpoint_dir: str | os.PathLike[str],
                  progress: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the drafter of ``cfg`` into ``out``; return its manifest. Rerun after an interruption to resume."""
    from companion.models.loading import load_pair, vocabulary_sha256
    from companion.prompts.sets import load_prompts

    out = Path(out).resolve()
    ckpt = Path(checkpoint_dir).resolve()
    ckpt.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    prompts = load_prompts("chat-requests-train")
    if cfg.n_prompts:
        if cfg.n_prompts > len(prompts):
            raise ValueError(f"n_prompts {cfg.n_prompts}: the training split has only {len(prompts)} requests")
        prompts = prompts[: cfg.n_prompts]
    with torch_threads(cfg.num_threads):
        target, _, tok = load_pair("smollm2", False, device="cpu", dtype="float32")
        t0 = time.perf_counter()
        harvest_answers(target, tok, prompts, ckpt / "answers", answer_steps=cfg.answer_steps,
                        batch_size=cfg.harvest_batch_size, progress=progress)
        data_seconds = time.perf_counter() - t0
        examples = load_examples(ckpt / "answers", tok, prompts)
        fit, val = split_validation(examples)
        model = make_drafter(cfg, target)
        pad_id = int(tok.pad_token_id)
        log_train = train(model, fit, cfg, checkpoint=ckpt / "train.pt", pad_id=pad_id, progress=progress, log=log)
        saved = copy.deepcopy(model).to(getattr(torch, cfg.save_dtype))
        # Agreement of the model as saved (rounded to save_dtype), computed in float32 as it is loaded.
        rounded = copy.deepcopy(saved).float()
        fit_agree = agreement(rounded, fit[: max(1, len(fit) // 4)], pad_id)
        val_agree = agreement(rounded, val, pad_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    staging.chmod(0o755)
    try:
        # Everything but the embedding, which is the target's (frozen in training): the loader adds it back
        # from the converted target (companion.models.weights.distilled_drafter.drafter_dir), which keeps the asset within 25 MB.
        own = {k: v for k, v in saved.state_dict().items() if k != SHARED_EMBEDDING_KEY}
        saved.save_pretrained(staging, safe_serialization=True, state_dict=own)
        n_params = model.own_parameters()
        target_params = sum(p.numel() for p in target.parameters())
        manifest = {
            "what": "SmolLM2-135M-Instruct's drafter: the target's embedding (shared, not stored here), copies of "
                    "its layers " + cfg.init_layers + " and its final norm, and an output head over the first "
                    f"{cfg.shortlist_size} ids, distilled from the target's greedy answers (forward KL on its top-64 "
                    "distribution) to the training split of the project's chat requests",
            "recipe": cfg.to_dict(),
            "target": {"preset": "smollm2", "params": target_params},
            "drafter": {"params": n_params, "layers": model.config.num_hidden_layers,
                        "hidden_size": model.config.hidden_size, "init_layers": init_layer_list(cfg),
                        "shortlist_size": cfg.shortlist_size,
                        "shared_embedding_params": model.model.embed_tokens.weight.numel()},
            "vocabulary_sha256": vocabulary_sha256(tok),
            "data": {"prompt_set": "chat-requests-train", "requests": len(prompts), "fit_requests": len(fit),
                     "validation_requests": len(val), "fit_steps": sum(e.n_answer for e in fit),
                     "validation_steps": sum(e.n_answer for e in val), "harvest_seconds": round(data_seconds, 1)},
            "training": log_train,
            "agreement": {"fit_sample": fit_agree, "validation": val_agree},
            "versions": package_versions(),
            "threads": cfg.num_threads,
            "seconds": round(time.perf_counter() - started, 1),
        }
        manifest["files_sha256"] = file_hashes(staging)
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        atomic.replace_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"drafter: {n_params / 1e6:.2f}M parameters of its own; greedy agreement {val_agree['greedy_agreement']:.1%} on "
        f"{val_agree['steps']} validation steps; written to {out} in {manifest['seconds']:.0f} s")
    return manifest


def compare_files(new: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Files whose sha256 differs between two manifests (empty: the builds are byte-identical)."""
    a, b = new.get("files_sha256", {}), reference.get("files_sha256", {})
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
