"""Tree shapes as policies: which drafts the drafter expands in a round.

==================================  ============================================================================
spec                                shape
==================================  ============================================================================
``static:W1,W2,...``                the full tree: every node at depth ``d - 1`` (the root at 0) gets the drafter's
                                    top ``W_d`` tokens as children (``W1 + W1 W2 + ...`` nodes)
``spine:W1,W2,...``                 the drafter's greedy chain (the spine) with its top ``W_d`` tokens at depth
                                    ``d``: only the rank-1 child is expanded (``W1 + W2 + ...`` nodes);
                                    ``spine:1,1,1`` is the chain of three drafts
``dynamic:N[,D[,K]]``               EAGLE-2's dynamic tree from the drafter's ``q`` alone: per depth (at most
                                    ``D``, default 6) the ``K`` (default 4) nodes of highest path probability are
                                    expanded into their top ``K`` children; the ``N`` nodes of highest path
                                    probability among all drafted are verified
``certified[:knob=value,...]``      the spine with each depth's width and the depth set by the drafter-side
                                    ``tree:m`` certificates and the cost model (:class:`Certified`)
==================================  ============================================================================

The decoder drives a policy each round: ``start_round(depth_cap)``; then, from the root (depth 0),
``grow(tree, depth, expanded)`` names the children to add at ``depth + 1`` among each expanded
node's top ``max_width`` drafter tokens, and ``expand(tree, new)`` the new nodes to feed to the
drafter (one forward over them, tree-masked) for the next depth; an empty expansion ends the
drafting. ``verify_nodes(tree)`` names the nodes the target verifies (closed under parents; all
by default), and ``end_round(outcome)`` reports the verification.

A chain policy of :mod:`companion.speculative.policies` (``constant:K``, ``confidence:T``...) is not a
tree policy: chains are run by :func:`companion.speculative.generate`, the baseline
(:func:`~companion.speculative.tree.decoder.generate_tree` hands a chain spec to it).
"""
from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from companion.speculative.survival import pava
from companion.speculative.tree.scores import tree_scores
from companion.speculative.tree.shape import DraftTree


@dataclass(frozen=True)
class Expansion:
    """One expanded node's drafter distribution: ``node`` (-1: the root), its top ``max_width`` probabilities
    ``probs`` (float64, descending) and their ``ids``; ``logits`` the whole row when the policy ``needs_rows``, or
    instead ``scores`` its ``tree:m`` certificate scores already computed (a replay's recorded ones)."""

    node: int
    probs: Tensor
    ids: Tensor
    logits: Tensor | None = None
    scores: np.ndarray | None = None


@dataclass(frozen=True)
class TreeOutcome:
    """A round's verification: the verified ``tree``, the kept ``path`` (its nodes), ``path_ranks`` the rank of the
    target's greedy token in the drafter's distribution at the root and at each kept node that was expanded, in
    depth order (``max_width + 1`` standing for "not in the top ``max_width``"), ``drafter_forwards`` the round's
    drafter forwards."""

    tree: DraftTree
    path: tuple[int, ...]
    path_ranks: tuple[int, ...]
    drafter_forwards: int

    @property
    def accepted(self) -> int:
        """Draft tokens the target accepted this round: the kept path's length."""
        return len(self.path)


class TreePolicy(ABC):
    """A tree shape (see the module docstring)."""

    needs_rows: ClassVar[bool] = False

    @property
    @abstractmethod
    def max_width(self) -> int:
        """The most children any node may get (the decoder computes each expanded node's top that many)."""

    @property
    @abstractmethod
    def max_nodes(self) -> int:
        """The most nodes a verified tree may hold (the node budget)."""

    def start_round(self, depth_cap: int) -> None:
        """A new round: no node deeper than ``depth_cap`` (the length budget)."""
        self._cap = depth_cap

    @abstractmethod
    def grow(self, tree: DraftTree, depth: int, expanded: Sequence[Expansion]) -> list[tuple[int, int]]:
        """The children to add at ``depth + 1``: pairs ``(index into expanded, rank)``, rank 1 the top token."""

    @abstractmethod
    def expand(self, tree: DraftTree, new: Sequence[int]) -> list[int]:
        """Which of the nodes just added to feed to the drafter (their children come next)."""

    def verify_nodes(self, tree: DraftTree) -> list[int]:
        """The nodes the target verifies (closed under parents)."""
        return list(range(len(tree)))

    def end_round(self, outcome: TreeOutcome) -> None:
        """Feedback after verification."""


