"""The drafter's training data: the target's own greedy answers, with its top-64 distribution at every step.

Sequence-level distillation (the target's answers as the text) and soft labels (its
next-token probabilities along them) come from one harvest of the target alone
(:func:`companion.harvest.harvest` without a drafter), which already stores, per step, the
greedy token, the 64 likeliest tokens with their probabilities and the mass of the rest. The
harvest is written shard by shard and resumes after an interruption, so this stage does too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from companion.prompts.sets import Prompt


@dataclass(frozen=True)
class Example:
    """One answer: the prompt's and answer's token ids, and the target's distribution at each answer step.

    ``ids = prompt + answer``; the drafter's output at position ``len(prompt) - 1 + t`` predicts
    answer token ``t``, whose target distribution is ``top_ids[t]``, ``top_probs[t]`` (the 64
    likeliest tokens) and ``tail[t]`` (the mass of all the others).
    """

    prompt_id: str
    ids: torch.Tensor  # int64 [P + A]
    n_prompt: int
    top_ids: torch.Tensor  # int64 [A, K]
    top_probs: torch.Tensor  # float32 [A, K]
    tail: torch.Tensor  # float32 [A]

    @property
    def n_answer(self) -> int:
        """The number of answer steps the example holds."""
        return int(self.top_ids.shape[0])


def harvest_answers(target: Any, tokenizer: Any, prompts: list[Prompt], out: Path, *, answer_steps: int,
                    batch_size: int, progress: bool) -> dict[str, Any]:
    """Greedy answers of ``target`` to ``prompts`` in ``out`` (a harvest; resumes what is there)."""
    from companion.harvest import harvest

    return harvest(target, None, tokenizer, prompts, out, criteria=["greedy"], tree_widths=[1], n_steps=answer_steps,
                   batch_size=batch_size, progress=progress, prompt_set_name="chat-requests:train",
                   extra={"purpose": "drafter training data"})


def load_examples(out: Path, tokenizer: Any, prompts: list[Prompt]) -> list[Example]:
    """The harvest in ``out`` as one :class:`Example` per prompt, in the prompt set's order."""
    from companion.harvest import load_traces

    table = load_traces(out, ["prompt_id", "step", "token", "top_ids", "top_probs", "top_tail"])
    pid = np.asarray(table.column("prompt_id").to_pylist())
    step = table.column("step").to_numpy()
    token = table.column("token").to_numpy().astype(np.int64)
    k = len(table.column("top_ids")[0].as_py())
    top_ids = np.asarray(table.column("top_ids").combine_chunks().flatten()).reshape(-1, k).astype(np.int64)
    top_probs = np.asarray(table.column("top_probs").combine_chunks().flatten()).reshape(-1, k)
    tail = table.column("top_tail").to_numpy()
    examples = []
    for p in prompts:
        rows = np.flatnonzero(pid == p.prompt_id)
        if rows.size == 0:
            raise ValueError(f"the answers in {out} have no row for prompt {p.prompt_id!r}")
        rows = rows[np.argsort(step[rows], kind="stable")]
        prompt_ids = tokenizer(p.text, add_special_tokens=False)["input_ids"]
        ids = torch.tensor(list(prompt_ids) + token[rows].tolist(), dtype=torch.long)
        examples.append(Example(p.prompt_id, ids, len(prompt_ids), torch.from_numpy(top_ids[rows]),
                                torch.from_numpy(top_probs[rows]).float(), torch.from_numpy(tail[rows]).float()))
    return examples
