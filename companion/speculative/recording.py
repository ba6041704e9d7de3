"""Record a lossless run once: the target's greedy text and the drafter's greedy chain from every position of it.

:func:`record_chains` records one prompt, :func:`record_many` many (in several threads if asked);
the :class:`RecordedChains` they return is what :func:`~companion.speculative.replay` replays and
:func:`~companion.speculative.oracle_cost` prices (see :mod:`companion.speculative.replay`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from companion.certify.criteria import StrictGreedy
from companion.speculative.decoder import (
    _check_ids_in_vocab,
    _check_model,
    _eos_ids,
    _forward,
    _prompt_ids,
    drafter_rho,
)
from companion.speculative.policies import DraftStep

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
    policy replays exactly; a replay that needs more raises ``ChainsTooShort``, a ``ValueError``).
    Capped chains are the uncapped ones cut to ``max_drafts``, bit for bit in any dtype: the
    extension's steps before the cap are the same forwards over the same batches and cache (a chain
    leaves the batch at its end-of-sequence draft or its length, and up to the cap both runs agree on
    both), so the extension past a mismatch costs ``max_drafts - 1`` forwards instead of as many as
    the text is long, and the drafts recorded grow with the text's length instead of its square.

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
    enough: Callable[[RecordedChains], bool] | None = None,
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

    ``enough(recording)``: with ``max_drafts`` set, whether a prompt's chains are long enough for
    what will be replayed on them (say ``companion.speculative.policy_replay.fits``); a prompt
    whose recording is not is recorded again with twice the ``max_drafts``, until it is, or with
    ``None`` (chains to the answer's end) once twice would reach the length budget. Capped chains
    are the uncapped ones cut short (the same forwards, fewer of them), so every replay that fits
    them is the replay of the uncapped recording, while the drafter's extension past a mismatch
    costs ``max_drafts`` forwards instead of as many as the answer is long. ``inspect`` sees a
    re-recorded prompt's rows again.
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
    n = len(prompts)
    if texts is not None and len(texts) != n:
        raise ValueError(f"texts has {len(texts)} entries for {n} prompts; give one text (or None) per prompt")

    def one(i: int) -> RecordedChains:
        look = None if inspect is None else (lambda lp, lq: inspect(i, lp, lq))
        text = None if texts is None else texts[i]
        cap = max_drafts
        while True:
            rec = record_chains(target, drafter, prompts[i], max_new_tokens=max_new_tokens, max_drafts=cap,
                                eos_token_id=eos_token_id, text=text, inspect=look)
            if cap is None or enough is None or enough(rec):
                return rec
            cap = None if 2 * cap >= max_new_tokens - 1 else 2 * cap
            text = list(rec.tokens)   # decoded once

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
