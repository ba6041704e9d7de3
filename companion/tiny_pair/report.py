"""``pair-report``: check a saved pair against its manifest and re-measure its figures on this machine."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from companion.tiny_pair import chat_corpus as chat_mod
from companion.tiny_pair import corpus as corpus_mod
from companion.tiny_pair.pair_folder import (  # noqa: F401 (re-exported: where callers found them first)
    PAIR_PARTS, PairFolderError, pair_config, read_pair_manifest, read_pair_prompts, verify_files)


def pair_report(pair_dir: str | Path, *, recompute: bool = True, speed: bool = True,
                progress: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(manifest, fresh): the stored manifest and what was re-checked/re-measured now.

    ``fresh`` holds ``files_ok``/``files_bad`` (sha256 check), and when asked ``figures``
    (held-out and greedy figures recomputed with the saved weights in float32 on the CPU, on this
    interpreter's standard library and the chat generator; ``corpus_note`` says whether it is the training
    corpus) and
    ``speed`` (load time and greedy tokens/s).
    """
    import torch

    from companion.models import load_pair
    from companion.tiny_pair.evaluate import evaluate_pair, measure_speed, torch_threads
    from companion.tiny_pair.windows import answer_weights, token_stream, windows

    pair_dir = Path(pair_dir)
    manifest = read_pair_manifest(pair_dir)
    cfg = pair_config(manifest, pair_dir / "manifest.json")
    bad = verify_files(pair_dir, manifest)
    fresh: dict[str, Any] = {"files_ok": not bad, "files_bad": bad}
    prompts = read_pair_prompts(pair_dir)
    with torch_threads(cfg.num_threads):
        if recompute:
            files = corpus_mod.load_corpus(max_files=cfg.max_files)
            digest = corpus_mod.corpus_digest(files)
            same = digest == manifest["corpus"]["digest_sha256"]
            fresh["corpus_note"] = ("this interpreter's standard library is the training corpus (digest matches)" if same
                                    else "this interpreter's standard library differs from the training corpus "
                                         f"(Python {manifest['corpus']['python']}): fresh figures use its own held-out split")
            target, drafter, tok = load_pair(pair_dir / "target", pair_dir / "drafter", device="cpu",
                                             dtype=torch.float32)
            assert drafter is not None
            _, held = corpus_mod.split_corpus(files)
            held_weights = None
            if "chat_digest_sha256" in manifest["corpus"]:
                # A chat build: its held-out text is the chat generator's "eval" stream on the held-out files,
                # scored where the build's training loss was (as the build itself scored it).
                held_texts = chat_mod.conversations(chat_mod.make_material(held), cfg.seed, cfg.eval_conversations,
                                                    "eval", cfg.task_set)
                held_weights = windows(answer_weights(tok, held_texts, cfg.answer_only_loss).long(), cfg.seq_len)
            else:  # a build of the earlier, stdlib-only recipe: the held-out files themselves
                held_texts = [f.text for f in held]
            held_windows = windows(token_stream(tok, held_texts), cfg.seq_len)
            fresh["figures"] = evaluate_pair(
                target, drafter, tok, held_windows, cfg.eval_max_tokens,
                [p.text for p in prompts[: cfg.greedy_prompts]], cfg.greedy_steps, progress=progress,
                held_weights=held_weights,
            ).to_dict()
            if "chat_digest_sha256" in manifest["corpus"]:
                # Per task, on the regime's prompts: exact-match accuracy and the uncertain steps.
                from companion.tiny_pair.tasks_report import task_table

                eos = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")})
                fresh["tasks"] = task_table(target, tok, prompts[: cfg.regime_prompts], chat_mod.make_material(held),
                                            cfg.seed, cfg.regime_steps, eos, task_set=cfg.task_set)
        if speed:
            n_new = (manifest.get("speed") or {}).get("new_tokens_per_prompt", cfg.greedy_steps)
            fresh["speed"] = measure_speed(pair_dir, [p.text for p in prompts[:3]], new_tokens=n_new)
    return manifest, fresh
