"""A greedy speculative decoder for Hugging Face causal LMs (batch 1), with KV caches for both models.

One round: the drafter proposes ``d_1 .. d_k`` greedily (``d_t = argmax q_t``), one target forward
over the not-yet-cached context plus the drafts gives ``p_1 .. p_{k+1}``, the longest accepted
prefix ``d_1 .. d_a`` is kept and the target's own greedy token ``argmax p_{a+1}`` follows it (the
correction when ``a < k``, the bonus token when every draft was accepted). Both caches are then
cropped to the tokens they computed on the kept prefix.

* ``criterion="greedy"``: a draft is accepted iff it equals ``argmax p`` (as ``torch.argmax``
  resolves ties, toward the lowest id). Every emitted token is then the target's greedy token
  after the emitted prefix, so the output is the target's own greedy decoding: *lossless* (up to
  the floating-point differences between a one-token and a multi-token forward, which only
  matter at exact near-ties of the target's logits).
* any other spec of :mod:`companion.certify.criteria` (``"multiplicative:0.1"``...): draft ``d_t`` is
  accepted iff a real decoder accepts it under that criterion
  (:meth:`~companion.certify.criteria.Criterion.decoder_accepts`): ``p_t(d_t) >= tau(p_t)`` (``>`` for
  typical acceptance) and, for the rank conditions, ``d_t`` in the id-ordered ``topk(p_t, M)``
  (``topm:M``; ``topk(p_t, K)`` for ``topk-delta:K,D``), exact ties going to the lowest id, as
  ``torch.argmax``/``topk`` resolve them. The output is *lossy*: it is no
  longer the target's greedy decoding, only a sequence in which every token passed the criterion.
  Calibrated policies then use that criterion's drafter-side certificate.
* ``criterion="mars:THETA"`` (:class:`~companion.certify.criteria.Mars`, a lossy relaxation): draft ``d_t``
  is accepted iff it is the target's argmax, or, on a *relaxed* step (``z(1) > 0`` and
  ``z(2) / z(1) > THETA`` for the two largest raw target logits, ratio in float64), one of the
  id-ordered ``topk(z_t, 2)``. The rule reads the target's logits as the forward returns them
  (no logits processor, no temperature): a constant offset changes the ratio. ``mars:1`` never
  relaxes and gives strict greedy's output. No drafter-side certificate exists for MARS (the
  drafter cannot know the target's logit offset), so calibrated policies use strict greedy's
  closed form, which is the infimum over all target logits.

The length budget is that of ``transformers``' assisted generation: generation stops at
``len(prompt) + max_new_tokens`` tokens or after an end-of-sequence token, and a round drafts at
most ``max_length - cur_len - 1`` tokens so that its last token is the target's.
"""
from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from companion.certify.criteria import Criterion, StrictGreedy, parse_criterion
from companion.models.shortlist_llama import logit_count
from companion.speculative.policies import DraftStep, Policy, RoundOutcome, parse_policy


@dataclass(frozen=True)
class Timings:
    """Wall-clock seconds: the whole call, the target forwards, the drafter forwards."""

    wall_s: float
    target_s: float
    drafter_s: float


@dataclass
class SpeculativeResult:
    """What one speculative generation did.

    ``tokens``: the generated ids (1-D, prompt excluded). Per round ``r``: ``drafted[r]`` drafter
    calls, ``submitted[r]`` drafts verified (the round's draft length), ``accepted[r]`` of them
    accepted (not counting the target's correction/bonus token), ``draft_tokens[r]`` the ids
    verified, ``round_target_s[r]`` and ``round_drafter_s[r]`` the seconds spent in the round's
    target forward and drafter forwards, ``round_wall_s[r]`` the whole round's.
    ``target_forwards`` is the number of rounds (one verification forward each, the prompt's
    prefill included in the first); ``drafter_forwards = sum(drafted)``.
    """

    tokens: Tensor
    target_forwards: int
    drafter_forwards: int
    accepted: list[int]
    submitted: list[int]
    drafted: list[int]
    policy: str
    criterion: str
    timings: Timings
    draft_tokens: list[list[int]] = field(default_factory=list)
    round_target_s: list[float] = field(default_factory=list)
    round_drafter_s: list[float] = field(default_factory=list)
    round_wall_s: list[float] = field(default_factory=list)
    ended_by_eos: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        """The number of draft-and-verify rounds, ``len(accepted)``."""
        return len(self.accepted)

    @property
    def lossless(self) -> bool:
        """Whether the output is the target's greedy decoding (strict-greedy verification)."""
        return self.criterion == "greedy"

    @property
    def mean_accepted(self) -> float:
        """Mean accepted length per round (bonus token not counted)."""
        return sum(self.accepted) / len(self.accepted) if self.accepted else math.nan

    @property
    def tokens_per_second(self) -> float:
        """Tokens generated per second of wall clock (NaN when no time was measured)."""
        return len(self.tokens) / self.timings.wall_s if self.timings.wall_s > 0 else math.nan


