"""The cost model of tree rounds, measured at batch 1.

Unit: one single-token target forward with a warm KV cache (as :mod:`companion.speculative.costs`).

* ``V(N)``: a target forward over the root and ``N`` tree nodes (4D tree mask, per-node positions), over one
  single-token target forward; ``V(0) = 1``;
* ``D(w)``: a drafter forward over ``w`` tree nodes (tree-masked, over cached nodes), over one single-token
  target forward; ``D(1)`` is the chain cost ratio ``c``.

A round that verifies ``N`` nodes after drafter forwards over ``w_1, w_2, ...`` nodes (the first over the
uncached context, usually the one token the last round emitted: ``w_1 = 1``) costs
``C = V(N) + sum_f D(w_f)`` and emits ``A + 1`` tokens; plain decoding emits one token per unit, so a policy's
modelled speed-up is ``sum (A + 1) / sum C`` over its rounds (:meth:`TreeCostModel.speedup`).

:func:`measure_tree_costs` times them with ``context`` tokens cached, every repeat interleaved (a one-token
target forward, then each tree size, then each drafter width) so that a shared machine's load changes bias no
size against another; the tree over ``N`` nodes is the heap-ordered binary tree (node ``i``'s parent is
``(i - 1) // 2``), the drafter's ``w`` nodes are siblings at depth 1 over one cached node.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from companion.models.shortlist_llama import logit_count
from companion.speculative.tree.shape import DraftTree
from companion.speculative.tree.verify import tree_forward


@dataclass(frozen=True)
class TreeCostModel:
    """``verify[N] = V(N)`` for ``N = 0 .. len(verify) - 1`` (``V(0) = 1``) and ``draft[w] = D(w)`` for
    ``w = 0 .. len(draft) - 1`` (``draft[0] = 0``); beyond a table the last step is extended (never negative)."""

    verify: tuple[float, ...]
    draft: tuple[float, ...]

    def __post_init__(self) -> None:
        for name, table, first in (("verify", self.verify, 1.0), ("draft", self.draft, 0.0)):
            if len(table) < 2 or table[0] != first or any(not (math.isfinite(v) and v >= 0) for v in table):
                raise ValueError(f"a tree cost model's {name} table needs finite entries >= 0 starting at {first}, "
                                 f"got {table!r}")

    @staticmethod
    def _at(table: Sequence[float], n: int) -> float:
        if n < len(table):
            return table[n]
        return table[-1] + max(table[-1] - table[-2], 0.0) * (n - len(table) + 1)

    def verify_cost(self, nodes: int) -> float:
        return self._at(self.verify, max(nodes, 0))

    def draft_cost(self, width: int) -> float:
        return self._at(self.draft, max(width, 0))

    @property
    def c(self) -> float:
        """The drafter's one-token forward over the target's: ``D(1)``."""
        return self.draft[1]

    def round_cost(self, nodes: int, widths: Sequence[int]) -> float:
        """``V(N) + sum_f D(w_f)``."""
        return self.verify_cost(nodes) + math.fsum(self.draft_cost(w) for w in widths)

    def speedup(self, accepted: Sequence[int], nodes: Sequence[int], widths: Sequence[Sequence[int]]) -> float:
        """Modelled tokens per unit cost over rounds, i.e. the speed-up over plain decoding."""
        tokens = sum(a + 1 for a in accepted)
        cost = math.fsum(self.round_cost(n, w) for n, w in zip(nodes, widths))
        return tokens / cost if cost > 0 else math.nan


@dataclass(frozen=True)
class TreeCostSamples:
    """Every timing of :func:`measure_tree_costs`: ``one_s`` the one-token target forwards, ``tree_s[N]`` the
    target forwards over ``N`` nodes, ``draft_s[w]`` the drafter forwards over ``w`` nodes, one per repeat each;
    ``context`` cached tokens, ``threads`` torch threads (0: not set, or not the CPU)."""

    one_s: tuple[float, ...]
    tree_s: dict[int, tuple[float, ...]]
    draft_s: dict[int, tuple[float, ...]]
    context: int
    threads: int = 0

    def model(self) -> TreeCostModel:
        """Medians, over the median one-token target forward; sizes between measured ones interpolated."""
        t1 = statistics.median(self.one_s)

        def table(samples: dict[int, tuple[float, ...]], first: float) -> tuple[float, ...]:
            med = {0: first * t1, **{n: statistics.median(v) for n, v in samples.items()}}
            ks = sorted(med)
            out = []
            for n in range(ks[-1] + 1):
                lo = max(k for k in ks if k <= n)
                hi = min(k for k in ks if k >= n)
                x = med[lo] if hi == lo else med[lo] + (med[hi] - med[lo]) * (n - lo) / (hi - lo)
                out.append(x / t1)
            return tuple(out)

        return TreeCostModel(verify=table(self.tree_s, 1.0), draft=table(self.draft_s, 0.0))

    def spread(self, kind: str, n: int) -> tuple[float, float, float]:
        """(min, median, max) over repeats of the paired ratio (each repeat's forward over its own one-token target
        forward) of ``V(n)`` (``kind="verify"``) or ``D(n)`` (``"draft"``)."""
        num = (self.tree_s if kind == "verify" else self.draft_s)[n]
        r = [a / b for a, b in zip(num, self.one_s)]
        return min(r), statistics.median(r), max(r)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TreeCostSamples:
        """The samples :meth:`to_json` wrote (a committed benchmark record's ``tree_costs``)."""
        try:
            return cls(one_s=tuple(float(x) for x in data["one_s"]),
                       tree_s={int(k): tuple(float(x) for x in v) for k, v in data["tree_s"].items()},
                       draft_s={int(k): tuple(float(x) for x in v) for k, v in data["draft_s"].items()},
                       context=int(data["context"]), threads=int(data.get("threads", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"not a tree cost measurement (one_s, tree_s, draft_s, context): {err!r}") from None

    def to_json(self) -> dict[str, Any]:
        return {"context": self.context, "threads": self.threads, "one_s": list(self.one_s),
                "tree_s": {str(k): list(v) for k, v in sorted(self.tree_s.items())},
                "draft_s": {str(k): list(v) for k, v in sorted(self.draft_s.items())}}


def _heap_tree(n: int, first_token: int = 1) -> DraftTree:
    tree = DraftTree()
    for i in range(n):
        tree.add((i - 1) // 2 if i else -1, first_token + i, 1 + (i % 2), 0.0)
    return tree


def _timed(model: Any, fn: Any) -> float:
    cuda = getattr(model, "device", torch.device("cpu")).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure_tree_costs(target: Any, drafter: Any, *, context: int = 128, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32),
                       widths: Sequence[int] = (1, 2, 4, 8, 16), repeats: int = 10, seed: int = 0) -> TreeCostSamples:
    """Time ``V(N)`` for ``N`` in ``sizes`` and ``D(w)`` for ``w`` in ``widths`` (see the module docstring); a first
    pass warms up and is not kept."""
    for name, value in (("context", context), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not sizes or not widths or min(sizes) < 1 or min(widths) < 1:
        raise ValueError(f"sizes and widths must be non-empty lists of integers >= 1, got {list(sizes)}, {list(widths)}")
    vocab = min(logit_count(target), logit_count(drafter))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (context + 1,), generator=gen).tolist()
    tok = ids[-1] % max(vocab - max(max(sizes), max(widths)) - 1, 1)
    caches: dict[str, DynamicCache] = {}
    with torch.inference_mode():
        for name, model in (("target", target), ("drafter", drafter)):
            caches[name] = DynamicCache()
            model(input_ids=torch.tensor([ids[:context]], device=model.device), past_key_values=caches[name],
                  use_cache=True, logits_to_keep=1)
        one: list[float] = []
        tree_s: dict[int, list[float]] = {n: [] for n in sizes}
        draft_s: dict[int, list[float]] = {w: [] for w in widths}
        # the drafter's nodes sit under one cached node (depth 2), as at a tree's second depth
        parent = DraftTree()
        parent.add(-1, tok, 1, 0.0)
        tree_forward(drafter, caches["drafter"], parent, [], [0], [], context, 1)
        base = context + 1
        for rep in range(repeats + 1):
            tc = caches["target"]
            dt = _timed(target, lambda: target(input_ids=torch.tensor([[tok]], device=target.device),
                                               past_key_values=tc, use_cache=True, logits_to_keep=1))
            tc.crop(context)
            if rep:
                one.append(dt)
            for n in sizes:
                tree = _heap_tree(n, tok + 1)
                dt = _timed(target, lambda: tree_forward(target, tc, tree, [tok], range(n), [], context, n + 1))
                tc.crop(context)
                if rep:
                    tree_s[n].append(dt)
            for w in widths:
                tree = DraftTree()
                tree.add(-1, tok, 1, 0.0)
                for r in range(w):
                    tree.add(0, tok + 1 + r, r + 1, 0.0)
                dc = caches["drafter"]
                dt = _timed(drafter, lambda: tree_forward(drafter, dc, tree, [], range(1, w + 1), [0], context, w))
                dc.crop(base)
                if rep:
                    draft_s[w].append(dt)
    on_cpu = getattr(target, "device", torch.device("cpu")).type == "cpu"
    return TreeCostSamples(one_s=tuple(one), tree_s={n: tuple(v) for n, v in tree_s.items()},
                           draft_s={w: tuple(v) for w, v in draft_s.items()}, context=context,
                           threads=torch.get_num_threads() if on_cpu else 0)
