"""The decode-time chapters' shared recordings: recorded once per configuration, cached, reused.

Chapters 10 (certificates at decode time) and 11 (speculative decoding on the clock) analyse the
same recordings: the drafter's greedy chains along the target's harvested answers
(:func:`companion.speculative.record_many`), the per-step columns of the drafter-side soundness
check made in the same pass, and the cost model they are priced with. :func:`decode_time_data`
makes them once and pickles them beside the shared harvest under ``runs/``; whichever of the two
chapters gets there first records, the other waits on the folder's lock (``companion reproduce``
runs two chapters at once) and then reads the file, so the main job records once, as before the
chapters were split.
"""
from __future__ import annotations

import hashlib
import json
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from companion.harvest.lock import exclusive
from companion.models.sizes import card_parameters
from companion.speculative.costs import CostModel

#: Bump when what :func:`decode_time_data` stores changes, so that older caches are not read.
CACHE_VERSION = 1


@dataclass
class DecodeTimeData:
    """What both decode-time chapters read (see the module docstring).

    ``chains``: one recording per prompt, the ``n_eval`` evaluated first, then the calibration
    prompts; ``per_step``: per recorded step, the columns of the soundness pass (``accepted``,
    ``certified``, ``q1``, ``q2``, ``rho``, ``tied``, ``near_target``, ``near_drafter``,
    ``path_certified``, ``path_rejected``); ``sound``: per criterion, the soundness counts summed
    over the answers; ``costs``: the cost model every replay is priced with and ``cost_source``
    where it came from (``pinned``, ``committed`` or ``measured``).
    """

    chains: list[Any]
    n_eval: int
    n_record: int
    prompt_ids: list[torch.Tensor]
    per_step: dict[str, np.ndarray]
    sound: dict[str, Any]
    record_s: float
    threads: int
    rerecorded: int
    model_dtype: str
    path_band: float
    z_max: float
    costs: CostModel
    cost_source: str
    from_cache: bool = field(default=False, compare=False)

    @property
    def eval_chains(self) -> list[Any]:
        return self.chains[:self.n_eval]

    @property
    def calib_chains(self) -> list[Any]:
        return self.chains[self.n_eval:]


