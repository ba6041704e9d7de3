"""The kernel paths of one decoder, side by side: where can the greedy token differ, and at what gap?

A decoder computes the logits of one position along several kernel paths. This module runs four
of them on the same text (the greedy answer of the first, every other path teacher-forced on it,
so that every path sees the same prefix at every step):

* ``decode``: batch 1, the prompt prefilled, then one token per forward with the KV cache (the
  plain greedy decoder, and the text every other path reads);
* ``verify``: batch 1, the prompt but its last token prefilled, then forwards of ``k + 1`` tokens
  with the cache (a speculative decoder's verification forward);
* ``full``: batch 1, one forward over the prompt and the whole answer, no cache;
* ``batch``: the prompts left-padded in batches (the harvest's shape), one token per forward.

For every step and path it keeps the greedy token (``argmax``, the lowest id among exact ties),
the two largest logits ``z(1) >= z(2)`` and the runner-up's id. :func:`compare` then finds the
*flips*, steps where two paths choose different greedy tokens, and states each path's top-2 gap
there in units in the last place of its ``z(1)`` (:func:`companion.certify.precision.ulp`). A
certificate that counts a step as a tie when its gap is at most ``TIE_ULPS`` ulps is sound across
these paths exactly when every flip's gaps, on both sides, are within that band.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from companion.assets import KERNEL_PATHS_DIR
from companion.analysis.traces import quantile
from companion.certify.precision import TIE_ULPS, ulp
from companion.harvest.decode import left_pad

#: The kernel paths :func:`measure_kernel_paths` runs, in this order.
PATHS = ("decode", "verify", "full", "batch")


@dataclass
class PathRows:
    """One path's record of every step: greedy token, runner-up, and the two largest logits."""

    token: np.ndarray  # int64 [N]
    runner_up: np.ndarray  # int64 [N]: argmax with the greedy token masked out
    z1: np.ndarray  # float64 [N]: the largest logit, as the model returned it
    z2: np.ndarray  # float64 [N]: the second largest (equal to z1 at an exact tie)

    def to_json(self) -> dict[str, list[Any]]:
        """The four columns as JSON lists."""
        return {"token": self.token.tolist(), "runner_up": self.runner_up.tolist(),
                "z1": self.z1.tolist(), "z2": self.z2.tolist()}

    @classmethod
    def from_json(cls, data: dict[str, list[Any]]) -> PathRows:
        """The rows that :meth:`to_json` wrote."""
        return cls(np.asarray(data["token"], dtype=np.int64), np.asarray(data["runner_up"], dtype=np.int64),
                   np.asarray(data["z1"], dtype=np.float64), np.asarray(data["z2"], dtype=np.float64))


def _top2(logits: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(token, runner_up, z1, z2)`` of rows ``[..., V]``: argmax first-index-wins, then again with it masked."""
    token = logits.argmax(-1)
    masked = logits.clone()
    masked.scatter_(-1, token.unsqueeze(-1), float("-inf"))
    runner = masked.argmax(-1)
    z1 = logits.gather(-1, token.unsqueeze(-1)).squeeze(-1)
    z2 = logits.gather(-1, runner.unsqueeze(-1)).squeeze(-1)
    return token, runner, z1, z2


def _rows(parts: list[tuple[Tensor, Tensor, Tensor, Tensor]]) -> PathRows:
    cat = [torch.cat([p[i].reshape(-1) for p in parts]) for i in range(4)]
    return PathRows(cat[0].cpu().numpy().astype(np.int64), cat[1].cpu().numpy().astype(np.int64),
                    cat[2].double().cpu().numpy(), cat[3].double().cpu().numpy())


@torch.inference_mode()
def decode_path(model: Any, prompt: Sequence[int], n_steps: int, eos_ids: Sequence[int] = ()
                ) -> tuple[list[int], tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Greedy-decode ``n_steps`` (fewer after an EOS token, which is kept) at batch 1 with the cache."""
    device = model.device
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    rows, text = [], []
    eos = set(int(e) for e in eos_ids)
    for _ in range(n_steps):
        logits = out.logits[:, -1]
        rows.append(_top2(logits))
        tok = int(rows[-1][0][0])
        text.append(tok)
        if tok in eos or len(text) == n_steps:
            break
        out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=out.past_key_values,
                    use_cache=True)
    return text, tuple(torch.cat([r[i] for r in rows]) for i in range(4))  # type: ignore[return-value]