def _check_widths(spec: str, widths: Sequence[int]) -> tuple[int, ...]:
    if not widths or any(w < 1 for w in widths):
        raise ValueError(f"tree {spec!r}: every depth needs a width >= 1, got {list(widths)}")
    return tuple(int(w) for w in widths)


@dataclass
class Static(TreePolicy):
    """A fixed shape: ``widths[d - 1]`` children per expanded node at depth ``d``; ``spine`` expands only each
    depth's rank-1 child (the drafter's greedy chain), otherwise every node (the full tree)."""

    widths: tuple[int, ...]
    spine: bool = False

    def __post_init__(self) -> None:
        self.widths = _check_widths(str(self), self.widths)

    @property
    def max_width(self) -> int:
        return max(self.widths)

    @property
    def max_nodes(self) -> int:
        if self.spine:
            return sum(self.widths)
        total, layer = 0, 1
        for w in self.widths:
            layer *= w
            total += layer
        return total

    def grow(self, tree: DraftTree, depth: int, expanded: Sequence[Expansion]) -> list[tuple[int, int]]:
        if depth >= len(self.widths):
            return []
        return [(i, r) for i in range(len(expanded)) for r in range(1, self.widths[depth] + 1)]

    def expand(self, tree: DraftTree, new: Sequence[int]) -> list[int]:
        if not new or tree.depths[new[0]] >= len(self.widths):
            return []
        return [j for j in new if tree.ranks[j] == 1] if self.spine else list(new)

    def __str__(self) -> str:
        return ("spine:" if self.spine else "static:") + ",".join(str(w) for w in self.widths)


