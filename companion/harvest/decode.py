"""Batched greedy decoding of the target, with the drafter teacher-forced on the same prefixes.

One batch of prompts is left-padded (attention mask, HF position-id convention), prefilled
with ``logits_to_keep=1`` (the prompt's logits over the vocabulary are never materialised),
and decoded greedily with the model's KV cache. The target's logits of every step are
collected on the device in *blocks* of ``chunk_steps`` steps; when a block is full:

* the drafter is fed the block's greedy tokens in one forward with its own KV cache (so it sees
  exactly prompt + the target's continuation: teacher forcing), giving ``q`` for every step;
* :class:`~companion.harvest.stats.StepStatistics` reduces the block ``[B * S, V]`` to
  per-step columns, which go to the host (a few numbers per step), and the block is dropped.

Peak memory is therefore that of one block, whatever the number of prompts or steps. The
greedy token is ``argmax`` of the target's logits (id-based: the lowest id among exact ties).
With ``stop_at_eos`` a prompt's rows end with the step whose greedy token is an EOS token;
its later steps are still computed (the batch keeps its shape) but not returned, and the
loop ends early once every prompt of the batch has finished.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from companion.harvest.stats import StepStatistics

#: ``hook(prompt_positions, first_step, logits_p [B, S, V], logits_q [B, S, V] | None, columns)``,
#: called once per block on the device tensors (for tests and inspection).
BlockHook = Callable[[list[int], int, Tensor, "Tensor | None", dict[str, Tensor]], None]


@dataclass
class BatchResult:
    """Columns of one batch as host arrays ``[B, T_run, ...]`` and the mask of recorded steps."""

    columns: dict[str, np.ndarray]
    valid: np.ndarray  # bool [B, T_run]: the step is part of the trace
    steps_run: int  # steps actually decoded (T, or fewer when every prompt ended early)


def left_pad(batch_ids: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, position_ids)`` for left-padded prompts.

    Position ids count real tokens only (pads get 1, as in ``transformers``' ``generate``), so a
    padded prompt sees the same positions as alone.
    """
    if not batch_ids or any(len(ids) == 0 for ids in batch_ids):
        raise ValueError("every prompt of a batch must have at least one token")
    width = max(len(ids) for ids in batch_ids)
    input_ids = torch.full((len(batch_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch_ids), width), dtype=torch.long)
    for b, ids in enumerate(batch_ids):
        input_ids[b, width - len(ids):] = torch.tensor(list(ids), dtype=torch.long)
        mask[b, width - len(ids):] = 1
    pos = mask.cumsum(-1) - 1
    pos.masked_fill_(mask == 0, 1)
    return input_ids.to(device), mask.to(device), pos.to(device)


class _Teacher:
    """A drafter fed the target's tokens, block by block, with its own KV cache."""

    def __init__(self, model: Any, input_ids: Tensor, mask: Tensor, pos: Tensor) -> None:
        self.model = model
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
        self.cache = out.past_key_values
        self.mask = mask
        self.next_pos = pos[:, -1:] + 1
        self.pending = out.logits[:, -1]  # q of the next step to be recorded

    def block(self, tokens: Tensor, last: bool) -> Tensor:
        """``q`` logits ``[B, S, V]`` of the steps whose greedy tokens are ``tokens [B, S]``.

        The first is the pending one; the others come from feeding ``tokens[:, :-1]``; unless
        this is the last block, the final token is fed too, leaving the next step's ``q`` pending.
        """
        feed = tokens[:, :-1] if last else tokens
        rows = [self.pending.unsqueeze(1)]
        n = feed.shape[1]
        if n:
            ones = torch.ones((feed.shape[0], n), dtype=self.mask.dtype, device=self.mask.device)
            self.mask = torch.cat([self.mask, ones], dim=1)
            pos = self.next_pos + torch.arange(n, device=feed.device)
            out = self.model(input_ids=feed, attention_mask=self.mask, position_ids=pos,
                             past_key_values=self.cache, use_cache=True, logits_to_keep=n)
            self.cache = out.past_key_values
            self.next_pos = self.next_pos + n
            logits = out.logits
            if last:
                rows.append(logits)
            else:
                rows.append(logits[:, :-1])
                self.pending = logits[:, -1]
        return torch.cat(rows, dim=1)


