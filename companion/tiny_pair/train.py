"""Training recipe of the embedded pair: tokenizer, target (next-token loss), drafter (distillation).

``build_pair(cfg, out_dir)`` does everything offline and deterministically for a given seed, thread
count and package versions: it writes ``tokenizer/``, ``target/``, ``drafter/`` (each loadable with
``from_pretrained``), ``prompts.jsonl`` and ``manifest.json`` into a staging folder next to
``out_dir`` and renames it into place only when everything succeeded.
"""
from __future__ import annotations

import contextlib
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

from companion.tiny_pair import corpus as corpus_mod
from companion.tiny_pair.config import ModelSpec, StageSpec, TrainConfig
from companion.tiny_pair.evaluate import evaluate_pair, measure_speed
from companion.tiny_pair.prompt_set import build_prompts, write_prompts_jsonl
from companion.tiny_pair.tokenizer import train_bpe, wrap

MANIFEST_NAME = "manifest.json"
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


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with exactly ``n`` intra-op threads (float reductions depend on it), then restore."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def make_model(spec: ModelSpec, cfg: TrainConfig, vocab_size: int, eos_id: int, pad_id: int) -> Qwen3ForCausalLM:
    """A freshly initialised ``Qwen3ForCausalLM`` of the given shape (weights from the current RNG state)."""
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
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = pad_id
    return model


def n_params(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All texts tokenised and joined into one 1-D stream, each followed by eos (the document separator)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    flat: list[int] = []
    for seq in ids:
        flat.extend(seq)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


def windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows of ``seq_len`` tokens, shape (n, seq_len); the tail that doesn't fill one is dropped."""
    n = stream.numel() // seq_len
    return stream[: n * seq_len].view(n, seq_len)


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
) -> StageLog:
    log = StageLog()
    opt = _optimizer(model, st)
    model.train()
    t0 = time.perf_counter()
    bar = tqdm(total=st.steps, desc=desc, disable=not progress, dynamic_ncols=True)
    for step, idx in enumerate(batch_order(data.shape[0], st.steps, st.batch_size, generator)):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, st)
        batch = data[idx]
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), st.grad_clip)
        opt.step()
        log.losses.append(float(loss.detach()))
        log.tokens += batch.numel()
        bar.update(1)
        if step % 10 == 0:
            bar.set_postfix(loss=f"{log.losses[-1]:.3f}")
    bar.close()
    log.seconds = time.perf_counter() - t0
    model.eval()
    return log


