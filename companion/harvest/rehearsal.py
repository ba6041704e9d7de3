"""A rehearsal of the paper profile on the CPU: every path of a Qwen3 run but the device and the weights.

The ``gpu`` profile harvests Qwen3 models in bfloat16 over a 151,936-token vocabulary, with
prompts drawn from UltraChat through a chat template, and feeds the harvest to chapters 7 and 8.
None of that can run where there is neither a GPU nor the weights, yet each piece can be
rehearsed in the same dtype and shape:

* :func:`build_standins` saves a random Qwen3-architecture target and a drafter (a noisy copy)
  with the real vocabulary size, in bfloat16, with a byte tokenizer that carries a Qwen3-style
  chat template. Their output layer is scaled so that many steps are very peaked (top-1 logit
  gaps of tens of nats, as a chat LLM's confident steps), and bfloat16 logits produce exact
  top-2 ties on some steps.
* :func:`write_ultrachat_jsonl` writes conversations in UltraChat's row format (``prompt_id``,
  ``prompt``, ``messages``), which ``companion harvest --ultrachat FILE`` reads through the same
  seeded selection as the paper presets.
* :func:`rehearse` runs ``companion harvest`` with the paper preset, the stand-ins in place of
  the weights, ``--dtype bfloat16``, once with the drafter and once ``--no-drafter`` (the paper's
  own setting), and returns the two harvest folders. Chapters 7 and 8 then run on them
  unmodified: ``companion reproduce --only 07 --only 08 -p traces_dir DIR`` (see ``main``).

Run it as ``python -m companion.harvest.rehearsal OUT``; the test suite runs it in CI.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from companion.harvest.shapes import QWEN3_VOCAB
from companion.harvest.toy import chat_tokenizer, save_pair, toy_pair

PRESET = "paper-qwen3-1.7b"  # the gpu profile's preset; its models are replaced by the stand-ins

_WORDS = ("explain", "the", "difference", "between", "a", "list", "and", "tuple", "in", "python", "write",
          "short", "story", "about", "river", "summarise", "this", "paragraph", "for", "child", "how", "do",
          "I", "sort", "dictionary", "by", "value", "what", "is", "gradient", "descent", "give", "three",
          "examples", "of", "renewable", "energy", "translate", "into", "French", "please", "compare")


@dataclass(frozen=True)
class Rehearsal:
    """Where a rehearsal put its files."""

    pair: dict[str, Path]        # target/, drafter/, tokenizer/ folders (save_pretrained)
    ultrachat: Path              # the UltraChat-format prompt file
    traces: Path                 # harvest with the drafter (chapters 7 and 8)
    traces_no_drafter: Path      # target-only harvest, as in the paper (chapter 7)


def build_standins(folder: str | Path, *, vocab: int = QWEN3_VOCAB, hidden: int = 32, layers: int = 1,
                   logit_scale: float = 8.0, noise: float = 0.05, seed: int = 0) -> dict[str, Path]:
    """Save a random bfloat16 Qwen3 target and drafter with ``vocab`` outputs and a chat tokenizer.

    ``logit_scale`` sets the spread of the logits (their standard deviation is about
    ``logit_scale`` times a per-token factor in ``[e^-1.2, e^1.2]``); at 8 the top-1 gap of
    many steps is tens of nats. Returns the folders, as :func:`~companion.harvest.toy.save_pair`.
    """
    target, drafter, _ = toy_pair(vocab=vocab, hidden=hidden, layers=layers, seed=seed, noise=noise,
                                  logit_scale=logit_scale)
    return save_pair(folder, target.to(torch.bfloat16), drafter.to(torch.bfloat16), chat_tokenizer())


def write_ultrachat_jsonl(path: str | Path, n: int = 64, *, seed: int = 0) -> Path:
    """``n`` conversations in UltraChat-200k's row format, one JSON object a line.

    Each row has ``prompt_id`` (sha256 of the prompt, as in the dataset), ``prompt`` and
    ``messages`` (the user turn and an assistant answer). Prompts are 12 to 40 words, so that
    most but not all reach 64 templated tokens and the selection's length filter has work to do.
    """
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        prompt = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(12, 40))).capitalize() + "?"
        answer = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 20))) + "."
        row = {"prompt_id": hashlib.sha256(prompt.encode()).hexdigest(), "prompt": prompt,
               "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
        lines.append(json.dumps(row))
    out = Path(path)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def rehearse(folder: str | Path, *, n_prompts: int = 16, n_steps: int = 24, batch_size: int = 16,
             threads: int | None = 1, progress: bool = False) -> Rehearsal:
    """Build the stand-ins and harvest them as the ``gpu`` profile would, on the CPU in bfloat16.

    Runs the real command line (``companion harvest --preset paper-qwen3-1.7b --target ...
    --drafter ... --ultrachat ... --dtype bfloat16``), so argument handling, preset defaults,
    prompt selection, the chat template and the bfloat16 statistics are the ones a GPU run uses.
    Raises ``RuntimeError`` if a harvest does not finish.
    """
    from companion.harvest.cli import main as harvest_main

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    pair = build_standins(root / "standins")
    ultrachat = write_ultrachat_jsonl(root / "ultrachat_train_sft.jsonl", max(64, 4 * n_prompts))
    common = ["--preset", PRESET, "--ultrachat", str(ultrachat), "--n-prompts", str(n_prompts),
              "--steps", str(n_steps), "--dtype", "bfloat16", "--device", "cpu", "--batch-size", str(batch_size),
              "--target", str(pair["target"])]
    if threads:
        common += ["--threads", str(threads)]
    if not progress:
        common.append("--no-progress")
    traces = root / "traces"
    bare = root / "traces-no-drafter"
    for out, extra in ((traces, ["--drafter", str(pair["drafter"])]), (bare, ["--no-drafter"])):
        code = harvest_main(["--out", str(out), *common, *extra])
        if code != 0:
            raise RuntimeError(f"companion harvest exited with {code} for {out}")
    return Rehearsal(pair, ultrachat, traces, bare)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m companion.harvest.rehearsal",
        description="Rehearse the gpu profile on the CPU: bfloat16 stand-ins with the Qwen3 vocabulary, "
                    "UltraChat-format prompts, the paper preset's harvest with and without a drafter.")
    parser.add_argument("out", type=Path, help="folder for the stand-ins, the prompt file and the two harvests")
    parser.add_argument("--n-prompts", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args(argv)
    if args.n_prompts <= 0 or args.steps <= 0:
        print("rehearsal: --n-prompts and --steps must be positive", file=sys.stderr)
        return 2
    r = rehearse(args.out, n_prompts=args.n_prompts, n_steps=args.steps, progress=True)
    print(f"stand-ins: {r.pair['target'].parent}\nharvests: {r.traces} and {r.traces_no_drafter}\n"
          "now run the chapters on them, unmodified:\n"
          f"  companion reproduce --only 07 --only 08 -p traces_dir {r.traces} --no-build\n"
          f"  companion reproduce --only 07 -p traces_dir {r.traces_no_drafter} --no-build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