@torch.inference_mode()
def decode_batch(
    target: Any,
    drafter: Any | None,
    batch_ids: Sequence[Sequence[int]],
    n_steps: int,
    stats: StepStatistics | None,
    *,
    chunk_steps: int,
    pad_id: int,
    eos_ids: Sequence[int] = (),
    stop_at_eos: bool = True,
    hook: BlockHook | None = None,
    on_block: Callable[[int], None] | None = None,
) -> BatchResult:
    """Greedy-decode ``n_steps`` from each prompt of the batch and return its step columns.

    ``stats`` None decodes without computing any statistic (the benchmark's baseline): only
    ``token`` is returned. ``on_block(n)`` is told how many steps (summed over prompts, recorded
    or not) each block covered, for progress bars.
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    if chunk_steps < 1:
        raise ValueError(f"chunk_steps must be >= 1, got {chunk_steps}")
    device = target.device
    input_ids, mask, pos = left_pad(batch_ids, pad_id, device)
    bsz = input_ids.shape[0]
    out = target(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    logits = out.logits[:, -1]
    next_pos = pos[:, -1:] + 1
    teacher = _Teacher(drafter, input_ids, mask, pos) if drafter is not None else None
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    finished = torch.zeros(bsz, dtype=torch.bool, device=device)

    blocks: list[dict[str, np.ndarray]] = []
    block_logits: list[Tensor] = []
    block_tokens: list[Tensor] = []
    first = 0
    steps_run = 0
    for t in range(n_steps):
        tok = logits.argmax(-1)
        block_logits.append(logits)
        block_tokens.append(tok)
        steps_run = t + 1
        if stop_at_eos and eos.numel():
            finished |= torch.isin(tok, eos)
        last = t == n_steps - 1
        if len(block_logits) == chunk_steps or last:
            # One host sync per block: stop once every prompt has produced an EOS.
            if not last and stop_at_eos and eos.numel() and bool(finished.all()):
                last = True
            blocks.append(_flush(block_logits, block_tokens, stats, teacher, last, hook, first))
            if on_block is not None:
                on_block(bsz * len(block_logits))
            first = t + 1
            block_logits, block_tokens = [], []
        if last:
            break
        mask = torch.cat([mask, torch.ones((bsz, 1), dtype=mask.dtype, device=device)], dim=1)
        out = target(input_ids=tok.unsqueeze(1), attention_mask=mask, position_ids=next_pos,
                     past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1]
        next_pos = next_pos + 1

    columns = {name: np.concatenate([b[name] for b in blocks], axis=1) for name in blocks[0]}
    tokens = columns["token"]
    valid = np.ones_like(tokens, dtype=bool)
    if stop_at_eos and len(eos_ids):
        is_eos = np.isin(tokens, np.asarray(sorted(set(eos_ids))))
        # A step is recorded if no EOS came strictly before it.
        before = np.cumsum(is_eos, axis=1) - is_eos
        valid = before == 0
    return BatchResult(columns=columns, valid=valid, steps_run=steps_run)


def _flush(
    block_logits: list[Tensor],
    block_tokens: list[Tensor],
    stats: StepStatistics | None,
    teacher: _Teacher | None,
    last: bool,
    hook: BlockHook | None,
    first: int,
) -> dict[str, np.ndarray]:
    """Reduce one block of steps to host columns ``[B, S, ...]``."""
    tokens = torch.stack(block_tokens, dim=1)  # [B, S]
    bsz, s = tokens.shape
    lq = teacher.block(tokens, last) if teacher is not None else None
    if stats is None:  # baseline: the same forwards, no statistics
        return {"token": tokens.cpu().numpy()}
    lp = torch.stack(block_logits, dim=1)  # [B, S, V]
    vocab = lp.shape[-1]
    cols = stats(lp.reshape(bsz * s, vocab), None if lq is None else lq.reshape(bsz * s, vocab),
                 token=tokens.reshape(-1))
    if hook is not None:
        hook(list(range(bsz)), first, lp, lq, cols)
    host: dict[str, np.ndarray] = {}
    for name, value in cols.items():
        arr = value.cpu().numpy()
        host[name] = arr.reshape((bsz, s) + arr.shape[1:])
    return host