@lru_cache(maxsize=1)
def _drafter_side() -> Callable[..., Tensor] | None:
    try:
        from companion.drafter.certificates import drafter_certificate  # type: ignore[import-not-found]
    except ImportError:
        return None
    return drafter_certificate


def drafter_rho(q_logits: Tensor, criterion: Criterion, q1: float, q2: float) -> float:
    """Drafter-side certificate of ``criterion`` at one drafter distribution (nats).

    For ``greedy`` the closed form ``-log(1 - (sqrt q(1) - sqrt q(2))^2)`` (exact; computed here in
    float64 from ``q1, q2``, a thousand times cheaper than a general routine). Otherwise
    :func:`companion.drafter.certificates.drafter_certificate` on the logits when that module is present,
    and the strict-greedy closed form when it is not: a sound (smaller) certificate for every
    criterion that accepts each target argmax, since such a criterion rejects ``d`` only where
    strict greedy does. For criteria that read the target's raw logits (``needs_logits``: MARS)
    the strict-greedy closed form always: it is exactly the infimum over all target logits
    (``z = log p`` is never relaxed), and no drafter-side certificate of their own exists.
    """
    fn = None if isinstance(criterion, StrictGreedy) or criterion.needs_logits else _drafter_side()
    if fn is not None:
        return float(fn(q_logits, criterion, from_logits=True))
    g = (math.sqrt(q1) - math.sqrt(q2)) ** 2
    return math.inf if g >= 1.0 else -math.log1p(-g)


def _token_id(x: Any, what: str) -> int:
    """An integer id (Python or numpy int, or a 0-d integer tensor); floats and bools refused, as transformers does."""
    if isinstance(x, Tensor):
        if x.dim() != 0 or x.is_floating_point() or x.dtype == torch.bool:
            raise ValueError(f"{what} must be integer token ids, got a tensor of dtype {x.dtype} and shape {tuple(x.shape)}")
        return int(x)
    if isinstance(x, (bool, str, bytes)):
        raise ValueError(f"{what} must be integer token ids, got {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise ValueError(f"{what} must be integer token ids, got {x!r} ({type(x).__name__})") from None


def _eos_ids(eos_token_id: int | Sequence[int] | None, target: Any) -> frozenset[int]:
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return frozenset()
    # A string is not a list of ids: "445" would otherwise read as {4, 5}, and tok.eos_token as
    # its characters.
    if isinstance(eos_token_id, (str, bytes)):
        raise ValueError(f"eos_token_id must be an integer id or a list of ids, got the string {eos_token_id!r}; "
                         "pass tokenizer.eos_token_id, not tokenizer.eos_token")
    if isinstance(eos_token_id, Tensor):
        eos_token_id = eos_token_id.reshape(-1) if eos_token_id.dim() else eos_token_id
        if eos_token_id.dim() == 0:
            return frozenset([_token_id(eos_token_id, "eos_token_id")])
        return frozenset(_token_id(e, "eos_token_id") for e in eos_token_id)
    if isinstance(eos_token_id, Iterable):
        return frozenset(_token_id(e, "eos_token_id") for e in eos_token_id)
    return frozenset([_token_id(eos_token_id, "eos_token_id")])


def _prompt_ids(input_ids: Tensor | Sequence[int]) -> list[int]:
    if isinstance(input_ids, Tensor):
        if input_ids.device.type == "meta":
            raise ValueError("input_ids is on the meta device (a shape without values); pass real token ids")
        if input_ids.is_floating_point() or input_ids.dtype == torch.bool or input_ids.is_complex():
            raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"speculative generate decodes one sequence: input_ids has batch size {input_ids.shape[0]}, expected 1")
            input_ids = input_ids[0]
        if input_ids.dim() != 1 or input_ids.numel() == 0:
            raise ValueError(f"input_ids must be a non-empty [1, L] or [L] tensor, got shape {tuple(input_ids.shape)}")
        return [int(x) for x in input_ids.tolist()]
    if isinstance(input_ids, (str, bytes)) or not isinstance(input_ids, Iterable):
        raise ValueError(f"input_ids must be token ids (a tensor or a list of integers), got {type(input_ids).__name__}; "
                         "tokenize the text first")
    ids = [_token_id(x, "input_ids") for x in input_ids]
    if not ids:
        raise ValueError("input_ids must not be empty")
    return ids


