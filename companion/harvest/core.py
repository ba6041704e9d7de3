"""``harvest``: traces of many prompts, sharded, resumable, and split across processes."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from companion.certify.criteria import PAPER_CRITERIA, Criterion, parse_criteria
from companion.harvest import store
from companion.harvest.decode import BlockHook, decode_batch
from companion.harvest.schema import arrow_schema
from companion.harvest.stats import StepStatistics
from companion.prompts.sets import Prompt, prompt_set_digest
from companion.models.shortlist_llama import logit_count

TREE_WIDTHS: tuple[int, ...] = (1, 2, 4, 8)
ORDERS = ("length", "given")


def default_batch_size(device: torch.device) -> int:
    """Prompts per batch when none is given: 32 on CUDA, 8 on the CPU."""
    return 32 if device.type == "cuda" else 8


def default_chunk_steps(device: torch.device, batch_size: int) -> int:
    """Steps per statistics block: about 256 rows per block on CUDA (amortises kernel launches), 1 on the CPU."""
    return max(1, 256 // batch_size) if device.type == "cuda" else 1


@dataclass(frozen=True)
class Distributed:
    """Rank and world size of this process, and a barrier (a no-op when alone)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    state: Any = None

    def barrier(self) -> None:
        if self.state is not None and self.world > 1:
            self.state.wait_for_everyone()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def distributed_context() -> Distributed:
    """This process's place among those started by ``accelerate launch`` / ``torchrun`` (``WORLD_SIZE`` > 1).

    Uses ``accelerate.PartialState``, which sets up the process group (gloo on CPUs, NCCL on GPUs).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Distributed()
    from accelerate import PartialState

    state = PartialState()
    return Distributed(rank=state.process_index, world=state.num_processes,
                       local_rank=state.local_process_index, state=state)


def as_prompts(prompts: Sequence[Prompt | str | dict[str, Any]]) -> list[Prompt]:
    """Prompt objects from ``Prompt``s, dicts with ``prompt_id`` and ``text``, or plain strings (ids ``prompt-00000``...)."""
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, Prompt):
            out.append(p)
        elif isinstance(p, str):
            out.append(Prompt(f"prompt-{i:05d}", p, -1, "<api>", 0))
        elif isinstance(p, dict) and "text" in p:
            out.append(Prompt(str(p.get("prompt_id", f"prompt-{i:05d}")), p["text"], int(p.get("n_tokens", -1)),
                              str(p.get("source", "<api>")), int(p.get("line", 0))))
        else:
            raise TypeError(f"prompt {i}: expected a Prompt, a str or a dict with 'text', got {type(p).__name__}")
    ids = [p.prompt_id for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate prompt_id values in the prompt set")
    if not out:
        raise ValueError("the prompt set is empty")
    return out


def resolve_eos(target: Any, tokenizer: Any, eos_token_ids: Sequence[int] | None) -> list[int]:
    """EOS ids: the given ones, else the target's generation config's plus the tokenizer's."""
    if eos_token_ids is not None:
        return sorted({int(i) for i in eos_token_ids})
    ids: set[int] = set()
    gen = getattr(target, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return sorted(ids)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def harvest(
    target: Any,
    drafter: Any | None,
    tokenizer: Any,
    prompts: Sequence[Prompt | str | dict[str, Any]],
    out_dir: str | os.PathLike[str],
    *,
    criteria: Sequence[str | Criterion] = PAPER_CRITERIA,
    tree_widths: Sequence[int] = TREE_WIDTHS,
    n_steps: int = 128,
    batch_size: int | None = None,
    prompts_per_shard: int | None = None,
    chunk_steps: int | None = None,
    top_k: int = 64,
    stop_at_eos: bool = True,
    eos_token_ids: Sequence[int] | None = None,
    order: str = "length",
    seed: int = 0,
    add_special_tokens: bool = False,
    prompt_set_name: str | None = None,
    extra: dict[str, Any] | None = None,
    progress: bool = True,
    hook: BlockHook | None = None,
    log: Callable[[str], None] | None = None,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Greedy-decode every prompt with ``target`` and write per-step traces to ``out_dir``; return the manifest.

    ``target`` / ``drafter``: causal LMs (``transformers``) on the same device, in eval mode; the
    device and dtype used are theirs. ``drafter`` None: target-side columns only. ``tokenizer``
    tokenizes the prompt texts as they are (``add_special_tokens`` False by default: chat prompts
    already carry their template). ``criteria``: specs or criteria (default: the paper's);
    ``tree_widths``: the ``m`` of the tree certificates; ``n_steps``: greedy steps per prompt;
    ``stop_at_eos``: a prompt's trace ends at its first EOS (``eos_token_ids``, default: the
    target's generation config and the tokenizer's).

    Batching: prompts are ordered (``order="length"``: by token count then position, which
    minimises padding; ``"given"``: as given) and cut into shards of at most ``prompts_per_shard``
    prompts (default ``batch_size``) and about equal work (prompt tokens + ``n_steps``), an even
    number of them unless one holds every prompt, so that two processes get halves within 10%
    (:func:`_shard_plan`); each is decoded in batches of ``batch_size`` (default 32 on CUDA, 8 on
    the CPU). ``chunk_steps`` steps are reduced to statistics at a time (default: about 256 rows
    on CUDA, 1 on the CPU); the drafter is fed one block of tokens per forward.

    Resuming: if ``out_dir`` already holds a harvest with the same configuration, its complete
    shards are kept and only the missing ones are computed; a different configuration raises
    :class:`~companion.harvest.store.HarvestConfigError` naming the differing keys.

    Several processes (``accelerate launch`` / ``torchrun``): shard ``i`` is computed by the
    process of rank ``i mod world``; shards are the same whatever the world size, so the merged
    result equals a single-process run. The main process merges the manifest at the end.

    Every shard already in ``out_dir`` is verified before it is kept (the sha256 the manifest
    records for it, or a full read with page checksums); a damaged one is named through
    ``log`` (default: standard error) and recomputed. The bits of a harvest depend on the
    models, dtype, batching, versions and the numerics of the device (CPU: torch threads and
    instruction set; CUDA: GPU model, CUDA version, TF32), all of which are in the
    configuration, so a resume under any other of them is refused.

    Ctrl-C (``KeyboardInterrupt``): the manifest is written with status ``interrupted`` and the
    shards complete so far, then the exception propagates; rerunning resumes.

    ``hook(batch_positions, first_step, logits_p, logits_q, columns)`` sees every block on the device.

    ``stop()``, when given, is asked after every block of steps; True ends the harvest as Ctrl-C
    does (``KeyboardInterrupt`` after recording the complete shards). The CLI uses it so that a
    Ctrl-C is acted on at a point of its own choosing, never lost inside library code.
    """
    say = log if log is not None else (lambda message: print(message, file=sys.stderr))
    t_start = time.perf_counter()
    started = store.iso_now()
    dist = distributed_context()
    out = Path(out_dir)
    settings = _settings(target, drafter, criteria, tree_widths, n_steps, order, top_k, batch_size,
                         prompts_per_shard, chunk_steps)
    plist, token_ids = _tokenized_prompts(prompts, tokenizer, target, drafter, n_steps, settings.vocab,
                                          add_special_tokens)
    eos = resolve_eos(target, tokenizer, eos_token_ids) if stop_at_eos else []
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    schema = arrow_schema(settings.specs, settings.widths, drafter is not None, top_k)
    shards = _shard_plan(token_ids, order, settings.per_shard, n_steps)
    config = _run_config(target, drafter, tokenizer, plist, settings, n_steps=n_steps, order=order,
                         stop_at_eos=stop_at_eos, eos=eos, pad_id=pad_id, add_special_tokens=add_special_tokens,
                         seed=seed, columns=schema.names, shards=shards)
    digest = store.config_digest(config)
    checksums = _open_manifest(out, config, digest, dist, say, device=target.device, schema=schema, prompt_set_name=prompt_set_name,
                               extra=extra, started=started)

    done = store.existing_shards(out)
    mine = [i for i in range(len(shards)) if i % dist.world == dist.rank and i not in done]
    torch.manual_seed(seed)  # greedy decoding uses no randomness; seeded for anything that might
    bar = _progress(progress, total=sum(len(shards[i]) for i in mine) * n_steps, rank=dist.rank, world=dist.world)
    written: dict[str, str] = {}
    tally = {"rows": 0, "compute_s": 0.0}
    try:
        for index in mine:
            _check_stop(stop)
            _decode_shard(index, shards[index], target, drafter, token_ids, plist, settings, schema, out, digest,
                          dist, n_steps=n_steps, pad_id=pad_id, eos=eos, stop_at_eos=stop_at_eos, hook=hook, bar=bar,
                          written=written, tally=tally, stop=stop)
    except KeyboardInterrupt:
        # Ctrl-C: the shard in progress is lost (its temporary file is removed); the complete ones
        # are recorded, so the manifest says what is there and a rerun computes only the rest.
        if bar is not None:
            bar.close()
        if dist.is_main:
            part = {"rank": dist.rank, "device": str(target.device), "shards_computed": len(written),
                    "rows": tally["rows"], "compute_s": round(tally["compute_s"], 3),
                    "wall_s": round(time.perf_counter() - t_start, 3)}
            _finalize(out, digest, len(shards), dist.world, [part], started, t_start, checksums | written,
                      interrupted=True)
        raise
    if bar is not None:
        bar.close()
    part = {"rank": dist.rank, "device": str(target.device), "shards_computed": len(mine), "rows": tally["rows"],
            "compute_s": round(tally["compute_s"], 3), "wall_s": round(time.perf_counter() - t_start, 3),
            "checksums": written}
    return _merge_ranks(out, digest, len(shards), dist, part, started, t_start, checksums)


@dataclass(frozen=True)
class _Settings:
    """The checked batching and statistics settings of a harvest."""

    vocab: int
    specs: list[str]
    widths: list[int]
    stats: StepStatistics
    batch_size: int
    per_shard: int
    chunk: int


def _settings(target: Any, drafter: Any | None, criteria: Sequence[str | Criterion], tree_widths: Sequence[int],
              n_steps: int, order: str, top_k: int, batch_size: int | None, prompts_per_shard: int | None,
              chunk_steps: int | None) -> _Settings:
    """Check the models agree and the options are valid; resolve the batching defaults for the device."""
    device = target.device
    if drafter is not None and drafter.device != device:
        raise ValueError(f"target is on {device} but drafter on {drafter.device}: put both on one device")
    vocab = logit_count(target)
    if drafter is not None and logit_count(drafter) != vocab:
        raise ValueError(f"target has {vocab} output tokens but drafter {logit_count(drafter)}: they must share a vocabulary")
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 1:
        raise ValueError(f"n_steps must be a positive integer, got {n_steps!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    crits = parse_criteria(list(criteria))
    widths = [int(m) for m in tree_widths]
    # the kernel-path columns count near ties of the dtype the target computes its logits in
    path_dtype = _dtype_name(next(target.parameters()).dtype) if hasattr(target, "parameters") else None
    stats = StepStatistics(crits, widths, vocab=vocab, top_k=top_k, path_dtype=path_dtype)
    bsz = default_batch_size(device) if batch_size is None else int(batch_size)
    if bsz < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    per_shard = bsz if prompts_per_shard is None else int(prompts_per_shard)
    if per_shard < 1:
        raise ValueError(f"prompts_per_shard must be >= 1, got {prompts_per_shard}")
    chunk = default_chunk_steps(device, bsz) if chunk_steps is None else int(chunk_steps)
    if chunk < 1:
        raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}")
    return _Settings(vocab, [str(c) for c in crits], widths, stats, bsz, per_shard, chunk)


def _tokenized_prompts(prompts: Sequence[Prompt | str | dict[str, Any]], tokenizer: Any, target: Any,
                       drafter: Any | None, n_steps: int, vocab: int,
                       add_special_tokens: bool) -> tuple[list[Prompt], list[list[int]]]:
    """The prompts (unknown token counts filled in) and their token ids; refuses empty, out-of-vocabulary or
    too-long prompts (prompt plus ``n_steps`` beyond either model's positions)."""
    plist = as_prompts(prompts)
    token_ids = [tokenizer(p.text, add_special_tokens=add_special_tokens)["input_ids"] for p in plist]
    # Unknown token counts (-1: a text file, JSONL with only 'text', plain strings) are the counts decoded.
    plist = [replace(p, n_tokens=len(ids)) if p.n_tokens < 0 else p for p, ids in zip(plist, token_ids)]
    for p, ids in zip(plist, token_ids):
        if not ids:
            raise ValueError(f"prompt {p.prompt_id!r} has no tokens")
        if max(ids) >= vocab:
            raise ValueError(f"prompt {p.prompt_id!r} has token id {max(ids)} >= the models' vocabulary {vocab}")
    for name, model in (("target", target), ("drafter", drafter)):
        limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) if model is not None else None
        if limit:
            too_long = [p.prompt_id for p, ids in zip(plist, token_ids) if len(ids) + n_steps > limit]
            if too_long:
                raise ValueError(f"{len(too_long)} prompt(s) do not fit the {name}'s {limit} positions with "
                                 f"{n_steps} steps, e.g. {too_long[0]!r}")
    return plist, token_ids


def _run_config(target: Any, drafter: Any | None, tokenizer: Any, plist: list[Prompt], st: _Settings, *,
                n_steps: int, order: str, stop_at_eos: bool, eos: list[int], pad_id: int, add_special_tokens: bool,
                seed: int, columns: list[str], shards: list[list[int]]) -> dict[str, Any]:
    """Everything that determines a harvest's bits; its digest decides whether a folder may be resumed.
    ``shards``: the plan (prompt positions per shard), recorded by its sha256: a shard file holds the
    prompts of its index in one plan, so a folder cut by another plan (another version) is not resumed."""
    versions = store.package_versions()
    return {
        "target": store.model_identity(target),
        "drafter": store.model_identity(drafter) if drafter is not None else None,
        "tokenizer": store.tokenizer_identity(tokenizer),
        "dtype": _dtype_name(next(target.parameters()).dtype),
        "drafter_dtype": _dtype_name(next(drafter.parameters()).dtype) if drafter is not None else None,
        "device_type": target.device.type,
        "prompt_set": {"digest": prompt_set_digest(plist), "n_prompts": len(plist)},
        "criteria": st.specs,
        "tree_widths": st.widths,
        "n_steps": n_steps,
        "top_k": st.stats.top_k,
        "batch_size": st.batch_size,
        "prompts_per_shard": st.per_shard,
        "chunk_steps": st.chunk,
        "order": order,
        "shard_plan": hashlib.sha256(json.dumps(shards).encode()).hexdigest(),
        "stop_at_eos": stop_at_eos,
        "eos_token_ids": eos,
        "pad_token_id": int(pad_id),
        "add_special_tokens": add_special_tokens,
        "seed": seed,
        # A harvest written by a version with other columns is another configuration: its shards
        # lack what this version reads.
        "columns": columns,
        # Numerics depend on these: a resume under other versions, thread counts or hardware would
        # mix rows of two programs.
        "software": {**{k: versions[k] for k in ("companion", "torch", "transformers")},
                     "engine": store.engine_digest()},
        "numerics": store.numerics_record(target.device),
    }


def shard_count(n_prompts: int, per_shard: int) -> int:
    """The fewest shards :func:`_shard_plan` cuts ``n_prompts`` prompts into: ``ceil(n / per_shard)``,
    rounded up to an even number (at most ``n``) when above one, so that two processes can get equal
    halves (one shard, every prompt in one batch, stays one: a single batch does them fastest)."""
    if n_prompts < 1:
        return 0
    count = -(-n_prompts // per_shard)
    return count if count == 1 else min(n_prompts, count + count % 2)


def shard_work(n_prompt_tokens: int, n_steps: int) -> int:
    """A prompt's work in tokens: its prompt tokens plus the steps to decode (each step one token)."""
    return n_prompt_tokens + n_steps


# Two processes' shares of the work (shard i to rank i mod 2) may differ by this factor before the
# plan takes more, smaller shards (a goal of 1.15, with room for the steps that end early at EOS).
_BALANCE = 1.10


def _shard_plan(token_ids: list[list[int]], order: str, per_shard: int, n_steps: int = 0) -> list[list[int]]:
    """Prompt positions of each shard: the same whatever the number of processes.

    The prompts are ordered (``"length"``: by token count then position, so that a batch pads
    little; ``"given"``: as given) and cut into ``S`` contiguous runs of about equal work
    (:func:`shard_work`: prompt tokens + ``n_steps``), none over ``per_shard`` prompts. With
    ``C(j)`` the work of the first ``j`` prompts and ``W = C(n)``, the ``k``-th cut is the ``j``
    closest to ``k W / S`` that leaves every run between 1 and ``per_shard`` prompts.

    Shard ``i`` goes to the process of rank ``i mod world``. ``S`` is the first even count from
    :func:`shard_count` up whose two halves (the even and the odd shards: two processes' shares)
    differ by at most a factor 1.10; where ``per_shard`` caps the runs of short prompts, equal
    work needs more, smaller runs. If no count up to four times :func:`shard_count` gets there
    (say, one prompt longer than all the others together), the most balanced of them (the fewest
    shards among equals).
    """
    positions = list(range(len(token_ids)))
    if order == "length":
        positions.sort(key=lambda i: (len(token_ids[i]), i))
    n = len(positions)
    if n == 0:
        return []
    cumulative = [0]
    for i in positions:
        cumulative.append(cumulative[-1] + shard_work(len(token_ids[i]), n_steps))
    best: tuple[float, list[int]] | None = None
    base = shard_count(n, per_shard)
    if base == 1:  # every prompt fits one batch, which decodes them fastest: no halves to balance
        return [positions]
    for count in range(base, min(n, 4 * base) + 1, 2):
        cuts = _equal_work_cuts(cumulative, count, per_shard)
        halves = [sum(cumulative[b] - cumulative[a] for a, b in list(zip(cuts, cuts[1:]))[r::2]) for r in (0, 1)]
        ratio = max(halves) / min(halves) if min(halves) > 0 else (1.0 if max(halves) == 0 else float("inf"))
        if best is None or ratio < best[0]:
            best = (ratio, cuts)
        if ratio <= _BALANCE:
            break
    cuts = best[1]
    return [positions[a:b] for a, b in zip(cuts, cuts[1:])]


def _equal_work_cuts(cumulative: list[int], count: int, per_shard: int) -> list[int]:
    """``count + 1`` cut positions ``0 = c_0 < ... < c_count = n``: each ``c_k`` the ``j`` with
    ``cumulative[j]`` closest to ``k W / count`` (the first of equals) that leaves every run
    between 1 and ``per_shard`` prompts (feasible for ``n / per_shard <= count <= n``)."""
    n, total = len(cumulative) - 1, cumulative[-1]
    cuts = [0]
    for k in range(1, count):
        # room for the runs still to come: each of the count - k left holds 1 to per_shard prompts
        lo = max(cuts[-1] + 1, n - (count - k) * per_shard)
        hi = min(cuts[-1] + per_shard, n - (count - k))
        target = k * total / count
        cuts.append(min(range(lo, hi + 1), key=lambda j: (abs(cumulative[j] - target), j)))
    cuts.append(n)
    return cuts


def _open_manifest(out: Path, config: dict[str, Any], digest: str, dist: Distributed, say: Callable[[str], None], *,
                   device: torch.device, schema: pa.Schema, prompt_set_name: str | None, extra: dict[str, Any] | None,
                   started: str) -> dict[str, str]:
    """Mark the harvest running; return the checksums of the verified shards already there.

    The main process checks an existing manifest and every shard already there (damaged ones are
    removed, to be recomputed) before writing anything; the others then check the manifest.
    """
    manifest_path = out / store.MANIFEST
    checksums: dict[str, str] = {}
    if dist.is_main:
        previous = _check_existing(out, config, digest)
        checksums = _verified_shards(out, digest, previous, say)
        manifest = previous or {
            "format": store.FORMAT,
            "status": "running",
            "config_digest": digest,
            "config": config,
            "schema": schema.names,
            "prompt_set_name": prompt_set_name,
            "extra": extra or {},
            "created": started,
            "runs": [],
        }
        manifest["status"] = "running"
        manifest["environment"] = store.environment_record(device, dist.world)
        store.write_json(manifest_path, manifest)
    dist.barrier()
    if not dist.is_main:
        _check_existing(out, config, digest)
    store.remove_stale_temporaries(out, dist.rank, dist.world)
    return checksums


def _decode_shard(index: int, members: list[int], target: Any, drafter: Any | None, token_ids: list[list[int]],
                  plist: list[Prompt], st: _Settings, schema: pa.Schema, out: Path, digest: str, dist: Distributed, *,
                  n_steps: int, pad_id: int, eos: list[int], stop_at_eos: bool, hook: BlockHook | None, bar: Any,
                  written: dict[str, str], tally: dict[str, float], stop: Callable[[], bool] | None = None) -> None:
    """Decode one shard's prompts in batches, write the shard atomically, record its checksum in ``written``."""
    t0 = time.perf_counter()
    parts = []
    for start in range(0, len(members), st.batch_size):
        batch = members[start:start + st.batch_size]
        result = decode_batch(
            target, drafter, [token_ids[i] for i in batch], n_steps, st.stats,
            chunk_steps=st.chunk, pad_id=pad_id, eos_ids=eos, stop_at_eos=stop_at_eos,
            hook=_batch_hook(hook, batch), on_block=_on_block(bar, stop),
        )
        parts.append(_batch_table(result, batch, plist, token_ids, schema))
        if bar is not None:  # steps skipped after every prompt ended count as done
            bar.update(len(batch) * (n_steps - result.steps_run))
    table = pa.concat_tables(parts)
    elapsed = time.perf_counter() - t0
    meta = {
        "index": index,
        "rank": dist.rank,
        "config_digest": digest,
        "prompt_ids": [plist[i].prompt_id for i in members],
        "rows": table.num_rows,
        "top2_ties": int(np.count_nonzero(table.column("top2_tie").to_numpy(zero_copy_only=False))),
        "compute_s": round(elapsed, 3),
    }
    path, sha = store.write_shard(out, index, dist.rank, table, meta)
    written[path.name] = sha
    tally["rows"] += table.num_rows
    tally["compute_s"] += elapsed


def _check_stop(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise KeyboardInterrupt


def _on_block(bar: Any, stop: Callable[[], bool] | None) -> Callable[[int], None] | None:
    """After every block: advance the progress bar, then honour a requested stop."""
    if bar is None and stop is None:
        return None

    def done(n: int) -> None:
        if bar is not None:
            bar.update(n)
        _check_stop(stop)

    return done


def _merge_ranks(out: Path, digest: str, n_shards: int, dist: Distributed, part: dict[str, Any], started: str,
                 t_start: float, checksums: dict[str, str]) -> dict[str, Any]:
    """Every process records its part; the main one merges them into the final manifest, which all return."""
    store.write_json(out / store.PARTS_DIR / f"rank{dist.rank}.json", part)
    dist.barrier()
    manifest = None
    if dist.is_main:
        ranks = _read_parts(out, dist.world)
        for r in ranks:
            checksums |= r.pop("checksums", {})
        manifest = _finalize(out, digest, n_shards, dist.world, ranks, started, t_start, checksums)
        _remove_parts(out)
    dist.barrier()
    if manifest is None:
        manifest = store.read_manifest(out)
    return manifest


def _check_existing(out: Path, config: dict[str, Any], digest: str) -> dict[str, Any] | None:
    """The manifest already in ``out`` if its configuration is ``config``; None if ``out`` is new; else raise."""
    if (out / store.MANIFEST).exists():
        previous = store.read_manifest(out)
        if previous.get("config_digest") != digest:
            diffs = store.config_differences(previous.get("config", {}), config)
            raise store.HarvestConfigError(
                f"{out} already holds a harvest with a different configuration ("
                + "; ".join(diffs or ["the digests differ"])
                + f"): use another output directory, or delete {out} to start over")
        return previous
    if out.exists() and any(not e.name.startswith(".") for e in out.iterdir()):
        raise store.HarvestConfigError(f"{out} exists, is not empty and has no {store.MANIFEST}: refusing to write into it")
    return None


def _verified_shards(out: Path, digest: str, previous: dict[str, Any] | None, say: Callable[[str], None]) -> dict[str, str]:
    """sha256 of every sound shard already in ``out``; damaged ones are deleted (to be recomputed) and named.

    A shard the manifest records is checked against its sha256; one it does not (written by a run
    killed before it could record it) is read whole with its page checksums verified.
    """
    recorded = {Path(s["file"]).name: s.get("sha256") for s in (previous or {}).get("shards", [])}
    sound: dict[str, str] = {}
    damaged = []
    for index, path in sorted(store.existing_shards(out).items()):  # all checked (a foreign one raises) ...
        sha = recorded.get(path.name)
        problem = store.shard_problem(path, digest, sha)
        if problem is None:
            sound[path.name] = sha or store.file_sha256(path)
        else:
            damaged.append((index, path, problem))
    for index, path, problem in damaged:  # ... before any is removed
        say(f"companion harvest: {path} is damaged ({problem}); recomputing shard {index}")
        path.unlink()
    return sound


def _read_parts(out: Path, world: int) -> list[dict[str, Any]]:
    """The per-process run records of this run (``parts/rank<r>.json``)."""
    ranks = []
    for r in range(world):
        path = out / store.PARTS_DIR / f"rank{r}.json"
        if path.exists():
            ranks.append(json.loads(path.read_text()))
    return ranks


def _remove_parts(out: Path) -> None:
    """Remove every per-process record, this run's and any a failed run left (whose shards this run resumed)."""
    parts_dir = out / store.PARTS_DIR
    for path in parts_dir.glob("rank*.json"):
        path.unlink(missing_ok=True)
    if parts_dir.is_dir() and not any(parts_dir.iterdir()):
        parts_dir.rmdir()


def _finalize(out: Path, digest: str, n_shards: int, world: int, ranks: list[dict[str, Any]], started: str,
              t_start: float, checksums: dict[str, str], *, interrupted: bool = False) -> dict[str, Any]:
    """Main process: merge this run's per-process records and the shard list into the manifest.

    Status: ``complete`` when every shard is there, else ``incomplete`` (``interrupted`` after
    Ctrl-C); ``missing_shards`` lists the others.
    """
    manifest = store.read_manifest(out)
    found = store.existing_shards(out)
    shard_records = store.summarize_shards((found[i] for i in sorted(found)), checksums)
    missing = sorted(set(range(n_shards)) - set(found))
    rows_this_run = sum(r["rows"] for r in ranks)
    wall = time.perf_counter() - t_start
    if rows_this_run:
        run = {"started": started, "finished": store.iso_now(), "wall_s": round(wall, 3), "world_size": world,
               "rows": rows_this_run, "steps_per_s": round(rows_this_run / wall, 3) if wall > 0 else None,
               "ranks": ranks}
        if interrupted:
            run["interrupted"] = True
        manifest["runs"].append(run)
    rows = sum(s["rows"] for s in shard_records)
    compute = sum(s["compute_s"] for s in shard_records)
    manifest["shards"] = shard_records
    manifest["totals"] = {
        "shards": len(shard_records),
        "prompts": sum(len(s["prompt_ids"]) for s in shard_records),
        "rows": rows,
        "top2_tie_steps": sum(s["top2_ties"] for s in shard_records),
        "compute_s": round(compute, 3),
        "steps_per_s_per_process": round(rows / compute, 3) if compute > 0 else None,
        "wall_s": round(sum(r["wall_s"] for r in manifest["runs"]), 3),
    }
    manifest["status"] = "complete" if not missing else ("interrupted" if interrupted else "incomplete")
    if missing:
        manifest["missing_shards"] = missing
    else:
        manifest.pop("missing_shards", None)
    store.write_json(out / store.MANIFEST, manifest)
    return manifest


def _batch_hook(hook: BlockHook | None, batch: list[int]) -> BlockHook | None:
    """Translate batch-local rows to prompt positions for the user's hook."""
    if hook is None:
        return None

    def inner(rows, first, lp, lq, cols):
        hook([batch[r] for r in rows], first, lp, lq, cols)

    return inner


_NUMPY = {pa.int32(): np.int32, pa.float64(): np.float64, pa.bool_(): np.bool_}


def _batch_table(result: Any, batch: list[int], plist: list[Prompt], token_ids: list[list[int]], schema: pa.Schema) -> pa.Table:
    """Rows (prompt-major, then step) of the recorded steps of one batch."""
    valid = result.valid
    counts = valid.sum(1)
    n = int(counts.sum())
    steps = np.broadcast_to(np.arange(valid.shape[1], dtype=np.int32), valid.shape)[valid]
    arrays: dict[str, pa.Array] = {
        "prompt_id": pa.array(np.repeat(np.array([plist[i].prompt_id for i in batch], dtype=object), counts), pa.string()),
        "prompt_index": pa.array(np.repeat(np.asarray(batch, dtype=np.int32), counts)),
        "prompt_tokens": pa.array(np.repeat(np.asarray([len(token_ids[i]) for i in batch], dtype=np.int32), counts)),
        "step": pa.array(steps),
    }
    for field in schema:
        if field.name in arrays:
            continue
        col = result.columns[field.name][valid]
        if pa.types.is_fixed_size_list(field.type):
            flat = pa.array(np.ascontiguousarray(col).reshape(-1).astype(_NUMPY[field.type.value_type]))
            arrays[field.name] = pa.FixedSizeListArray.from_arrays(flat, field.type.list_size)
        else:
            arrays[field.name] = pa.array(col.astype(_NUMPY[field.type]), field.type)
    assert all(len(a) == n for a in arrays.values())
    return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)


def _progress(enabled: bool, total: int, rank: int, world: int):
    if not enabled or total == 0:
        return None
    from tqdm.auto import tqdm

    desc = "harvest" if world == 1 else f"harvest rank {rank}"
    return tqdm(total=total, desc=desc, unit="step", position=rank, dynamic_ncols=True, smoothing=0.05)
