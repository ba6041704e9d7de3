"""Training recipe of the embedded pair: tokenizer, target (next-token loss), drafter (distillation).

``build_pair(cfg, out_dir)`` does everything offline and deterministically for a given seed, thread
count and package versions: it writes ``tokenizer/``, ``target/``, ``drafter/`` (each loadable with
``from_pretrained``), ``prompts.jsonl`` and ``manifest.json`` into a staging folder next to
``out_dir`` and renames it into place only when everything succeeded.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from companion import atomic
from companion.tiny_pair import chat_corpus as chat_mod
from companion.tiny_pair import corpus as corpus_mod
from companion.tiny_pair.config import ModelSpec, StageSpec, TrainConfig
from companion.tiny_pair.evaluate import assisted_acceptance, evaluate_pair, measure_speed, regime, torch_threads
from companion.tiny_pair.pair_folder import MANIFEST_NAME, file_hashes, sha256_file
from companion.tiny_pair.prompt_set import write_prompts_jsonl
from companion.tiny_pair.tasks_report import format_task_table, task_table
from companion.tiny_pair.tokenizer import DOC_SEPARATOR, train_bpe, wrap
from companion.tiny_pair.windows import answer_weights, token_stream, windows

PROMPTS_NAME = "prompts.jsonl"


@dataclass
class StageLog:
    """Loss trace of one stage: per-step losses and wall time."""

    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0

    def summary(self, n_points: int = 20) -> dict[str, Any]:
        """Compact record for the manifest: first/last window means and an evenly spaced mean curve."""
        k = max(1, len(self.losses) // n_points)
        curve = [sum(self.losses[i:i + k]) / len(self.losses[i:i + k]) for i in range(0, len(self.losses), k)]
        w = max(1, len(self.losses) // 10)
        return {
            "steps": len(self.losses),
            "tokens": self.tokens,
            "seconds": round(self.seconds, 1),
            "tokens_per_second": round(self.tokens / self.seconds, 1) if self.seconds else None,
            "first_loss_mean": _mean(self.losses[:w]),
            "last_loss_mean": _mean(self.losses[-w:]),
            "curve_every_steps": k,
            "curve": [round(x, 4) for x in curve],
        }


@dataclass
class BuildResult:
    """What ``build_pair`` produced: the final folder, the manifest written there, and the stage logs."""

    out_dir: Path
    manifest: dict[str, Any]
    target_log: StageLog | None  # None when the target stage was reused
    drafter_log: StageLog


def _mean(xs: list[float]) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def make_model(spec: ModelSpec, cfg: TrainConfig, vocab_size: int, eos_id: int, pad_id: int,
               stop_ids: list[int] | None = None) -> Qwen3ForCausalLM:
    """A freshly initialised ``Qwen3ForCausalLM`` of the given shape (weights from the current RNG state).

    ``eos_id`` goes to the model config; generation stops at ``stop_ids`` (default ``[eos_id]``), as
    Qwen3's chat models stop at ``<|im_end|>`` or ``<|endoftext|>``.
    """
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        attention_dropout=0.0,
        use_cache=True,
    )
    model = Qwen3ForCausalLM(config)
    model.generation_config.eos_token_id = stop_ids if stop_ids else eos_id
    model.generation_config.pad_token_id = pad_id
    return model


def n_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def batch_order(n_windows: int, n_batches: int, batch_size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Window indices for each step: a fresh seeded permutation per epoch, consumed in order."""
    perm = torch.randperm(n_windows, generator=generator)
    pos = 0
    for _ in range(n_batches):
        if pos + batch_size > n_windows:
            perm = torch.randperm(n_windows, generator=generator)
            pos = 0
        yield perm[pos:pos + batch_size]
        pos += batch_size


