"""Recording SmolLM2's drafter chains: the batched extension against one chain at a time, side by side.

Run from the repository root (about a minute a prompt on one core)::

    python benchmarks/bench_record_chains.py                   # 2 held-out requests, 128 tokens
    python benchmarks/bench_record_chains.py --prompts 4 --max-drafts 20

For each prompt the target's greedy answer is decoded once; then, alternately:

* ``record_chains(..., text=answer)``: one teacher-forced forward per model and every mismatch's
  drafter extension in one batch (what chapter 10 runs);
* a reference written here, one chain at a time: the same teacher-forced rows, then at every
  position where the drafter's greedy token is not the answer's, a greedy extension of the drafter
  from that context with a cropped KV cache, one token per forward (how ``record_chains``
  extended chains before it batched them).

It prints both times, their ratio, and checks that both record the same chains (tokens exactly;
``q(1)`` to float32 rounding of a batched forward).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def one_at_a_time(target, drafter, prompt: list[int], text: list[int], max_drafts: int | None, eos: set[int]):
    """Chains as lists of (token, q1), extended one chain and one token at a time (the reference)."""
    import torch
    from transformers import DynamicCache

    def step(logits):
        q = torch.softmax(logits.double(), -1)
        tok = int(torch.argmax(logits))
        return tok, float(q[tok])

    n, n0 = len(text), len(prompt)
    with torch.inference_mode():
        cache = DynamicCache()
        full = torch.tensor([prompt + text[:-1]])
        q_logits = drafter(input_ids=full, past_key_values=cache, use_cache=True).logits[0, -n:].float()
        target(input_ids=full).logits  # the target's teacher-forced forward, as record_chains runs it
        rows = [step(q_logits[t]) for t in range(n)]
        ext = {}
        for m in range(n - 1, -1, -1):
            if rows[m][0] == text[m] or rows[m][0] in eos:
                continue
            cap = n - m - 1 if max_drafts is None else min(n - m - 1, max_drafts)
            cache.crop(n0 + m)
            out, ctx = [], [rows[m][0]]
            while len(out) < cap - 1:
                logits = drafter(input_ids=torch.tensor([ctx]), past_key_values=cache, use_cache=True).logits[0, -1].float()
                out.append(step(logits))
                if out[-1][0] in eos:
                    break
                ctx = [out[-1][0]]
            ext[m] = out
    return rows, ext


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--max-drafts", type=int, default=20)
    args = parser.parse_args()

    import torch

    from companion.harvest.plan import load_planned, plan_harvest
    from companion.speculative import record_chains

    torch.set_num_threads(1)
    plan = plan_harvest("smollm2", n_prompts=args.prompts, seed=0)
    target, drafter, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    eos = {int(target.generation_config.eos_token_id)}
    batched_s = single_s = 0.0
    for i, p in enumerate(prompts):
        ids = tok(p.text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=args.tokens)
        answer = out[0, len(ids):].tolist()
        t0 = time.perf_counter()
        rec = record_chains(target, drafter, ids, max_new_tokens=args.tokens, max_drafts=args.max_drafts, text=answer)
        t1 = time.perf_counter()
        rows, ext = one_at_a_time(target, drafter, ids, answer, args.max_drafts, eos)
        t2 = time.perf_counter()
        batched_s += t1 - t0
        single_s += t2 - t1
        worst = 0.0
        for m, chain in ext.items():
            recorded = rec.chains[m][1:1 + len(chain)]   # the chain from m: its first draft, then the extension
            assert [s.token for s in recorded] == [t for t, _ in chain], f"prompt {i}: chains differ at position {m}"
            worst = max([worst] + [abs(s.q1 - q) for s, (_, q) in zip(recorded, chain)])
        print(f"prompt {i}: {len(answer)} tokens, {len(ext)} mismatches extended; batched {t1 - t0:.1f} s, "
              f"one at a time {t2 - t1:.1f} s; same chains, largest q(1) difference {worst:.1e}", flush=True)
    print(f"total: batched {batched_s:.1f} s, one at a time {single_s:.1f} s, ratio {single_s / batched_s:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
