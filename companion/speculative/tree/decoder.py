"""A greedy tree speculative decoder for transformers causal LMs (batch 1), with KV caches for both models.

One round, with the context's last token as the root:

1. *drafting*: the drafter's forward over the context tokens it has not cached gives the root's
   distribution; the policy (:mod:`companion.speculative.tree.policies`) picks the root's children among its
   top tokens; then, depth by depth, one drafter forward over the nodes the policy expands (tree-masked, each
   node seeing the context and its own ancestors) gives their distributions and the policy their children;
2. *verification*: one target forward over the uncached context tokens and every node the policy submits,
   with the tree's 4D attention mask and per-node positions (:mod:`companion.speculative.tree.verify`), gives
   the target's greedy token after the root and after each node;
3. *acceptance*: the greedy walk from the root keeps the longest path whose every token is the target's
   greedy token after its ancestors, and the target's greedy token after the path's end follows it;
4. *compaction*: both caches keep the context and the kept path's nodes (re-gathered: see
   :mod:`companion.speculative.tree.verify`); the target's token after the path is fed next round.

Every emitted token is the target's greedy token after the emitted prefix, so the output is the target's
greedy decoding (lossless), up to the floating-point differences between a one-token forward and a tree
forward, which only matter at near ties of the target's logits (:func:`bf16_parting` names them). Length
budget and end of sequence as in :func:`companion.speculative.generate`: no node deeper than
``max_length - cur_len - 1``, a drafted end-of-sequence token is never expanded, and an emitted one ends the
generation.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from companion.speculative.decoder import (
    SpeculativeResult,
    Timings,
    _check_ids_in_vocab,
    _check_model,
    _eos_ids,
    _forward,
    _prompt_ids,
    generate,
)
from companion.speculative.tree.policies import (
    Expansion,
    TreeOutcome,
    TreePolicy,
    is_tree_spec,
    parse_tree_policy,
)
from companion.speculative.tree.shape import DraftTree
from companion.speculative.tree.verify import check_tree_support, keep_slots, tree_forward


@dataclass
class TreeResult(SpeculativeResult):
    """A tree run: :class:`~companion.speculative.decoder.SpeculativeResult`'s fields (``submitted[r]`` the nodes
    verified in round ``r``, ``drafted[r]`` its drafter forwards, ``draft_tokens[r]`` the verified nodes' tokens in
    tree order), plus ``trees[r]`` the verified tree, ``paths[r]`` its kept nodes and ``drafted_nodes[r]`` the
    nodes drafted (a dynamic tree drafts more than it verifies), ``widths[r]`` the tokens or nodes each drafter
    forward fed (the cost model's ``w_f``)."""

    trees: list[DraftTree] = field(default_factory=list)
    paths: list[list[int]] = field(default_factory=list)
    drafted_nodes: list[int] = field(default_factory=list)
    widths: list[list[int]] = field(default_factory=list)


def _top(rows: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per row of drafter logits ``[n, V]``: the top ``k`` probabilities (float64, descending) and their ids, equal
    probabilities in id order (as ``torch.argmax`` resolves a tie at the top). ``topk`` over the logits, not a sort
    of the vocabulary: on a 150k vocabulary a sort per expanded node costs more than the drafter's forward."""
    rows64 = rows.double()
    vals, ids = rows64.topk(k, dim=-1)
    # within equal values, id order: sort by id, then stably by value
    by_id = ids.sort(dim=-1)
    vals = vals.gather(-1, by_id.indices)
    order = (-vals).sort(dim=-1, stable=True).indices
    ids = by_id.values.gather(-1, order)
    probs = (vals.gather(-1, order) - torch.logsumexp(rows64, dim=-1, keepdim=True)).exp()
    return probs, ids


def _rank(q_ids: Tensor, token: int, width: int) -> int:
    hit = (q_ids == token).nonzero()
    return int(hit[0, 0]) + 1 if len(hit) else width + 1


def generate_tree(
    target: Any,
    drafter: Any,
    input_ids: Tensor | Sequence[int],
    *,
    policy: str | TreePolicy,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None = None,
    fallback: str | None = None,
) -> SpeculativeResult:
    """Tree speculative greedy decoding of ``input_ids`` (one sequence); see the module docstring.

    ``policy``: a tree spec (``TREE_FORMS``) or a
    :class:`~companion.speculative.tree.policies.TreePolicy` (its state carries over); a chain spec
    (``constant:K``...) runs the chain decoder :func:`companion.speculative.generate`. ``fallback``: a chain spec
    to run instead when a model cannot verify a tree (no 4D-mask support); without it such a model is refused.
    """
    if not is_tree_spec(policy):
        return generate(target, drafter, input_ids, policy=policy, max_new_tokens=max_new_tokens,  # type: ignore[arg-type]
                        eos_token_id=eos_token_id)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    pol = parse_tree_policy(policy)
    vt = _check_model(target, "target")
    vd = _check_model(drafter, "drafter")
    if vt != vd:
        raise ValueError(f"target and drafter vocabularies differ ({vt} vs {vd} logits); a drafter must share the target's vocabulary")
    seq = _prompt_ids(input_ids)
    _check_ids_in_vocab(seq, (target, drafter), vt)
    if pol.max_width >= vt:
        raise ValueError(f"tree policy {pol}: a node may get {pol.max_width} children but the vocabulary has {vt} "
                         "tokens; use widths below the vocabulary size")
    if pol.max_nodes < 1:
        raise ValueError(f"tree policy {pol}: a node budget of {pol.max_nodes}; give it at least 1 node")
    context = min((getattr(getattr(m, "config", None), "max_position_embeddings", None) or math.inf)
                  for m in (target, drafter))
    if len(seq) + max_new_tokens + pol.max_nodes > context:
        raise ValueError(f"tree policy {pol}: {len(seq)} prompt + {max_new_tokens} new tokens + a tree of "
                         f"{pol.max_nodes} nodes exceed the models' context of {context} positions; use a smaller "
                         "node budget or fewer tokens")
    try:
        check_tree_support(target, "target")
        check_tree_support(drafter, "drafter")
    except ValueError:
        if fallback is None:
            raise
        return generate(target, drafter, seq, policy=fallback, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id)
    eos = _eos_ids(eos_token_id, target)
    return _run(target, drafter, seq, pol, max_new_tokens, eos)


@dataclass
class DraftedRound:
    """A round's drafting: the drafted ``tree``, the nodes ``fed`` to the drafter (in its cache's order after the
    context), the top ids ``rows`` of every expanded node (-1: the root), the drafter ``forwards`` and the number of
    tokens or nodes each fed (``widths``; the first: the uncached context)."""

    tree: DraftTree
    fed: list[int]
    rows: dict[int, Tensor]
    forwards: int
    widths: list[int]

    def __iter__(self) -> Any:
        return iter((self.tree, self.fed, self.rows, self.forwards, self.widths))


def draft_round(drafter: Any, dcache: DynamicCache, seq: Sequence[int], d_len: int, pol: TreePolicy, cap: int,
                eos: frozenset[int]) -> DraftedRound:
    """Step 1 of the module docstring: the drafter's forward over ``seq[d_len:]`` (it then caches all of
    ``seq``), then one tree-masked forward per depth over the nodes the policy expands; no node deeper than
    ``cap``, no drafted end-of-sequence token expanded."""
    width = pol.max_width
    ctx = len(seq)
    tree = DraftTree()
    fed: list[int] = []
    rows: dict[int, Tensor] = {}
    row = _forward(drafter, list(seq[d_len:]), dcache, 1)[0]
    widths = [ctx - d_len]
    probs, ids = _top(row[None], width)
    rows[-1] = ids[0]
    expanded = [Expansion(-1, probs[0], ids[0], row if pol.needs_rows else None)]
    depth = 0
    while expanded and depth < cap:
        new = []
        for i, r in pol.grow(tree, depth, expanded):
            e = expanded[i]
            base = tree.logq[e.node] if e.node >= 0 else 0.0
            new.append(tree.add(e.node, int(e.ids[r - 1]), r, base + math.log(float(e.probs[r - 1]))))
        depth += 1
        if not new or depth >= cap:
            break
        feed = [j for j in pol.expand(tree, new) if tree.tokens[j] not in eos]
        if not feed:
            break
        logits = tree_forward(drafter, dcache, tree, [], feed, fed, ctx, len(feed))
        widths.append(len(feed))
        fed.extend(feed)
        probs, ids = _top(logits, width)
        expanded = []
        for k, j in enumerate(feed):
            rows[j] = ids[k]
            expanded.append(Expansion(j, probs[k], ids[k], logits[k] if pol.needs_rows else None))
    return DraftedRound(tree, fed, rows, len(widths), widths)


def _run(target: Any, drafter: Any, seq: list[int], pol: TreePolicy, max_new_tokens: int,
         eos: frozenset[int]) -> TreeResult:
    prompt_len = len(seq)
    max_len = prompt_len + max_new_tokens
    tcache, dcache = DynamicCache(), DynamicCache()
    t_len = d_len = 0
    res: dict[str, list[Any]] = {k: [] for k in ("accepted", "submitted", "drafted", "draft_tokens", "round_t",
                                                   "round_d", "round_w", "trees", "paths", "drafted_nodes")}
    t_time = d_time = 0.0
    ended_by_eos = False
    width = pol.max_width
    res["widths"] = []
    start = time.perf_counter()
    with torch.inference_mode():
        while len(seq) < max_len and not ended_by_eos:
            round_start = time.perf_counter()
            old_len = len(seq)
            cap = max_len - old_len - 1
            pol.start_round(cap)
            d0 = time.perf_counter()
            drafted = draft_round(drafter, dcache, seq, d_len, pol, cap, eos) if cap > 0 else None
            if drafted is None:
                tree, fed, rows, forwards, widths = DraftTree(), [], {}, 0, []
            else:
                tree, fed, rows, forwards, widths = drafted
                d_len = old_len
            d_time += time.perf_counter() - d0
            res["round_d"].append(time.perf_counter() - d0)

            vtree, old_ids = tree.subtree(pol.verify_nodes(tree))
            t0 = time.perf_counter()
            p_logits = tree_forward(target, tcache, vtree, seq[t_len:], range(len(vtree)), [], t_len, 1 + len(vtree))
            res["round_t"].append(time.perf_counter() - t0)
            t_time += res["round_t"][-1]
            greedy = p_logits.argmax(-1).tolist()
            path = vtree.longest_match(greedy)
            a = len(path)
            new_tokens = [vtree.tokens[i] for i in path] + [greedy[path[-1] + 1 if path else 0]]
            for i, tok in enumerate(new_tokens):
                if tok in eos:
                    new_tokens = new_tokens[: i + 1]
                    ended_by_eos = True
                    break
            seq.extend(new_tokens)

            # compaction: the context, then the kept path's nodes (target: all of them; drafter: those it fed)
            keep_slots(tcache, list(range(old_len)) + [old_len + i for i in path])
            t_len = old_len + a
            if cap > 0:
                slot = {j: old_len + k for k, j in enumerate(fed)}
                kept = []
                for i in path:
                    if old_ids[i] not in slot:
                        break
                    kept.append(slot[old_ids[i]])
                keep_slots(dcache, list(range(old_len)) + kept)
                d_len = old_len + len(kept)

            on_path = [-1] + [old_ids[i] for i in path]
            ranks = []
            for k, j in enumerate(on_path):
                if j not in rows:
                    break
                ranks.append(_rank(rows[j], greedy[path[k - 1] + 1] if k else greedy[0], width))
            pol.end_round(TreeOutcome(tree=vtree, path=tuple(path), path_ranks=tuple(ranks), drafter_forwards=forwards))
            res["accepted"].append(a)
            res["submitted"].append(len(vtree))
            res["drafted"].append(forwards)
            res["draft_tokens"].append(list(vtree.tokens))
            res["trees"].append(vtree)
            res["paths"].append(path)
            res["drafted_nodes"].append(len(tree))
            res["widths"].append(widths)
            res["round_w"].append(time.perf_counter() - round_start)
    wall = time.perf_counter() - start
    return TreeResult(
        tokens=torch.tensor(seq[prompt_len:], dtype=torch.long),
        target_forwards=len(res["accepted"]),
        drafter_forwards=sum(res["drafted"]),
        accepted=res["accepted"],
        submitted=res["submitted"],
        drafted=res["drafted"],
        policy=str(pol),
        criterion="greedy",
        timings=Timings(wall_s=wall, target_s=t_time, drafter_s=d_time),
        draft_tokens=res["draft_tokens"],
        round_target_s=res["round_t"],
        round_drafter_s=res["round_d"],
        round_wall_s=res["round_w"],
        ended_by_eos=ended_by_eos,
        trees=res["trees"],
        paths=res["paths"],
        drafted_nodes=res["drafted_nodes"],
        widths=res["widths"],
    )


def bf16_parting(tokens: Sequence[int], reference: Sequence[int], target: Any, prompt: Sequence[int],
                 dtype: str = "bfloat16") -> tuple[int, float] | None:
    """Where a tree run's ``tokens`` first part from the target's one-token greedy ``reference`` (both without the
    prompt), and the gap there between the target's two largest logits in ulps of ``dtype`` at the top logit
    (:func:`companion.certify.precision.ulp`), read from one teacher-forced forward over ``prompt + reference``;
    ``None`` when they agree. A lossless decoder parts only at a near tie: a gap of a few ulps."""
    from companion.certify.precision import ulp

    n = min(len(tokens), len(reference))
    t = next((i for i in range(n) if int(tokens[i]) != int(reference[i])), None)
    if t is None:
        return None if len(tokens) == len(reference) else (n, math.nan)
    ids = torch.tensor([list(prompt) + [int(x) for x in reference[:t]]], dtype=torch.long, device=target.device)
    with torch.inference_mode():
        row = target(input_ids=ids).logits[0, -1].float()
    top = row.topk(2).values.double().cpu().numpy()
    return t, float((top[0] - top[1]) / float(np.asarray(ulp(np.float64(top[0]), dtype))))
