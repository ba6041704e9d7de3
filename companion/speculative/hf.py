"""``transformers``' own assisted generation, run under a policy spec and recorded round by round.

``hf_assisted_generate(target, drafter, ids, policy="constant:4", max_new_tokens=32)`` calls
``target.generate(ids, assistant_model=drafter, do_sample=False, ...)`` with the built-in
schedule that corresponds to the spec and returns a
:class:`~companion.speculative.decoder.SpeculativeResult`, so that it can be compared field by
field with :func:`companion.speculative.generate`.

Details of transformers 4.57 that this has to get right (``generation/candidate_generator.py``,
``generation/utils.py``):

* the schedule is read from the *assistant's* ``generation_config``
  (``num_assistant_tokens``, ``num_assistant_tokens_schedule``,
  ``assistant_confidence_threshold``): the same names passed as ``generate`` keyword arguments
  land in the target's config and are silently ignored. They are set on the drafter for the
  call and restored afterwards.
* the ``heuristic`` schedule writes its final ``num_assistant_tokens`` back into the assistant's
  config, so a later call would start from there; the original value is restored, so every call
  starts from the spec's ``K0``.
* the confidence threshold defaults to 0.4 and is on unless set to 0; ``constant:K`` and a plain
  ``heuristic:K0`` set it to 0.
* with scikit-learn importable, ``AssistedCandidateGenerator`` retunes the threshold after every
  round from an ROC curve; it is switched off for the call (``is_sklearn_available`` patched to
  ``False`` in that module), so the threshold stays the spec's.
* rounds are recorded by wrapping ``AssistedCandidateGenerator.get_candidates`` (the number of
  candidate tokens) and ``update_candidate_strategy`` (the sequence after acceptance); the
  accepted length is the number of leading candidates found in the appended tokens. This
  differs from transformers' ``n_matches`` in one case: when the last candidate is an
  end-of-sequence token and every candidate matched, transformers decrements ``n_matches`` and
  emits that token as the target's; the tokens are the same, and the record counts it accepted.
* forwards are counted with forward hooks on both models.

The patches are class-level for the duration of the call (not thread-safe).
"""
from __future__ import annotations

import copy
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from transformers.utils import logging as hf_logging

from companion.speculative.decoder import (
    SpeculativeResult,
    Timings,
    _check_ids_in_vocab,
    _check_model,
    _eos_ids,
    _prompt_ids,
)
from companion.speculative.policies import (
    Confidence,
    Constant,
    Heuristic,
    Policy,
    parse_policy,
)


def hf_settings(policy: str | Policy) -> dict[str, Any]:
    """The assistant ``generation_config`` values that implement a built-in policy spec."""
    pol = parse_policy(policy)
    if isinstance(pol, Constant):
        return {"num_assistant_tokens": pol.k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0}
    if isinstance(pol, Confidence):
        return {"num_assistant_tokens": pol.k, "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": pol.threshold}
    if isinstance(pol, Heuristic):
        return {"num_assistant_tokens": pol.k0, "num_assistant_tokens_schedule": "heuristic",
                "assistant_confidence_threshold": pol.threshold}
    raise ValueError(f"policy {str(pol)!r} has no transformers equivalent; expected constant:K, heuristic[:K0[,T]] or confidence:T[,K]")


