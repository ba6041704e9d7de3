"""Figures of a target/drafter pair: held-out quality, agreement, and the shape of the target's steps.

All figures are per step (one next-token prediction): teacher-forced on held-out text, and
on-policy along greedy continuations of prompts (the setting of the paper's experiments).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from companion.devices import torch_threads  # noqa: F401  (the recipe's modules import it from here)


PEAKED = 0.9  # p(1) at or above: a peaked step
FLAT = 0.3  # p(1) below: a flat step
NEAR_TIE = 0.05  # p(1) - p(2) below: a near-tie


@dataclass
class StepStats:
    """Per-step statistics over a set of steps (means unless named otherwise)."""

    n_steps: int
    agreement_top1: float  # argmax q == argmax p
    overlap: float  # sum_y min(p_y, q_y) = 1 - TV(p, q)
    kl_pq: float  # KL(p || q), nats
    kl_qp: float  # KL(q || p), nats
    target_top1_mean: float
    target_top1_median: float
    target_top1_p5: float
    target_top1_p25: float
    target_top10_mass: float
    frac_peaked: float
    frac_flat: float
    frac_near_tie: float


@dataclass
class PairFigures:
    """Held-out teacher-forced figures (``held_out``, plus losses) and greedy on-policy figures (``greedy``)."""

    eval_tokens: int
    target_loss: float  # mean next-token cross entropy, nats
    drafter_loss: float
    target_accuracy: float  # top-1 next-token accuracy on the held-out text
    drafter_accuracy: float
    held_out: StepStats
    greedy: StepStats | None

    def to_dict(self) -> dict[str, Any]:
        return _rounded(asdict(self))


def _rounded(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 5)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def step_arrays(logits_p: torch.Tensor, logits_q: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-step quantities from target and drafter logits of shape (n, V)."""
    log_p = F.log_softmax(logits_p.float(), -1)
    log_q = F.log_softmax(logits_q.float(), -1)
    p, q = log_p.exp(), log_q.exp()
    top = p.topk(10, dim=-1).values
    return {
        "agree": (p.argmax(-1) == q.argmax(-1)).numpy(),
        "overlap": torch.minimum(p, q).sum(-1).numpy(),
        "kl_pq": (p * (log_p - log_q)).sum(-1).numpy(),
        "kl_qp": (q * (log_q - log_p)).sum(-1).numpy(),
        "p1": top[:, 0].numpy(),
        "p2": top[:, 1].numpy(),
        "top10": top.sum(-1).numpy(),
    }


def summarise(arrs: dict[str, np.ndarray]) -> StepStats:
    p1 = arrs["p1"]
    return StepStats(
        n_steps=int(p1.size),
        agreement_top1=float(arrs["agree"].mean()),
        overlap=float(arrs["overlap"].mean()),
        kl_pq=float(arrs["kl_pq"].mean()),
        kl_qp=float(arrs["kl_qp"].mean()),
        target_top1_mean=float(p1.mean()),
        target_top1_median=float(np.median(p1)),
        target_top1_p5=float(np.percentile(p1, 5)),
        target_top1_p25=float(np.percentile(p1, 25)),
        target_top10_mass=float(arrs["top10"].mean()),
        frac_peaked=float((p1 >= PEAKED).mean()),
        frac_flat=float((p1 < FLAT).mean()),
        frac_near_tie=float(((p1 - arrs["p2"]) < NEAR_TIE).mean()),
    )


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([d[k] for d in parts]) for k in parts[0]}