def _check_model(model: Any, what: str) -> int:
    """The vocabulary size of a causal LM (its output rows); anything else is refused by name."""
    head = getattr(model, "get_output_embeddings", None)
    if not callable(head) or not callable(model) or head() is None:
        raise ValueError(f"{what} must be a causal language model (transformers' AutoModelForCausalLM), "
                         f"got {type(model).__name__}")
    device = getattr(model, "device", None)
    if device is None:
        device = next((w.device for w in model.parameters()), None) if hasattr(model, "parameters") else None
    if device is not None and torch.device(device).type == "meta":
        raise ValueError(f"{what} is on the meta device (its weights were never loaded); "
                         "load it with from_pretrained or move it to cpu or cuda")
    return logit_count(model)


def _check_ids_in_vocab(ids: list[int], models: Sequence[Any], vocab: int) -> None:
    # The input embeddings bound the ids a model can read (they may be fewer than its logits).
    sizes = [vocab] + [int(e.weight.shape[0]) for m in models
                       if (e := getattr(m, "get_input_embeddings", lambda: None)()) is not None]
    limit = min(sizes)
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < limit), None)
    if bad is not None:
        raise ValueError(f"input_ids[{bad}] = {ids[bad]} is not a token id of the models: ids must lie in [0, {limit})")


def _forward(model: Any, ids: list[int], cache: DynamicCache, keep: int) -> Tensor:
    """Logits ``[keep, V]`` of the last ``keep`` fed positions (float32)."""
    x = torch.tensor([ids], dtype=torch.long, device=model.device)
    kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True}
    if getattr(model, "_supports_logits_to_keep", lambda: False)():
        kwargs["logits_to_keep"] = keep
    out = model(input_ids=x, **kwargs)
    return out.logits[0, -keep:].float()


