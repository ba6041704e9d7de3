"""The experiment chapters' harvests: made once per configuration, cached under ``runs/``, reused.

:func:`chapter_traces` is what chapters 7, 8 and 10 call: it returns the traces of a finished
harvest (``traces_dir``), or harvests a preset into a folder named after its configuration
(:func:`default_traces_dir`), resuming what is there and setting aside a cache made by another
configuration. It belongs to the book: the folder is found from the book project's root and the
harvest is described as the reproduction-status page describes it. The harvest itself, the lock
one writer takes on a folder (:mod:`companion.harvest.lock`) and the worker process of a
multi-process harvest (:mod:`companion.harvest.chapter_worker`) are the harvest layer's; the
statistics computed on the traces live in :mod:`companion.analysis.traces`.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from companion.atomic import replace_dir
from companion.book.layout import ReproduceError, find_root
from companion.book.execute import note_harvest
from companion.book.record import describe_harvest
from companion.harvest import plan as planning
from companion.harvest.chapter_worker import ChapterJob
from companion.harvest.lock import exclusive


@dataclass(frozen=True)
class ChapterTraces:
    """Where a chapter's traces are and what produced them (one harvest, possibly resumed)."""

    traces_dir: Path
    manifest: dict[str, Any]
    harvested_rows: int  # rows computed by this call (0: everything was reused)

    @property
    def preset(self) -> str:
        """The preset the harvest ran, from its manifest (``(unknown)`` when absent)."""
        return str(self.manifest.get("extra", {}).get("preset", "(unknown)"))

    def describe(self) -> str:
        """One Markdown line from the harvest's manifest: preset, models (and sizes), dtype, device,
        prompts, steps and exact ties (``companion.book.record.describe_harvest``)."""
        return describe_harvest(self.manifest)


def _root() -> Path:
    """The book project's root (:func:`companion.book.layout.find_root`), else the working directory."""
    try:
        return find_root()
    except ReproduceError:
        return Path.cwd()


def default_traces_dir(preset: str, n_prompts: int, n_steps: int, *, device_type: str = "cpu",
                       batch_size: int | None = None, seed: int = 0, runs_root: str | os.PathLike[str] | None = None) -> Path:
    """``<root>/runs/<preset>-<n_prompts>x<n_steps>-<device type>-b<batch>-seed<seed>``.

    ``root`` is the project root (the folder holding ``_toc.yml``, searched upward from the
    working directory) unless ``runs_root`` names the ``runs`` folder itself. The device type,
    batch size and seed are in the name because they are part of a harvest's configuration:
    chapters run with the same parameters share one harvest.
    """
    root = Path(runs_root) if runs_root is not None else _root() / "runs"
    batch = "auto" if batch_size is None else str(batch_size)
    return root / f"{preset}-{n_prompts}x{n_steps}-{device_type}-b{batch}-seed{seed}"


def chapter_traces(preset: str = "closed-world", *, device: str = "auto", seed: int = 0, n_prompts: int = 64,
                   n_steps: int = 64, batch_size: int | None = None, traces_dir: str | os.PathLike[str] = "",
                   runs_root: str | os.PathLike[str] | None = None, progress: bool = False,
                   cpu_threads: int | None = 1, processes: int = 1) -> ChapterTraces:
    """Harvest (or reuse) the traces an experiment chapter analyses; return where they are.

    * ``traces_dir`` given and holding a complete harvest: it is used as it is (e.g. traces
      made by ``companion harvest`` on another machine); no model is loaded.
    * ``traces_dir`` given otherwise: the preset is harvested into it (resuming what is there).
    * ``traces_dir`` empty: into :func:`default_traces_dir`, a cache shared by the chapters run
      with the same parameters. ``harvest`` reuses its complete shards; if the cache was
      made by another configuration (say, retrained models or other package versions), it is
      moved to ``<dir>.stale`` (replacing an older one) and harvested afresh.

    ``device``: ``"auto"`` (CUDA if present, else the CPU), ``"cpu"``, ``"cuda"``...; models
    load in bfloat16 on CUDA and float32 on the CPU. Trees are harvested for ``m = 1, 2, 4, 8``
    (other widths are computed from the stored top-64 probabilities).

    ``cpu_threads``: torch threads while harvesting on the CPU (restored afterwards; None:
    torch's default). One by default: on a shared two-core machine, two OpenMP threads that
    wait on each other made the embedded pair's harvest about ten times slower than one
    (measured: 108 s against 8 s for 1,024 steps), and the tiny models gain nothing from more.

    ``processes``: on the CPU, a harvest into a folder that does not exist yet runs in that many
    processes of ``cpu_threads`` threads each (``torch.distributed.run``; shards dealt out as in
    a ``torchrun`` run of ``companion harvest``, the same rows as one process), capped at the
    cores this process may use and at the number of shards (batches of prompts). The chapters
    that share a harvest wait for it in any case, so their cores are otherwise idle: on two
    cores SmolLM2's 36 x 128 harvest took 158 s against 226 s. A folder that exists (resumed,
    or of another configuration) is harvested in this process; so is everything when the
    processes fail, after saying why.

    Under ``companion reproduce``, the folder is noted for the run record
    (``companion.book.execute.note_harvest``), so the reproduction-status page names the
    models and weights each chapter analysed.
    """
    got = _chapter_traces(preset, device=device, seed=seed, n_prompts=n_prompts, n_steps=n_steps,
                          batch_size=batch_size, traces_dir=traces_dir, runs_root=runs_root, progress=progress,
                          cpu_threads=cpu_threads, processes=processes)
    note_harvest(got.traces_dir)  # for the run record's status page, under `companion reproduce`
    return got


