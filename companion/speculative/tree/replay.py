"""Tree rounds replayed from a recording, without the target.

Under greedy verification the target's tokens are its greedy text, whatever was drafted, so a round that
starts at text position ``s`` keeps the text's path as deep as the text's token is among the expanded children
at each depth: with ``R_t`` the rank of text token ``t`` in the drafter's distribution teacher-forced on the text
(:attr:`RecordedTreeText.ranks`), a tree of rank paths ``T`` accepts ``max { d : (R_s, .., R_{s+d-1}) in T }``.
That decides every round of a shape fixed in advance (``static``, ``spine``), and of any shape whose choices
along the text's path read only the drafter's distributions *on* that path.

Where a shape needs more than that, and what the recording keeps for it:

* the cost of a round (its nodes and drafter forwards) also depends on the nodes *off* the text's path once the
  text leaves the drafter's greedy chain; the ``certified`` spine sizes each depth from the certificates at the
  drafter's greedy chain, so the recording keeps, for every position, that chain's distributions (top ids and
  probabilities and the ``tree:m`` certificate scores, :attr:`RecordedTreeText.chains`), and the replay drives the
  policy object itself through them (its online calibration included);
* the ``dynamic`` tree ranks every drafted node by its drafter path probability, siblings off the text's path
  included, so which nodes it expands and verifies depends on the drafter's distributions at nodes the text never
  visits: the recording keeps, for every position, the tree the drafter drafts there under that policy
  (:attr:`RecordedTreeText.trees`; stateless policies only).

:func:`record_tree_text` records; :func:`replay_tree` replays a policy and returns its rounds, which
:meth:`~companion.speculative.tree.costs.TreeCostModel.speedup` prices. The prompt's prefill is not counted: the
first round's drafter forward is priced as one token, as in every later round that kept its drafter cache.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from transformers import DynamicCache

from companion.speculative.decoder import _check_model, _forward, _prompt_ids
from companion.speculative.tree.costs import TreeCostModel
from companion.speculative.tree.decoder import _top, draft_round
from companion.speculative.tree.policies import (
    Certified,
    Dynamic,
    Expansion,
    Static,
    TreeOutcome,
    TreePolicy,
    parse_tree_policy,
)
from companion.speculative.tree.model import check_rank_paths
from companion.speculative.tree.scores import tree_scores
from companion.speculative.tree.shape import DraftTree


@dataclass(frozen=True)
class ChainNode:
    """The drafter's distribution at one node of its greedy chain: top ``ids`` and ``probs`` (descending) and the
    scores ``u_m = 1 - exp(-rho_m)`` of its ``tree:m`` certificates, ``m = 1 .. len(scores)``."""

    ids: tuple[int, ...]
    probs: tuple[float, ...]
    scores: tuple[float, ...]


@dataclass(frozen=True)
class RecordedTreeText:
    """One prompt recorded for tree replays (see the module docstring): the target's greedy ``tokens``, the
    teacher-forced drafter ``ranks`` of each (``width + 1``: beyond the top ``width``), ``chains[s]`` the drafter's
    greedy chain from position ``s`` (at most ``depth`` nodes and the round's depth budget), and ``trees[spec][s]``
    the tree (verified nodes), the drafter forward widths and the verified nodes the drafter was fed, as a
    stateless policy drafts them at ``s``."""

    tokens: tuple[int, ...]
    ranks: tuple[int, ...]
    width: int
    max_new_tokens: int
    chains: tuple[tuple[ChainNode, ...], ...] = ()
    trees: dict[str, tuple[tuple[DraftTree, tuple[int, ...], frozenset[int]], ...]] = field(default_factory=dict)

    def cap(self, s: int) -> int:
        """The deepest node a round at ``s`` may draft (the length budget)."""
        return self.max_new_tokens - s - 1


@dataclass(frozen=True)
class TreeReplay:
    """A policy's replayed rounds: ``accepted`` path lengths, verified ``nodes``, drafter forward ``widths``."""

    policy: str
    accepted: tuple[int, ...]
    nodes: tuple[int, ...]
    widths: tuple[tuple[int, ...], ...]

    def speedup(self, costs: TreeCostModel) -> float:
        return costs.speedup(self.accepted, self.nodes, self.widths)

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else math.nan


def _nodes(rows: Tensor, width: int) -> tuple[ChainNode, ...]:
    probs, ids = _top(rows, width)
    scores = tree_scores(rows, width)
    return tuple(ChainNode(tuple(int(i) for i in ids[k]), tuple(float(p) for p in probs[k]),
                           tuple(float(u) for u in scores[k])) for k in range(len(rows)))


def record_tree_text(target: Any, drafter: Any, input_ids: Tensor | Sequence[int], *, max_new_tokens: int,
                     width: int = 4, depth: int = 8, trees: Iterable[str | TreePolicy] = ()) -> RecordedTreeText:
    """Record one prompt (no end-of-sequence stop): the target's greedy text, the drafter's teacher-forced ranks,
    its greedy chain of ``depth`` nodes from every position, and the trees of the stateless policies ``trees``."""
    seq = _prompt_ids(input_ids)
    vocab = _check_model(drafter, "drafter")
    if width >= vocab:
        raise ValueError(f"width {width} must be below the vocabulary size {vocab}")
    with torch.inference_mode():
        ids = torch.tensor([seq], dtype=torch.long, device=target.device)
        config = copy.deepcopy(target.generation_config)
        config.do_sample, config.max_new_tokens, config.eos_token_id = False, max_new_tokens, None
        config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
        text = target.generate(ids, generation_config=config)[0, len(seq):].tolist()
        full = torch.tensor([seq + text], dtype=torch.long, device=drafter.device)
        rows = drafter(input_ids=full).logits[0, len(seq) - 1:len(seq) - 1 + len(text)].float()
        _, top = _top(rows, width)
        ranks = []
        for t, tok in enumerate(text):
            hit = (top[t] == tok).nonzero()
            ranks.append(int(hit[0, 0]) + 1 if len(hit) else width + 1)
        chains = []
        cache = DynamicCache()
        cached = 0
        for s in range(len(text)):
            ctx = seq + text[:s]
            chain_rows: list[Tensor] = []
            for d in range(min(depth, max_new_tokens - s - 1)):
                if d:
                    row = _forward(drafter, [int(chain_rows[-1].argmax())], cache, 1)[0]
                else:
                    row = _forward(drafter, ctx[cached:], cache, 1)[0]
                    cached = len(ctx)
                chain_rows.append(row)
            cache.crop(cached)
            chains.append(_nodes(torch.stack(chain_rows), width) if chain_rows else ())
        recorded: dict[str, tuple[tuple[DraftTree, tuple[int, ...], frozenset[int]], ...]] = {}
        for spec in trees:
            pol = parse_tree_policy(spec)
            if isinstance(pol, Certified):
                raise ValueError("the certified policy learns online; replay it through the chains, not recorded trees")
            per: list[tuple[DraftTree, tuple[int, ...], frozenset[int]]] = []
            cache, cached = DynamicCache(), 0
            for s in range(len(text)):
                ctx = seq + text[:s]
                cap = max_new_tokens - s - 1
                if cap <= 0:
                    per.append((DraftTree(), (), frozenset()))
                    continue
                pol.start_round(cap)
                drafted = draft_round(drafter, cache, ctx, cached, pol, cap, frozenset())
                cached = len(ctx)
                cache.crop(cached)
                vtree, old = drafted.tree.subtree(pol.verify_nodes(drafted.tree))
                fed = set(drafted.fed)
                per.append((vtree, tuple(drafted.widths), frozenset(k for k, o in enumerate(old) if o in fed)))
            recorded[str(pol)] = tuple(per)
    return RecordedTreeText(tuple(text), tuple(ranks), width, max_new_tokens, tuple(chains), recorded)


def _walk(tree: DraftTree, text: Sequence[int], s: int) -> list[int]:
    greedy = [text[s + d] if s + d < len(text) else -1 for d in range(tree.depth + 1)]
    # the target's greedy token after a node of depth d on the text's path is text[s + d]
    at = [greedy[0]] + [greedy[tree.depths[i]] for i in range(len(tree))]
    return tree.longest_match(at)


def _fed_after(path: Sequence[int], fed: set[int]) -> int:
    b = 0
    for i in path:
        if i not in fed:
            break
        b += 1
    return b


def replay_tree(rec: RecordedTreeText, policy: str | TreePolicy) -> TreeReplay:
    """Replay ``policy`` on ``rec`` (see the module docstring for which shapes need which records)."""
    pol = parse_tree_policy(policy)
    if pol.max_width > rec.width:
        raise ValueError(f"policy {pol} reads the top {pol.max_width} drafter tokens; the recording kept {rec.width}")
    text, n = rec.tokens, len(rec.tokens)
    acc: list[int] = []
    nodes: list[int] = []
    widths: list[tuple[int, ...]] = []
    s = 0
    lag = 1   # tokens the drafter has not cached at the round's start (the prefill priced as one token)
    while s < n:
        cap = rec.cap(s)
        if isinstance(pol, Static) and not pol.spine:
            tree, fed, w = _static_round(pol, cap)
            path = _rank_walk(tree, rec.ranks, s)
        elif isinstance(pol, Dynamic):
            if str(pol) not in rec.trees:
                raise ValueError(f"policy {pol} expands nodes off the text's path by their drafter probabilities; record "
                                 f"its trees first (record_tree_text(..., trees=['{pol}']))")
            tree, w, fed_nodes = rec.trees[str(pol)][s]
            fed = set(fed_nodes)
            path = _walk(tree, text, s)
        else:
            tree, fed, w = _chain_round(pol, rec, s, cap, lag)
            path = _walk(tree, text, s)
        if cap <= 0:
            tree, fed, w, path = DraftTree(), set(), (), []
        a = len(path)
        if w:
            w = (lag,) + tuple(w[1:])
        acc.append(a)
        nodes.append(len(tree))
        widths.append(tuple(w))
        b = _fed_after(path, fed)
        lag = (a + 1 - b) if w else lag + a + 1
        s += a + 1
    return TreeReplay(str(pol), tuple(acc), tuple(nodes), tuple(widths))


def _static_round(pol: Static, cap: int) -> tuple[DraftTree, set[int], tuple[int, ...]]:
    tree = DraftTree()
    layer = [-1]
    w = [1]
    for d, width in enumerate(pol.widths[: max(cap, 0)]):
        new = [tree.add(p, 0, r, 0.0) for p in layer for r in range(1, width + 1)]
        if d + 1 < min(len(pol.widths), cap):
            layer = new
            w.append(len(new))
    fed = {i for i in range(len(tree)) if tree.depths[i] < min(len(pol.widths), cap)}
    return tree, fed, tuple(w)


def _rank_walk(tree: DraftTree, ranks: Sequence[int], s: int) -> list[int]:
    at_rank: dict[tuple[int, int], int] = {(p, r): i for i, (p, r) in enumerate(zip(tree.parents, tree.ranks))}
    out, cur = [], -1
    while s + len(out) < len(ranks):
        nxt = at_rank.get((cur, ranks[s + len(out)]))
        if nxt is None:
            break
        out.append(nxt)
        cur = nxt
    return out


def _chain_round(pol: TreePolicy, rec: RecordedTreeText, s: int, cap: int,
                 lag: int) -> tuple[DraftTree, set[int], tuple[int, ...]]:
    chain = rec.chains[s] if s < len(rec.chains) else ()
    pol.start_round(cap)
    tree = DraftTree()
    fed: set[int] = set()
    w = [lag]
    if cap <= 0 or not chain:
        return tree, fed, ()

    def expansion(node: int, depth: int) -> Expansion:
        c = chain[depth]
        probs = torch.tensor(c.probs, dtype=torch.float64)
        return Expansion(node, probs, torch.tensor(c.ids), None, scores=np.asarray(c.scores))

    expanded = [expansion(-1, 0)]
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
        feed = pol.expand(tree, new)
        if not feed:
            break
        if any(tree.ranks[j] != 1 or (tree.parents[j] >= 0 and tree.parents[j] not in fed) for j in feed) \
                or len(feed) != 1 or depth >= len(chain):
            raise ValueError(f"policy {pol} expands nodes off the drafter's greedy chain (or deeper than recorded); "
                             "a replay through the chains covers spine-shaped trees only")
        fed.add(feed[0])
        w.append(1)
        expanded = [expansion(feed[0], depth)]
    vtree, old = tree.subtree(pol.verify_nodes(tree))
    fed_new = {k for k, o in enumerate(old) if o in fed}
    # the outcome the live decoder reports: the text's ranks at the expanded nodes on the kept path
    path = _walk(vtree, rec.tokens, s)
    ranks = []
    on_path = [-1] + [old[i] for i in path]
    for k, j in enumerate(on_path):
        if j >= 0 and j not in fed:
            break
        ranks.append(rec.ranks[s + k] if s + k < len(rec.ranks) else rec.width + 1)
    pol.end_round(TreeOutcome(tree=vtree, path=tuple(path), path_ranks=tuple(ranks), drafter_forwards=len(w)))
    return vtree, fed_new, tuple(w)


def replay_ranks(ranks: Sequence[int], paths: Iterable[Sequence[int]], name: str = "") -> TreeReplay:
    """A fixed tree of rank paths (:mod:`companion.speculative.tree.model`) replayed along one text from its
    teacher-forced drafter ranks alone (``ranks[t]``: the rank of text token ``t``; any rank the tree lacks ends a
    path): every round at ``s`` accepts ``max { d : (R_s, .., R_{s+d-1}) in T }`` (no node deeper than the text's
    end), emits that plus one token, and is priced with its drafter forwards as :func:`replay_tree` prices them
    (the nodes that have children are fed, depth by depth; the tokens of the kept path the drafter was not fed
    are its next round's first forward)."""
    tree = check_rank_paths(paths)
    members = set(tree)
    parents = {p[:-1] for p in tree if len(p) > 1}
    per_depth = {d: sum(1 for p in parents if len(p) == d) for d in {len(p) for p in parents}}
    acc: list[int] = []
    nodes: list[int] = []
    widths: list[tuple[int, ...]] = []
    n, s, lag = len(ranks), 0, 1
    while s < n:
        cap = n - s - 1
        if cap <= 0:   # the text's last token: nothing left to draft, the target emits it
            acc.append(0)
            nodes.append(0)
            widths.append(())
            lag += 1
            s += 1
            continue
        kept = [p for p in tree if len(p) <= cap]
        a = 0
        while a < cap and tuple(ranks[s:s + a + 1]) in members:
            a += 1
        w = (lag,) + tuple(per_depth[d] for d in sorted(per_depth) if d < cap)
        b = 0
        while b < a and tuple(ranks[s:s + b + 1]) in parents and b + 1 < cap:
            b += 1
        acc.append(a)
        nodes.append(len(kept))
        widths.append(w)
        lag = a + 1 - b
        s += a + 1
    return TreeReplay(name or f"{len(tree)} nodes", tuple(acc), tuple(nodes), tuple(widths))