def lm_loss(model: Qwen3ForCausalLM, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy (nats) of ``model`` on ``batch``."""
    logits = model(input_ids=batch).logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def distill_loss_fn(teacher: Qwen3ForCausalLM):
    """Forward KL(p_teacher || q_student) per position, averaged: the student matches the teacher's full distribution."""

    def loss(student: Qwen3ForCausalLM, batch: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            log_p = F.log_softmax(teacher(input_ids=batch).logits.float(), dim=-1)
        log_q = F.log_softmax(student(input_ids=batch).logits.float(), dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    return loss


def _round_trip_dtype(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Round weights to the storage dtype in place, so later stages see exactly what gets saved."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(p.dtype))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` except the manifest itself, keyed by POSIX relative path."""
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


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


def atomic_replace_dir(staging: Path, out_dir: Path) -> None:
    """Move a finished ``staging`` folder to ``out_dir``, replacing any previous one with two renames."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if out_dir.exists():
        old = out_dir.with_name(out_dir.name + f".old-{os.getpid()}")
        os.replace(out_dir, old)
    os.replace(staging, out_dir)
    if old is not None:
        shutil.rmtree(old)


def build_pair(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    progress: bool = True,
    stdlib: Path | None = None,
    log=print,
    reuse_target: str | Path | None = None,
) -> BuildResult:
    """Train tokenizer, target and drafter from ``cfg``; write the pair, prompts and manifest to ``out_dir``.

    Nothing is left half-written: all output goes to a staging folder beside ``out_dir`` that is
    renamed into place at the end (and removed on failure). ``reuse_target``: a finished pair folder
    whose tokenizer and target this config would reproduce exactly (checked); they are loaded instead
    of retrained, to iterate on the drafter stage.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary shared folder
    try:
        result = _build_into(cfg, staging, progress=progress, stdlib=stdlib, log=log,
                             reuse_target=Path(reuse_target).resolve() if reuse_target is not None else None)
        atomic_replace_dir(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    result.out_dir = out_dir
    return result


# Config fields that determine the tokenizer and the target; a target may be reused only if they all match.
TARGET_FIELDS: tuple[str, ...] = ("seed", "vocab_size", "max_files", "seq_len", "max_position_embeddings",
                                  "rope_theta", "target", "target_stage", "save_dtype", "num_threads")


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


def _build_into(cfg: TrainConfig, root: Path, *, progress: bool, stdlib: Path | None, log,
                reuse_target: Path | None = None) -> BuildResult:
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

        # --- tokenizer (trained on the training split only)
        reused = _check_reusable(cfg, Path(reuse_target), digest) if reuse_target is not None else None
        if reused is None:
            tokenizer = train_bpe([f.text for f in train_files], cfg.vocab_size)
        else:
            # Rebuilt exactly as train_bpe returns it, so every saved tokenizer file is byte-identical.
            tokenizer = wrap(Tokenizer.from_file(str(Path(reuse_target) / "tokenizer" / "tokenizer.json")))
        tokenizer.save_pretrained(root / "tokenizer")
        train_stream = token_stream(tokenizer, [f.text for f in train_files])
        held_stream = token_stream(tokenizer, [f.text for f in held_files])
        train_windows = windows(train_stream, cfg.seq_len)
        log(f"tokenizer: {len(tokenizer)} tokens; train {train_stream.numel()} tokens, held-out {held_stream.numel()}")

        # --- target: next-token cross entropy
        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        if reused is None:
            torch.manual_seed(cfg.seed)
            target = make_model(cfg.target, cfg, len(tokenizer), eos, pad)
            gen = torch.Generator().manual_seed(cfg.seed)
            target_log: StageLog | None = _run_stage(target, train_windows, cfg.target_stage, gen, lm_loss, "target",
                                                     progress)
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

        # --- drafter: distillation from the (storage-rounded) target
        torch.manual_seed(cfg.seed + 1)
        drafter = make_model(cfg.drafter, cfg, len(tokenizer), eos, pad)
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        drafter_log = _run_stage(drafter, train_windows, cfg.drafter_stage, gen, distill_loss_fn(target),
                                 "drafter (distill)", progress)
        _round_trip_dtype(drafter, save_dtype)
        log(f"drafter: {n_params(drafter):,} params, KL {drafter_log.summary()['first_loss_mean']} -> "
            f"{drafter_log.summary()['last_loss_mean']} in {drafter_log.seconds:.0f}s")

        _save_model(target, tokenizer, root / "target", save_dtype)
        _save_model(drafter, tokenizer, root / "drafter", save_dtype)

        # --- prompts and held-out figures
        prompts = build_prompts(held_files, tokenizer, cfg.n_prompts, cfg.prompt_min_tokens, cfg.prompt_max_tokens)
        write_prompts_jsonl(prompts, root / PROMPTS_NAME)
        figures = evaluate_pair(
            target, drafter, tokenizer, windows(held_stream, cfg.seq_len), cfg.eval_max_tokens,
            [p.text for p in prompts[: cfg.greedy_prompts]], cfg.greedy_steps, progress=progress,
        )
        speed = measure_speed(root, [p.text for p in prompts[:3]], new_tokens=cfg.greedy_steps)

    manifest = {
        "name": "default",
        "description": "Embedded Qwen3ForCausalLM target/drafter pair trained offline on the Python standard "
                       "library source; the drafter is distilled from the target (forward KL).",
        "seed": cfg.seed,
        "config": cfg.to_dict(),
        "corpus": {
            "source": "stdlib .py files of the training interpreter (companion.tiny_pair.corpus)",
            "python": platform.python_version(),
            "digest_sha256": digest,
            "n_files": len(files),
            "held_out_rule": f"sha256(relpath)[:8] as int % 100 < {corpus_mod.HELD_OUT_PERCENT}",
            "train_files": len(train_files),
            "held_out_files": [f.relpath for f in held_files],
            "train_tokens": int(train_stream.numel()),
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
                    "min_tokens": min(p.n_tokens for p in prompts), "max_tokens": max(p.n_tokens for p in prompts)},
        "figures": figures.to_dict(),
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