def _chapter_traces(preset: str, *, device: str, seed: int, n_prompts: int, n_steps: int, batch_size: int | None,
                    traces_dir: str | os.PathLike[str], runs_root: str | os.PathLike[str] | None, progress: bool,
                    cpu_threads: int | None, processes: int) -> ChapterTraces:
    from companion.models.devices import resolve_device, usable_cores
    from companion.harvest import read_manifest

    if traces_dir:
        out = Path(traces_dir)
        if (out / "manifest.json").is_file():
            manifest = read_manifest(out)
            if manifest.get("status") == "complete":
                return ChapterTraces(out, manifest, 0)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be a whole number >= 1, got {processes!r}")
    dev = resolve_device(device)
    auto = not traces_dir
    out = (default_traces_dir(preset, n_prompts, n_steps, device_type=dev.type, batch_size=batch_size, seed=seed,
                              runs_root=runs_root) if auto else Path(traces_dir))
    # The same plan and loading as `companion harvest --preset PRESET --n-prompts N --seed S`.
    plan = planning.plan_harvest(preset, n_prompts=n_prompts, seed=seed)
    job = ChapterJob(preset, n_prompts, n_steps, batch_size, seed, progress, cpu_threads)
    # Chapters 7, 8 and 10 share this folder and `companion reproduce` may run them at once: the
    # others wait here, then find the first one's complete harvest and reuse it.
    with exclusive(out):
        from companion.harvest.core import default_batch_size, shard_count

        # no more processes than cores, or than shards (one per batch of prompts) to deal out
        shards = shard_count(n_prompts, batch_size or default_batch_size(dev))
        processes = min(processes, usable_cores(), shards) if dev.type == "cpu" else 1
        if processes > 1 and not out.exists():
            failure = _harvest_in_processes(job, out, processes)
            if failure is None:
                manifest = read_manifest(out)
                return ChapterTraces(out, manifest, sum(int(r["rows"]) for r in manifest.get("runs", [])))
            print(f"the {processes}-process harvest into {out} failed ({failure}); going on in this process")
        return _harvest_here(job, plan, dev, out, auto)


def _harvest_in_processes(job: ChapterJob, out: Path, processes: int) -> str | None:
    """Run ``job`` into ``out`` in ``processes`` CPU processes (:mod:`companion.harvest.chapter_worker`
    under ``torch.distributed.run``); None when they finished it, else why not (their last lines)."""
    import json
    import signal
    import subprocess
    import sys

    from companion.harvest import read_manifest

    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(job.cpu_threads or 1)
    root = str(Path(__file__).resolve().parents[2])  # so that the workers import this checkout of companion
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    spec = json.dumps({**job.__dict__, "out": str(out)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
           "-m", "companion.harvest.chapter_worker", spec]
    # A session of its own, so that an interrupt (Ctrl-C, a kernel interrupt) can stop the launcher and
    # its workers together: none may go on writing into the folder once this process lets go of its lock.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if proc.returncode == 0 and (out / "manifest.json").is_file() and read_manifest(out).get("status") == "complete":
        return None
    tail = [line for line in (err or "").splitlines() if line.strip()][-3:]
    return f"exit status {proc.returncode}: " + (" | ".join(tail) or "no message")


def _harvest_here(job: ChapterJob, plan: planning.HarvestPlan, dev: torch.device, out: Path, auto: bool) -> ChapterTraces:
    """Harvest (or resume) ``job`` into ``out`` in this process; ``auto``: a cache folder, whose harvest of
    another configuration is moved aside to ``<out>.stale``."""
    from companion.harvest import harvest
    from companion.harvest.store import HarvestConfigError

    target, drafter, tokenizer, prompts = planning.load_planned(plan, device=dev)
    kwargs = job.harvest_kwargs(plan)
    threads = torch.get_num_threads()
    if dev.type == "cpu" and job.cpu_threads:
        torch.set_num_threads(job.cpu_threads)
    with contextlib.ExitStack() as restore:
        restore.callback(torch.set_num_threads, threads)
        before = _runs_done(out)
        try:
            manifest = harvest(target, drafter, tokenizer, prompts, out, **kwargs)
        except HarvestConfigError as err:
            if not auto or not (out / "manifest.json").is_file():
                raise
            stale = out.with_name(out.name + ".stale")
            print(f"{out} holds traces of another configuration; moving them to {stale} and harvesting again.\n{err}")
            replace_dir(out, stale)  # replacing an older stale one
            before = 0
            manifest = harvest(target, drafter, tokenizer, prompts, out, **kwargs)
    if manifest.get("status") != "complete":
        raise RuntimeError(f"the harvest in {out} is {manifest.get('status')!r}; rerun to finish it")
    return ChapterTraces(out, manifest, sum(int(r["rows"]) for r in manifest.get("runs", [])[before:]))


def _runs_done(out: Path) -> int:
    """How many harvest runs a directory's manifest records (0 if none): this call's come after them."""
    try:
        from companion.harvest import read_manifest

        return len(read_manifest(out).get("runs", []))
    except (OSError, ValueError, KeyError):
        return 0
