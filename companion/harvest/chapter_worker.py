"""A chapter's harvest of a preset (:class:`ChapterJob`) and one process of its multi-process run.

The book's ``chapter_traces(..., processes=N)`` (:mod:`companion.book.harvest_cache`) runs
``python -m torch.distributed.run --standalone --nproc_per_node N -m
companion.harvest.chapter_worker '<job as JSON>'`` on the CPU: every process plans and loads the
preset as ``chapter_traces`` does and calls :func:`companion.harvest.harvest` with the same
arguments, which deals the shards out by rank (``torch.distributed.run`` sets ``WORLD_SIZE`` and
``RANK``). It takes no lock: the ``chapter_traces`` that started it holds the folder's.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

import torch

from companion.harvest import plan as planning


@dataclass(frozen=True)
class ChapterJob:
    """A chapter's harvest, by the parameters that name it (what a worker process needs to redo it)."""

    preset: str
    n_prompts: int
    n_steps: int
    batch_size: int | None
    seed: int
    progress: bool
    cpu_threads: int | None

    def harvest_kwargs(self, plan: planning.HarvestPlan) -> dict[str, Any]:
        """The keyword arguments of :func:`companion.harvest.harvest` for this job under ``plan``."""
        return dict(n_steps=self.n_steps, batch_size=self.batch_size, seed=self.seed,
                    prompt_set_name=plan.prompt_set_name, progress=self.progress,
                    extra={"preset": self.preset,
                           "chapter_parameters": {"n_prompts": self.n_prompts, "n_steps": self.n_steps,
                                                  "batch_size": self.batch_size, "seed": self.seed}})


def main(argv: list[str]) -> int:
    """Run one chapter's harvest job from its JSON spec (``argv[0]``); the exit status."""
    from companion.harvest import harvest

    spec = json.loads(argv[0])
    out = spec.pop("out")
    job = ChapterJob(**spec)
    if job.cpu_threads:
        torch.set_num_threads(job.cpu_threads)
    plan = planning.plan_harvest(job.preset, n_prompts=job.n_prompts, seed=job.seed)
    target, drafter, tokenizer, prompts = planning.load_planned(plan, device=torch.device("cpu"))
    manifest = harvest(target, drafter, tokenizer, prompts, out, **job.harvest_kwargs(plan))
    return 0 if manifest.get("status") == "complete" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
