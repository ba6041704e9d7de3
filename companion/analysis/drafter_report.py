"""Chapter 8's plumbing: the numbers it reads off a harvest with a real drafter, as data.

Nothing here writes a sentence; the chapter's prose is written by hand and quotes these numbers.

* :func:`pair_facts` -- the pair that ran, from the harvest's manifest (names, sizes, dtype).
* :func:`near_tie_counts` -- near ties of the target and the drafter, and strict greedy's certified
  share under the exact-ties and the kernel-path conventions.
* :func:`run_assisted` -- ``transformers``' assisted generation on the harvest's first prompts,
  compared round for round with the harvest (:mod:`companion.speculative.harvest_rounds`).
* :func:`agreement_groups` -- the drafter's agreement with the target's greedy token per group of
  steps (by the target's top-1 probability, by kind of request, by position in the answer).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from companion.harvest.ties import near_ties


@dataclass(frozen=True)
class PairFacts:
    """What ran: model names (the published name when converted from a GGUF file), parameter
    counts in millions, the dtype, prompts and steps."""

    target: str
    drafter: str
    target_params_m: float
    drafter_params_m: float
    published_drafter: bool
    dtype: str
    device: str
    n_prompts: int
    n_steps: int
    rows: int


def _name(ident: dict[str, Any]) -> str:
    conv = ident.get("converted_from") or {}
    return str(conv.get("display_name") or ident.get("name") or "(in memory)")


def pair_facts(manifest: dict[str, Any], rows: int) -> PairFacts:
    """The pair of a harvest, from its manifest alone (so traces made elsewhere are described as
    they were made)."""
    cfg = manifest["config"]
    target, drafter = cfg["target"], cfg.get("drafter") or {}
    return PairFacts(
        target=_name(target), drafter=_name(drafter) if drafter else "none",
        target_params_m=target.get("parameters", 0) / 1e6,
        drafter_params_m=drafter.get("parameters", 0) / 1e6,
        published_drafter=bool((drafter.get("converted_from") or {}).get("display_name")),
        dtype=str(cfg.get("dtype", "?")), device=str(cfg.get("device_type", "?")),
        n_prompts=int(cfg.get("prompt_set", {}).get("n_prompts", 0)),
        n_steps=int(cfg.get("n_steps", 0)), rows=rows)


@dataclass(frozen=True)
class NearTieCounts:
    """Near ties (top-2 logit gap within the band, :func:`companion.harvest.ties.near_ties`) of the
    target and of the drafter, the share of steps with either, and strict greedy's certified share
    (``KL(p || q) < rho*``) under the exact-ties convention and with the target's near ties counted
    as ties (the kernel-path convention)."""

    target: int
    drafter: int
    share_either: float
    certified_exact_ties: float
    certified_kernel_path: float
    near_tie_mask: np.ndarray


def near_tie_counts(traces, traces_exact, dtype: str) -> NearTieCounts:
    """Count near ties on a harvest; ``traces_exact`` holds the exact-ties certificates."""
    near_target = near_ties(traces.column("logit_top1"), traces.column("logit_gap"), dtype)
    near_drafter = near_ties(traces.column("draft_logit_top1"), traces.column("draft_logit_gap"), dtype)
    cert = traces_exact.cert("greedy")
    kl = traces_exact.kl()
    return NearTieCounts(
        target=int(near_target.sum()), drafter=int(near_drafter.sum()),
        share_either=float(np.mean(near_target | near_drafter)),
        certified_exact_ties=float(np.mean(kl < cert)),
        certified_kernel_path=float(np.mean(kl < np.where(near_target, 0.0, cert))),
        near_tie_mask=near_target)


@dataclass(frozen=True)
class AssistedRun:
    """``transformers``' assisted generation against the harvest; ``comparison`` is None (and
    ``skipped`` says why) when it could not run here."""

    comparison: Any
    seconds: float
    tokens: int
    skipped: str | None


def run_assisted(preset: str, traces, *, n_prompts: int, seed: int, n_check: int, tokens: int,
                 dtype: str, device_type: str, traces_dir: str) -> AssistedRun:
    """Decode the harvest's first ``n_check`` prompts with assisted generation (constant draft
    length 4, ``tokens`` new tokens each) and compare with the harvest's rounds."""
    from companion.harvest.plan import PlanError, load_planned, plan_harvest
    from companion.prompts.ultrachat import PromptsUnavailableError
    from companion.speculative.harvest_rounds import compare_runs, harvest_rows_by_prompt
    from companion.speculative.hf import hf_assisted_generate

    n_check = min(n_check, traces.n_trajectories)
    if traces_dir:
        return AssistedRun(None, 0.0, tokens, "this harvest was made elsewhere (`traces_dir`), so its "
                           "prompts and models are not rebuilt here")
    if n_check == 0:
        return AssistedRun(None, 0.0, tokens, "`n_assisted_prompts` is 0")
    try:
        plan = plan_harvest(preset, n_prompts=n_prompts, seed=seed)
        target, drafter, tok, prompts = load_planned(plan, device=device_type, dtype=dtype)
    except (PlanError, PromptsUnavailableError, OSError, ValueError) as err:
        return AssistedRun(None, 0.0, tokens, "its prompts or models are not available here ("
                           + " ".join(str(err).split()) + ")")
    t0 = time.perf_counter()
    runs = []
    for p in prompts[:n_check]:
        ids = tok(p.text, add_special_tokens=False).input_ids
        r = hf_assisted_generate(target, drafter, ids, policy="constant:4", max_new_tokens=tokens)
        runs.append((r.tokens.tolist(), r.accepted))
    seconds = time.perf_counter() - t0
    rows = harvest_rows_by_prompt(traces.table, range(n_check))
    return AssistedRun(compare_runs(rows, runs, k=4, n=tokens, dtype=dtype), seconds, tokens, None)


