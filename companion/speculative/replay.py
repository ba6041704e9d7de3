"""Record a lossless run once, replay any drafting policy on it, and price the best any policy can do.

Under strict-greedy (lossless) verification everything a drafting policy can observe is fixed in
advance. The output is the target's greedy text ``x_0 x_1 ...``; a round that starts after ``s``
emitted tokens drafts the drafter's greedy chain from the context ``prompt + x_0 .. x_{s-1}``,
whatever the policy; and the number ``L_s`` of leading drafts of that chain equal to
``x_s x_{s+1} ...`` decides how many of ``k`` submitted drafts are accepted: ``min(k, L_s)``.

* :func:`record_chains` computes all of it once per prompt: the target's greedy text (one
  single-token forward per token, as plain decoding), one teacher-forced drafter forward over
  prompt and text (its row at position ``t`` is the first draft from ``t``, and, as long as a
  chain agrees with the text, every later draft of every chain that has reached ``t``), one
  teacher-forced target forward over the same sequence (``KL(p || q)`` at every position, for
  the policies that read it), and, at each position ``m`` where the drafter's greedy token is not
  the text's, a cached greedy extension of the drafter past that mismatch (shared by every chain
  that diverges at ``m``). :func:`record_many` records many prompts, in several threads if asked.
* :func:`replay` runs a :class:`~companion.speculative.Policy` on the recording and
  returns the :class:`~companion.speculative.SpeculativeResult` that
  :func:`~companion.speculative.generate` would return (tokens, forwards, and per round
  the drafts made, submitted and accepted), without running a model: the policy sees the same
  ``start_round`` / ``wants_draft`` / ``observe`` / ``submit`` / ``end_round`` calls with the same
  arguments.
* :func:`oracle_cost` is the least modelled cost per token (the convention of
  :func:`~companion.speculative.modelled_cost`) of any lossless chain policy on the recorded
  text, by dynamic programming over positions; :func:`oracle_plan` and :func:`oracle_result`
  give the rounds that reach it.

Floating point: the recording computes the drafter's and the target's logits in other batch
shapes than a live decode does (one long forward instead of one or two tokens at a time), so
``q(1)``, ``q(2)`` and the certificate may differ from a live run's in their last bits. A
policy's decision can only differ where it sits exactly on such a boundary; the tests compare
replays with live decoding round for round.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from companion.criteria import StrictGreedy
from companion.speculative.compare import CALIBRATED, PolicyComparison, RatioEstimate, builtin_policies, display_name
from companion.speculative.costs import CostModel
from companion.speculative.decoder import (
    SpeculativeResult,
    Timings,
    _check_ids_in_vocab,
    _check_model,
    _eos_ids,
    _forward,
    _prompt_ids,
    drafter_rho,
)
from companion.speculative.policies import DraftStep, Policy, RoundOutcome, parse_policy
from companion.speculative.replay_fast import is_builtin, oracle_dp, replay_builtin

__all__ = ["GRID_CONSTANTS", "ORACLE", "GridRow", "RecordedChains", "grid_builtins", "grid_row", "oracle_cost",
           "oracle_plan", "oracle_result", "ratio_outcome", "record_chains", "replay", "replay_comparison",
           "replay_grid", "versus_sentence", "gap_sentence", "goal_sentence"]

_GREEDY = StrictGreedy()


@dataclass(frozen=True)
class RecordedChains:
    """Everything a lossless drafting policy can observe on one prompt.

    ``tokens``: the target's greedy text (prompt excluded), ``max_new_tokens`` long unless it ends
    with an end-of-sequence token of ``eos_token_ids`` (then ``ended_by_eos``). ``chains[s]`` for
    ``s = 0 .. len(tokens) - 1``: the drafter's greedy chain from the context ``prompt + tokens[:s]``,
    one :class:`DraftStep` per draft (token, ``q(1)``, ``q(2)``, strict-greedy drafter-side
    certificate), as long as a round starting at ``s`` may draft (``max_new_tokens - s - 1``) or
    ``max_drafts``, whichever is smaller, and ending early after a drafted end-of-sequence token
    (the decoder stops drafting there). ``kl[t]``: ``KL(p_t || q_t)`` of the target's and the
    drafter's distributions predicting ``tokens[t]`` from the true prefix. ``matched[s]``
    (derived): ``L_s``, the number of leading drafts of ``chains[s]`` equal to ``tokens[s:]``.
    ``disagreements``: positions where the target's teacher-forced forward (all positions at
    once) picks another token than its one-token-at-a-time greedy decoding, i.e. exact near-ties
    of its logits, where a live speculative decoder's multi-token verification could leave the
    greedy text (empty when the recording is safe to replay as lossless decoding).
    """

    tokens: tuple[int, ...]
    chains: tuple[tuple[DraftStep, ...], ...]
    kl: tuple[float, ...]
    max_new_tokens: int
    max_drafts: int | None = None
    eos_token_ids: frozenset[int] = frozenset()
    ended_by_eos: bool = False
    disagreements: tuple[int, ...] = ()
    matched: tuple[int, ...] = field(init=False)
    # the per-position arrays of the array replays (replay_fast.chain_arrays), made on first use
    _arrays: Any = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.chains) != n or len(self.kl) != n:
            raise ValueError(f"one chain and one KL per text position expected: {n} tokens, "
                             f"{len(self.chains)} chains, {len(self.kl)} KLs")
        if n > self.max_new_tokens:
            raise ValueError(f"{n} tokens recorded, more than max_new_tokens = {self.max_new_tokens}")
        if n < self.max_new_tokens and not self.ended_by_eos:
            raise ValueError(f"{n} tokens recorded for max_new_tokens = {self.max_new_tokens} without an end-of-sequence token")
        matched = []
        for s, chain in enumerate(self.chains):
            if len(chain) > self.cap(s):
                raise ValueError(f"chain from position {s} has {len(chain)} drafts; a round there drafts at most {self.cap(s)}")
            L = 0
            while L < len(chain) and s + L < n and chain[L].token == self.tokens[s + L]:
                L += 1
            matched.append(L)
        object.__setattr__(self, "matched", tuple(matched))

    def cap(self, s: int) -> int:
        """The most drafts a round starting after ``s`` emitted tokens may make (the decoder's length budget)."""
        return self.max_new_tokens - s - 1

    @property
    def mean_matched(self) -> float:
        """Mean ``L_s`` over the text's positions."""
        return sum(self.matched) / len(self.matched) if self.matched else math.nan


_HEAD = 8
"""Entries of a drafter row whose probabilities :func:`_steps` works out in float64 (the largest logits)."""
_ROWS = 8
"""Rows of logits :func:`_steps` exponentiates at a time (a small buffer, reused, instead of a ``[B, V]`` copy)."""


def _steps(logits: Tensor) -> tuple[list[DraftStep], Tensor]:
    """The drafter's greedy token per row of ``logits [B, V]`` (float32) and what a policy reads there, and the
    tokens ``[B]``: the argmax (first index among ties, as the decoder's ``torch.argmax``), ``q(1)``, ``q(2)``
    and the strict-greedy certificate ``-log(1 - (sqrt q(1) - sqrt q(2))^2)``.

    ``q(i) = exp(z_(i) - m) / S`` with ``m`` the row's largest logit and ``S = sum_v exp(z_v - m)``. The
    ``_HEAD`` largest terms (``q(1)``'s and ``q(2)``'s among them) are taken in float64 from the float32
    logits (``z - m`` is then exact); the rest of the row, the tail, in float32 (one pass over a reused
    buffer, cascade-summed), which is where the time went: the decoder's ``softmax(logits.double())``
    converts and exponentiates the whole row in float64 and writes it out (about 4x slower at
    ``[128, 151936]``). So ``q(1)`` and ``q(2)`` are those of the float64 softmax up to the tail's float32
    rounding, relative ``~1e-7`` times the tail's share of ``S`` (measured at most ``1e-7`` on flat random
    rows, ``~1e-8`` where ``q(1) > 0.9``): below what the recording already differs from a live decode by
    (its logits come from other batch shapes, and a float32 logit ``z ~ 10`` alone carries ``~1e-6``
    relative in ``exp(z)``), so a policy's decision can only differ where it sits on a boundary within that,
    as before. No decision reads a float64 tie: the token is the float32 argmax, and an exact tie of the two
    largest logits still gives ``q(1) == q(2)`` exactly (certificate 0).

    Float64 over the whole vocabulary is still needed, and kept, in :func:`record_chains`' ``KL(p || q)``
    (every entry of both rows enters the sum, and ``cal=kl`` ranks those divergences) and in the live
    decoder, whose ``q(1)``, ``q(2)`` are the float64 softmax's.
    """
    tokens = logits.argmax(-1)
    b, v = logits.shape
    top = logits.topk(min(_HEAD, v), dim=-1)
    m = top.values[:, :1]
    head = torch.exp(top.values.double() - m.double())    # [B, HEAD], head[:, 0] = 1
    tail = torch.empty(b, dtype=torch.float64, device=logits.device)
    buf = torch.empty((min(_ROWS, b), v), dtype=logits.dtype, device=logits.device)
    for r in range(0, b, _ROWS):
        e = buf[:min(_ROWS, b - r)]
        torch.sub(logits[r:r + _ROWS], m[r:r + _ROWS], out=e)
        e.exp_()
        e.scatter_(-1, top.indices[r:r + _ROWS], 0.0)      # the head is summed in float64
        tail[r:r + _ROWS] = e.sum(-1)
    total = head.sum(-1) + tail
    q1 = head[:, 0] / total
    q2 = head[:, 1] / total if head.shape[1] > 1 else torch.zeros_like(q1)
    steps = [DraftStep(token=t, q1=a, q2=c, rho=drafter_rho(logits[i], _GREEDY, a, c))
             for i, (t, a, c) in enumerate(zip(tokens.tolist(), q1.tolist(), q2.tolist()))]
    return steps, tokens


def _steps_float64(logits: Tensor) -> tuple[list[DraftStep], Tensor]:
    """:func:`_steps` as the decoder computes it, from ``softmax`` in float64 over the whole row (the
    reference: ``benchmarks/bench_replay.py`` times both and ``tests/test_replay_fast.py`` compares them)."""
    tokens = logits.argmax(-1)
    q = torch.softmax(logits, -1, dtype=torch.float64)   # bit for bit softmax(logits.double())
    top = torch.topk(q, 2, dim=-1)
    q1 = q.gather(-1, tokens[:, None])[:, 0]
    q2 = torch.where(top.indices[:, 0] == tokens, top.values[:, 1], top.values[:, 0])
    steps = [DraftStep(token=t, q1=a, q2=b, rho=drafter_rho(logits[i], _GREEDY, a, b))
             for i, (t, a, b) in enumerate(zip(tokens.tolist(), q1.tolist(), q2.tolist()))]
    return steps, tokens


def _extend_batched(drafter: Any, cache: DynamicCache, n0: int, starts: Sequence[tuple[int, int, int]],
                    eos: frozenset[int]) -> dict[int, list[DraftStep]]:
    """The drafter's greedy chains past every mismatch at once, on the teacher-forced cache.

    ``cache`` holds the drafter's keys and values over ``prompt + text`` (one sequence, ``N``
    positions); ``starts`` lists ``(m, d_m, need)``: the chain that diverges at text position ``m``
    continues from the context ``prompt + text[:m] + [d_m]`` for ``need`` more drafts (fewer when
    it drafts an end-of-sequence token). All chains grow in the one cached sequence, as the
    branches of a token tree: each step appends one token per live chain, and a custom 4-D mask
    lets chain ``m`` see the cached positions before ``n0 + m`` and its own tokens only, at
    position ids ``n0 + m + j``. So it computes what a one-sequence forward over its context
    would, up to the last bits of a batched reduction, without copying the cache once per chain
    (which a batch of chains, one cache row each, spent most of its time doing). ``cache`` is
    consumed.
    """
    out: dict[int, list[DraftStep]] = {m: [] for m, _, _ in starts}
    live = [(m, need) for m, _, need in starts if need > 0]
    if not live:
        return out
    dev = drafter.device
    tokens = torch.tensor([[d for _, d, need in starts if need > 0]], dtype=torch.long, device=dev)  # [1, chains]
    n_cached = cache.get_seq_length()
    dtype = next(drafter.parameters()).dtype
    limit = torch.tensor([n0 + m for m, _ in live], device=dev)
    sees_prefix = torch.arange(n_cached, device=dev)[None, :] < limit[:, None]   # [chains, N]
    sees_new = torch.zeros((len(live), 0), dtype=torch.bool, device=dev)        # [chains, tokens appended so far]
    keep_logits = getattr(drafter, "_supports_logits_to_keep", lambda: False)()
    j = 0
    while live:
        # this step appends one token per live chain; chain r sees the r-th of them
        sees_new = torch.cat([sees_new, torch.eye(len(live), dtype=torch.bool, device=dev)], dim=1)
        allowed = torch.cat([sees_prefix, sees_new], dim=1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        kwargs: dict[str, Any] = {"past_key_values": cache, "use_cache": True}
        if keep_logits:
            kwargs["logits_to_keep"] = len(live)
        logits = drafter(input_ids=tokens, attention_mask=mask[None, None], position_ids=(limit + j)[None, :],
                         **kwargs).logits[0].float()
        steps, drafted = _steps(logits)
        keep = []
        for row, ((m, need), step) in enumerate(zip(live, steps)):
            out[m].append(step)
            if len(out[m]) < need and step.token not in eos:
                keep.append(row)
        j += 1
        if len(keep) < len(live):
            if not keep:
                break
            rows = torch.tensor(keep, device=dev)
            live = [live[r] for r in keep]
            drafted, limit, sees_prefix, sees_new = drafted[rows], limit[rows], sees_prefix[rows], sees_new[rows]
        tokens = drafted[None, :]
    return out


def _last_rows(model: Any, ids: Tensor, keep: int, cache: DynamicCache | None) -> Tensor:
    """Logits ``[keep, V]`` (float32) of the last ``keep`` positions of one forward over ``ids`` (filling ``cache``)."""
    kwargs: dict[str, Any] = {"use_cache": cache is not None}
    if cache is not None:
        kwargs["past_key_values"] = cache
    if getattr(model, "_supports_logits_to_keep", lambda: False)():
        kwargs["logits_to_keep"] = keep
    return model(input_ids=ids.to(model.device), **kwargs).logits[0, -keep:].float()


def record_chains(
    target: Any,
    drafter: Any,
    input_ids: Tensor | Sequence[int],
    *,
    max_new_tokens: int,
    max_drafts: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    text: Sequence[int] | Tensor | None = None,
    inspect: Callable[[Tensor, Tensor], None] | None = None,
) -> RecordedChains:
    """Record the target's greedy text of ``input_ids`` and the drafter's greedy chain from every position of it.

    ``max_new_tokens`` and ``eos_token_id`` as in :func:`~companion.speculative.generate`
    (``None``: the target's ``generation_config.eos_token_id``). ``max_drafts``: the longest chain
    recorded from any position (``None``: as long as the length budget allows, so that every
    policy replays exactly; a replay that needs more raises ``ValueError``).

    ``text``: the target's greedy text when it is already known (from a batched harvest, say),
    which spares the one-token-at-a-time decoding; it must be ``max_new_tokens`` long or end with
    an end-of-sequence token. Where it is not what the target's teacher-forced forward picks,
    the position is listed in ``disagreements`` (a text that is not the target's greedy text shows up
    there). ``inspect(p_logits, q_logits)``: called once with both models' teacher-forced logits
    ``[n, V]`` (float32; row ``t`` predicts ``text[t]``), for checks that need the full rows.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_drafts is not None and (isinstance(max_drafts, bool) or not isinstance(max_drafts, int) or max_drafts < 0):
        raise ValueError(f"max_drafts must be None or an integer >= 0, got {max_drafts!r}")
    vt = _check_model(target, "target")
    vd = _check_model(drafter, "drafter")
    prompt = _prompt_ids(input_ids)
    if vt != vd:
        raise ValueError(f"target and drafter vocabularies differ ({vt} vs {vd} logits); a drafter must share the target's vocabulary")
    _check_ids_in_vocab(prompt, (target, drafter), vt)
    eos = _eos_ids(eos_token_id, target)
    given = None if text is None else _given_text(text, max_new_tokens, eos, vt)
    n0 = len(prompt)

    with torch.inference_mode():
        if given is not None:
            text = given
        else:
            # 1. the target's greedy text, one token per forward (plain decoding, `constant:0`)
            text = []
            cache = DynamicCache()
            fed = 0
            seq = list(prompt)
            while len(text) < max_new_tokens:
                token = int(torch.argmax(_forward(target, seq[fed:], cache, 1)[0]))
                fed = len(seq)
                text.append(token)
                seq.append(token)
                if token in eos:
                    break
        ended = bool(text) and text[-1] in eos
        n = len(text)
        if n == 0:
            return RecordedChains((), (), (), max_new_tokens, max_drafts, eos, False)

        # 2. one teacher-forced forward per model over prompt + text[:-1]: row t predicts text[t]
        full = torch.tensor([prompt + text[:-1]], dtype=torch.long)
        d_cache = DynamicCache()
        q_logits = _last_rows(drafter, full, n, d_cache)
        p_logits = _last_rows(target, full, n, None)
        if inspect is not None:
            inspect(p_logits, q_logits)
        disagree = tuple(int(t) for t in torch.nonzero(p_logits.argmax(-1).cpu() != torch.tensor(text)).reshape(-1))
        lp = torch.log_softmax(p_logits.double(), -1)
        lq = torch.log_softmax(q_logits.double(), -1)
        kl = tuple(float(x) for x in (lp.exp() * (lp - lq)).sum(-1).clamp_min(0.0))
        del lp, lq, p_logits
        rows, _ = _steps(q_logits)

        def budget(s: int) -> int:
            cap = max_new_tokens - s - 1
            return cap if max_drafts is None else min(cap, max_drafts)

        # 3. at every position m where the drafter's greedy token is not the text's, extend the
        # drafter's chain past that draft (every chain that diverges at m continues with it); the
        # longest chain that diverges at m starts at m itself. All extensions grow together in one cached sequence.
        starts = [(m, rows[m].token, max(budget(m) - 1, 0)) for m in range(n)
                  if rows[m].token != text[m] and rows[m].token not in eos]
        extensions = _extend_batched(drafter, d_cache, n0, starts, eos)

    chains: list[tuple[DraftStep, ...]] = []
    for s in range(n):
        b = budget(s)
        chain: list[DraftStep] = []
        t = s
        while len(chain) < b:
            if t >= n:  # every text token matched up to the end: only when it is the end-of-sequence draft
                break
            step = rows[t]
            chain.append(step)
            if step.token in eos:
                break
            if step.token != text[t]:
                chain.extend(extensions[t][: b - len(chain)])
                break
            t += 1
        chains.append(tuple(chain))
    return RecordedChains(tuple(text), tuple(chains), kl, max_new_tokens, max_drafts, eos, ended, disagree)


def record_many(
    target: Any,
    drafter: Any,
    prompts: Sequence[Tensor | Sequence[int]],
    *,
    max_new_tokens: int,
    max_drafts: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    texts: Sequence[Sequence[int] | Tensor | None] | None = None,
    inspect: Callable[[int, Tensor, Tensor], None] | None = None,
    threads: int = 1,
    progress: bool = False,
) -> list[RecordedChains]:
    """:func:`record_chains` for every prompt, in ``threads`` threads; the recordings in the prompts' order.

    ``texts[i]`` is passed as prompt ``i``'s ``text`` (``None``: decoded), and
    ``inspect(i, p_logits, q_logits)`` is called with the prompt's index, so that a caller can
    keep per-prompt results in order whatever the order the threads finish in (``inspect`` may be
    called from several threads at once: it should write to prompt ``i``'s own slot only).

    Each prompt is recorded by one thread from start to end, and torch runs a thread's operators
    in that thread when its intra-op pool has one thread, so with ``torch.get_num_threads() == 1``
    every recording is bit for bit the one a single thread makes; ``threads`` then spreads the
    prompts over that many cores (the models' weights are shared, not copied). With a larger
    intra-op pool the threads share it, which gains little: one thread is then the sensible choice.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    n = len(prompts)
    if texts is not None and len(texts) != n:
        raise ValueError(f"texts has {len(texts)} entries for {n} prompts; give one text (or None) per prompt")

    def one(i: int) -> RecordedChains:
        look = None if inspect is None else (lambda lp, lq: inspect(i, lp, lq))
        return record_chains(target, drafter, prompts[i], max_new_tokens=max_new_tokens, max_drafts=max_drafts,
                             eos_token_id=eos_token_id, text=None if texts is None else texts[i], inspect=look)

    from tqdm.auto import tqdm

    bar = tqdm(total=n, desc="recording", unit="prompt", disable=not progress or None)
    out: list[RecordedChains | None] = [None] * n
    try:
        if threads == 1 or n <= 1:
            for i in range(n):
                out[i] = one(i)
                bar.update(1)
        else:
            from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

            pool = ThreadPoolExecutor(max_workers=min(threads, n), thread_name_prefix="record")
            try:
                futures = {pool.submit(one, i): i for i in range(n)}
                pending = set(futures)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_EXCEPTION)
                    for f in done:
                        out[futures[f]] = f.result()   # re-raises the first failure here
                        bar.update(1)
            finally:
                # on a failure or an interrupt: drop the prompts not started, let the running ones end
                pool.shutdown(wait=True, cancel_futures=True)
    finally:
        bar.close()
    assert all(r is not None for r in out), "every prompt is recorded once the loop ends"
    return out  # type: ignore[return-value]


def _given_text(text: Sequence[int] | Tensor, max_new_tokens: int, eos: frozenset[int], vocab: int) -> list[int]:
    """``text`` as a list of ids, checked: at most ``max_new_tokens``, shorter only when it ends with an
    end-of-sequence token, no end-of-sequence token before its end, every id in the vocabulary."""
    if isinstance(text, (str, bytes)):
        raise ValueError(f"text must be token ids (a tensor or a list of integers), got {type(text).__name__}")
    empty = text.numel() == 0 if isinstance(text, Tensor) else len(text) == 0
    try:
        ids = [] if empty else _prompt_ids(text)
    except ValueError as err:
        raise ValueError(str(err).replace("input_ids", "text")) from None
    if len(ids) > max_new_tokens:
        raise ValueError(f"text has {len(ids)} tokens, more than max_new_tokens = {max_new_tokens}")
    early = [i for i, t in enumerate(ids[:-1]) if t in eos]
    if early:
        raise ValueError(f"text has an end-of-sequence token at position {early[0]} before its end ({len(ids)} tokens); "
                         "greedy decoding stops there")
    if len(ids) < max_new_tokens and not (ids and ids[-1] in eos):
        raise ValueError(f"text has {len(ids)} tokens for max_new_tokens = {max_new_tokens} and does not end with an "
                         f"end-of-sequence token {sorted(eos)}")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"text holds token id {bad[0]} outside the vocabulary of {vocab}")
    return ids


def _check_chains(chains: Any, what: str = "chains") -> RecordedChains:
    if not isinstance(chains, RecordedChains):
        raise ValueError(f"{what} must be a RecordedChains (made by record_chains), got {type(chains).__name__}")
    return chains


def _check_costs(costs: Any) -> CostModel:
    if not isinstance(costs, CostModel):
        raise ValueError(f"costs must be a CostModel (companion.speculative.CostModel: c and the V(k) table), "
                         f"got {type(costs).__name__}")
    return costs


def replay(chains: RecordedChains, policy: str | Policy, *, fast: bool = True) -> SpeculativeResult:
    """Decode ``chains``' prompt under ``policy`` without a model: the rounds a lossless :func:`generate` makes.

    The policy is driven exactly as the decoder drives it (see ``Policy``): per round
    ``start_round(cap)``, then ``wants_draft`` / ``observe`` per draft with the recorded
    ``q(1)``, ``q(2)`` and (when the policy asks for it) the strict-greedy certificate, then
    ``submit``; ``min(k, L_s)`` of ``k`` submitted drafts are accepted, the target's token follows,
    and ``end_round`` receives ``KL(p || q)`` at the verified positions when the policy reads it.
    A :class:`Policy` object carries its state over (as with ``generate``); a spec string gives a
    fresh one. The result has no timings (``nan``) and no per-round seconds.

    ``fast``: transformers' built-ins (``constant``, ``confidence``, ``heuristic``) are replayed by
    :func:`~companion.speculative.replay_fast.replay_builtin` from per-position arrays, with the
    same result and the same policy state; ``False`` drives every policy call by call (the reference).
    """
    _check_chains(chains)
    pol = parse_policy(policy)
    if fast and is_builtin(pol):
        return replay_builtin(chains, pol, str(_GREEDY))
    needs_rho = bool(getattr(pol, "needs_certificate", False))
    needs_kl = bool(getattr(pol, "needs_kl", False))
    text = chains.tokens
    n = len(text)
    accepted: list[int] = []
    submitted: list[int] = []
    drafted: list[int] = []
    draft_tokens: list[list[int]] = []
    s = 0
    ended_by_eos = False
    while s < chains.max_new_tokens and not ended_by_eos:
        if s >= n:
            raise ValueError(f"replay reached position {s} past the recorded text of {n} tokens")
        chain = chains.chains[s]
        cap = chains.cap(s)
        pol.start_round(cap)
        drafts: list[int] = []
        while len(drafts) < cap and pol.wants_draft(len(drafts)):
            j = len(drafts)
            if j >= len(chain):
                raise ValueError(f"policy {pol} asks for draft {j + 1} at position {s}, but the chains were recorded "
                                 f"with max_drafts = {chains.max_drafts}; record with a larger max_drafts (or None)")
            step = chain[j]
            drafts.append(step.token)
            pol.observe(step if needs_rho else DraftStep(token=step.token, q1=step.q1, q2=step.q2))
            if step.token in chains.eos_token_ids:
                break
        k = min(max(int(pol.submit(len(drafts))), 0), len(drafts))
        a = min(k, chains.matched[s])
        new = list(text[s:s + a + 1])
        if any(t in chains.eos_token_ids for t in new):
            first = next(i for i, t in enumerate(new) if t in chains.eos_token_ids)
            new = new[:first + 1]
            ended_by_eos = True
        kl: tuple[float, ...] = ()
        if needs_kl and k:
            kl = tuple(chains.kl[s:s + min(a + 1, k)])
        pol.end_round(RoundOutcome(drafted=len(drafts), submitted=k, accepted=a, kl=kl))
        accepted.append(a)
        submitted.append(k)
        drafted.append(len(drafts))
        draft_tokens.append(drafts[:k])
        s += len(new)
    nan = math.nan
    return SpeculativeResult(
        tokens=torch.tensor(text[:s], dtype=torch.long),
        target_forwards=len(accepted),
        drafter_forwards=sum(drafted),
        accepted=accepted,
        submitted=submitted,
        drafted=drafted,
        policy=str(pol),
        criterion=str(_GREEDY),
        timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
        draft_tokens=draft_tokens,
        ended_by_eos=ended_by_eos,
        extra={"replayed": True},
    )


def _advance(chains: RecordedChains, s: int, k: int) -> int:
    """Position after a round at ``s`` that submits ``k`` drafts: ``min(k, L_s)`` accepted plus the target's
    token, which is not emitted when the accepted drafts already end the text with its end-of-sequence token."""
    return min(s + min(k, chains.matched[s]) + 1, len(chains.tokens))


def _dp(chains: RecordedChains, costs: CostModel, fast: bool = True) -> tuple[list[float], list[int]]:
    """``best[s]``: least cost from ``s`` to the end of the text; ``choice[s]``: drafts submitted there.

    ``fast``: :func:`~companion.speculative.replay_fast.oracle_dp` (the same sums and tie rule, one
    array operation per position); ``False``: the reference loop below."""
    if fast:
        return oracle_dp(chains, costs)
    n = len(chains.tokens)
    best = [0.0] * (n + 1)
    choice = [0] * n
    for s in range(n - 1, -1, -1):
        # a round drafts i >= k tokens and submits k: drafting more than it submits only adds c;
        # submitting more than L_s gains nothing but can cost less where V(k) is not monotone
        options = [(costs.verify_cost(k) + costs.c * k + best[_advance(chains, s, k)], k)
                   for k in range(len(chains.chains[s]) + 1)]
        best[s], choice[s] = min(options)
    return best, choice


def oracle_plan(chains: RecordedChains, costs: CostModel, *, fast: bool = True) -> list[int]:
    """Drafts submitted per round by a lossless chain policy of least modelled cost on ``chains``.

    Dynamic programming over positions: from ``s`` a round drafts and submits ``k`` drafts of the
    recorded chain (``k <= len(chains[s])``), costs ``V(k) + c k`` and continues at
    ``s + min(k, L_s) + 1`` (the accepted drafts and the target's token). Ties go to the fewest
    drafts. ``fast``: as :func:`_dp`'s.
    """
    _, choice = _dp(_check_chains(chains), _check_costs(costs), fast)
    plan, s = [], 0
    while s < len(chains.tokens):
        plan.append(choice[s])
        s = _advance(chains, s, choice[s])
    return plan


def oracle_cost(chains: RecordedChains, costs: CostModel) -> float:
    """Least modelled cost per generated token any lossless chain policy reaches on ``chains``' text.

    ``(sum_r V(k_r) + c * drafter calls) / tokens`` minimised over every sequence of rounds (see
    :func:`oracle_plan`); the convention of :func:`~companion.speculative.modelled_cost`
    (prefill counted as an ordinary forward). ``nan`` for an empty text.
    """
    n = len(_check_chains(chains).tokens)
    _check_costs(costs)
    if n == 0:
        return math.nan
    return _dp(chains, costs)[0][0] / n


def oracle_result(chains: RecordedChains, costs: CostModel, *, fast: bool = True) -> SpeculativeResult:
    """The rounds of :func:`oracle_plan` as a :class:`SpeculativeResult` (policy ``"oracle"``), so that
    :func:`~companion.speculative.modelled_cost` and the comparison's bootstrap price it like any policy."""
    plan = oracle_plan(chains, costs, fast=fast)
    accepted, draft_tokens = [], []
    s = 0
    for k in plan:
        accepted.append(min(k, chains.matched[s]))
        draft_tokens.append([d.token for d in chains.chains[s][:k]])
        s = _advance(chains, s, k)
    nan = math.nan
    return SpeculativeResult(
        tokens=torch.tensor(chains.tokens, dtype=torch.long),
        target_forwards=len(plan),
        drafter_forwards=sum(plan),
        accepted=accepted,
        submitted=list(plan),
        drafted=list(plan),
        policy="oracle",
        criterion=str(_GREEDY),
        timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
        draft_tokens=draft_tokens,
        ended_by_eos=chains.ended_by_eos,
        extra={"replayed": True},
    )


# -- every policy under many cost models, from recordings ----------------------------------------------
ORACLE = "oracle"
"""Row name of the oracle's rounds in a replayed comparison."""

GRID_CONSTANTS: tuple[str, ...] = tuple(f"constant:{k}" for k in range(17))
"""The constant schedules of the cost-model grid: K = 0 .. 16 (long drafts pay where verification is flat)."""


def grid_builtins() -> list[str]:
    """transformers' built-ins replayed on the cost-model grid: :data:`GRID_CONSTANTS`, ``confidence:T`` for
    T = 0.1 .. 0.8 and the heuristic schedules (``constant:0`` first, the reference)."""
    return list(GRID_CONSTANTS) + [s for s in builtin_policies() if not s.startswith("constant:")]


def replay_comparison(
    eval_chains: Sequence[RecordedChains],
    calibration_chains: Sequence[RecordedChains],
    costs: CostModel,
    *,
    builtins: Sequence[str],
    calibrated: Sequence[str] = CALIBRATED,
    cold: bool = True,
    replayed: dict[str, list[SpeculativeResult]] | None = None,
    fast: bool = True,
) -> PolicyComparison:
    """:func:`~companion.speculative.compare_policies` from recordings, priced with ``costs``, plus the oracle.

    The same protocol: ``builtins`` (``constant:0`` first) replayed on every evaluated prompt;
    each calibrated rule given ``costs``' knobs (``c``, ``v1``, ``dv``), warmed on
    ``calibration_chains`` in order, and replayed on every evaluated prompt from a copy of that
    warm state; a ``certificate (cold)`` row from the prior when ``cold``; and the
    :data:`ORACLE` row (:func:`oracle_result`). ``replayed`` may hold built-in runs already
    replayed on ``eval_chains`` (they do not depend on the cost model). The comparison's
    ``fitted`` model is ``costs`` itself (a replay has no timings to fit). ``fast``: as :func:`replay`'s
    and :func:`oracle_plan`'s (``False``: the reference paths, for comparison).
    """
    names = list(builtins)
    if not names or names[0] != "constant:0":
        raise ValueError(f"the built-ins must start with 'constant:0' (the reference decoding), got {names[:1]}")
    if not eval_chains:
        raise ValueError("no recordings to replay")
    _check_costs(costs)
    for i, ch in enumerate(eval_chains):
        # an empty text has no token to price: its cost per token is NaN, and a NaN in the totals
        # would make every policy's cost NaN
        if not _check_chains(ch, f"eval_chains[{i}]").tokens:
            raise ValueError(f"eval_chains[{i}] is an empty recording (max_new_tokens = {ch.max_new_tokens}): "
                             "it has no token to price; leave it out")
    for i, ch in enumerate(calibration_chains):
        _check_chains(ch, f"calibration_chains[{i}]")
    results: dict[str, list[SpeculativeResult]] = {}
    for spec in names:
        runs = (replayed or {}).get(spec)
        results[spec] = list(runs) if runs is not None else [replay(ch, spec, fast=fast) for ch in eval_chains]
    knobs = costs.policy_defaults()
    for spec in calibrated:
        warm = parse_policy(spec, **knobs)
        for ch in calibration_chains:
            replay(ch, warm)
        results[display_name(spec)] = [replay(ch, warm.fresh()) for ch in eval_chains]
    if cold:
        results["certificate (cold)"] = [replay(ch, parse_policy("certificate", **knobs)) for ch in eval_chains]
    results[ORACLE] = [oracle_result(ch, costs, fast=fast) for ch in eval_chains]
    reference = [r.tokens for r in results["constant:0"]]
    failures = [f"{name} on prompt {i}" for name, runs in results.items() for i, r in enumerate(runs)
                if not torch.equal(r.tokens, reference[i])]
    return PolicyComparison(results, names, costs, costs, failures)


@dataclass(frozen=True)
class GridRow:
    """One cost model of the grid: every policy's cost against the oracle's and the certificate rule's ratios.

    ``to_oracle[p]``: policy ``p``'s cost per token over the oracle's (total cost over total tokens
    of the evaluated prompts). ``best_constant``: the cheapest of :data:`GRID_CONSTANTS`;
    ``best_policy``: the cheapest of every policy replayed. Ratios with their 95 % paired
    bootstrap intervals over prompts: ``cert_vs_constant`` (the certificate rule over the best
    constant schedule, re-selected in every resample), ``cert_vs_default`` (over ``default``),
    ``cert_vs_oracle`` and ``best_vs_oracle``. ``gap_closed[p]``: the share of the gap from the
    best constant schedule down to the oracle that ``p`` closes, ``(C_const - C_p) / (C_const -
    C_oracle)`` (negative when ``p`` costs more than the best constant schedule; ``nan`` when there
    is no gap).
    """

    shape: str
    c: float
    oracle_cost: float
    costs: dict[str, float]
    to_oracle: dict[str, float]
    best_constant: str
    best_policy: str
    default: str
    cert_vs_constant: RatioEstimate
    cert_vs_default: RatioEstimate
    cert_vs_oracle: RatioEstimate
    best_vs_oracle: RatioEstimate
    gap_closed: dict[str, float]


def grid_row(comparison: PolicyComparison, shape: str, *, default: str = "confidence:0.4",
             certificate: str = "certificate", n_boot: int = 2000, seed: int = 0) -> GridRow:
    """The :class:`GridRow` of one replayed comparison (see :func:`replay_comparison`)."""
    policies = [p for p in comparison.policies if p != ORACLE]
    constants = [p for p in comparison.builtins if p in GRID_CONSTANTS]
    for name in (default, certificate):
        if name not in policies:
            raise ValueError(f"{name!r} was not replayed; policies: {policies}")
    if not constants:
        raise ValueError(f"no constant schedule among the built-ins {comparison.builtins}")
    per_token = {p: comparison.summary(p).cost_per_token for p in comparison.policies}
    oracle = per_token[ORACLE]
    best_constant = min(constants, key=lambda p: (per_token[p], p))
    best_policy = min(policies, key=lambda p: (per_token[p], p))
    gap = per_token[best_constant] - oracle
    closed = {p: (per_token[best_constant] - per_token[p]) / gap if gap > 0 else math.nan for p in policies}
    return GridRow(
        shape=shape, c=comparison.costs.c, oracle_cost=oracle,
        costs={p: per_token[p] for p in policies},
        to_oracle={p: per_token[p] / oracle for p in policies},
        best_constant=best_constant, best_policy=best_policy, default=default,
        cert_vs_constant=comparison.ratio(certificate, constants, n_boot=n_boot, seed=seed),
        cert_vs_default=comparison.ratio(certificate, [default], n_boot=n_boot, seed=seed),
        cert_vs_oracle=comparison.ratio(certificate, [ORACLE], n_boot=n_boot, seed=seed),
        best_vs_oracle=comparison.ratio(best_policy, [ORACLE], n_boot=n_boot, seed=seed),
        gap_closed=closed,
    )


def replay_grid(
    eval_chains: Sequence[RecordedChains],
    calibration_chains: Sequence[RecordedChains],
    grid: Sequence[tuple[str, CostModel]],
    *,
    builtins: Sequence[str] | None = None,
    calibrated: Sequence[str] = CALIBRATED,
    default: str = "confidence:0.4",
    n_boot: int = 2000,
    seed: int = 0,
    processes: int = 0,
    fast: bool = True,
) -> list[GridRow]:
    """A :class:`GridRow` per ``(shape name, cost model)`` of ``grid``: the built-ins (default
    :func:`grid_builtins`) replayed once, the calibrated rules recalibrated for each cost model.

    ``processes``: 0 computes every row here; ``N >= 1`` hands the cost models to ``N`` worker
    processes (started fresh, one thread each; at most one per cost model). Each row is a function
    of its cost model alone (its bootstrap is seeded with ``seed``), so the rows are the same
    either way. Workers that cannot start or that die are reported in one line, and the rows are
    then computed here. ``fast``: as :func:`replay_comparison`'s.
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"processes must be an integer >= 0, got {processes!r}")
    names = list(builtins) if builtins is not None else grid_builtins()
    replayed = {spec: [replay(ch, spec, fast=fast) for ch in eval_chains] for spec in names}
    job = (list(eval_chains), list(calibration_chains), names, list(calibrated), default, n_boot, seed, replayed, fast)
    if processes and len(grid) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        try:
            with ProcessPoolExecutor(max_workers=min(processes, len(grid)), mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_grid_worker_start, initargs=(job,)) as pool:
                return list(pool.map(_grid_worker_row, grid))
        except (BrokenProcessPool, OSError) as err:
            print(f"replay_grid: the worker processes failed ({type(err).__name__}: {err}); replaying here instead")
    return [_grid_point(job, shape, costs) for shape, costs in grid]


def submit_replay_grid(eval_chains: Sequence[RecordedChains], calibration_chains: Sequence[RecordedChains],
                       grid: Sequence[tuple[str, CostModel]], **kwargs: Any) -> Future[tuple[list[GridRow], float]]:
    """:func:`replay_grid` started in the background: a future of ``(rows, seconds it took)``.

    With ``processes >= 1`` the work happens in the worker processes, and the calling thread stays
    free, e.g. to decode live on the other cores meanwhile (a thread of this process replays the
    built-ins, under a second, then only waits on the workers); with ``processes = 0`` that thread
    does all of it, sharing the interpreter with the caller. Arguments as :func:`replay_grid`'s:
    ``processes`` is checked here, the others when the replay starts (the future raises their error).
    """
    processes = kwargs.get("processes", 0)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"processes must be an integer >= 0, got {processes!r}")
    from concurrent.futures import ThreadPoolExecutor

    def timed() -> tuple[list[GridRow], float]:
        t0 = time.perf_counter()
        rows = replay_grid(eval_chains, calibration_chains, grid, **kwargs)
        return rows, time.perf_counter() - t0

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="replay-grid")
    try:
        return pool.submit(timed)
    finally:
        pool.shutdown(wait=False)


_GRID_JOB: tuple | None = None   # a grid worker process's shared inputs (set once by its initializer)


def _grid_worker_start(job: tuple) -> None:
    global _GRID_JOB
    torch.set_num_threads(1)
    _GRID_JOB = job


def _grid_worker_row(point: tuple[str, CostModel]) -> GridRow:
    assert _GRID_JOB is not None, "the worker's initializer sets the job"
    return _grid_point(_GRID_JOB, *point)


def _grid_point(job: tuple, shape: str, costs: CostModel) -> GridRow:
    eval_chains, calibration_chains, names, calibrated, default, n_boot, seed, replayed, fast = job
    cmp = replay_comparison(eval_chains, calibration_chains, costs, builtins=names, calibrated=calibrated,
                            cold=False, replayed=replayed, fast=fast)
    return grid_row(cmp, shape, default=default, n_boot=n_boot, seed=seed)


def ratio_outcome(est: RatioEstimate) -> str:
    """``"cheaper"`` when the whole 95 % interval is below 1, ``"dearer"`` when above, else ``"no difference"``."""
    if est.hi < 1.0:
        return "cheaper"
    if est.lo > 1.0:
        return "dearer"
    return "no difference"


def _places(rows: Sequence[GridRow], labels: dict[str, str]) -> str:
    """``"flat V at c = 0.02, 0.05; CPU V at c = 1"``: the cost models of ``rows``, grouped by shape."""
    shapes = list(dict.fromkeys(r.shape for r in rows))
    return "; ".join(f"{labels.get(sh, sh)} at c = " + ", ".join(f"{r.c:g}" for r in rows if r.shape == sh)
                     for sh in shapes)


def _by_how_much(rows: Sequence[GridRow], est: Callable[[GridRow], RatioEstimate]) -> str:
    return "by " + _span([abs(1.0 - est(r).point) for r in rows], ".1%")


def versus_sentence(rows: Sequence[GridRow], est: Callable[[GridRow], RatioEstimate], other: str,
                    labels: dict[str, str]) -> str:
    """Where the certificate rule is cheaper than ``other``, where dearer and where not resolved, by how much.

    Cheaper / dearer: the 95 % interval of the cost ratio ``est(row)`` lies wholly below / above 1
    (:func:`ratio_outcome`); by how much: the range of ``|1 - ratio|`` over those cost models.
    """
    n = len(rows)
    groups = {o: [r for r in rows if ratio_outcome(est(r)) == o] for o in ("cheaper", "dearer", "no difference")}
    parts = []
    for outcome, verb in (("cheaper", "cheaper than"), ("dearer", "dearer than")):
        g = groups[outcome]
        if not g:
            parts.append(f"it is {verb} {other} on none of the {n} cost models")
        elif len(g) == n:
            parts.append(f"it is {verb} {other} on every one of the {n} cost models, {_by_how_much(g, est)}")
        else:
            parts.append(f"it is {verb} {other} on {len(g)} of the {n} cost models ({_places(g, labels)}), "
                         f"{_by_how_much(g, est)}")
    unresolved = groups["no difference"]
    if unresolved:
        parts.append(f"on {len(unresolved)} of the {n} the 95 % interval contains 1 (no difference resolved: "
                     f"{_places(unresolved, labels)})")
    else:
        parts.append("the difference is resolved on every cost model")
    return "; ".join(parts[:-1]) + ", and " + parts[-1] + "."


def _fmt(x: float, fmt: str) -> str:
    """``format(x, fmt)`` without the sign of a value that rounds to zero (``"0%"``, not ``"-0%"``)."""
    text = format(x, fmt)
    return text[1:] if text.startswith("-") and not any(d in text for d in "123456789") else text


def _span(values: Sequence[float], fmt: str) -> str:
    """``"12% to 30%"``, or one number when the range rounds to one."""
    lo, hi = _fmt(min(values), fmt), _fmt(max(values), fmt)
    return lo if lo == hi else f"{lo} to {hi}"


def gap_sentence(rows: Sequence[GridRow], certificate: str = "certificate") -> str:
    """How far the best constant schedule is above the oracle and how much of that gap any policy closes."""
    above = [r.to_oracle[r.best_constant] - 1 for r in rows]
    with_gap = [r for r in rows if math.isfinite(r.gap_closed[r.best_policy])]
    text = f"The best constant schedule costs {_span(above, '.1%')} more than the oracle across the grid."
    if not with_gap:
        return text + " It reaches the oracle on every cost model, so there is no gap for any policy to close."
    best = [r.gap_closed[r.best_policy] for r in with_gap]
    cert = [r.gap_closed[certificate] for r in with_gap]
    text += (f" The cheapest policy replayed at each cost model closes {_span(best, '.0%')} of the gap "
             f"from the best constant schedule to the oracle (median {_fmt(float(np.median(best)), '.0%')})")
    if all(b == 0 for b in best):
        text += ": no policy improves on the best constant schedule anywhere"
    text += f"; the certificate rule closes {_span(cert, '.0%')} (median {_fmt(float(np.median(cert)), '.0%')})"
    negative = sum(x < 0 for x in cert)
    if negative:
        text += (f", a negative share on {negative} of the {len(with_gap)} cost models meaning it costs more than "
                 f"the best constant schedule there")
    text += "."
    rest = [r for r in rows if r not in with_gap]
    if rest:
        why = " (plain decoding: drafting does not pay there)" if all(r.best_constant == "constant:0" for r in rest) else ""
        text += (f" On {len(rest)} cost model{'s' if len(rest) > 1 else ''}{why} the best constant schedule already "
                 f"reaches the oracle, and these are left out of the shares.")
    return text


def goal_sentence(row: GridRow, *, within: float = 0.10, cheaper_by: float = 0.05, certificate: str = "certificate") -> str:
    """At one cost model: is the cheapest policy replayed within ``within`` of the oracle, and is the
    certificate rule's ratio to the best constant schedule resolved below 1, by at least ``cheaper_by``?
    Every outcome has its words; when no policy is within reach, every policy's distance to the oracle
    is listed."""
    best = row.best_vs_oracle
    if best.point <= 1 + within:
        first = (f"the cheapest policy replayed, `{row.best_policy}`, costs {best.point:.3f} times the oracle "
                 f"(95 % interval [{best.lo:.3f}, {best.hi:.3f}]): within {within:.0%} of the limit")
        if best.hi > 1 + within:
            first += f" by its point estimate, though the interval reaches above {1 + within:.2f}"
    else:
        ranked = sorted(row.to_oracle.items(), key=lambda kv: kv[1])
        first = (f"none of the policies replayed comes within {within:.0%} of the oracle: the cheapest, `{row.best_policy}`, costs "
                 f"{best.point:.3f} times the limit (95 % interval [{best.lo:.3f}, {best.hi:.3f}]); every policy's "
                 f"cost over the oracle's: " + ", ".join(f"`{p}` {x:.3f}" for p, x in ranked))
    est = row.cert_vs_constant
    outcome = ratio_outcome(est)
    if outcome == "cheaper":
        second = (f"the certificate rule's cost over the best constant schedule's is {est.point:.3f} "
                  f"[{est.lo:.3f}, {est.hi:.3f}], an interval entirely below 1: it is {1 - est.point:.1%} cheaper")
        second += (f", at least the {cheaper_by:.0%} asked" if 1 - est.point >= cheaper_by else
                   f", less than the {cheaper_by:.0%} asked")
    elif outcome == "dearer":
        second = (f"the certificate rule's cost over the best constant schedule's is {est.point:.3f} "
                  f"[{est.lo:.3f}, {est.hi:.3f}], an interval entirely above 1: it is {est.point - 1:.1%} dearer")
    else:
        second = (f"the certificate rule's cost over the best constant schedule's is {est.point:.3f} "
                  f"[{est.lo:.3f}, {est.hi:.3f}], an interval that contains 1: no difference is resolved")
    if outcome != "cheaper":
        second += f", so it is not the {cheaper_by:.0%} saving with an interval below 1 that was asked"
    return first + "; and " + second + "."