@torch.no_grad()
def greedy_continue(model: PreTrainedModel, input_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Greedy continuation of one prompt (1, n) by exactly ``steps`` tokens (eos does not stop it)."""
    out = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=steps, min_new_tokens=steps,
        do_sample=False, pad_token_id=model.config.pad_token_id, eos_token_id=model.config.eos_token_id,
    )
    return out


@torch.no_grad()
def evaluate_pair(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    held_windows: torch.Tensor,
    max_tokens: int,
    greedy_prompts: list[str],
    greedy_steps: int,
    batch_size: int = 8,
    progress: bool = True,
    held_weights: torch.Tensor | None = None,
) -> PairFigures:
    """Score ``held_windows`` (n, L) teacher-forced, up to ``max_tokens`` tokens, and greedy continuations.

    ``held_weights`` (n, L), if given, are the training loss weights of the same tokens: a token is
    scored (loss, accuracy and step statistics of the position that predicts it) where its weight is
    positive, so the held-out figures measure what the models were trained to predict (the
    assistant's answers, under answer-only training) rather than random user turns.

    Greedy figures: the target continues each prompt greedily for ``greedy_steps`` tokens; both
    models are then scored at those steps (the drafter sees the target's tokens, as in verification).
    """
    target.eval()
    drafter.eval()
    n_win = max(1, min(held_windows.shape[0], max_tokens // held_windows.shape[1]))
    data = held_windows[:n_win]
    if held_weights is not None and held_weights.shape != held_windows.shape:
        raise ValueError(f"held_weights has shape {tuple(held_weights.shape)}, "
                         f"held_windows {tuple(held_windows.shape)}")
    parts, nll_t, nll_d, acc_t, acc_d = [], [], [], [], []
    for i in tqdm(range(0, n_win, batch_size), desc="held-out eval", disable=not progress):
        batch = data[i:i + batch_size]
        lp = target(input_ids=batch).logits[:, :-1].float()
        lq = drafter(input_ids=batch).logits[:, :-1].float()
        labels = batch[:, 1:].reshape(-1)
        lp, lq = lp.reshape(-1, lp.shape[-1]), lq.reshape(-1, lq.shape[-1])
        if held_weights is not None:
            keep = held_weights[i:i + batch.shape[0], 1:].reshape(-1) > 0
            lp, lq, labels = lp[keep], lq[keep], labels[keep]
        nll_t.append(F.cross_entropy(lp, labels, reduction="none").numpy())
        nll_d.append(F.cross_entropy(lq, labels, reduction="none").numpy())
        acc_t.append((lp.argmax(-1) == labels).numpy())
        acc_d.append((lq.argmax(-1) == labels).numpy())
        parts.append(step_arrays(lp, lq))
    held = summarise(_concat(parts))

    greedy = None
    if greedy_prompts and greedy_steps > 0:
        gparts = []
        for text in tqdm(greedy_prompts, desc="greedy eval", disable=not progress):
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            seq = greedy_continue(target, ids, greedy_steps)
            n = ids.shape[1]
            # logits at positions n-1 .. n+steps-2 predict the generated tokens
            lp = target(input_ids=seq).logits[0, n - 1:-1]
            lq = drafter(input_ids=seq).logits[0, n - 1:-1]
            gparts.append(step_arrays(lp, lq))
        greedy = summarise(_concat(gparts))

    return PairFigures(
        eval_tokens=int(sum(a.size for a in nll_t)),
        target_loss=float(np.concatenate(nll_t).mean()),
        drafter_loss=float(np.concatenate(nll_d).mean()),
        target_accuracy=float(np.concatenate(acc_t).mean()),
        drafter_accuracy=float(np.concatenate(acc_d).mean()),
        held_out=held,
        greedy=greedy,
    )


@torch.no_grad()
def greedy_tokens_per_second(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompts: list[str], new_tokens: int = 128
) -> float:
    """Batch-1 greedy decoding speed (KV cache on): generated tokens per wall-clock second, after a warm-up."""
    device = next(model.parameters()).device
    enc = [tokenizer(t, add_special_tokens=False, return_tensors="pt")["input_ids"].to(device) for t in prompts]
    greedy_continue(model, enc[0], 4)  # warm-up: first-call allocations and kernel selection
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for ids in enc:
        greedy_continue(model, ids, new_tokens)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return len(enc) * new_tokens / (time.perf_counter() - t0)


def measure_speed(pair_dir, prompts: list[str], new_tokens: int = 128, device: str = "cpu") -> dict[str, Any]:
    """Load time of a saved pair (target, drafter and tokenizer via ``load_pair``) and each model's greedy tokens/s."""
    from pathlib import Path

    from companion.models import load_pair

    pair_dir = Path(pair_dir)
    t0 = time.perf_counter()
    target, drafter, tok = load_pair(pair_dir / "target", pair_dir / "drafter", device=device)
    load_s = time.perf_counter() - t0
    assert drafter is not None
    return {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "load_seconds": round(load_s, 3),
        "new_tokens_per_prompt": new_tokens,
        "n_prompts": len(prompts),
        "target_greedy_tokens_per_s": round(greedy_tokens_per_second(target, tok, prompts, new_tokens), 1),
        "drafter_greedy_tokens_per_s": round(greedy_tokens_per_second(drafter, tok, prompts, new_tokens), 1),
    }


@torch.no_grad()
def regime(
    target: PreTrainedModel,
    drafter: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_steps: int = 128,
    eos_ids: list[int] | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """The target's regime on its own greedy answers: what the harvest measures, in one pass.

    Each prompt is continued greedily by the target for at most ``max_steps`` tokens, stopping at
    the first EOS (that step included). At every step, with ``p`` the target's distribution:
    ``p(1)``, the top-10 mass, the strict-greedy certificate
    ``rho*(p) = min_q { KL(p || q) : argmax q != argmax p } = p(1) log(2 p(1) / (p(1) + p(2))) +
    p(2) log(2 p(2) / (p(1) + p(2)))`` (computed by :func:`companion.kl_certificates.certificate`), and
    whether the drafter's greedy token is accepted by strict greedy (``p_y >= p(1)``).
    """
    from companion.kl_certificates import certificate
    from companion.criteria import parse_criterion

    greedy = parse_criterion("greedy")
    eos = sorted(set(eos_ids if eos_ids is not None else _eos_ids(target, tokenizer)))
    p1s, top10s, certs, acc, lengths, ended = [], [], [], [], [], []
    for text in tqdm(prompts, desc="regime", disable=not progress):
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        n = ids.shape[1]
        seq = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_steps, do_sample=False,
                              eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
        gen = seq[0, n:]
        hits = [i for i, t in enumerate(gen.tolist()) if t in eos]
        k = hits[0] + 1 if hits else gen.numel()
        seq = seq[:, : n + k]
        lp = target(input_ids=seq).logits[0, n - 1:-1].double()
        probs = torch.softmax(lp, -1)
        top = probs.topk(10, dim=-1).values
        p1s.append(top[:, 0].numpy())
        top10s.append(top.sum(-1).numpy())
        certs.append(certificate(lp, "greedy", from_logits=True).numpy())
        if drafter is not None:
            lq = drafter(input_ids=seq).logits[0, n - 1:-1]
            acc.append(greedy.accepts(lp, lq.argmax(-1), from_logits=True).numpy())
        lengths.append(k)
        ended.append(bool(hits))
    p1, cert = np.concatenate(p1s), np.concatenate(certs)
    qs = (5, 10, 25, 50, 75, 90)
    out: dict[str, Any] = {
        "n_prompts": len(prompts),
        "max_steps": max_steps,
        "n_steps": int(p1.size),
        "top1_mean": float(p1.mean()),
        "top1_median": float(np.median(p1)),
        "top1_quantiles": {str(q): float(np.percentile(p1, q)) for q in qs},
        "top10_mass_mean": float(np.concatenate(top10s).mean()),
        "top10_mass_median": float(np.median(np.concatenate(top10s))),
        "greedy_certificate_median": float(np.median(cert)),
        "greedy_certificate_quantiles": {str(q): float(np.percentile(cert, q)) for q in qs},
        "eos_rate": float(np.mean(ended)),
        "answer_length_mean": float(np.mean(lengths)),
        "drafter_greedy_acceptance": float(np.concatenate(acc).mean()) if acc else None,
    }
    return _rounded(out)


def _eos_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    ids: set[int] = set()
    for src in (getattr(model.generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return sorted(ids)


@torch.no_grad()
def assisted_acceptance(
    target: PreTrainedModel,
    drafter: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    num_assistant_tokens: int = 4,
    max_new_tokens: int = 128,
    eos_ids: list[int] | None = None,
) -> dict[str, Any]:
    """Hugging Face assisted generation (greedy) with a constant ``num_assistant_tokens`` drafts per round.

    A round is one target forward pass (counted with a forward hook): it verifies the drafts and adds
    one token of the target's own, so per prompt ``accepted = new_tokens - rounds``. The drafter's
    confidence-based early stop is disabled (``assistant_confidence_threshold = 0``) so every round
    proposes exactly ``num_assistant_tokens`` drafts (fewer only at the length limit). Returns the
    mean accepted drafts per round and the mean new tokens per round, pooled over prompts.
    """
    eos = sorted(set(eos_ids if eos_ids is not None else _eos_ids(target, tokenizer)))
    gc = drafter.generation_config
    saved = (gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = num_assistant_tokens, "constant"
    gc.assistant_confidence_threshold = 0.0
    calls = [0]
    handle = target.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    rounds = new = 0
    try:
        for text in prompts:
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            calls[0] = 0
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter,
                                  num_assistant_tokens=num_assistant_tokens,
                                  num_assistant_tokens_schedule="constant", do_sample=False,
                                  max_new_tokens=max_new_tokens, eos_token_id=eos,
                                  pad_token_id=tokenizer.pad_token_id)
            rounds += calls[0]
            new += out.shape[1] - ids.shape[1]
    finally:
        handle.remove()
        gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = saved
    return _rounded({"num_assistant_tokens": num_assistant_tokens, "n_prompts": len(prompts), "rounds": rounds,
                     "new_tokens": new, "accepted_per_round": (new - rounds) / rounds,
                     "tokens_per_round": new / rounds})
