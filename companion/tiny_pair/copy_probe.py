"""Go/no-go probe for teaching the embedded target to copy: does the second copy get cheaper?

A sequence of ``n`` random "words" (token ids drawn from ``words`` distinct ids) is written twice,
``<sep> w_1 .. w_n <sep> w_1 .. w_n <eos>``. The first copy is unpredictable (its loss stays near
``log(words)``); the second is predictable from the first, and its loss falls towards 0 once the
model has learnt induction-style copying (attend to the previous occurrence of the current word,
predict what followed it). The probe trains the target's architecture (fresh weights, the
recipe's optimiser) on such sequences only and prints the mean loss of each copy every
``log_every`` steps, within a time budget. The decision it supports: build a copy curriculum only
if the second-copy loss falls well below the first copy's within the budget.

    python -m companion.tiny_pair.copy_probe --minutes 15 --words 512 --length 16

One thread, a fixed seed: the numbers are reproducible on a given machine and package versions.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from companion.tiny_pair.config import StageSpec, default_config
from companion.tiny_pair.train import make_model


@dataclass(frozen=True)
class ProbePoint:
    step: int
    seconds: float
    first_copy: float  # mean loss (nats) on the first copy's words
    second_copy: float  # mean loss on the second copy's words


def copy_batch(gen: torch.Generator, batch: int, length: int, words: int, vocab: int) -> torch.Tensor:
    """``[batch, 2 length + 3]`` token ids: ``sep w.. sep w.. eos`` with ``sep = 0``, ``eos = 1`` and
    words from ids ``2 .. words + 1`` (so ``words + 2 <= vocab``)."""
    if words + 2 > vocab:
        raise ValueError(f"words={words} needs a vocabulary of at least {words + 2} ids, the model has {vocab}")
    w = torch.randint(2, words + 2, (batch, length), generator=gen)
    sep = torch.zeros(batch, 1, dtype=torch.long)
    eos = torch.ones(batch, 1, dtype=torch.long)
    return torch.cat([sep, w, sep, w, eos], 1)


def copy_losses(logits: torch.Tensor, ids: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token next-token losses on the first and the second copy's words."""
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(ids.shape[0], -1)
    # targets at positions 1..length are the first copy, length + 2 .. 2 length + 1 the second
    return loss[:, :length], loss[:, length + 1: 2 * length + 1]


def run_probe(*, minutes: float, words: int, length: int, batch: int, lr: float, seed: int = 0,
              log_every: int = 25, log=print) -> list[ProbePoint]:
    """Train on repeated sequences for ``minutes`` (one thread); the copy losses every ``log_every`` steps."""
    cfg = default_config()
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = make_model(cfg.target, cfg, cfg.vocab_size, eos_id=1, pad_id=1)
    stage = StageSpec(steps=10**9, batch_size=batch, lr=lr, warmup_steps=30)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=stage.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    held = copy_batch(torch.Generator().manual_seed(seed + 1), 64, length, words, cfg.vocab_size)
    points: list[ProbePoint] = []
    start, step = time.perf_counter(), 0
    while True:
        if step % log_every == 0:
            model.eval()
            with torch.no_grad():
                first, second = copy_losses(model(held).logits, held, length)
            model.train()
            points.append(ProbePoint(step, time.perf_counter() - start, float(first.mean()), float(second.mean())))
            p = points[-1]
            log(f"step {p.step:5d}  {p.seconds:6.0f} s  first copy {p.first_copy:.3f}  second copy {p.second_copy:.3f} "
                f"(log words = {math.log(words):.3f})")
            if p.seconds > minutes * 60:
                return points
        for group in opt.param_groups:
            group["lr"] = lr if step >= stage.warmup_steps else lr * (step + 1) / stage.warmup_steps
        ids = copy_batch(gen, batch, length, words, cfg.vocab_size)
        logits = model(ids).logits
        first, second = copy_losses(logits, ids, length)
        loss = torch.cat([first, second], 1).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), stage.grad_clip)
        opt.step()
        step += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=15.0)
    ap.add_argument("--words", type=int, default=512, help="distinct words (token ids) sequences are drawn from")
    ap.add_argument("--length", type=int, default=16, help="words per copy")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("minutes", "lr"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be positive")
    for name in ("words", "length", "batch"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    points = run_probe(minutes=args.minutes, words=args.words, length=args.length, batch=args.batch, lr=args.lr,
                       seed=args.seed, log=lambda s: print(s, flush=True))
    last = points[-1]
    fell = last.second_copy < 0.5 * last.first_copy
    print(f"after {last.step} steps ({last.seconds:.0f} s): second copy {last.second_copy:.3f} vs first {last.first_copy:.3f}: "
          f"{'GO (copying is being learnt)' if fell else 'NO-GO (the second copy is not much cheaper than the first)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
