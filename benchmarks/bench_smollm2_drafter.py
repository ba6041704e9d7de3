"""SmolLM2-135M-Instruct's distilled drafter against its goals, measured side by side in one run.

Run from the repository root (a few minutes on one core)::

    python benchmarks/bench_smollm2_drafter.py                  # 8 held-out requests, 96 new tokens
    python benchmarks/bench_smollm2_drafter.py --prompts 32 --tokens 128

1. **Cost.** One forward at batch 1 with a KV cache (the decode step speculative decoding
   repeats), target and drafter alternately, ``--repeats`` times each after a warm-up, on one
   thread; the ratio of medians (goal: the drafter at most 1/8 of the target).
2. **Greedy agreement** along the target's own greedy answers to held-out requests (the
   drafter's argmax equals the target's): the share of steps (goal: at least 55 %).
3. **transformers' assisted generation** (``assistant_model=``, greedy, a constant
   ``num_assistant_tokens=4``, no confidence stop): drafts accepted per round (goal: at least 1.5).

Held-out requests only: the first ``--prompts`` of the ``chat-requests`` set, which the drafter's
training never read.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()

    import torch

    from companion.models.loading import load_pair
    from companion.prompts.sets import load_prompts
    from companion.models.tiny_pair.evaluate import assisted_acceptance

    torch.set_num_threads(1)
    target, drafter, tok = load_pair("smollm2", device="cpu", dtype="float32")
    if drafter is None:
        print("no drafter is committed for SmolLM2 (companion build-drafter)")
        return 1
    prompts = [p for p in load_prompts("chat-requests")[: args.prompts]]
    assert all(p.source.endswith(":heldout") for p in prompts), "the benchmark must use held-out requests"

    # 1. cost of one decode step at batch 1
    ids = tok(prompts[0].text, return_tensors="pt", add_special_tokens=False).input_ids
    times: dict[str, list[float]] = {"target": [], "drafter": []}
    with torch.inference_mode():
        caches = {name: m(ids, use_cache=True).past_key_values for name, m in (("target", target), ("drafter", drafter))}
        nxt = ids[:, -1:]
        for i in range(args.repeats + 5):
            for name, m in (("target", target), ("drafter", drafter)):
                t0 = time.perf_counter()
                m(nxt, past_key_values=caches[name], use_cache=True)
                if i >= 5:
                    times[name].append(time.perf_counter() - t0)
                caches[name].crop(ids.shape[1])
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["drafter"] / med["target"]
    print(f"decode step at batch 1, 1 thread: target {med['target'] * 1e3:.1f} ms, drafter {med['drafter'] * 1e3:.2f} ms; "
          f"drafter / target = {ratio:.3f} (1/{1 / ratio:.1f}); goal <= 1/8: {'met' if ratio <= 1 / 8 else 'NOT met'}")

    # 2. greedy agreement along the target's greedy answers
    agree = total = 0
    with torch.inference_mode():
        for p in prompts:
            pid = tok(p.text, return_tensors="pt", add_special_tokens=False).input_ids
            out = target.generate(pid, attention_mask=torch.ones_like(pid), max_new_tokens=args.tokens,
                                  do_sample=False, pad_token_id=tok.pad_token_id)
            seq = out[:, : pid.shape[1] + args.tokens]
            n = seq.shape[1] - pid.shape[1]
            t_arg = target(seq).logits[0, pid.shape[1] - 1: -1].argmax(-1)
            d_arg = drafter(seq).logits[0, pid.shape[1] - 1: -1].argmax(-1)
            agree += int((t_arg[:n] == d_arg[:n]).sum())
            total += n
    share = agree / total
    print(f"greedy agreement on {total} steps of {len(prompts)} held-out answers: {share:.1%}; goal >= 55 %: "
          f"{'met' if share >= 0.55 else 'NOT met'}")

    # 3. transformers' assisted generation, constant 4 drafts a round
    res = assisted_acceptance(target, drafter, tok, [p.text for p in prompts], num_assistant_tokens=4,
                              max_new_tokens=args.tokens)
    acc = res["accepted_per_round"]
    print(f"assisted generation (num_assistant_tokens=4): {acc:.2f} drafts accepted per round ({res}); goal >= 1.5: "
          f"{'met' if acc >= 1.5 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
