"""Drafter-side certificate speed on language-model-like logits (the machine is shared: indicative).

    python benchmarks/bench_drafter_side.py [--rows 8] [--vocab 151936] [--repeats 3] [--threads 1]

Prints, for each criterion and tree width, the best-of-``repeats`` time of
``drafter_certificate(logits, spec, from_logits=True)`` on float32 logits ``[rows, vocab]``,
next to one ``torch.softmax`` of the same tensor. Rows: a Gaussian body (sigma 2) with one
boosted token whose probability spreads like a chat model's (70% in [0.95, 0.999], 20% in
[0.5, 0.95], 10% in [0.1, 0.5]).
"""
from __future__ import annotations

import argparse
import time

import torch

from companion.certify.criteria import PAPER_CRITERIA
from companion.drafter.certificates import drafter_certificate


def lm_like_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(rows, vocab, generator=gen)
    log_z = torch.logsumexp(logits, -1)
    u = torch.rand(rows, generator=gen)
    band = torch.rand(rows, generator=gen)
    p1 = torch.where(band < 0.7, 0.95 + 0.049 * u, torch.where(band < 0.9, 0.5 + 0.45 * u, 0.1 + 0.4 * u))
    token = torch.randint(vocab, (rows,), generator=gen)
    logits[torch.arange(rows), token] = log_z + torch.log(p1 / (1 - p1))
    return logits


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logits = lm_like_logits(args.rows, args.vocab)
    specs = list(PAPER_CRITERIA) + ["tree:2", "tree:8"]
    drafter_certificate(logits, "greedy", from_logits=True)  # warm-up
    soft = best_of(lambda: torch.softmax(logits, -1), args.repeats)
    print(f"[{args.rows}, {args.vocab}] float32 logits, {args.threads} thread(s); softmax {soft * 1e3:.1f} ms")
    for spec in specs:
        t = best_of(lambda s=spec: drafter_certificate(logits, s, from_logits=True), args.repeats)
        print(f"{spec:>20}  {t * 1e3:9.1f} ms  ({t / soft:6.1f} x softmax)")


if __name__ == "__main__":
    main()
