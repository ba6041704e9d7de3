"""One process of a chapter's multi-process harvest (``chapter_traces(..., processes=N)`` on the CPU).

Run as ``python -m torch.distributed.run --standalone --nproc_per_node N -m
companion.harvest.chapter_worker '<job as JSON>'``: every process plans and loads the preset as
:func:`companion.harvest.cache.chapter_traces` does and calls :func:`companion.harvest.harvest`
with the same arguments, which deals the shards out by rank (``torch.distributed.run`` sets
``WORLD_SIZE`` and ``RANK``). It takes no lock: the ``chapter_traces`` that started it holds the
folder's.
"""
from __future__ import annotations

import json
import sys

import torch


def main(argv: list[str]) -> int:
    from companion.harvest import harvest
    from companion.harvest import plan as planning
    from companion.harvest.cache import _Job

    spec = json.loads(argv[0])
    out = spec.pop("out")
    job = _Job(**spec)
    if job.cpu_threads:
        torch.set_num_threads(job.cpu_threads)
    plan = planning.plan_harvest(job.preset, n_prompts=job.n_prompts, seed=job.seed)
    target, drafter, tokenizer, prompts = planning.load_planned(plan, device=torch.device("cpu"))
    manifest = harvest(target, drafter, tokenizer, prompts, out, **job.harvest_kwargs(plan))
    return 0 if manifest.get("status") == "complete" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