@dataclass(frozen=True)
class AgreementRow:
    """One group of steps: its label, share of all steps, the drafter's agreement there (NaN when
    empty) and the share of all disagreements that fall in it."""

    label: str
    share: float
    agreement: float
    share_of_disagreements: float


def agreement_rows(agree: np.ndarray, groups: list[tuple[str, np.ndarray]]) -> list[AgreementRow]:
    """``agree``: per step, whether the drafter's greedy token is the target's; ``groups``:
    (label, boolean mask) pairs."""
    n_dis = max(int((~agree).sum()), 1)
    return [AgreementRow(label, float(m.mean()), float(agree[m].mean()) if m.any() else float("nan"),
                         float((~agree & m).sum() / n_dis)) for label, m in groups]


def confidence_groups(p_top1: np.ndarray, edges=(0.0, 0.25, 0.5, 0.75, 0.9, 1.0)) -> list[tuple[str, np.ndarray]]:
    """Steps grouped by the target's top-1 probability into ``[a, b)`` (the last ``[a, 1]``)."""
    out = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        last = hi >= 1.0
        m = (p_top1 >= lo) & ((p_top1 <= hi) if last else (p_top1 < hi))
        out.append((f"[{lo:.2f}, {hi:.2f}{']' if last else ')'}", m))
    return out


def kind_and_position_groups(traces, preset: str, n_prompts: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """Steps grouped by kind of request (code: chat requests for code and every standard-library
    request; prose: the rest), when the planned prompts name their kind, and by position in the
    answer (steps 0-15, 16-31, 32-63, 64 on)."""
    from companion.harvest.plan import plan_harvest
    from companion.prompts.sets import request_kind

    pid = np.asarray(traces.table.column("prompt_id").to_pylist())
    step = traces.column("step")
    try:
        planned = plan_harvest(preset, n_prompts=n_prompts, seed=seed).prompts or []
    except Exception:   # a finished harvest of another preset's models (traces_dir): no records
        planned = []
    kind_of = {p.prompt_id: request_kind(p) for p in planned if request_kind(p) is not None}
    groups = []
    if kind_of and all(i in kind_of for i in set(pid)):
        is_code = np.array([kind_of[i] == "code" or kind_of[i].startswith("stdlib-") for i in pid])
        groups += [("requests for code", is_code), ("every other kind (prose)", ~is_code)]
    for lo, hi in ((0, 16), (16, 32), (32, 64), (64, None)):
        label = f"answer steps {lo}-{hi - 1}" if hi else f"answer steps {lo} on"
        groups.append((label, (step >= lo) & ((step < hi) if hi else True)))
    return groups


def confident_disagreements(traces, tokenizer_dir: str, *, threshold: float = 0.9, limit: int = 5,
                            context: int = 12) -> list[tuple[str, str, float, str]]:
    """Up to ``limit`` steps where the target's top-1 probability is at least ``threshold`` and the
    drafter's greedy token differs: (the last ``context`` tokens before it, the target's token,
    its probability, the drafter's token), decoded with the tokenizer in ``tokenizer_dir``."""
    from companion.models.loading import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    pid = np.asarray(traces.table.column("prompt_id").to_pylist())
    token, draft, step = traces.column("token"), traces.column("draft_token"), traces.column("step")
    p1, agree = traces.column("p_top1"), traces.column("accepted[greedy]")
    out = []
    for r in np.flatnonzero(~agree & (p1 >= threshold))[:limit]:
        rows = np.flatnonzero(pid == pid[r])
        before = " ".join(tok.decode(token[rows[: int(step[r])]][-context:]).split())
        out.append((before, tok.decode([int(token[r])]), float(p1[r]), tok.decode([int(draft[r])])))
    return out
