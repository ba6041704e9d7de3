"""Recording drafter chains: capped chains recorded again where a replay needs more (chapter 10's path), against
chains to the answer's end (its path before), and against one chain at a time, side by side.

Run from the repository root (one CPU thread; a few minutes a prompt on the Qwen pair)::

    python benchmarks/bench_record_chains.py --preset qwen2.5-coder --prompts 2 --tokens 96
    python benchmarks/bench_record_chains.py --preset smollm2 --one-at-a-time

For each prompt the target's greedy answer is decoded once; then, one after the other:

* capped: ``record_many(..., max_drafts=D, enough=fits(grid builtins))`` (chapter 10's recording): chains
  of at most ``D`` drafts, and the prompt recorded again with twice ``D`` (or to the end) where a
  built-in of the chapter's grid would ask for more. The drafter's extension past a mismatch then
  runs ``D - 1`` forwards, whatever the answer's length;
* uncapped: ``record_chains(..., max_drafts=None)``: every chain to the answer's end, which takes as
  many extension forwards as the answer is long and drafts about the square of it;
* with ``--one-at-a-time``, a reference written here: the same teacher-forced rows, then at every
  position where the drafter's greedy token is not the answer's, a greedy extension of the drafter
  from that context with a cropped KV cache, one token per forward, chains of ``--max-drafts``.

It prints the times and their ratio, and checks that the capped chains are the uncapped ones cut
short (exactly: the same first forwards) and that every grid built-in replays to the same rounds on both.
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
    parser.add_argument("--preset", default="qwen2.5-coder")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--cap", type=int, default=24, help="max_drafts of the capped recording (chapter 10's)")
    parser.add_argument("--one-at-a-time", action="store_true", help="also the one-chain-at-a-time reference")
    parser.add_argument("--max-drafts", type=int, default=20, help="chains of the one-at-a-time reference")
    args = parser.parse_args()

    import torch

    from companion.harvest.plan import load_planned, plan_harvest
    from companion.speculative import fits, grid_builtins, record_chains, record_many, replay

    torch.set_num_threads(1)
    plan = plan_harvest(args.preset, n_prompts=args.prompts, seed=0)
    target, drafter, tok, prompts = load_planned(plan, device=torch.device("cpu"))
    eos = target.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    builtins = grid_builtins()
    capped_s = full_s = single_s = 0.0
    for i, p in enumerate(prompts):
        ids = tok(p.text, add_special_tokens=False).input_ids
        with torch.inference_mode():
            x = torch.tensor([ids])
            out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=args.tokens)
        answer = out[0, len(ids):].tolist()
        t0 = time.perf_counter()
        capped = record_many(target, drafter, [ids], max_new_tokens=args.tokens, max_drafts=args.cap, texts=[answer],
                             enough=lambda ch: fits(ch, builtins))[0]
        t1 = time.perf_counter()
        full = record_chains(target, drafter, ids, max_new_tokens=args.tokens, text=answer)
        t2 = time.perf_counter()
        capped_s += t1 - t0
        full_s += t2 - t1
        assert (capped.tokens, capped.kl) == (full.tokens, full.kl), f"prompt {i}: texts or KLs differ"
        for s, (a, b) in enumerate(zip(capped.chains, full.chains)):
            assert a == b[:len(a)], f"prompt {i}: the capped chain from position {s} is not the uncapped one cut short"
        differ = [b for b in builtins if (lambda x, y: (x.accepted, x.drafted, x.draft_tokens)
                                          != (y.accepted, y.drafted, y.draft_tokens))(replay(capped, b), replay(full, b))]
        assert not differ, f"prompt {i}: replays differ under {differ}"
        # the drafter's extensions past each mismatch (one per position whose first draft is not the text's)
        drafted = [sum(max(len(ch.chains[m]) - 1, 0) for m in range(len(ch.tokens)) if ch.matched[m] == 0)
                   for ch in (capped, full)]
        line = (f"prompt {i}: {len(answer)} tokens ({len(ids)} prompt tokens); capped at {capped.max_drafts} "
                f"{t1 - t0:.1f} s, to the end {t2 - t1:.1f} s ({(t2 - t1) / (t1 - t0):.2f}x); same chains cut short, "
                f"{len(builtins)} built-ins replay the same rounds")
        if args.one_at_a_time:
            rows, ext = one_at_a_time(target, drafter, ids, answer, args.max_drafts, eos)
            t3 = time.perf_counter()
            single_s += t3 - t2
            rec = record_chains(target, drafter, ids, max_new_tokens=args.tokens, max_drafts=args.max_drafts,
                                text=answer)
            worst = 0.0
            for m, chain in ext.items():
                recorded = rec.chains[m][1:1 + len(chain)]   # the chain from m: its first draft, then the extension
                assert [s.token for s in recorded] == [t for t, _ in chain], f"prompt {i}: chains differ at position {m}"
                worst = max([worst] + [abs(s.q1 - q) for s, (_, q) in zip(recorded, chain)])
            line += f"; one at a time {t3 - t2:.1f} s (largest q(1) difference {worst:.1e})"
        print(line + f"; extension drafts {drafted[0]} capped, {drafted[1]} to the end", flush=True)
    print(f"total: capped {capped_s:.1f} s, to the end {full_s:.1f} s, ratio {full_s / capped_s:.2f}x"
          + (f"; one at a time {single_s:.1f} s" if args.one_at_a_time else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