def cache_path(traces_dir: Path, settings: dict[str, Any]) -> Path:
    """``<traces_dir>-recordings-<hash of settings>.pkl``, beside the harvest folder (which a harvest of
    another configuration may move aside) and named by every setting that changes what is recorded."""
    key = hashlib.sha256(json.dumps({**settings, "version": CACHE_VERSION}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:12]
    return traces_dir.with_name(f"{traces_dir.name}-recordings-{key}.pkl")


def cached(path: Path, make: Callable[[], DecodeTimeData], on_wait: Callable[[Path], None] | None = None
           ) -> DecodeTimeData:
    """The data pickled at ``path``, or ``make()``'s, pickled there; one maker at a time (the lock)."""
    with exclusive(path, on_wait=on_wait):
        if path.is_file():
            with open(path, "rb") as f:
                data = pickle.load(f)
            if isinstance(data, DecodeTimeData):
                data.from_cache = True
                return data
        data = make()
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(data, f)
        tmp.replace(path)
        return data


def cost_model(preset: str, device_type: str, pinned_costs: str, measured_costs: str, model_dtype: str,
               measure: Callable[[], CostModel]) -> tuple[CostModel, str]:
    """``(the cost model, its source)``: ``pinned_costs`` ``"c,v1,dv"`` if given; on the CPU with
    ``measured_costs == "auto"`` the preset's committed measurement (``V(k)`` past its longest
    measured draft on its least-squares line); else ``measure()`` now (extended the same way)."""
    from companion.speculative.clock import committed_costs

    if measured_costs not in ("auto", "now"):
        raise ValueError(f"measured_costs must be 'auto' or 'now', got {measured_costs!r}")
    if pinned_costs:
        c_pin, v1_pin, dv_pin = (float(x) for x in pinned_costs.split(","))
        return CostModel(c=c_pin, verify=(1.0,) + tuple(v1_pin + dv_pin * (k - 1) for k in range(1, 41))), "pinned"
    committed = committed_costs(preset) if measured_costs == "auto" and device_type == "cpu" else None
    if committed is not None:
        samples, record = committed
        if record["preset"] != preset or record["dtype"] != model_dtype:
            raise ValueError(f"the committed cost measurement is of {record['preset']!r} in {record['dtype']}, "
                             f"not {preset!r} in {model_dtype}: measure it again (benchmarks/measure_costs.py)")
        measured, source = samples.model(), "committed"
    else:
        measured, source = measure(), "measured"
    v1, dv = measured.affine()
    kmax = len(measured.verify) - 1
    verify = measured.verify + tuple(v1 + dv * (k - 1) for k in range(kmax + 1, 41))
    return CostModel(c=measured.c, verify=verify, target_s=measured.target_s, drafter_s=measured.drafter_s), source


def sum_soundness(per_answer: list[dict[str, Any]]) -> dict[str, Any]:
    """Per criterion, the soundness counts of every answer summed, in the answers' order."""
    totals: dict[str, Any] = {}
    for counts in per_answer:
        for k, v in counts.items():
            t = totals.get(k)
            totals[k] = v if t is None else type(v)(k, t.rows + v.rows, t.accepted + v.accepted,
                                                    t.certified + v.certified,
                                                    t.certified_and_rejected + v.certified_and_rejected)
    return totals


def record_with_soundness(target: Any, drafter: Any, prompt_ids: list[torch.Tensor], answers: list[list[int]], *,
                          n_record: int, max_drafts: int | None, threads: int, model_dtype: str, path_band: float,
                          specs: list[str], builtins: list[str]) -> tuple[list[Any], dict[str, np.ndarray],
                                                                          dict[str, Any], float]:
    """Record every answer's chains (its first ``n_record`` tokens) and, in the same pass, the drafter-side
    soundness of each step (:func:`companion.speculative.soundness_rows.step_rows`): ``(chains, per-step
    columns, soundness counts per criterion, seconds)``. An answer on which a built-in of ``builtins``
    would ask for more drafts than recorded is recorded again with longer chains."""
    from companion.speculative import fits, record_many
    from companion.speculative.soundness_rows import step_rows

    per_answer: list[Any] = [None] * len(prompt_ids)

    def inspect(i: int, lp: torch.Tensor, lq: torch.Tensor) -> None:
        per_answer[i] = step_rows(lp, lq, specs, model_dtype, path_band)

    t0 = time.perf_counter()
    chains = record_many(target, drafter, prompt_ids, max_new_tokens=n_record, max_drafts=max_drafts,
                         texts=[a[:n_record] for a in answers], inspect=inspect, threads=threads, progress=True,
                         enough=lambda ch: fits(ch, builtins))
    seconds = time.perf_counter() - t0
    per_step = {k: np.concatenate([cols[k] for _, cols in per_answer]) for k in per_answer[0][1]}
    return chains, per_step, sum_soundness([counts for counts, _ in per_answer]), seconds


@dataclass
class DecodeTime:
    """A decode-time chapter's inputs: the shared harvest, its answers, the models when loaded, the data."""

    harvest: Any
    traces: Any
    answers: list[list[int]]
    data: DecodeTimeData
    models: tuple[Any, Any, Any, Any] | None   # (target, drafter, tokenizer, prompts), or None


def harvested_answers(traces: Any, n_prompts: int) -> list[list[int]]:
    """The harvest's greedy answers by prompt: tokens in step order, the end token included when the answer ended."""
    prompt_index, step_no, token_col = (traces.column(c) for c in ("prompt_index", "step", "token"))
    answers = []
    for i in range(n_prompts):
        rows = np.flatnonzero(prompt_index == i)
        rows = rows[np.argsort(step_no[rows])]
        if not np.array_equal(step_no[rows], np.arange(len(rows))):
            raise ValueError(f"prompt {i}: the harvested steps are not 0..{len(rows) - 1}; harvest again")
        answers.append([int(t) for t in token_col[rows]])
    return answers


def decode_time(preset: str, *, device: str, seed: int, n_eval_prompts: int, n_calibration_prompts: int,
                max_new_tokens: int, record_new_tokens: int, batch_size: int, harvest_processes: int,
                harvest_threads: int, record_threads: int, traces_dir: str, max_drafts: int | None,
                pinned_costs: str, measured_costs: str, measure_kmax: int, measure_repeats: int,
                load_models: bool) -> DecodeTime:
    """The shared harvest (:func:`companion.book.harvest_cache.chapter_traces`) and the recordings of
    :class:`DecodeTimeData`, made once per configuration (:func:`cached`). ``load_models``: load the pair
    even when the recordings come from the cache (chapter 10 decodes live; chapter 11 does not)."""
    import companion.analysis as A
    from companion.book.harvest_cache import chapter_traces
    from companion.certify.precision import tie_band
    from companion.harvest import load_traces
    from companion.harvest.plan import load_planned, plan_harvest
    from companion.models.devices import resolve_device, usable_cores
    from companion.speculative import grid_builtins, measure_costs, parse_policy
    from companion.certify.criteria import PAPER_CRITERIA

    if isinstance(record_new_tokens, bool) or not isinstance(record_new_tokens, int) or record_new_tokens < 1:
        raise ValueError(f"record_new_tokens must be a positive integer, got {record_new_tokens!r}")
    kmax = parse_policy("certificate").kmax
    if max_drafts is not None and (isinstance(max_drafts, bool) or not isinstance(max_drafts, int) or max_drafts < kmax):
        raise ValueError(f"max_drafts must be None or an integer >= {kmax} (the calibrated rules' longest draft), "
                         f"got {max_drafts!r}")
    n_prompts = n_eval_prompts + n_calibration_prompts
    harvest = chapter_traces(preset, device=device, seed=seed, n_prompts=n_prompts, n_steps=max_new_tokens,
                             batch_size=batch_size, traces_dir=traces_dir, processes=harvest_processes,
                             cpu_threads=harvest_threads)
    traces = A.Traces(load_traces(harvest.traces_dir), harvest.manifest)
    answers = harvested_answers(traces, n_prompts)
    dev = resolve_device(device)
    plan = plan_harvest(preset, n_prompts=n_prompts, seed=seed)
    models: list[Any] = []

    def loaded() -> tuple[Any, Any, Any, Any]:
        if not models:
            got = load_planned(plan, device=dev)
            if got[1] is None:
                raise ValueError(f"preset {preset!r} has no drafter; the decode-time chapters need one")
            models.append(got)
        return models[0]

    n_record = min(record_new_tokens, max_new_tokens)
    settings = dict(preset=preset, device=dev.type, seed=seed, n_eval=n_eval_prompts, n_calib=n_calibration_prompts,
                    n_record=n_record, max_drafts=max_drafts, pinned=pinned_costs, measured=measured_costs,
                    measure=(measure_kmax, measure_repeats), builtins=grid_builtins(),
                    # the harvest's configuration, not its whole manifest: the chapter that harvests holds the
                    # manifest harvest() returned, the other the one read back, and the two need not be equal
                    harvest=harvest.manifest.get("config"))

    def make() -> DecodeTimeData:
        target, drafter, tokenizer, prompts = loaded()
        ids = [tokenizer(p.text, return_tensors="pt", add_special_tokens=False).input_ids.to(dev) for p in prompts]
        dtype = str(next(target.parameters()).dtype).removeprefix("torch.")
        # the target's band at the largest top logit the harvest saw: the bound the drafter-side
        # certificate under kernel paths assumes (q alone does not reveal the target's logit scale)
        z_max = float(np.max(traces.column("logit_top1")))
        band = float(tie_band(z_max, dtype)) if dtype in ("bfloat16", "float16") else 0.0
        threads = min(record_threads, usable_cores()) if dev.type == "cpu" else 1
        chains, per_step, sound, seconds = record_with_soundness(
            target, drafter, ids, answers, n_record=n_record, max_drafts=max_drafts, threads=threads,
            model_dtype=dtype, path_band=band, specs=list(PAPER_CRITERIA), builtins=grid_builtins())
        context = int(np.median([x.shape[1] for x in ids[:n_eval_prompts]])) + n_record // 2
        costs, source = cost_model(preset, dev.type, pinned_costs, measured_costs, dtype, lambda: measure_costs(
            target, drafter, context=context, kmax=measure_kmax, repeats=measure_repeats))
        return DecodeTimeData(chains=chains, n_eval=n_eval_prompts, n_record=n_record, prompt_ids=[x.cpu() for x in ids],
                              per_step=per_step, sound=sound, record_s=seconds, threads=threads,
                              rerecorded=sum(ch.max_drafts != max_drafts for ch in chains), model_dtype=dtype,
                              path_band=band, z_max=z_max, costs=costs, cost_source=source)

    data = cached(cache_path(Path(harvest.traces_dir), settings), make,
                  on_wait=lambda p: print(f"waiting for the other decode-time chapter's recordings ({p.name})"))
    return DecodeTime(harvest, traces, answers, data, loaded() if load_models else None)


def pair_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """The pair's names and sizes from the harvest's manifest, for a page to glue one by one: ``target`` and
    ``drafter`` (the model cards' names where the weights were converted, else the models' ids), ``dtype``, and
    ``target_parameters`` and ``drafter_parameters`` (as the model cards count them where known:
    :func:`companion.models.sizes.card_parameters`)."""
    config = manifest["config"]
    out: dict[str, Any] = {"dtype": config["dtype"]}
    for role in ("target", "drafter"):
        model = config[role]
        converted = model.get("converted_from") or {}
        name = str(converted.get("display_name") or model["name"])
        # a model read from a folder (the closed-world pair) is named by its last two folders, not its path
        out[role] = "/".join(Path(name).parts[-2:]) if Path(name).is_absolute() else name
        out[f"{role}_parameters"] = card_parameters(model) if converted.get("display_name") else model["parameters"]
    return out


def answer_ranks(traces: Any, n_prompts: int) -> list[list[int]]:
    """Per answer, in step order, the rank of the target's greedy token in the drafter's distribution read on the
    same prefix (``token_rank_in_draft``: 1 when it is the drafter's own greedy token, ties to the lowest id)."""
    prompt_index, step_no, rank = (traces.column(c) for c in ("prompt_index", "step", "token_rank_in_draft"))
    out = []
    for i in range(n_prompts):
        rows = np.flatnonzero(prompt_index == i)
        out.append([int(r) for r in rank[rows[np.argsort(step_no[rows])]]])
    return out