def _lr_at(step: int, st: StageSpec) -> float:
    if step < st.warmup_steps:
        return st.lr * (step + 1) / st.warmup_steps
    frac = (step - st.warmup_steps) / max(1, st.steps - st.warmup_steps)
    return st.lr * (st.min_lr_ratio + (1 - st.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def _optimizer(model: torch.nn.Module, st: StageSpec) -> torch.optim.Optimizer:
    # Weight decay on matrices only; norms (1-D) are left alone, as is usual for transformers.
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": st.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=st.lr, betas=(0.9, 0.95), eps=1e-8, foreach=False,
    )


def _run_stage(
    model: Qwen3ForCausalLM,
    data: torch.Tensor,
    st: StageSpec,
    generator: torch.Generator,
    loss_fn,
    desc: str,
    progress: bool,
    checkpoint: Path | None = None,
    checkpoint_every: int = 200,
) -> StageLog:
    """Train ``model`` for ``st.steps`` steps; with ``checkpoint``, save there every ``checkpoint_every`` steps
    and resume from it when it exists (the batch order is replayed, so a resumed run equals an uninterrupted one)."""
    log = StageLog()
    opt = _optimizer(model, st)
    start = 0
    if checkpoint is not None and checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start, log.losses, log.tokens, log.seconds = state["step"], state["losses"], state["tokens"], state["seconds"]
    model.train()
    t0 = time.perf_counter() - log.seconds
    bar = tqdm(total=st.steps, initial=start, desc=desc, disable=not progress, dynamic_ncols=True)
    for step, idx in enumerate(batch_order(data.shape[0], st.steps, st.batch_size, generator)):
        if step < start:
            continue
        if checkpoint is not None and step > start and step % checkpoint_every == 0:
            tmp = checkpoint.with_suffix(".tmp")
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "losses": log.losses,
                        "tokens": log.tokens, "seconds": time.perf_counter() - t0}, tmp)
            os.replace(tmp, checkpoint)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, st)
        batch = data[idx]
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), st.grad_clip)
        opt.step()
        log.losses.append(float(loss.detach()))
        log.tokens += split_batch(batch)[0].numel()
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{log.losses[-1]:.3f}")
        if not progress and step % 50 == 0:
            print(f"{desc} step {step}/{st.steps} loss {log.losses[-1]:.4f} "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
    bar.close()
    log.seconds = time.perf_counter() - t0
    model.eval()
    return log


def split_batch(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, weights)`` of a batch: ``(B, L)`` ids weigh 1 everywhere; ``(B, 2, L)`` carries weights in row 1."""
    if batch.dim() == 2:
        return batch, torch.ones(batch.shape, dtype=torch.float32)
    return batch[:, 0], batch[:, 1].float()


def lm_loss(model: Qwen3ForCausalLM, batch: torch.Tensor) -> torch.Tensor:
    """Weighted mean next-token cross entropy (nats): sum_j w_j CE_j / sum_j w_j over predicted tokens j."""
    ids, w = split_batch(batch)
    logits = model(input_ids=ids).logits[:, :-1].float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none")
    w = w[:, 1:].reshape(-1)
    return (ce * w).sum() / w.sum().clamp_min(1.0)


def distill_loss_fn(teacher: Qwen3ForCausalLM):
    """Forward KL(p_teacher || q_student) per position, weighted as :func:`lm_loss`: the student matches the
    teacher's full distribution where the target is trained (the position before each weighted token)."""

    def loss(student: Qwen3ForCausalLM, batch: torch.Tensor) -> torch.Tensor:
        ids, w = split_batch(batch)
        with torch.no_grad():
            log_p = F.log_softmax(teacher(input_ids=ids).logits.float(), dim=-1)
        log_q = F.log_softmax(student(input_ids=ids).logits.float(), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(-1)[:, :-1]
        w = w[:, 1:]
        return (kl * w).sum() / w.sum().clamp_min(1.0)

    return loss


def _round_trip_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Round weights to the storage dtype in place, so later stages see exactly what gets saved."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(p.dtype))


def package_versions() -> dict[str, str]:
    import tokenizers
    import transformers
    import safetensors

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


def _save_model(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path, dtype: torch.dtype) -> None:
    # Convert a copy: .to(dtype) would also round non-persistent float buffers (rotary inv_freq) in
    # the live model, which then would no longer equal a model loaded from disk.
    copy.deepcopy(model).to(dtype).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)  # each model folder is self-contained


def build_pair(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    progress: bool = True,
    stdlib: Path | None = None,
    log=print,
    reuse_target: str | Path | None = None,
    checkpoint_dir: str | Path | None = None,
) -> BuildResult:
    """Train tokenizer, target and drafter from ``cfg``; write the pair, prompts and manifest to ``out_dir``.

    Nothing is left half-written: all output goes to a staging folder beside ``out_dir`` that is
    renamed into place at the end (and removed on failure). ``reuse_target``: a finished pair folder
    whose tokenizer and target this config would reproduce exactly (checked); they are loaded instead
    of retrained, to iterate on the drafter stage. ``checkpoint_dir``: where each stage saves its state
    every 200 steps and resumes from (rerun the same command after an interruption).
    """
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary shared folder
    try:
        result = _build_into(cfg, staging, progress=progress, stdlib=stdlib, log=log,
                             reuse_target=Path(reuse_target).resolve() if reuse_target is not None else None,
                             checkpoint_dir=Path(checkpoint_dir).resolve() if checkpoint_dir is not None else None)
        atomic.replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.out_dir = out_dir
    return result


# Config fields that determine the tokenizer and the target; a target may be reused only if they all match.
TARGET_FIELDS: tuple[str, ...] = ("seed", "vocab_size", "max_files", "seq_len", "max_position_embeddings",
                                  "rope_theta", "target", "target_stage", "save_dtype", "num_threads",
                                  "chat_conversations", "natural_share", "answer_only_loss")


def _check_reusable(cfg: TrainConfig, pair_dir: Path, digest: str) -> dict[str, Any]:
    """The manifest of ``pair_dir`` if its tokenizer and target are exactly what ``cfg`` would train here.

    Same target-side config, same corpus, same package versions, untouched files: then the target
    stage is deterministic, so loading it is equivalent to retraining it.
    """
    manifest = json.loads((pair_dir / MANIFEST_NAME).read_text())
    problems = []
    ours = cfg.to_dict()
    for key in TARGET_FIELDS:
        if manifest["config"].get(key) != ours[key]:
            problems.append(f"config {key}: {manifest['config'].get(key)} != {ours[key]}")
    if manifest["corpus"]["digest_sha256"] != digest:
        problems.append("corpus digest differs")
    for key, version in package_versions().items():
        if manifest["versions"].get(key) != version:
            problems.append(f"{key} {manifest['versions'].get(key)} != {version}")
    for rel, h in manifest["files_sha256"].items():
        if rel.startswith(("tokenizer/", "target/")) and sha256_file(pair_dir / rel) != h:
            problems.append(f"{rel} does not match its manifest")
    if problems:
        raise ValueError(f"cannot reuse the target of {pair_dir}: " + "; ".join(problems))
    return manifest


def _chat_stream_windows(cfg: TrainConfig, tokenizer: PreTrainedTokenizerFast, chat_texts: list[str],
                         natural_texts: list[str]) -> tuple[torch.Tensor, int, int]:
    """Training windows: every window of the chat stream plus a seeded sample of natural-text windows.

    The natural windows make up ``cfg.natural_share`` of the result (all of them if there are fewer).
    Returns ``(windows, chat_tokens, natural_tokens)`` with the token counts of the two streams.
    """
    chat_stream = token_stream(tokenizer, chat_texts)
    nat_stream = token_stream(tokenizer, natural_texts)
    chat_weights = answer_weights(tokenizer, chat_texts, cfg.answer_only_loss)
    nat_weights = torch.ones(nat_stream.shape, dtype=torch.float32)
    # Row 0: token ids, row 1: loss weights (as ids' dtype, so one tensor indexes both).
    chat_w = torch.stack([windows(chat_stream, cfg.seq_len), windows(chat_weights.long(), cfg.seq_len)], 1)
    nat_w = torch.stack([windows(nat_stream, cfg.seq_len), windows(nat_weights.long(), cfg.seq_len)], 1)
    share = cfg.natural_share
    k = 0 if share <= 0 else min(nat_w.shape[0], round(share / (1 - share) * chat_w.shape[0]))
    pick = torch.randperm(nat_w.shape[0], generator=torch.Generator().manual_seed(cfg.seed + 2))[:k]
    return torch.cat([chat_w, nat_w[pick.sort().values]]), int(chat_stream.numel()), int(nat_stream.numel())


def repetition_windows(tokenizer: PreTrainedTokenizerFast, n_windows: int, seq_len: int, seed: int,
                       length: int = 16, words: int = 512) -> torch.Tensor:
    """``[n_windows, 2, seq_len]`` windows (ids, weights) of the copy curriculum: back-to-back
    sequences of ``length`` random tokens (drawn from ``words`` ordinary tokens of the vocabulary),
    each written twice, ``w_1 .. w_n \n w_1 .. w_n \n``, loss on every token. The first copy is
    unpredictable; the second rewards attending to where the current token last occurred and
    copying what followed it (induction-style copying). With ``length = 16`` and short windows
    this is the setting of :mod:`companion.tiny_pair.copy_probe`, where copying forms within
    ~150 steps of batch 32."""
    rng = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in special]
    pick = torch.randperm(len(ordinary), generator=rng)[:words]
    vocab = torch.tensor(ordinary)[pick]
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][-1]
    per = 2 * (length + 1)
    n_seq = -(-seq_len // per)
    seqs = vocab[torch.randint(len(vocab), (n_windows, n_seq, length), generator=rng)]
    nl = torch.full((n_windows, n_seq, 1), newline, dtype=torch.long)
    ids = torch.cat([seqs, nl, seqs, nl], 2).reshape(n_windows, -1)[:, :seq_len]
    return torch.stack([ids, torch.ones_like(ids)], 1)


def _description(cfg: TrainConfig) -> str:
    """The manifest's one-paragraph description of a build of ``cfg``."""
    corpus = {"mixed": "answers mostly determined by their prompts: a stand-in for a chat LLM's greedy regime",
              "closed": "answers from memorised facts and closed-set rules, with a few valid alternatives placed on "
                        "purpose: a stand-in for a chat LLM's greedy regime and its uncertain steps"}[cfg.task_set]
    natural = " mixed with Python standard library source" if cfg.natural_share > 0 else ""
    return (f"Embedded Qwen3ForCausalLM target/drafter pair trained offline on a rule-generated chat corpus "
            f"({corpus}){natural}; the drafter is distilled from the target (forward KL).")


def _build_into(cfg: TrainConfig, root: Path, *, progress: bool, stdlib: Path | None, log,
                reuse_target: Path | None = None, checkpoint_dir: Path | None = None) -> BuildResult:
    t_start = time.perf_counter()
    save_dtype = getattr(torch, cfg.save_dtype)
    with torch_threads(cfg.num_threads):
        # --- corpus and split
        files = corpus_mod.load_corpus(stdlib, max_files=cfg.max_files)
        train_files, held_files = corpus_mod.split_corpus(files)
        if not held_files or not train_files:
            raise RuntimeError("corpus selection left an empty train or held-out split; raise max_files")
        digest = corpus_mod.corpus_digest(files)
        log(f"corpus: {len(files)} files ({len(train_files)} train, {len(held_files)} held out), digest {digest[:16]}")
        mat_train, mat_held = chat_mod.make_material(train_files), chat_mod.make_material(held_files)
        chat_train = chat_mod.conversations(mat_train, cfg.seed, cfg.chat_conversations, "train", cfg.task_set)
        chat_eval = chat_mod.conversations(mat_held, cfg.seed, cfg.eval_conversations, "eval", cfg.task_set)
        chat_digest = hashlib.sha256("\x00".join(chat_train + chat_eval).encode("utf-8")).hexdigest()
        log(f"chat corpus: {len(chat_train)} training conversations from {len(mat_train.units)} stdlib units, "
            f"digest {chat_digest[:16]}")

        # --- tokenizer (trained on the training split only)
        reused = _check_reusable(cfg, Path(reuse_target), digest) if reuse_target is not None else None
        natural = [f.text for f in train_files]
        if reused is None:
            tokenizer = train_bpe(natural + chat_train, cfg.vocab_size)
        else:
            # Rebuilt exactly as train_bpe returns it, so every saved tokenizer file is byte-identical.
            tokenizer = wrap(Tokenizer.from_file(str(Path(reuse_target) / "tokenizer" / "tokenizer.json")))
        tokenizer.save_pretrained(root / "tokenizer")
        train_windows, chat_tokens, natural_tokens = _chat_stream_windows(cfg, tokenizer, chat_train, natural)
        held_stream = token_stream(tokenizer, chat_eval)
        held_weights = answer_weights(tokenizer, chat_eval, cfg.answer_only_loss).long()
        log(f"tokenizer: {len(tokenizer)} tokens; chat {chat_tokens} tokens, natural {natural_tokens}, "
            f"{train_windows.shape[0]} training windows; held-out {held_stream.numel()}")

        # --- target: next-token cross entropy
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        stop_ids = [eos, tokenizer.convert_tokens_to_ids(DOC_SEPARATOR)]
        ckpt = (lambda name: None if checkpoint_dir is None else Path(checkpoint_dir) / f"{name}.pt")
        if checkpoint_dir is not None:
            Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        if reused is None:
            torch.manual_seed(cfg.seed)
            target = make_model(cfg.target, cfg, len(tokenizer), eos, pad, stop_ids)
            stage_windows = train_windows
            if cfg.copy_share > 0:
                n_rep = round(cfg.copy_share / (1 - cfg.copy_share) * train_windows.shape[0])
                stage_windows = torch.cat([train_windows,
                                           repetition_windows(tokenizer, n_rep, cfg.seq_len, cfg.seed + 3)])
            if cfg.copy_warmup_steps > 0:
                # short windows of one repeated sequence, batch 32: the probe's setting
                warm = StageSpec(steps=cfg.copy_warmup_steps, batch_size=32, lr=1e-3, warmup_steps=30, min_lr_ratio=1.0)
                rep = repetition_windows(tokenizer, warm.steps * warm.batch_size, 34, cfg.seed + 4)  # each seen once
                copy_log = _run_stage(target, rep, warm, torch.Generator().manual_seed(cfg.seed + 4), lm_loss,
                                      "target (copy curriculum)", progress, checkpoint=ckpt("copy"))
                log(f"copy curriculum: loss on repeated sequences {copy_log.summary()['first_loss_mean']} -> "
                    f"{copy_log.summary()['last_loss_mean']} in {copy_log.seconds:.0f}s")
            gen = torch.Generator().manual_seed(cfg.seed)
            target_log: StageLog | None = _run_stage(target, stage_windows, cfg.target_stage, gen, lm_loss, "target",
                                                     progress, checkpoint=ckpt("target"))
            _round_trip_dtype(target, save_dtype)
            target_summary = target_log.summary()
        else:
            # Stored weights are the round-tripped ones, so float32 from disk equals the in-memory target.
            target = Qwen3ForCausalLM.from_pretrained(Path(reuse_target) / "target", dtype=torch.float32)
            target_log = None
            target_summary = {**reused["training"]["target"], "reused": True}
        target.requires_grad_(False)
        target.eval()
        log(f"target: {n_params(target):,} params, loss {target_summary['first_loss_mean']} -> "
            f"{target_summary['last_loss_mean']} in {target_summary['seconds']}s"
            + (" (reused)" if reused is not None else ""))
        if checkpoint_dir is not None and reused is None:
            _save_model(target, tokenizer, Path(checkpoint_dir) / "target-final", save_dtype)

        # --- drafter: distillation from the (storage-rounded) target
        torch.manual_seed(cfg.seed + 1)
        drafter = make_model(cfg.drafter, cfg, len(tokenizer), eos, pad, stop_ids)
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        drafter_log = _run_stage(drafter, train_windows, cfg.drafter_stage, gen, distill_loss_fn(target),
                                 "drafter (distill)", progress, checkpoint=ckpt("drafter"))
        _round_trip_dtype(drafter, save_dtype)
        log(f"drafter: {n_params(drafter):,} params, KL {drafter_log.summary()['first_loss_mean']} -> "
            f"{drafter_log.summary()['last_loss_mean']} in {drafter_log.seconds:.0f}s")

        _save_model(target, tokenizer, root / "target", save_dtype)
        _save_model(drafter, tokenizer, root / "drafter", save_dtype)

        # --- prompts and figures
        prompts = chat_mod.build_chat_prompts(mat_held, tokenizer, cfg.seed, cfg.n_prompts, cfg.prompt_min_tokens,
                                              cfg.prompt_max_tokens, task_set=cfg.task_set)
        write_prompts_jsonl(prompts, root / PROMPTS_NAME)
        figures = evaluate_pair(
            target, drafter, tokenizer, windows(held_stream, cfg.seq_len), cfg.eval_max_tokens,
            [p.text for p in prompts[: cfg.greedy_prompts]], cfg.greedy_steps, progress=progress,
            held_weights=windows(held_weights, cfg.seq_len),
        ).to_dict()
        figures["regime"] = regime(target, drafter, tokenizer, [p.text for p in prompts[: cfg.regime_prompts]],
                                   cfg.regime_steps, stop_ids, progress=progress)
        log(f"regime: {json.dumps(figures['regime'])}")
        figures["tasks"] = task_table(target, tokenizer, prompts[: cfg.regime_prompts], mat_held, cfg.seed,
                                      cfg.regime_steps, stop_ids, task_set=cfg.task_set)
        log("per task:\n" + "\n".join(format_task_table(figures["tasks"])))
        figures["assisted"] = assisted_acceptance(target, drafter, tokenizer,
                                                  [p.text for p in prompts[: cfg.regime_prompts]],
                                                  cfg.assisted_num_tokens, cfg.regime_steps, stop_ids)
        log(f"assisted generation: {json.dumps(figures['assisted'])}")
        speed = measure_speed(root, [p.text for p in prompts[:3]], new_tokens=cfg.greedy_steps)

    manifest = {
        "name": "default",
        "description": _description(cfg),
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "corpus": {
            "sources": [
                {"name": "Python standard library source", "what": (
                    "plain training text, and the code snippets, docstrings and identifiers used inside chat "
                    "conversations" if cfg.task_set == "mixed" else "plain training text (the closed task set's "
                    "conversations use none of it)"), "licence": "PSF-2.0 (Python Software "
                 "Foundation License)", "origin": "the .py files of the training interpreter (companion.tiny_pair.corpus)"},
                {"name": "rule-generated chat conversations", "what": "questions and answers generated by "
                 "companion.tiny_pair.chat_corpus from word lists written for it and the material above",
                 "licence": "generated by this package's code; same licence as the package"},
            ],
            "chat_template": "Qwen3 style, thinking disabled: <|im_start|>user ... <|im_end|> <|im_start|>assistant "
                             "<think></think> answer <|im_end|>",
            "chat_task_set": cfg.task_set,
            "chat_tasks": {name: w for name, (_, w) in chat_mod.tasks_of(cfg.task_set).items()},
            "chat_train_conversations": len(chat_train),
            "chat_eval_conversations": len(chat_eval),
            "chat_digest_sha256": chat_digest,
            "chat_tokens": chat_tokens,
            "natural_tokens_available": natural_tokens,
            "natural_share_of_windows": cfg.natural_share,
            "training_windows": int(train_windows.shape[0]),
            "python": platform.python_version(),
            "digest_sha256": digest,
            "n_files": len(files),
            "held_out_rule": f"sha256(relpath)[:8] as int % 100 < {corpus_mod.HELD_OUT_PERCENT}",
            "train_files": len(train_files),
            "held_out_files": [f.relpath for f in held_files],
            "held_out_tokens": int(held_stream.numel()),
            "files": [f.relpath for f in files],
        },
        "models": {
            "target": {"params": n_params(target), "class": "Qwen3ForCausalLM"},
            "drafter": {"params": n_params(drafter), "class": "Qwen3ForCausalLM"},
            "vocab_size": len(tokenizer),
            "save_dtype": cfg.save_dtype,
        },
        "training": {
            "target": target_summary,
            "drafter": drafter_log.summary(),
            "total_seconds": round(time.perf_counter() - t_start, 1),
            "num_threads": cfg.num_threads,
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        },
        "prompts": {"file": PROMPTS_NAME, "count": len(prompts), "sha256": sha256_file(root / PROMPTS_NAME),
                    "rule": "user turns of the chat generator's 'prompts' stream on held-out stdlib material, "
                            "kept when their templated length is within min..max tokens",
                    "min_tokens": min(p.n_tokens for p in prompts), "max_tokens": max(p.n_tokens for p in prompts)},
        "figures": figures,
        "speed": speed,
        "versions": package_versions(),
        "files_sha256": file_hashes(root),
    }
    (root / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")
    return BuildResult(root, manifest, target_log, drafter_log)


def compare_to_manifest(new_manifest: dict[str, Any], reference: dict[str, Any]) -> list[str]:
    """Human-readable differences between a rebuilt pair's file hashes and a reference manifest's."""
    diffs = []
    if new_manifest["corpus"]["digest_sha256"] != reference["corpus"]["digest_sha256"]:
        diffs.append("corpus digest differs (different Python standard library): weights cannot match")
    for key in ("python", "torch", "transformers", "tokenizers"):
        a, b = new_manifest["versions"].get(key), reference["versions"].get(key)
        if a != b:
            diffs.append(f"{key} {a} != reference {b}")
    ref, new = reference["files_sha256"], new_manifest["files_sha256"]
    for name in sorted(set(ref) | set(new)):
        if ref.get(name) != new.get(name):
            diffs.append(f"{name}: {'missing' if name not in new else 'differs'}")
    return diffs


if __name__ == "__main__":  # pragma: no cover - convenience: python -m companion.tiny_pair.train OUT
    from companion.tiny_pair.config import default_config

    build_pair(default_config(), sys.argv[1] if len(sys.argv) > 1 else "runs/default_pair")
