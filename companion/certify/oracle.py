"""A brute-force reference for the certificates, for small vocabularies (tests and chapters).

It uses none of the structure the fast engine relies on (pooling, monotonicity, the sorted
scan): for every rejected token ``y`` it minimises ``D(p, q)`` over ``q = softmax(theta)``
subject to the linear constraints ``theta_y >= theta_z`` with scipy's SLSQP from several
starts, and takes the minimum over ``y``. Thresholds are recomputed here in NumPy from the
criterion's parameters, again independently of the engine. Cost grows like ``V`` solves of a
``V``-dimensional problem: keep ``V`` small (<= 10).

Ties. ``ties="level-set"`` is the threshold rule read as a level set (:func:`rejected_tokens`' default, as the
criteria's own ``rejection_mask``); ``ties="worst"`` (the default of
:func:`brute_force_certificate`, as of the engine's certificates) is the worst case over
tie-breaks, found without the engine's ``tau_worst`` formulas: a token is worst-case rejected
when the threshold rule read as a level set rejects it, or when its rank condition (strict greedy: the top place;
``topm:M`` and ``topk-delta:K,D``: the top ``M`` or ``K``) fails under the perturbation of ``p``
most unfavourable to it (:func:`perturbed_against`: ``p_y`` lowered and every other probability
raised by a relative ``1e-9``, far below every gap that is not an exact tie, which breaks every
tie against ``y`` and nothing else). A token exactly at a threshold (``p_y = p(1) - D``,
``p_y = A p(1)``) is accepted, as the decoders' ``p_y >= tau`` accepts it: no tie-break is
involved there. Worst-case trees take every maximiser of ``p`` as the decoder's token and every
other token as a competitor.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import minimize

from companion.certify.criteria import (
    AdditiveRelaxed,
    Criterion,
    MultiplicativeRelaxed,
    StrictGreedy,
    TopKDelta,
    TopM,
    Typical,
    check_ties,
    parse_criterion,
)


def _softmax(theta: np.ndarray) -> np.ndarray:
    z = np.exp(theta - theta.max())
    return z / z.sum()


def _objective(p: np.ndarray, divergence: str):
    logp = np.log(np.where(p > 0, p, 1.0))

    def forward(theta: np.ndarray) -> tuple[float, np.ndarray]:
        q = _softmax(theta)
        lse = theta.max() + math.log(np.exp(theta - theta.max()).sum())
        value = float(np.sum(p * (logp - theta)) + lse)
        return value, q - p

    def reverse(theta: np.ndarray) -> tuple[float, np.ndarray]:
        shift = theta.max()
        logq = theta - shift - math.log(np.exp(theta - shift).sum())
        q = np.exp(logq)
        g = logq - logp
        value = float(np.sum(q * g))
        return value, q * (g - value)

    if divergence == "forward":
        return forward
    if divergence == "reverse":
        if np.any(p <= 0):
            raise ValueError("the reverse-KL oracle needs p > 0 everywhere")
        return reverse
    raise ValueError(f"unknown divergence {divergence!r}")


def _solve(p: np.ndarray, divergence: str, pairs: list[tuple[int, int]], restarts: int, rng: np.random.Generator) -> float:
    """min D(p, softmax(theta)) s.t. theta_hi >= theta_lo for each (hi, lo) in pairs."""
    fun = _objective(p, divergence)
    v = len(p)
    a = np.zeros((len(pairs), v))
    for row, (hi, lo) in enumerate(pairs):
        a[row, hi], a[row, lo] = 1.0, -1.0
    constraints = [{"type": "ineq", "fun": lambda t: a @ t, "jac": lambda t: a}]
    # Starts: uniform q, q = p itself (feasible or not), then perturbations of p. Tiny entries
    # of p sit at theta ~ log p far from 0, which SLSQP reaches slowly from the uniform start.
    base = np.log(np.clip(p, 1e-300, None))
    starts = [np.zeros(v), base] + [base + rng.normal(scale=1.0, size=v) for _ in range(max(restarts - 2, 0))]
    best = math.inf
    for theta0 in starts:
        res = minimize(fun, theta0, jac=True, method="SLSQP", constraints=constraints,
                       options={"ftol": 1e-15, "maxiter": 1000})
        if np.all(a @ res.x >= -1e-9):
            best = min(best, float(res.fun))
    return best


def _entropy(p: np.ndarray) -> float:
    nz = p[p > 0]
    return float(-(nz * np.log(nz)).sum())


def perturbed_against(p: np.ndarray, y: int, rel: float = 1e-9) -> np.ndarray:
    """``p`` with ``p_y`` lowered and every other entry raised by a relative ``rel`` (plus 1e-300
    absolute, so that zeros move too), renormalised: ``q = p (1 + rel d) + 1e-300 d``, ``d_y = -1``,
    ``d_z = +1`` otherwise, then ``q / sum q``."""
    p = np.asarray(p, dtype=np.float64)
    d = np.ones(len(p))
    d[y] = -1.0
    q = p * (1 + rel * d) + 1e-300 * d
    return q / q.sum()


def rejected_tokens(p: np.ndarray, criterion: Criterion | str, ties: str = "level-set",
                    rel: float = 1e-9) -> np.ndarray:
    """Indices of the rejection region, computed in NumPy from the criterion's definition.

    ``ties="level-set"`` (default): ``{y : p_y < tau(p)}`` (``<=`` for typical acceptance), ``tau``
    recomputed here. ``"worst"``: those, and the tokens whose rank condition fails under
    ``perturbed_against(p, y, rel)`` (more than ``m - 1`` tokens strictly above ``y`` there, for
    the criterion's rank limit ``m``): the tokens some tie-break rejects (module docstring).
    """
    level = _level_set_rejected(p, criterion)
    if check_ties(ties) == "worst":
        p = np.asarray(p, dtype=np.float64)
        m = _rank_limit(parse_criterion(criterion))
        out = set(level.tolist())
        if m is not None:
            for y in range(len(p)):
                moved = perturbed_against(p, y, rel)
                if int((moved > moved[y]).sum()) >= m:
                    out.add(y)
        return np.array(sorted(out), dtype=np.int64)
    return level


def _rank_limit(c: Criterion) -> int | None:
    """The rank condition's ``m`` (``y`` among the top ``m``), from the criterion's parameters."""
    if isinstance(c, StrictGreedy):
        return 1
    if isinstance(c, TopM):
        return c.m
    if isinstance(c, TopKDelta):
        return c.k
    return None


def _level_set_rejected(p: np.ndarray, criterion: Criterion | str) -> np.ndarray:
    """``{y : p_y < tau(p)}`` (``<=`` for typical), ``tau`` from the criterion's parameters."""
    c = parse_criterion(criterion)
    s = np.sort(p)[::-1]
    if isinstance(c, StrictGreedy):
        tau = s[0]
    elif isinstance(c, AdditiveRelaxed):
        tau = s[0] - c.delta
    elif isinstance(c, MultiplicativeRelaxed):
        tau = c.alpha * s[0]
    elif isinstance(c, TopM):
        tau = s[c.m - 1]
    elif isinstance(c, TopKDelta):
        tau = max(s[c.k - 1], s[0] - c.delta)
    elif isinstance(c, Typical):
        tau = min(c.eps, c.delta * math.exp(-_entropy(p)))
        return np.nonzero(p <= tau)[0]
    else:
        raise TypeError(f"no oracle for {type(c).__name__}")
    return np.nonzero(p < tau)[0]


def brute_force_cost(p: np.ndarray, y: int, divergence: str = "forward", restarts: int = 3, seed: int = 0) -> float:
    """``min { D(p, q) : q_y >= q_z for all z }`` by SLSQP."""
    p = np.asarray(p, dtype=np.float64)
    rng = np.random.default_rng(seed)
    pairs = [(y, z) for z in range(len(p)) if z != y]
    return _solve(p, divergence, pairs, restarts, rng)


def brute_force_certificate(p: np.ndarray, criterion: Criterion | str, divergence: str = "forward",
                            restarts: int = 3, seed: int = 0, ties: str = "worst") -> float:
    """``min over rejected y`` of :func:`brute_force_cost`; ``inf`` when nothing is rejected.

    ``ties``: whose rejection region (:func:`rejected_tokens`): ``"worst"`` (default, as the
    engine's certificates) or ``"level-set"``; the cost of each token is the same either way."""
    p = np.asarray(p, dtype=np.float64)
    rejected = rejected_tokens(p, criterion, ties)
    return min((brute_force_cost(p, int(y), divergence, restarts, seed) for y in rejected), default=math.inf)


def brute_force_tree_certificate(p: np.ndarray, m: int, divergence: str = "forward",
                                 restarts: int = 3, seed: int = 0, ties: str = "level-set") -> float:
    """The width-``m`` tree certificate by enumeration of every competitor set.

    ``ties="level-set"`` (default here, unlike the engine's ``tree_certificate``: callers read it
    as the level-set reference): min over every set ``S`` of ``m`` non-maximisers of ``p`` of
    ``min { D(p, q) : q_z >= q_g for z in S and every maximiser g of p }``: the drafter's top
    ``m``, ties broken against us, then holds no maximiser of ``p``; ``inf`` when fewer than ``m``
    tokens are not maximisers. ``"worst"``: min over every maximiser ``g`` of ``p`` (the decoder's
    token under some tie-break) and every set ``S`` of ``m`` tokens other than ``g`` of
    ``min { D(p, q) : q_z >= q_g for z in S }``; ``inf`` when ``m >= V``."""
    p = np.asarray(p, dtype=np.float64)
    maximisers = np.nonzero(p == p.max())[0]
    rng = np.random.default_rng(seed)
    if check_ties(ties) == "worst":
        best = math.inf
        for g in maximisers:
            others = [z for z in range(len(p)) if z != g]
            for subset in itertools.combinations(others, m):
                best = min(best, _solve(p, divergence, [(z, int(g)) for z in subset], restarts, rng))
        return best
    others = [z for z in range(len(p)) if p[z] != p.max()]
    return min((_solve(p, divergence, [(z, int(g)) for z in subset for g in maximisers], restarts, rng)
                for subset in itertools.combinations(others, m)), default=math.inf)


# ---------------------------------------------------------------------------------------------
# Drafter side: min KL(p || q) over the target p, directly on the simplex.

_D_LB = 1e-16


def _d_kl_and_grad(q: np.ndarray):
    log_q = np.log(q)

    def fun(p: np.ndarray) -> tuple[float, np.ndarray]:
        p = np.clip(p, _D_LB, None)
        return float(np.sum(p * (np.log(p) - log_q))), np.log(p) - log_q + 1

    return fun


def _d_linear(vec: np.ndarray, const: float) -> dict:
    """The constraint ``vec . p + const >= 0``."""
    return {"type": "ineq", "fun": lambda p: float(vec @ p + const), "jac": lambda p: vec}


def _d_solve(q: np.ndarray, cons: list[dict], starts: list[np.ndarray]) -> float:
    fun = _d_kl_and_grad(q)
    v = len(q)
    every = [{"type": "eq", "fun": lambda p: p.sum() - 1, "jac": lambda p: np.ones(v)}] + cons
    best = math.inf
    for p0 in starts:
        res = minimize(fun, p0, jac=True, method="SLSQP", bounds=[(_D_LB, 1.0)] * v, constraints=every,
                       options={"ftol": 1e-16, "maxiter": 2000})
        if abs(res.x.sum() - 1) < 1e-9 and all(c["fun"](res.x) >= -1e-10 for c in cons):
            best = min(best, fun(res.x)[0])
    return best


def brute_force_drafter_certificate(q: np.ndarray, spec: str, seed: int = 0) -> float:
    """``rho~_c(q) = min KL(p||q)`` over the closure of the targets ``p`` under which ``c`` rejects ``argmax q``.

    A reference for :mod:`companion.drafter.certificates`, written from each criterion's definition and
    nothing else: one SLSQP problem (several starts) per branch of the rejection region: every
    competitor ``z`` (greedy, relaxed), every set of ``m`` competitors (top-m), every token
    outside the drafter's top ``m`` (``tree:M``), typical acceptance's two conditions together.
    ``argmax q`` is the top of a stable sort (callers avoid ties where they matter). ``spec``
    is a criterion spec or ``tree:M``. Keep ``V`` small (<= 8).
    """
    q = np.asarray(q, dtype=np.float64)
    rng = np.random.default_rng(seed)
    v = len(q)
    order = np.argsort(-q, kind="stable")
    d = int(order[0])
    others = [z for z in range(v) if z != d]
    eye = np.eye(v)
    base = [q.copy(), np.full(v, 1.0 / v)] + [rng.dirichlet(np.ones(v)) for _ in range(3)]

    def toward(z: int, w: float) -> np.ndarray:
        return w * eye[z] + (1 - w) * q

    kind, _, arg = spec.partition(":")
    branches: list[tuple[list[dict], list[np.ndarray]]] = []
    if kind == "greedy":
        branches = [([_d_linear(eye[z] - eye[d], 0.0)], [toward(z, 0.5)]) for z in others]
    elif kind == "multiplicative":
        a = float(arg)
        branches = [([_d_linear(a * eye[z] - eye[d], 0.0)], [toward(z, 0.7)]) for z in others]
    elif kind == "additive":
        delta = float(arg)
        if delta >= 1:
            return math.inf
        branches = [([_d_linear(eye[z] - eye[d], -delta)], [toward(z, min(0.999, 0.5 + delta))]) for z in others]
    elif kind == "topm":
        m = int(arg)
        for group in itertools.combinations(others, m):
            branches.append(([_d_linear(eye[z] - eye[d], 0.0) for z in group],
                             [0.9 * sum(eye[z] for z in group) / m + 0.1 * q]))
    elif kind == "tree":
        m = int(arg)
        tree = [int(i) for i in order[:m]]
        for y in (int(i) for i in order[m:]):
            branches.append(([_d_linear(eye[y] - eye[z], 0.0) for z in tree], [toward(y, 0.7)]))
    elif kind == "topk-delta":
        k, delta = arg.split(",")
        best = brute_force_drafter_certificate(q, f"additive:{delta}", seed)
        return min(best, brute_force_drafter_certificate(q, f"topm:{k}", seed)) if int(k) < v else best
    elif kind == "typical":
        eps, delta = (float(x) for x in arg.split(","))

        def entropy_cap(p: np.ndarray) -> float:  # log delta - log p_d - H(p) >= 0
            p = np.clip(p, _D_LB, None)
            return math.log(delta) - math.log(p[d]) + float(np.sum(p * np.log(p)))

        def entropy_cap_jac(p: np.ndarray) -> np.ndarray:
            p = np.clip(p, _D_LB, None)
            jac = np.log(p) + 1
            jac[d] -= 1 / p[d]
            return jac

        cons = [{"type": "ineq", "fun": entropy_cap, "jac": entropy_cap_jac}, _d_linear(-eye[d], eps)]
        starts = [toward(z, w) for z in others for w in (0.6, 0.9, 0.99)] + [toward(d, 0.999)]
        base += [rng.dirichlet(np.ones(v)) for _ in range(3)]
        # The point mass on d (p_d = 1, H = 0) is rejected iff 1 <= min(eps, delta): with
        # eps = delta = 1 an isolated point of the region, which a local solver finds or misses
        # by chance (by machine), so it is counted here explicitly, never left to SLSQP.
        point = -math.log(q[d]) if eps >= 1 and delta >= 1 else math.inf
        return min(point, _d_solve(q, cons, base + starts))
    else:
        raise ValueError(spec)
    return min(_d_solve(q, cons, base + extra) for cons, extra in branches)


def exhaustive_drafter_typical(q: np.ndarray, eps: float, delta: float, grid: int = 4001) -> np.ndarray:
    """``min KL(p||q)`` over the targets ``p`` under which ``typical:eps,delta`` rejects ``d = argmax q``,
    for ``V = 3`` by exhaustive search: a reference for the drafter-side typical certificate.

    ``q``: ``[3]`` or ``[N, 3]``; returns a float64 array of shape ``q.shape[:-1]``.
    ``p = (s, (1 - s) a, (1 - s)(1 - a))`` (``d`` first). The rejection condition
    ``s <= min(eps, delta e^-H(p))`` reads ``h2(a) <= c(s) = (log delta - log s - h2(s)) / (1 - s)``
    in the binary entropy ``h2``: ``a`` lies outside ``(a_c, 1 - a_c)``, ``a_c = h2^-1(c)`` (bisection),
    and ``KL(p||q)`` is convex in ``a``, so the best ``a`` is ``q``'s own split when allowed, else
    the better of ``a_c`` and ``1 - a_c``. ``s`` runs over ``grid`` points (even in ``logit s`` over
    ``[-40, 40]``, plus ``eps`` and the ends ``0`` and ``1``: ``s = 1`` is the point mass on ``d``,
    rejected iff ``1 <= min(eps, delta)``); the best point is refined by golden-section search
    over the grid cells either side. Each value is that of a rejected target, so the result is
    an upper bound of the infimum, converging to it as the grid grows; nothing here uses the
    Gibbs family or the bounds of the library.
    """
    q = np.asarray(q, dtype=np.float64)
    if q.shape[-1:] != (3,):
        raise ValueError(f"exhaustive_drafter_typical is for V = 3, got q of shape {q.shape}")
    flat = q.reshape(-1, 3)
    srt = -np.sort(-flat, axis=1, kind="stable")
    qd, q1, q2 = srt[:, :1], srt[:, 1:2], srt[:, 2:3]
    bar1 = q1 / (q1 + q2)

    def h2(a: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return -np.where(a > 0, a * np.log(a), 0.0) - np.where(a < 1, (1 - a) * np.log1p(-a), 0.0)

    def xlogy_ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(x > 0, x * np.log(x / y), 0.0)

    def kl_split(s: np.ndarray, a: np.ndarray) -> np.ndarray:
        return xlogy_ratio(s, qd) + xlogy_ratio((1 - s) * a, q1) + xlogy_ratio((1 - s) * (1 - a), q2)

    def value(s: np.ndarray) -> np.ndarray:
        """Least KL of a rejected target with ``p_d = s`` (``[N, G]``), ``+inf`` where none is rejected."""
        with np.errstate(divide="ignore", invalid="ignore"):
            c = (math.log(delta) - np.log(s) - h2(s)) / (1 - s)
        lo, hi = np.zeros(s.shape), np.full(s.shape, 0.5)
        for _ in range(64):  # h2 increases on [0, 1/2]; absolute error 2^-65 in a
            mid = 0.5 * (lo + hi)
            up = h2(mid) > c
            hi, lo = np.where(up, mid, hi), np.where(up, lo, mid)
        a_c = lo  # the largest a <= 1/2 with h2(a) <= c (the closed set)
        free = h2(np.broadcast_to(bar1, s.shape)) <= c
        best = np.where(free, kl_split(s, np.broadcast_to(bar1, s.shape)),
                        np.minimum(kl_split(s, a_c), kl_split(s, 1 - a_c)))
        out = np.where((s < 1) & (s <= eps) & (c >= 0), best, np.inf)
        point = -np.log(np.broadcast_to(qd, s.shape)) if (eps >= 1 and delta >= 1) else np.full(s.shape, np.inf)
        return np.where(s >= 1, point, out)

    xs = np.linspace(-40.0, 40.0, grid)
    ss = np.unique(np.concatenate([[0.0, 1.0, min(eps, 1.0)], 1 / (1 + np.exp(-xs))]))
    vals = value(np.broadcast_to(ss, (flat.shape[0], ss.size)).copy())
    i = np.argmin(vals, axis=1)
    best = vals[np.arange(flat.shape[0]), i]
    a = ss[np.maximum(i - 1, 0)][:, None]
    b = ss[np.minimum(i + 1, ss.size - 1)][:, None]
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(80):
        c1, c2 = b - golden * (b - a), a + golden * (b - a)
        f1, f2 = value(c1), value(c2)
        best = np.minimum(best, np.minimum(f1, f2)[:, 0])
        left = f1 <= f2
        b, a = np.where(left, c2, b), np.where(left, a, c1)
    return best.reshape(q.shape[:-1])