@torch.inference_mode()
def verify_path(model: Any, prompt: Sequence[int], text: Sequence[int], k: int
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced logits of every step of ``text`` from forwards of ``k + 1`` tokens with the cache."""
    if len(prompt) < 2:
        raise ValueError("the verification path needs a prompt of at least two tokens")
    device = model.device
    out = model(input_ids=torch.tensor([list(prompt[:-1])], device=device), use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    feed = [prompt[-1], *text[:-1]]  # position i's logits give step i
    parts = []
    for start in range(0, len(feed), k + 1):
        block = feed[start:start + k + 1]
        out = model(input_ids=torch.tensor([block], device=device), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        parts.append(_top2(out.logits[0]))
    return tuple(torch.cat([p[i] for p in parts]) for i in range(4))  # type: ignore[return-value]


@torch.inference_mode()
def full_path(model: Any, prompt: Sequence[int], text: Sequence[int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Teacher-forced logits of every step of ``text`` from one forward over the prompt and the text, no cache."""
    ids = torch.tensor([[*prompt, *text[:-1]]], device=model.device)
    out = model(input_ids=ids, use_cache=False, logits_to_keep=len(text))
    return _top2(out.logits[0])


@torch.inference_mode()
def batch_path(model: Any, prompts: Sequence[Sequence[int]], texts: Sequence[Sequence[int]], pad_id: int
               ) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Teacher-forced logits of each text, the prompts left-padded in one batch, one token per forward."""
    device = model.device
    input_ids, mask, pos = left_pad(prompts, pad_id, device)
    out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache, next_pos = out.past_key_values, pos[:, -1:] + 1
    longest = max(len(t) for t in texts)
    steps = [_top2(out.logits[:, -1])]
    for t in range(longest - 1):
        # A finished text is fed its own last token again; its later rows are cut off below.
        tok = torch.tensor([[text[min(t, len(text) - 1)]] for text in texts], device=device)
        mask = torch.cat([mask, torch.ones((len(texts), 1), dtype=mask.dtype, device=device)], dim=1)
        out = model(input_ids=tok, attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True)
        cache, next_pos = out.past_key_values, next_pos + 1
        steps.append(_top2(out.logits[:, -1]))
    stacked = [torch.stack([s[i] for s in steps], dim=1) for i in range(4)]  # [B, T]
    return [tuple(stacked[i][b, :len(text)] for i in range(4)) for b, text in enumerate(texts)]  # type: ignore[misc]


def measure_kernel_paths(model: Any, prompts: Sequence[Sequence[int]], n_steps: int, *, k: int = 4,
                         batch_size: int = 16, pad_id: int = 0, eos_ids: Sequence[int] = (),
                         on_prompt: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the four :data:`PATHS` on ``prompts`` (token ids) and return ``{"lengths", "paths"}``.

    ``lengths[i]`` is the number of steps of prompt ``i``'s answer; ``paths[name]`` is a
    :class:`PathRows` over the steps of every answer, concatenated in prompt order.
    ``on_prompt(path)`` is called after each prompt's (or batch's) work, for a progress bar.
    """
    if n_steps < 1 or k < 1 or batch_size < 1:
        raise ValueError(f"n_steps, k and batch_size must be >= 1, got {n_steps}, {k}, {batch_size}")
    texts, parts = [], {name: [] for name in PATHS}
    for prompt in prompts:
        text, rows = decode_path(model, prompt, n_steps, eos_ids)
        texts.append(text)
        parts["decode"].append(rows)
        parts["verify"].append(verify_path(model, prompt, text, k))
        parts["full"].append(full_path(model, prompt, text))
        if on_prompt is not None:
            on_prompt("decode, verify, full")
    for start in range(0, len(prompts), batch_size):
        parts["batch"].extend(batch_path(model, prompts[start:start + batch_size], texts[start:start + batch_size],
                                         pad_id))
        if on_prompt is not None:
            on_prompt("batch")
    return {"lengths": [len(t) for t in texts], "paths": {name: _rows(parts[name]) for name in PATHS}}


@dataclass(frozen=True)
class Flip:
    """A step where paths ``a`` and ``b`` chose different greedy tokens, and each one's top-2 gap in ulps."""

    a: str
    b: str
    step: int  # index into the concatenated steps
    gap_ulps_a: float
    gap_ulps_b: float

    @property
    def widest(self) -> float:
        """The wider of the two paths' top-2 gaps at the flip, in ulps."""
        return max(self.gap_ulps_a, self.gap_ulps_b)


def gap_ulps(rows: PathRows, dtype: str) -> np.ndarray:
    """Each step's top-2 gap ``z(1) - z(2)`` in ulps of ``z(1)`` in ``dtype``."""
    return (rows.z1 - rows.z2) / ulp(rows.z1, dtype)


def compare(paths: dict[str, PathRows], dtype: str) -> tuple[list[Flip], dict[str, dict[str, float]]]:
    """The flips between every pair of paths, and per pair how far the top logit and the top-2 gap moved.

    The moves are in ulps of the larger ``z(1)``: ``top1_max``/``top1_p99`` of ``|z1_a - z1_b|``
    (the 99th percentile an order statistic, :func:`companion.analysis.traces.quantile`),
    ``gap_max`` of ``|gap_a - gap_b|`` over the steps where both paths chose the same two tokens.
    """
    names = [n for n in PATHS if n in paths]
    n = {len(paths[x].token) for x in names}
    if len(n) != 1:
        raise ValueError(f"the paths cover different numbers of steps: {sorted(n)}")
    gaps = {x: gap_ulps(paths[x], dtype) for x in names}
    flips: list[Flip] = []
    moves: dict[str, dict[str, float]] = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pa, pb = paths[a], paths[b]
            for s in np.flatnonzero(pa.token != pb.token):
                flips.append(Flip(a, b, int(s), float(gaps[a][s]), float(gaps[b][s])))
            unit = ulp(np.maximum(pa.z1, pb.z1), dtype)
            top1 = np.abs(pa.z1 - pb.z1) / unit
            same = (pa.token == pb.token) & (pa.runner_up == pb.runner_up)
            gap_move = np.abs((pa.z1 - pa.z2) - (pb.z1 - pb.z2))[same] / unit[same]
            moves[f"{a}/{b}"] = {"flips": float(np.sum(pa.token != pb.token)),
                                 "top1_max": float(top1.max(initial=0.0)),
                                 "top1_p99": quantile(top1, 0.99) if top1.size else 0.0,
                                 "gap_max": float(gap_move.max(initial=0.0))}
    return flips, moves


@dataclass(frozen=True)
class BandCheck:
    """What the measurement says of a band of ``band_ulps``."""

    steps: int
    flips: int  # (pair of paths, step) with different greedy tokens
    flip_steps: int  # distinct steps with a flip between some pair
    widest_flip_ulps: float  # the largest top-2 gap, either side, at any flip (0 when no flip)
    band_ulps: float
    within_band: int  # steps whose gap (on the decode path) is within the band
    outside: int  # flips with a gap beyond the band on either side

    @property
    def covers(self) -> bool:
        """Whether the band holds every flip (none outside it)."""
        return self.outside == 0


def band_check(paths: dict[str, PathRows], dtype: str, band_ulps: float = TIE_ULPS) -> BandCheck:
    """Does a band of ``band_ulps`` contain both sides' gaps of every flip between the measured paths?"""
    flips, _ = compare(paths, dtype)
    widest = max((f.widest for f in flips), default=0.0)
    near = int(np.sum(gap_ulps(paths["decode"], dtype) <= band_ulps)) if "decode" in paths else 0
    return BandCheck(steps=len(next(iter(paths.values())).token), flips=len(flips),
                     flip_steps=len({f.step for f in flips}), widest_flip_ulps=widest,
                     band_ulps=float(band_ulps), within_band=near,
                     outside=sum(1 for f in flips if f.widest > band_ulps))


def committed_record(preset: str, folder: Path | None = None) -> tuple[dict[str, Any], dict[str, PathRows]] | None:
    """``(the record's provenance, its rows by path)`` of the preset's committed measurement, or ``None``."""
    path = (folder or KERNEL_PATHS_DIR) / f"{preset}.json"
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
        paths = {name: PathRows.from_json(rows) for name, rows in record.pop("paths").items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path} is not a kernel-path measurement ({type(err).__name__}: {err})") from None
    n = {len(rows.token) for rows in paths.values()}
    if n != {sum(record.get("lengths", []))}:
        raise ValueError(f"{path}: the paths' step counts {sorted(n)} do not add up to the answers' lengths")
    return record, paths


@dataclass(frozen=True)
class BandMargin:
    """How much room the measurement leaves the band, in numbers.

    A flip needs the gap to cross 0 between two paths, so the largest move of the top-2 gap (same
    two tokens, :func:`compare`) bounds the gap at which a flip was possible on these steps.
    ``gap_move_ulps``: that move; ``widest_flip_ulps``: the widest gap at an observed flip;
    ``near_share``: the share of steps whose decode-path gap is within the band;
    ``wider_band_ulps``: ``ceil(max(move, widest flip)) + 1``, a band one ulp beyond both;
    ``wider_share``: the share of steps that band would count as ties.
    """

    band_ulps: float
    gap_move_ulps: float
    widest_flip_ulps: float
    near_share: float
    wider_band_ulps: float
    wider_share: float

    @property
    def has_margin(self) -> bool:
        """Both the move and every flip's gap lie strictly inside the band."""
        return self.gap_move_ulps < self.band_ulps and self.widest_flip_ulps < self.band_ulps


def band_margin(paths: dict[str, PathRows], dtype: str, band_ulps: float = TIE_ULPS) -> BandMargin:
    """:class:`BandMargin` of the measured ``paths`` for a band of ``band_ulps``."""
    flips, moves = compare(paths, dtype)
    widest_flip = max((f.widest for f in flips), default=0.0)
    move = max((m["gap_max"] for m in moves.values()), default=0.0)
    gaps = gap_ulps(paths["decode"], dtype)
    wider = float(math.ceil(max(move, widest_flip)) + 1)
    return BandMargin(float(band_ulps), float(move), float(widest_flip), float(np.mean(gaps <= band_ulps)),
                      wider, float(np.mean(gaps <= wider)))