@contextmanager
def _recording(target: Any, drafter: Any) -> Iterator[dict[str, Any]]:
    from transformers.generation import candidate_generator as cg

    rec: dict[str, Any] = {"rounds": [], "target": 0, "drafter": 0, "target_s": 0.0, "drafter_s": 0.0}
    cls = cg.AssistedCandidateGenerator
    orig_get, orig_update = cls.get_candidates, cls.update_candidate_strategy
    orig_sklearn = cg.is_sklearn_available
    pending: dict[str, Any] = {}

    def get_candidates(self: Any, input_ids: Tensor) -> Any:
        out = orig_get(self, input_ids)
        cur = input_ids.shape[-1]
        pending["cur"] = cur
        pending["cand"] = out[0][0, cur:].tolist()
        return out

    def update(self: Any, input_ids: Tensor, scores: Tensor, num_matches: int) -> Any:
        cand = pending["cand"]
        new = input_ids[0, pending["cur"]:].tolist()
        a = 0
        while a < len(cand) and a < len(new) and cand[a] == new[a]:
            a += 1
        rec["rounds"].append((len(cand), a, int(num_matches)))
        rec.setdefault("drafts", []).append(cand)
        return orig_update(self, input_ids, scores, num_matches)

    clocks: dict[str, float] = {}

    def pre(name: str) -> Any:
        def hook(module: Any, args: Any) -> None:
            clocks[name] = time.perf_counter()
        return hook

    def post(name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            rec[name] += 1
            rec[name + "_s"] += time.perf_counter() - clocks[name]
        return hook

    handles = [target.register_forward_pre_hook(pre("target")), target.register_forward_hook(post("target")),
               drafter.register_forward_pre_hook(pre("drafter")), drafter.register_forward_hook(post("drafter"))]
    cls.get_candidates, cls.update_candidate_strategy = get_candidates, update  # type: ignore[method-assign]
    cg.is_sklearn_available = lambda: False
    try:
        yield rec
    finally:
        cls.get_candidates, cls.update_candidate_strategy = orig_get, orig_update  # type: ignore[method-assign]
        cg.is_sklearn_available = orig_sklearn
        for h in handles:
            h.remove()


def hf_assisted_generate(
    target: Any,
    drafter: Any,
    input_ids: Tensor | Sequence[int],
    *,
    policy: str | Policy,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
) -> SpeculativeResult:
    """transformers' assisted greedy generation under a built-in policy spec, recorded per round.

    ``submitted`` and ``drafted`` are both the number of candidates of each round (transformers
    verifies every candidate it drafts); ``extra["n_matches"]`` keeps transformers' own counts.
    """
    settings = hf_settings(policy)
    vocab = _check_model(target, "target")
    _check_model(drafter, "drafter")
    seq = _prompt_ids(input_ids)
    _check_ids_in_vocab(seq, (target, drafter), vocab)
    ids = torch.tensor([seq], dtype=torch.long, device=target.device)
    eos = sorted(_eos_ids(eos_token_id, target))
    gc = drafter.generation_config
    # transformers also overwrites the assistant's eos_token_id with the target's
    saved = {k: copy.deepcopy(getattr(gc, k)) for k in (*settings, "eos_token_id")}
    for k, v in settings.items():
        setattr(gc, k, v)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers warns that the assistant's config differs from its defaults
    try:
        with _recording(target, drafter) as rec, torch.inference_mode():
            start = time.perf_counter()
            config = copy.deepcopy(target.generation_config)
            config.eos_token_id = eos if eos else None
            out = target.generate(ids, generation_config=config, assistant_model=drafter, do_sample=False,
                                  max_new_tokens=max_new_tokens)
            wall = time.perf_counter() - start
    finally:
        for k, v in saved.items():
            setattr(gc, k, v)
        hf_logging.set_verbosity(verbosity)
    rounds = rec["rounds"]
    tokens = out[0, ids.shape[1]:].cpu()
    return SpeculativeResult(
        tokens=tokens,
        target_forwards=rec["target"],
        drafter_forwards=rec["drafter"],
        accepted=[a for _, a, _ in rounds],
        submitted=[n for n, _, _ in rounds],
        drafted=[n for n, _, _ in rounds],
        policy=str(parse_policy(policy)),
        criterion="greedy",
        timings=Timings(wall_s=wall, target_s=rec["target_s"], drafter_s=rec["drafter_s"]),
        draft_tokens=rec.get("drafts", []),
        ended_by_eos=bool(len(tokens) and int(tokens[-1]) in set(eos)),
        extra={"n_matches": [m for _, _, m in rounds]},
    )