def generate(
    target: Any,
    drafter: Any,
    input_ids: Tensor | Sequence[int],
    *,
    policy: str | Policy,
    max_new_tokens: int,
    criterion: str | Criterion = "greedy",
    eos_token_id: int | Sequence[int] | None = None,
) -> SpeculativeResult:
    """Speculative greedy decoding of ``input_ids`` (one sequence) with ``drafter`` proposing for ``target``.

    ``policy``: a spec (see ``companion.speculative.policies`` and the package docs) or a :class:`Policy` object (its
    state, e.g. calibration, carries over to later calls). ``criterion``: verification rule,
    ``"greedy"`` for lossless decoding. ``eos_token_id``: ``None`` takes the target's
    ``generation_config.eos_token_id`` as ``transformers`` does; ``[]`` never stops early.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    crit = parse_criterion(criterion)
    pol = parse_policy(policy)
    vt = _check_model(target, "target")
    vd = _check_model(drafter, "drafter")
    seq = _prompt_ids(input_ids)
    if vt != vd:
        raise ValueError(f"target and drafter vocabularies differ ({vt} vs {vd} logits); a drafter must share the target's vocabulary")
    _check_ids_in_vocab(seq, (target, drafter), vt)
    eos = _eos_ids(eos_token_id, target)
    lossless = isinstance(crit, StrictGreedy)
    needs_rho = bool(getattr(pol, "needs_certificate", False))
    needs_kl = bool(getattr(pol, "needs_kl", False))

    prompt_len = len(seq)
    max_len = prompt_len + max_new_tokens
    tcache, dcache = DynamicCache(), DynamicCache()
    t_len = d_len = 0
    accepted: list[int] = []
    submitted: list[int] = []
    drafted: list[int] = []
    draft_tokens: list[list[int]] = []
    round_t: list[float] = []
    round_d: list[float] = []
    round_w: list[float] = []
    t_time = d_time = 0.0
    ended_by_eos = False
    start = time.perf_counter()
    with torch.inference_mode():
        while len(seq) < max_len and not ended_by_eos:
            round_start = time.perf_counter()
            old_len = len(seq)
            cap = max_len - old_len - 1
            pol.start_round(cap)
            drafts: list[int] = []
            q_rows: list[Tensor] = []
            d_before = d_time
            while len(drafts) < cap and pol.wants_draft(len(drafts)):
                ctx = seq + drafts
                t0 = time.perf_counter()
                logits = _forward(drafter, ctx[d_len:], dcache, 1)[0]
                d_time += time.perf_counter() - t0
                d_len = len(ctx)
                token = int(torch.argmax(logits))
                q = torch.softmax(logits.double(), -1)
                top = torch.topk(q, 2)
                q1 = float(q[token])
                q2 = float(top.values[1] if int(top.indices[0]) == token else top.values[0])
                rho = drafter_rho(logits, crit, q1, q2) if needs_rho else math.nan
                drafts.append(token)
                if needs_kl:
                    q_rows.append(logits)
                pol.observe(DraftStep(token=token, q1=q1, q2=q2, rho=rho))
                if token in eos:
                    break
            n = len(drafts)
            k = min(max(int(pol.submit(n)), 0), n)

            t0 = time.perf_counter()
            p_logits = _forward(target, seq[t_len:] + drafts[:k], tcache, k + 1)
            round_t.append(time.perf_counter() - t0)
            t_time += round_t[-1]
            round_d.append(d_time - d_before)
            greedy = p_logits.argmax(-1).tolist()
            if lossless:
                ok = [drafts[j] == greedy[j] for j in range(k)]
            else:
                # the decoders' own rule: the threshold test, and for rank conditions (greedy, top-m,
                # top-k-delta, MARS) the id-ordered argmax/topk of the target's logits, first index
                # wins. p_logits are the forward's raw logits (float32, unprocessed), as MARS needs:
                # its ratio z(2)/z(1) is computed in float64 inside Mars.relaxed_from_top.
                ok = crit.decoder_accepts(p_logits[:k], torch.tensor(drafts[:k], dtype=torch.long,
                                                                     device=p_logits.device),
                                          from_logits=True).tolist() if k else []
            a = 0
            while a < k and ok[a]:
                a += 1
            new = drafts[:a] + [greedy[a]]
            for i, tok in enumerate(new):
                if tok in eos:
                    new = new[: i + 1]
                    ended_by_eos = True
                    break
            seq.extend(new)

            tcache.crop(old_len + a)
            t_len = old_len + a
            if n:
                d_len = old_len + min(a, n - 1)
                dcache.crop(d_len)

            kl: tuple[float, ...] = ()
            if needs_kl and k:
                v = min(a + 1, k)
                lp = torch.log_softmax(p_logits[:v].double(), -1)
                lq = torch.log_softmax(torch.stack(q_rows[:v]).double(), -1)
                kl = tuple(float(x) for x in (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0))
            pol.end_round(RoundOutcome(drafted=n, submitted=k, accepted=a, kl=kl))
            accepted.append(a)
            submitted.append(k)
            drafted.append(n)
            draft_tokens.append(drafts[:k])
            round_w.append(time.perf_counter() - round_start)
    wall = time.perf_counter() - start
    return SpeculativeResult(
        tokens=torch.tensor(seq[prompt_len:], dtype=torch.long),
        target_forwards=len(accepted),
        drafter_forwards=sum(drafted),
        accepted=accepted,
        submitted=submitted,
        drafted=drafted,
        policy=str(pol),
        criterion=str(crit),
        timings=Timings(wall_s=wall, target_s=t_time, drafter_s=d_time),
        draft_tokens=draft_tokens,
        round_target_s=round_t,
        round_drafter_s=round_d,
        round_wall_s=round_w,
        ended_by_eos=ended_by_eos,
    )