@dataclass
class Dynamic(TreePolicy):
    """EAGLE-2's context-aware dynamic tree (Li et al., *EAGLE-2: Faster Inference of Language Models with Dynamic
    Draft Trees*, arXiv:2406.16858), driven by the drafter's own probabilities only (no trained draft head).

    A node's value is its path probability under the drafter, ``prod q`` over its path (EAGLE-2's estimate of the
    probability that the target accepts the whole path). Expansion: at each depth (at most ``depth``) the ``top_k``
    nodes of the newest layer with the highest value are fed to the drafter, and each gets its ``top_k`` most likely
    tokens as children. Reranking: the ``nodes`` drafted nodes of highest value are verified (a child's value never
    exceeds its parent's, and ties go to the shallower and earlier node, so they form a tree).
    """

    nodes: int
    depth: int = 6
    top_k: int = 4

    def __post_init__(self) -> None:
        for name, lo in (("nodes", 1), ("depth", 1), ("top_k", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"dynamic tree: {name} must be an integer >= {lo}, got {v!r}")

    @property
    def max_width(self) -> int:
        return self.top_k

    @property
    def max_nodes(self) -> int:
        return self.nodes

    def grow(self, tree: DraftTree, depth: int, expanded: Sequence[Expansion]) -> list[tuple[int, int]]:
        if depth >= self.depth:
            return []
        return [(i, r) for i in range(len(expanded)) for r in range(1, self.top_k + 1)]

    def expand(self, tree: DraftTree, new: Sequence[int]) -> list[int]:
        if not new or tree.depths[new[0]] >= self.depth:
            return []
        best = sorted(new, key=lambda j: (-tree.logq[j], j))[: self.top_k]
        return sorted(best)

    def verify_nodes(self, tree: DraftTree) -> list[int]:
        order = sorted(range(len(tree)), key=lambda j: (-tree.logq[j], tree.depths[j], j))
        return sorted(order[: self.nodes])

    def __str__(self) -> str:
        return f"dynamic:{self.nodes},{self.depth},{self.top_k}"


class _Calibration:
    """``P(the target's token is within the drafter's top m | u)`` for a score ``u`` in ``[0, 1]``: the hit rate
    of verified (score, hit) pairs in the score's quantile bin (at most ``bins`` bins of at least 8 pairs, each
    with ``n0`` pseudo-pairs at ``prior``), made non-decreasing in ``u`` (pool adjacent violators)."""

    def __init__(self, bins: int, prior: float, n0: float) -> None:
        self.bins, self.prior, self.n0 = bins, prior, n0
        self.u: list[float] = []
        self.hit: list[float] = []
        self._table: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, u: float, hit: bool) -> None:
        self.u.append(float(u))
        self.hit.append(1.0 if hit else 0.0)
        if len(self.u) % 8 == 0:
            self._table = None

    def __call__(self, u: np.ndarray) -> np.ndarray:
        if self._table is None:
            x = np.asarray(self.u, dtype=float)
            y = np.asarray(self.hit, dtype=float)
            nb = max(1, min(self.bins, len(x) // 8))
            edges = np.unique(np.quantile(x, np.linspace(0, 1, nb + 1)[1:-1])) if nb > 1 else np.zeros(0)
            b = np.searchsorted(edges, x, side="right")
            n = np.bincount(b, minlength=len(edges) + 1).astype(float)
            acc = np.bincount(b, weights=y, minlength=len(edges) + 1)
            rates = (acc + self.n0 * self.prior) / (n + self.n0)
            self._table = (edges, np.array(pava(rates.tolist(), (n + self.n0).tolist())))
        edges, rates = self._table
        return rates[np.searchsorted(edges, np.asarray(u, dtype=float), side="right")]


_CERT_DEFAULTS: dict[str, Any] = {"nmax": 16, "dmax": 8, "wmax": 4, "c": 0.28, "v1": 1.0, "dv": 0.02,
                                  "prior": 0.8, "n0": 4.0, "bins": 16}


@dataclass
class Certified(TreePolicy):
    """Certificate-sized trees: the spine (the drafter's greedy chain), each depth as wide and the spine as deep as
    the drafter-side ``tree:m`` certificates and the cost model say pays.

    At a spine node with drafter distribution ``q`` the certificate ``rho_m(q)`` (:mod:`companion.drafter`,
    ``tree:m``) is the least ``KL(p || q)`` of a target whose greedy token lies outside ``q``'s top ``m``; its score
    ``u_m = 1 - exp(-rho_m)`` (``companion.speculative.tree.scores.tree_scores``) is calibrated online
    into ``s_m``, the probability that the target's token is within
    the top ``m`` (binned over every verified spine node and width, non-decreasing in ``u``, then in ``m``).
    With ``S`` the probability that the spine survives to the node (the product of the ``s_1`` above it), the
    ``m``-th child adds ``S (s_m - s_{m-1})`` expected accepted tokens and one verified node; it is added while that
    exceeds ``lam (V(n + 1) - V(n))``, ``n`` the nodes so far, ``V`` the verification cost over tree tokens (in
    one-token target forwards) and ``lam`` the running tokens per unit of modelled cost (the rate the round must
    beat, as in the chain rule's Dinkelbach form). The spine deepens while ``S s_1 s_bar > lam (c + V(n + 1) - V(n))``
    (``s_bar`` the calibrated mean of ``s_1``): the next depth's expected token pays for a drafter forward and a node.
    At most ``nmax`` nodes, ``dmax`` depths and ``wmax`` children per node.

    Knobs: ``nmax`` (16), ``dmax`` (8), ``wmax`` (4), ``c`` (0.28), ``v1`` (1.0) and ``dv`` (0.02) the affine
    ``V(n) = v1 + dv (n - 1)`` unless a measured ``verify`` table ``V(0) = 1, V(1), ...`` is given, ``prior``
    (0.8), ``n0`` (4), ``bins`` (16).
    """

    nmax: int = 16
    dmax: int = 8
    wmax: int = 4
    c: float = 0.28
    v1: float = 1.0
    dv: float = 0.02
    prior: float = 0.8
    n0: float = 4.0
    bins: int = 16
    verify: tuple[float, ...] = ()
    _tokens: float = field(default=0.0, repr=False)
    _cost: float = field(default=0.0, repr=False)

    needs_rows: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for name in ("nmax", "dmax", "wmax", "bins"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"certified tree: {name} must be an integer >= 1, got {v!r}")
        for name, lo in (("c", 0.0), ("v1", 0.0), ("dv", 0.0), ("n0", 0.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo:
                raise ValueError(f"certified tree: {name} must be a finite number >= {lo}, got {v!r}")
        if not 0.0 <= self.prior <= 1.0:
            raise ValueError(f"certified tree: prior must be in [0, 1], got {self.prior!r}")
        self.verify = tuple(float(v) for v in self.verify)
        if self.verify and (self.verify[0] != 1.0 or any(not (math.isfinite(v) and v > 0) for v in self.verify)):
            raise ValueError("certified tree: verify must be a table of finite numbers > 0 starting with V(0) = 1")
        self.cal = _Calibration(self.bins, self.prior, self.n0)
        self._spine_u: list[np.ndarray] = []
        self._S = 1.0
        self._s1 = 0.0

    @property
    def max_width(self) -> int:
        return self.wmax

    @property
    def max_nodes(self) -> int:
        return self.nmax

    def verify_cost(self, n: int) -> float:
        """``V(n)``: one forward over ``n`` tree tokens (plus the root), in one-token target forwards."""
        if n <= 0:
            return 1.0
        t = self.verify
        if not t:
            return self.v1 + self.dv * (n - 1)
        if n < len(t):
            return max(t[: n + 1])
        return max(t) + max(t[-1] - t[-2], 0.0) * (n - len(t) + 1) if len(t) > 1 else t[-1]

    @property
    def rate(self) -> float:
        """``lam``: tokens per unit of modelled cost over the rounds so far (``n0`` pseudo-rounds of plain decoding,
        one token at cost 1)."""
        return (self._tokens + self.n0) / (self._cost + self.n0)

    def start_round(self, depth_cap: int) -> None:
        super().start_round(depth_cap)
        self._spine_u = []
        self._S = 1.0
        self._n = 0

    def _scores(self, row: Tensor) -> np.ndarray:
        return tree_scores(row, self.wmax)

    def grow(self, tree: DraftTree, depth: int, expanded: Sequence[Expansion]) -> list[tuple[int, int]]:
        if not expanded or depth >= self.dmax or self._n >= self.nmax:
            return []
        e = expanded[0]
        if e.scores is not None:
            u = np.asarray(e.scores, dtype=float)[: self.wmax]
        elif e.logits is not None:
            u = self._scores(e.logits)
        else:
            raise ValueError("the certified tree needs the drafter's whole row (or its certificate scores) at each node")
        self._spine_u.append(u)
        s = np.maximum.accumulate(self.cal(u))
        lam = self.rate
        out = [(0, 1)]
        self._n += 1
        for m in range(2, len(u) + 1):
            if self._n >= self.nmax:
                break
            gain = self._S * (s[m - 1] - s[m - 2])
            if gain <= lam * (self.verify_cost(self._n + 1) - self.verify_cost(self._n)):
                break
            out.append((0, m))
            self._n += 1
        self._s1 = float(s[0])
        return out

    def expand(self, tree: DraftTree, new: Sequence[int]) -> list[int]:
        spine = [j for j in new if tree.ranks[j] == 1]
        if not spine or tree.depths[spine[0]] >= self.dmax or self._n >= self.nmax:
            return []
        self._S *= self._s1
        mean_s1 = (sum(self.cal.hit[::self.wmax]) + self.n0 * self.prior) / (len(self.cal.hit[::self.wmax]) + self.n0)
        step = self.c + self.verify_cost(self._n + 1) - self.verify_cost(self._n)
        return spine if self._S * mean_s1 > self.rate * step else []

    def end_round(self, outcome: TreeOutcome) -> None:
        # the spine's expanded nodes the target verified: the root's, then each kept spine node's
        for u, rank in zip(self._spine_u, outcome.path_ranks):
            for m in range(1, len(u) + 1):
                self.cal.add(float(u[m - 1]), rank <= m)
            if len(u) < self.wmax:   # a tiny vocabulary: pad so that every node adds wmax pairs
                for _ in range(self.wmax - len(u)):
                    self.cal.add(1.0, True)
        self._tokens += outcome.accepted + 1
        self._cost += self.verify_cost(len(outcome.tree)) + self.c * outcome.drafter_forwards

    def __str__(self) -> str:
        # floats to 4 significant digits: a label (a measured c would otherwise print 16 digits)
        knobs = [f"{k}={getattr(self, k):.4g}" for k, v in _CERT_DEFAULTS.items() if getattr(self, k) != v]
        return "certified" + (":" + ",".join(knobs) if knobs else "")


TREE_FORMS = ("static:W1,W2,...", "spine:W1,W2,...", "dynamic:N[,D[,K]]", "certified[:knob=value,...]")
"""The accepted tree policy specs."""


def _ints(spec: str, body: str) -> list[int]:
    parts = body.split(",")
    if not body or any(not re.fullmatch(r"\s*[0-9]+\s*", p) for p in parts):
        raise ValueError(f"tree policy {spec!r}: expected comma-separated integers, got {body!r}")
    return [int(p) for p in parts]


def is_tree_spec(spec: Any) -> bool:
    """Whether ``spec`` names a tree shape (a :class:`TreePolicy` or a spec of :data:`TREE_FORMS`)."""
    if isinstance(spec, TreePolicy):
        return True
    return isinstance(spec, str) and spec.strip().partition(":")[0] in ("static", "spine", "dynamic", "certified")


def parse_tree_policy(spec: str | TreePolicy, **defaults: Any) -> TreePolicy:
    """A tree policy from its spec (:data:`TREE_FORMS`); a :class:`TreePolicy` is returned unchanged. ``defaults``
    set the certified policy's knobs (e.g. ``c`` and a measured ``verify`` table); knobs in the spec win."""
    if isinstance(spec, TreePolicy):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"tree policy spec must be a string, got {type(spec).__name__}; expected one of: "
                         f"{', '.join(TREE_FORMS)}")
    s = spec.strip()
    name, has, body = s.partition(":")
    if name in ("static", "spine") and has:
        return Static(tuple(_ints(spec, body)), spine=name == "spine")
    if name == "dynamic" and has:
        vals = _ints(spec, body)
        if len(vals) > 3:
            raise ValueError(f"tree policy {spec!r}: expected dynamic:N[,D[,K]]")
        return Dynamic(*vals)
    if name == "certified":
        unknown = set(defaults) - set(_CERT_DEFAULTS) - {"verify"}
        if unknown:
            raise ValueError(f"unknown certified-tree defaults {sorted(unknown)}; knobs: {', '.join(_CERT_DEFAULTS)}, verify")
        values = {**_CERT_DEFAULTS, **defaults}
        for item in (body.split(",") if has and body else []):
            key, sep, text = (x.strip() for x in item.partition("="))
            if not sep or key not in _CERT_DEFAULTS:
                raise ValueError(f"tree policy {spec!r}: {item!r} is not a knob=value pair; knobs: {', '.join(_CERT_DEFAULTS)}")
            try:
                values[key] = int(text) if isinstance(_CERT_DEFAULTS[key], int) else float(text)
            except ValueError:
                raise ValueError(f"tree policy {spec!r}: {key} must be a number, got {text!r}") from None
        return Certified(**values)
    raise ValueError(f"malformed tree policy spec {spec!r}; expected one of: {', '.join(TREE_FORMS)}")
