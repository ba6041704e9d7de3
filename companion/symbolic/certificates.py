"""Symbolic derivations (sympy) behind the theory chapters.

Each function derives one step of the theory and returns sympy expressions; the chapters
display them and assert their properties, and ``tests/test_symbolic.py`` checks them against
independent numerics. Nothing here is quoted from the paper: these are the project's own
derivations of the results its abstract states (the book's chapter on the claims lists them).

Notation. ``p`` is the target distribution, ``q`` the drafter's; ``p(1) >= p(2) >= ...`` are
the sorted target probabilities. Forward divergence ``KL(p||q) = sum_i p_i log(p_i / q_i)``,
reverse ``KL(q||p)``. A *pool* ``A`` is a set of ``k`` tokens on which the minimiser ``q`` is
flat; ``P_A = sum_{i in A} p_i``, ``G_A = (prod_{i in A} p_i)^(1/k)``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy as sp

__all__ = [
    "identical",
    "PoolKKT",
    "forward_pool_kkt",
    "reverse_pool_kkt",
    "forward_kkt_explicit",
    "two_point_forward",
    "two_point_reverse",
    "exchange_gain_forward",
    "exchange_gain_reverse",
    "binary_entropy",
    "phi",
    "phi_series_coefficient",
    "greedy_forward",
    "greedy_reverse",
    "margin_series",
    "perspective_slope",
    "multiplicative_floor_expr",
    "multiplicative_floor_exact",
    "additive_floor_exact",
    "threshold_floor",
    "tree_secondary_leading",
    "tree_kkt_explicit",
    "tree_perspective_slope",
    "tree_extremal_cost",
    "tree_quadratic_constant",
    "ceiling_kl",
    "ceiling_reverse_kl",
    "ceiling_slack",
    "ceiling_drafter",
    "pair_relaxation_kkt",
    "pool_excess",
    "threshold_floor_exact",
    "speculative_sampling_cases",
    "kl_chain_rule",
    "swap_example",
    "kl_vector",
    "capacitory_discrimination",
    "triangular_discrimination",
]

# Shared symbols. Probabilities are positive reals; sympy uses the assumptions to simplify logs.
k = sp.Symbol("k", positive=True, integer=True)
j = sp.Idx("j")
p_idx = sp.IndexedBase("p", positive=True)
lam = sp.Symbol("lambda", real=True)
c = sp.Symbol("c", positive=True)
P_A = sp.Symbol("P_A", positive=True)
G_A = sp.Symbol("G_A", positive=True)
t = sp.Symbol("t", positive=True)
p_i, q_i = sp.symbols("p_i q_i", positive=True)


def identical(a: sp.Expr, b: sp.Expr) -> bool:
    """Whether ``a - b`` simplifies to 0, splitting logarithms of products and quotients.

    Log arguments are factored first (``log(1 - u**2) -> log(1 - u) + log(1 + u)``).
    ``expand_log(force=True)`` uses ``log(xy) = log x + log y``, which holds here because every
    logarithm in these derivations has a positive argument (probabilities and their means, or
    ``1 - u`` with ``0 < u < 1``), even where sympy cannot infer that from the symbols.
    """
    diff = (a - b).replace(sp.log, lambda arg: sp.log(sp.factor(arg)))
    diff = sp.expand_log(sp.expand(diff), force=True)
    return sp.simplify(diff) == 0


@dataclass(frozen=True)
class PoolKKT:
    """Solution of the stationarity + normalisation system of a pooled minimiser.

    ``multiplier``: the normalisation multiplier ``lambda``; ``off_pool``: ``q_i`` in terms of
    ``p_i`` for a token outside the pool; ``level``: the flat value of ``q`` on the pool;
    ``cost``: the minimum divergence; ``equations``: the equations that were solved.
    """

    multiplier: sp.Expr
    off_pool: sp.Expr
    level: sp.Expr
    cost: sp.Expr
    equations: tuple[sp.Eq, ...]


def _pool_sum(expr: sp.Expr) -> sp.Sum:
    return sp.Sum(expr, (j, 1, k))


def forward_pool_kkt() -> PoolKKT:
    """KKT system of ``min KL(p||q)`` with ``q`` flat (``= c``) on a pool of symbolic size ``k``.

    Lagrangian ``L = sum_i p_i log(p_i/q_i) + lambda (sum_i q_i - 1)`` (the order constraints
    are active on the pool, which is what makes ``q`` flat there). Stationarity off the pool:
    ``-p_i/q_i + lambda = 0``; on the pool: ``d/dc [sum_A p_j log(p_j/c) + lambda k c] = 0``,
    i.e. ``-P_A/c + lambda k = 0``; normalisation ``k c + (1 - P_A)/lambda = 1``.
    Solution: ``lambda = 1``, ``q_i = p_i`` off the pool, ``c = P_A / k`` (the pool's mean),
    cost ``sum_A p_j log p_j - P_A log(P_A / k) = sum_A p_j log(p_j / mean_A p)``.
    """
    off = sp.solve(sp.Eq(sp.diff(p_i * sp.log(p_i / q_i) + lam * q_i, q_i), 0), q_i)
    assert len(off) == 1
    q_off = off[0]
    pool_obj = _pool_sum(p_idx[j] * sp.log(p_idx[j] / c)) + lam * k * c
    d_pool = sp.factor_terms(sp.expand(sp.diff(pool_obj, c).doit()))
    d_pool = d_pool.subs(_pool_sum(p_idx[j]), P_A)
    # Off-pool tokens carry sum_{i not in A} p_i = 1 - P_A, each scaled by q_i / p_i.
    norm = k * c + (1 - P_A) * (q_off / p_i) - 1
    eqs = (sp.Eq(d_pool, 0), sp.Eq(norm, 0))
    sol = sp.solve(list(eqs), [c, lam], dict=True)
    assert len(sol) == 1, sol
    level, mult = sp.simplify(sol[0][c]), sp.simplify(sol[0][lam])
    cost = _pool_sum(p_idx[j] * sp.log(p_idx[j])) - P_A * sp.log(level)
    return PoolKKT(mult, sp.simplify(q_off.subs(lam, mult)), level, cost, eqs)


def reverse_pool_kkt() -> PoolKKT:
    """KKT system of ``min KL(q||p)`` with ``q`` flat (``= c``) on a pool of symbolic size ``k``.

    Stationarity off the pool: ``log(q_i/p_i) + 1 + lambda = 0``, so ``q_i = t p_i`` with
    ``t = exp(-1 - lambda)``; on the pool ``k (log c + 1) - sum_A log p_j + lambda k = 0``, so
    ``c = t G_A``; normalisation ``t (1 - P_A) + k t G_A = 1``. The cost
    ``t(1-P_A) log t + k c log(c / G_A)`` collapses to ``log t``:
    ``C = -log(1 - (P_A - k G_A))``. ``multiplier`` is returned as ``t = exp(-1-lambda)``.
    """
    off = sp.solve(sp.Eq(sp.diff(q_i * sp.log(q_i / p_i) + lam * q_i, q_i), 0), q_i)
    assert len(off) == 1
    q_off = off[0]
    pool_obj = _pool_sum(c * sp.log(c / p_idx[j])) + lam * k * c
    d_pool = sp.expand(sp.expand_log(sp.diff(pool_obj, c).doit(), force=True))
    d_pool = sp.factor_terms(d_pool).subs(_pool_sum(sp.log(p_idx[j])), k * sp.log(G_A)).doit()
    c_sol = sp.solve(sp.Eq(d_pool, 0), c)
    assert len(c_sol) == 1
    # Write both in terms of t = exp(-1 - lambda).
    t_of_lam = sp.exp(-1 - lam)
    assert sp.simplify(q_off / p_i - t_of_lam) == 0
    assert sp.simplify(c_sol[0] - t_of_lam * G_A) == 0
    norm = sp.Eq(t * (1 - P_A) + k * t * G_A, 1)
    t_sol = sp.solve(norm, t)
    assert len(t_sol) == 1
    level = t_sol[0] * G_A
    # sum_A c log(c/p_j) = k c log c - c sum_A log p_j = k c log(c / G_A).
    cost = t * (1 - P_A) * sp.log(t) + k * (t * G_A) * sp.log(t * G_A / G_A)
    cost = sp.simplify(sp.expand_log(cost, force=True).subs(t, t_sol[0]))
    # t > 0, so log(1/x) = -log(x) is safe here.
    cost = sp.expand_log(cost, force=True)
    return PoolKKT(t_sol[0], t_sol[0] * p_i, level, cost, (sp.Eq(d_pool, 0), norm))


def forward_kkt_explicit(n: int = 4, pool_size: int = 3) -> dict[str, sp.Expr | dict]:
    """The full KKT system for an explicit vocabulary of ``n`` tokens, solved by sympy.

    Token ``y = pool_size`` (1-based, sorted order) must satisfy ``q_y >= q_z`` for all ``z``;
    the constraints with ``z < y`` are taken active (``q_z = q_y``, multipliers ``mu_z``) and
    those with ``z > y`` inactive (``mu_z = 0``). Returns the solution for ``q``, ``lambda`` and
    ``mu`` in terms of symbolic ``p_1..p_n`` (with ``p_n = 1 - sum of the others``) and the
    derived dual-feasibility conditions ``mu_z = p_z / mean_A(p) - 1``.
    """
    if not 2 <= pool_size <= n:
        raise ValueError("need 2 <= pool_size <= n")
    ps = sp.symbols(f"p1:{n + 1}", positive=True)
    qs = sp.symbols(f"q1:{n + 1}", positive=True)
    mus = sp.symbols(f"mu1:{pool_size}", real=True)
    y = pool_size - 1  # 0-based index of the proposed token
    lag = sum(ps[i] * sp.log(ps[i] / qs[i]) for i in range(n)) + lam * (sum(qs) - 1)
    lag += sum(mus[z] * (qs[z] - qs[y]) for z in range(pool_size - 1))
    eqs = [sp.diff(lag, qs[i]) for i in range(n)]
    eqs += [qs[z] - qs[y] for z in range(pool_size - 1)]
    eqs += [sum(qs) - 1]
    subs_norm = {ps[-1]: 1 - sum(ps[:-1])}
    sol = sp.solve([e.subs(subs_norm) for e in eqs], list(qs) + [lam] + list(mus), dict=True)
    sol = [s for s in sol if all(sp.simplify(s[q]).is_positive is not False for q in qs)]
    assert len(sol) == 1, sol
    s = {key: sp.simplify(val) for key, val in sol[0].items()}
    mean = sum(ps[:pool_size]) / pool_size
    return {"p": ps, "q": qs, "mu": mus, "solution": s, "pool_mean": mean.subs(subs_norm), "subs": subs_norm}


def two_point_forward(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """Forward cost of pooling two tokens with probabilities ``a >= b``:
    ``a log(2a/(a+b)) + b log(2b/(a+b))``."""
    s = a + b
    return a * sp.log(2 * a / s) + b * sp.log(2 * b / s)


def two_point_reverse(a: sp.Expr, b: sp.Expr) -> sp.Expr:
    """Reverse cost of pooling two tokens: ``-log(1 - (sqrt(a) - sqrt(b))**2)``
    (the reverse pool formula with ``P_A = a + b``, ``k G_A = 2 sqrt(ab)``)."""
    return -sp.log(1 - (sp.sqrt(a) - sp.sqrt(b)) ** 2)


def exchange_gain_forward(py: sp.Expr, pz: sp.Expr, qy: sp.Expr, qz: sp.Expr) -> sp.Expr:
    """``KL(p||q') - KL(p||q)`` when ``q'`` swaps the draft masses of ``y`` and ``z``.

    Equals ``(p_y - p_z)(log q_y - log q_z)``: non-positive when ``p_y >= p_z`` and
    ``q_z >= q_y`` — so a token with larger target probability is never dearer to promote.
    """
    before = -py * sp.log(qy) - pz * sp.log(qz)
    after = -py * sp.log(qz) - pz * sp.log(qy)
    return after - before


def exchange_gain_reverse(py: sp.Expr, pz: sp.Expr, qy: sp.Expr, qz: sp.Expr) -> sp.Expr:
    """``KL(q'||p) - KL(q||p)`` for the same swap: ``(q_z - q_y)(log p_z - log p_y)``."""
    before = -qy * sp.log(py) - qz * sp.log(pz)
    after = -qz * sp.log(py) - qy * sp.log(pz)
    return after - before


def binary_entropy(x: sp.Expr) -> sp.Expr:
    """``h(x) = -x log x - (1-x) log(1-x)`` in nats."""
    return -x * sp.log(x) - (1 - x) * sp.log(1 - x)


def phi(m: sp.Expr | int, gamma: sp.Expr) -> sp.Expr:
    """Margin-only tree certificate
    ``phi_m(gamma) = [(1 + m gamma) log(1 + m gamma) + m (1 - gamma) log(1 - gamma)] / (m + 1)``.

    ``m = 1`` is strict greedy: ``phi_1(u) = [(1+u)log(1+u) + (1-u)log(1-u)]/2``.
    """
    return ((1 + m * gamma) * sp.log(1 + m * gamma) + m * (1 - gamma) * sp.log(1 - gamma)) / (m + 1)


def phi_series_coefficient(m: sp.Expr | int, n: sp.Expr | int) -> sp.Expr:
    """Coefficient of ``gamma**n`` (``n >= 2``) in the Taylor series of ``phi_m`` at 0:
    ``((-m)**n + m) / (n (n-1) (m+1))``; from ``(1+x)log(1+x) = x + sum_n (-1)^n x^n/(n(n-1))``."""
    return ((-m) ** n + m) / (n * (n - 1) * (m + 1))


def greedy_forward(s: sp.Expr, delta: sp.Expr) -> sp.Expr:
    """Strict greedy forward certificate in ``s = p(1)+p(2)``, ``Delta = p(1)-p(2)``:
    ``s [log 2 - h(p(1)/s)]`` with ``p(1) = (s + Delta)/2``."""
    return s * (sp.log(2) - binary_entropy((s + delta) / (2 * s)))


def kl_vector(P: sp.Matrix | list, Q: sp.Matrix | list) -> sp.Expr:
    """``KL(P||Q) = sum_i P_i log(P_i / Q_i)`` of two finite distributions given as lists."""
    return sum(a * sp.log(a / b) for a, b in zip(list(P), list(Q)))


def capacitory_discrimination(P: sp.Matrix | list, Q: sp.Matrix | list) -> sp.Expr:
    """Capacitory discrimination ``C(P, Q) = KL(P||M) + KL(Q||M)`` with ``M = (P + Q)/2``
    (twice the Jensen-Shannon divergence); the name is Topsoe's (IEEE Trans. Inf. Theory 46(4), 2000)."""
    M = [(a + b) / 2 for a, b in zip(list(P), list(Q))]
    return kl_vector(P, M) + kl_vector(Q, M)


def triangular_discrimination(P: sp.Matrix | list, Q: sp.Matrix | list) -> sp.Expr:
    """Triangular discrimination ``sum_i (P_i - Q_i)**2 / (P_i + Q_i)``."""
    return sum((a - b) ** 2 / (a + b) for a, b in zip(list(P), list(Q)))


def greedy_reverse(p1: sp.Expr, p2: sp.Expr) -> sp.Expr:
    """Strict greedy reverse certificate ``-log(1 - (sqrt p(1) - sqrt p(2))**2)``."""
    return two_point_reverse(p1, p2)


def margin_series(expr: sp.Expr, var: sp.Symbol, order: int) -> sp.Expr:
    """Taylor polynomial of ``expr`` in ``var`` about 0, terms below ``var**order``."""
    return sp.series(expr, var, 0, order).removeO()


def perspective_slope(u: sp.Symbol) -> sp.Expr:
    """``d/ds [s phi_1(gamma/s)]`` written in ``u = gamma/s``: ``phi_1(u) - u phi_1'(u)``.

    Simplifies to ``log(1 - u**2)/2 <= 0``: at a fixed margin the certificate shrinks as the
    pooled mass ``s`` grows, so over all targets it is smallest at ``s = 1``.
    """
    f = phi(1, u)
    return f - u * sp.diff(f, u)


def multiplicative_floor_expr(alpha: sp.Expr, p1: sp.Expr) -> sp.Expr:
    """``Delta**2/(2 s)`` at the extreme ``Delta = (1-alpha) p(1)``, ``s = (1+alpha) p(1)``:
    ``(1-alpha)**2 p(1) / (2 (1+alpha))``."""
    return ((1 - alpha) * p1) ** 2 / (2 * (1 + alpha) * p1)


def multiplicative_floor_exact(alpha: sp.Expr, p1: sp.Expr) -> sp.Expr:
    """Infimum of the multiplicative-relaxed forward certificate over targets with top-1 ``p(1)``
    and ``p(1) <= 1/(1+alpha)``: the two-point cost ``two_point_forward(p(1), alpha p(1))``."""
    return two_point_forward(p1, alpha * p1)


def additive_floor_exact(delta: sp.Expr) -> sp.Expr:
    """Infimum of the additive-relaxed forward certificate over all targets: ``phi_1(delta)``
    (approached by ``p = ((1+delta)/2, (1-delta)/2 - eps, eps)``); ``>= delta**2/2``."""
    return phi(1, delta)


def threshold_floor(p1: sp.Expr, tau: sp.Expr) -> sp.Expr:
    """Generic floor for a criterion with threshold ``tau < p(1)``:
    ``(p(1) - tau)**2 / (2 min(1, p(1) + tau))``.

    The boundary token has ``p_{y*} <= tau``, so ``Delta >= p(1) - tau`` and
    ``s = p(1) + p_{y*} <= min(1, p(1) + tau)``; then ``rho* >= Delta**2/(2s)``.
    """
    return (p1 - tau) ** 2 / (2 * sp.Min(1, p1 + tau))


def tree_secondary_leading(m: sp.Expr | int, gamma: sp.Expr) -> sp.Expr:
    """The leading term ``(m+1) gamma**2 / 4`` that secondary summaries attribute to the paper."""
    return (m + 1) * gamma**2 / 4


def tree_kkt_explicit(n: int = 4, m: int = 2, pooled: int = 1) -> dict[str, object]:
    """Full KKT system of the width-``m`` tree certificate for ``n`` explicit tokens.

    ``min KL(p||q)`` subject to ``q_z >= q_1`` for the competitors ``z = 2..m+1`` (token 1 is
    the target's greedy token ``g``). The ``pooled`` lowest competitors are taken active
    (``q_z = q_1``, multipliers ``mu_z``), the others inactive. Returns the solution in terms of
    symbolic ``p_1..p_n`` (``p_n = 1 - sum of the others``); it has ``lambda = 1``, ``q`` equal
    to the pool's mean on the pool, ``q = p`` elsewhere, and ``mu_z = 1 - p_z / mean``.
    """
    if not (1 <= m < n and 0 <= pooled <= m):
        raise ValueError("need 1 <= m < n and 0 <= pooled <= m")
    ps = sp.symbols(f"p1:{n + 1}", positive=True)
    qs = sp.symbols(f"q1:{n + 1}", positive=True)
    active = list(range(m + 1 - pooled, m + 1))  # 0-based indices of the lowest competitors
    mus = sp.symbols(f"mu1:{pooled + 1}", real=True) if pooled else ()
    lag = sum(ps[i] * sp.log(ps[i] / qs[i]) for i in range(n)) + lam * (sum(qs) - 1)
    # Constraint q_z - q_1 >= 0 enters the Lagrangian of a minimisation with a minus sign.
    lag -= sum(mu * (qs[z] - qs[0]) for mu, z in zip(mus, active))
    eqs = [sp.diff(lag, qs[i]) for i in range(n)]
    eqs += [qs[z] - qs[0] for z in active]
    eqs += [sum(qs) - 1]
    subs_norm = {ps[-1]: 1 - sum(ps[:-1])}
    unknowns = list(qs) + [lam] + list(mus)
    sol = sp.solve([e.subs(subs_norm) for e in eqs], unknowns, dict=True)
    assert len(sol) == 1, sol
    s = {key: sp.simplify(val) for key, val in sol[0].items()}
    pool = [0] + active
    mean = sum(ps[i] for i in pool) / len(pool)
    return {"p": ps, "q": qs, "mu": mus, "active": active, "solution": s, "pool_mean": mean, "subs": subs_norm}


def tree_perspective_slope(m: sp.Expr | int, u: sp.Symbol) -> sp.Expr:
    """``phi_m(u) - u phi_m'(u)``, the slope in the pooled mass ``P`` of ``P phi_m(gamma / P)``.

    Simplifies to ``[log(1 + m u) + m log(1 - u)] / (m + 1)``, which is ``<= 0`` because
    ``log(1 + x) <= x``: at a fixed margin the tree certificate is smallest when the pool holds
    all the mass.
    """
    f = phi(m, u)
    return f - u * sp.diff(f, u)


def tree_extremal_cost(m: int, gamma: sp.Expr) -> sp.Expr:
    """Forward tree certificate of the extremal target: ``g`` at ``(1 + m gamma)/(m + 1)`` and
    ``m`` competitors at ``(1 - gamma)/(m + 1)``, all pooled at the mean ``1/(m + 1)``:
    ``sum_B p_i log(p_i (m + 1))``."""
    top = (1 + m * gamma) / (m + 1)
    comp = (1 - gamma) / (m + 1)
    return top * sp.log(top * (m + 1)) + m * comp * sp.log(comp * (m + 1))


def tree_quadratic_constant(m: sp.Expr | int) -> sp.Expr:
    """``c_m = m**2 log(m) / (m**2 - 1)``: the minimum of ``phi_m(gamma)/gamma**2`` over
    ``(0, 1]`` for ``m >= 2``, reached at ``gamma = (m - 1)/m`` (where ``1 + m gamma = m`` and
    ``1 - gamma = 1/m``). ``c_1 = 1/2`` is the limit ``m -> 1``."""
    if m == 1:
        return sp.Rational(1, 2)
    return m**2 * sp.log(m) / (m**2 - 1)


# -- chapter 2: the log 2 ceiling of every single-token criterion --------------------------------


def ceiling_kl(py: sp.Expr) -> sp.Expr:
    """``KL(p||q)`` of the drafter ``q = (p + e_y)/2``:
    ``(1 - p_y) log 2 + p_y log(2 p_y / (1 + p_y))``. It depends on ``p`` only through ``p_y``."""
    return (1 - py) * sp.log(2) + py * sp.log(2 * py / (1 + py))


def ceiling_reverse_kl(py: sp.Expr) -> sp.Expr:
    """``KL(q||p)`` of the same drafter:
    ``-(1 - p_y) log(2) / 2 + (1 + p_y)/2 log((1 + p_y) / (2 p_y))``; it tends to ``+oo`` as
    ``p_y -> 0``, so the construction gives no ceiling in the reverse direction."""
    return -(1 - py) * sp.log(2) / 2 + (1 + py) / 2 * sp.log((1 + py) / (2 * py))


def ceiling_slack(py: sp.Expr) -> sp.Expr:
    """``(1 - p_y) log 2 - ceiling_kl(p_y) = p_y log((1 + p_y) / (2 p_y))``, which is ``>= 0``
    because ``(1 + p_y) / (2 p_y) >= 1`` for ``0 < p_y <= 1``."""
    return (1 - py) * sp.log(2) - ceiling_kl(py)


def ceiling_drafter(n: int = 4) -> dict[str, object]:
    """The drafter ``q = (p + e_y)/2`` on an explicit vocabulary of ``n`` tokens, ``y`` the first.

    ``p_y, p_2, ..., p_n`` are positive symbols with total ``S``; ``q_y = (p_y + S)/2`` and
    ``q_i = p_i / 2`` otherwise (``S = 1`` for a distribution). Returns

    * ``p``, ``q``: the symbols and the drafter;
    * ``gaps``: ``q_y - q_i - p_y`` for ``i != y``, which come out as half the mass of the
      tokens other than ``y`` and ``i`` (so ``q_y - q_i >= p_y``: ``y`` is a maximiser of ``q``,
      the only one when ``p_y > 0``);
    * ``kl``, ``reverse_kl``: ``KL(p||q)`` and ``KL(q||p)`` with ``p_n = 1 - p_y - p_2 - ... - p_{n-1}``
      substituted, to be compared with :func:`ceiling_kl` and :func:`ceiling_reverse_kl`.
    """
    if n < 2:
        raise ValueError(f"need a vocabulary of n >= 2 tokens, got n={n}")
    ps = sp.symbols(["p_y"] + [f"p_{i}" for i in range(2, n + 1)], positive=True)
    total = sum(ps)
    qs = [(ps[0] + total) / 2] + [p / 2 for p in ps[1:]]
    gaps = [sp.simplify(qs[0] - q - ps[0]) for q in qs[1:]]
    norm = {ps[-1]: 1 - sum(ps[:-1])}
    kl = sum(p * sp.log(p / q) for p, q in zip(ps, qs)).subs(norm)
    reverse_kl = sum(q * sp.log(q / p) for p, q in zip(ps, qs)).subs(norm)
    return {"p": ps, "q": qs, "gaps": gaps, "kl": kl, "reverse_kl": reverse_kl}


# -- chapter 4: the two-point lemma -------------------------------------------------------------


def pair_relaxation_kkt(n: int = 4) -> dict[str, object]:
    """``min KL(p||q)`` subject to the single constraint ``q_y >= q_1``, on ``n`` explicit tokens.

    Token 1 is the target's top token, ``y`` the boundary token, and tokens ``3..n`` are left
    unconstrained (in the full problem they would also have to satisfy ``q_y >= q_z``).
    Lagrangian ``sum_i p_i log(p_i/q_i) + lambda (sum_i q_i - 1) - mu (q_y - q_1)`` with the
    constraint active; sympy solves stationarity, activity and normalisation
    (``p_n = 1 - p_1 - ... - p_{n-1}``). The solution: ``lambda = 1``,
    ``q_1 = q_y = (p_1 + p_y)/2``, ``q_z = p_z`` for the rest, and
    ``mu = (p_1 - p_y)/(p_1 + p_y)``, which is ``>= 0`` (dual feasible) exactly when
    ``p_y <= p_1``. The problem is convex, so this KKT point is the minimiser, and ``cost`` is
    the two-point cost ``p_1 log(2p_1/s) + p_y log(2p_y/s) = s [log 2 - h(p_1/s)]``,
    ``s = p_1 + p_y``.
    """
    if n < 3:
        raise ValueError(f"need n >= 3 tokens (top, boundary and at least one other), got n={n}")
    names = ["p_1", "p_y"] + [f"p_{i}" for i in range(3, n + 1)]
    ps = sp.symbols(names, positive=True)
    qs = sp.symbols([name.replace("p", "q", 1) for name in names], positive=True)
    mu = sp.Symbol("mu", real=True)
    lag = sum(p * sp.log(p / q) for p, q in zip(ps, qs)) + lam * (sum(qs) - 1) - mu * (qs[1] - qs[0])
    eqs = [sp.diff(lag, q) for q in qs] + [qs[1] - qs[0], sum(qs) - 1]
    norm = {ps[-1]: 1 - sum(ps[:-1])}
    sol = sp.solve([e.subs(norm) for e in eqs], [*qs, lam, mu], dict=True)
    assert len(sol) == 1, sol
    solution = {key: sp.simplify(val) for key, val in sol[0].items()}
    cost = sum(p * sp.log(p / solution[q]) for p, q in zip(ps, qs)).subs(norm)
    return {"p": ps, "q": qs, "mu": mu, "solution": solution, "cost": cost, "subs": norm}


def pool_excess(k: int) -> tuple[sp.Expr, sp.Expr, tuple[sp.Symbol, ...]]:
    """What the constraints dropped by the two-point lemma cost, for a pool of ``k`` tokens.

    The full minimiser for the boundary token ``y`` pools ``y``, the top token and ``k - 2``
    tokens ``z`` between them at their mean; the relaxed one pools only ``{1, y}``. Returns
    ``(C_A - C_pair, P_A KL(g || u), symbols)`` with ``g = (s, p_z, ...)/P_A`` the pool's
    mass grouped as ``{1, y}`` and the single ``z``'s, ``u = (2, 1, ..., 1)/k``. The two are
    equal (the chain rule of KL), so the full cost exceeds the pair cost by a KL divergence,
    which is ``>= 0``.
    """
    if k < 3:
        raise ValueError(f"a pool beyond the pair has k >= 3 tokens, got k={k}")
    p1, py = sp.symbols("p_1 p_y", positive=True)
    zs = sp.symbols(f"p_z1:{k - 1}", positive=True)
    pool = [p1, py, *zs]
    mass = sum(pool)
    full = sum(p * sp.log(p / (mass / k)) for p in pool)
    excess = full - two_point_forward(p1, py)
    grouped = [(p1 + py) / mass, *[z / mass for z in zs]]
    uniform = [sp.Rational(2, k)] + [sp.Rational(1, k)] * (k - 2)
    kl = mass * sum(g * sp.log(g / u) for g, u in zip(grouped, uniform))
    return excess, kl, (p1, py, *zs)


def threshold_floor_exact(p1: sp.Expr, tau: sp.Expr) -> sp.Expr:
    """Exact floor of the forward certificate over targets with top probability ``p(1)`` for a
    criterion with threshold ``tau <= p(1)``: ``two_point_forward(p(1), min(tau, 1 - p(1)))``.

    The boundary token has ``p_{y*} <= tau`` and ``p_{y*} <= 1 - p(1)``; the two-point cost
    increases in its first argument and decreases in its second (derivatives
    ``log(2a/(a+b)) >= 0`` and ``log(2b/(a+b)) <= 0`` for ``b <= a``). It is approached by a
    target whose boundary token sits just below that value and whose remaining mass is spread
    thinly. Multiplicative ``alpha``: ``tau = alpha p(1)`` gives :func:`multiplicative_floor_exact`
    while ``p(1) <= 1/(1 + alpha)``.
    """
    return two_point_forward(p1, sp.Min(tau, 1 - p1))


# -- chapter 6: speculative sampling and Pinsker ------------------------------------------------


def _sign(expr: sp.Expr) -> int:
    """The sign of ``expr`` as sympy proves it from the symbols' positivity; raises if unknown."""
    expr = sp.factor(sp.simplify(expr))
    if expr == 0:
        return 0
    if expr.is_positive:
        return 1
    if expr.is_negative:
        return -1
    raise ValueError(f"cannot decide the sign of {expr}")


def speculative_sampling_cases(n: int = 3) -> list[dict[str, object]]:
    """Speculative sampling's acceptance probability and output law, for every sign pattern.

    For ``n`` tokens each is "up" (``p_x = b_x + d_x > q_x = b_x``), "down" (``p_x = b_x <
    q_x = b_x + d_x``) or "equal" (``p_x = q_x = b_x``), with ``b, d > 0``; patterns need at
    least one up and one down token (otherwise ``p = q``). In each, sympy decides every ``min``,
    ``|.|`` and positive part from the sign of the difference, then imposes
    ``sum p = sum q = 1`` (solving for the last ``b`` and the first down ``d``). Each entry holds
    ``pattern``, ``tv`` (``TV(p, q)`` after normalisation) and the simplified differences

    * ``accept_minus_summin``: ``sum_x q_x min(1, p_x/q_x) - sum_x min(p_x, q_x)``,
    * ``accept_minus_one_minus_tv``: ``sum_x q_x min(1, p_x/q_x) - (1 - sum_x |p_x - q_x| / 2)``,
    * ``output_minus_p``: per token, ``P[output = x] - p_x`` with
      ``P[output = x] = q_x min(1, p_x/q_x) + (1 - P[accept]) (p_x - q_x)_+ / sum_z (p_z - q_z)_+``

    which are all 0: the draft is accepted with probability ``1 - TV(p, q)`` and the output is
    distributed as ``p``.
    """
    if n < 2:
        raise ValueError(f"need n >= 2 tokens, got n={n}")

    def smin(a: sp.Expr, b: sp.Expr) -> sp.Expr:
        return a if _sign(a - b) <= 0 else b

    def sabs(a: sp.Expr) -> sp.Expr:
        return a if _sign(a) >= 0 else -a

    def spos(a: sp.Expr) -> sp.Expr:
        return a if _sign(a) > 0 else sp.Integer(0)

    out = []
    base = sp.symbols(f"b1:{n + 1}", positive=True)
    d = sp.symbols(f"d1:{n + 1}", positive=True)
    for pattern in itertools.product(("up", "down", "equal"), repeat=n):
        if "up" not in pattern or "down" not in pattern:
            continue
        p = [b + dd if kind == "up" else b for b, dd, kind in zip(base, d, pattern)]
        q = [b + dd if kind == "down" else b for b, dd, kind in zip(base, d, pattern)]
        accept = sum(qq * smin(1, pp / qq) for pp, qq in zip(p, q))
        summin = sum(smin(pp, qq) for pp, qq in zip(p, q))
        tv = sum(sabs(pp - qq) for pp, qq in zip(p, q)) / 2
        resid = [spos(pp - qq) for pp, qq in zip(p, q)]
        law = [qq * smin(1, pp / qq) + (1 - accept) * r / sum(resid) for pp, qq, r in zip(p, q, resid)]
        first_down = pattern.index("down")
        norm = sp.solve([sum(p) - 1, sum(q) - 1], [base[-1], d[first_down]], dict=True)
        assert len(norm) == 1, norm
        out.append({
            "pattern": pattern,
            "tv": sp.simplify(tv.subs(norm[0])),
            "accept_minus_summin": sp.simplify(accept - summin),
            "accept_minus_one_minus_tv": sp.simplify((accept - (1 - tv)).subs(norm[0])),
            "output_minus_p": [sp.simplify((o - pp).subs(norm[0])) for o, pp in zip(law, p)],
        })
    return out


def kl_chain_rule(n: int = 3, group: int = 2) -> tuple[sp.Expr, sp.Expr, tuple[sp.Symbol, ...]]:
    """Grouping tokens cannot increase KL: the chain rule on ``n`` explicit tokens.

    The first ``group`` tokens are merged into one. Returns
    ``(KL(p||q) - KL(p_grouped||q_grouped), P_G KL(p|G || q|G), symbols)`` with ``P_G`` the
    group's ``p``-mass and ``p|G``, ``q|G`` the distributions restricted to the group and
    renormalised. The two are equal, and the second is ``>= 0``. (No normalisation is needed:
    the identity holds for any positive masses.)
    """
    if not 2 <= group <= n:
        raise ValueError(f"need 2 <= group <= n, got group={group}, n={n}")
    ps = sp.symbols(f"p1:{n + 1}", positive=True)
    qs = sp.symbols(f"q1:{n + 1}", positive=True)
    kl = sum(p * sp.log(p / q) for p, q in zip(ps, qs))
    pg, qg = sum(ps[:group]), sum(qs[:group])
    grouped = pg * sp.log(pg / qg) + sum(p * sp.log(p / q) for p, q in zip(ps[group:], qs[group:]))
    within = pg * sum((p / pg) * sp.log((p / pg) / (q / qg)) for p, q in zip(ps[:group], qs[:group]))
    return kl - grouped, within, (*ps, *qs)


def swap_example(eta: sp.Expr) -> dict[str, sp.Expr]:
    """The two-token target ``p = (1/2 + eta, 1/2 - eta)`` and the drafter that swaps it.

    Returns ``kl`` (``KL(p||q) = 2 eta log((1 + 2eta)/(1 - 2eta))``, equal to ``KL(q||p)`` by
    symmetry), ``tv`` (``2 eta``), ``accept`` (speculative sampling, ``1 - 2 eta``),
    ``pinsker`` (``1 - sqrt(KL/2)``) and ``certificate`` (strict greedy's forward certificate
    of ``p``, ``phi_1(2 eta)``: all mass sits on the two tokens).
    """
    p = (sp.Rational(1, 2) + eta, sp.Rational(1, 2) - eta)
    q = (p[1], p[0])
    kl = sum(a * sp.log(a / b) for a, b in zip(p, q))
    tv = sum(sp.Abs(a - b) for a, b in zip(p, q)) / 2
    accept = sum(sp.Min(a, b) for a, b in zip(p, q))
    return {"p": p, "q": q, "kl": kl, "tv": sp.simplify(tv), "accept": sp.simplify(accept),
            "pinsker": 1 - sp.sqrt(kl / 2), "certificate": phi(1, 2 * eta)}


def normaliser_error_identities(n_top: int = 4, pool: int = 2) -> dict[str, sp.Expr]:
    """The two identities behind :func:`companion.certify.precision.lower_log_normaliser`, on an
    explicit row: ``n_top`` top probabilities ``e_i`` (positive), the tail ``t = 1 - sum e``, and the
    reverse tilted normaliser ``X(e) = t + sum_{i > pool} e_i + pool G`` with ``G`` the geometric mean
    of the first ``pool`` values. The computed row is ``v = lambda e`` with a computed tail ``t_hat``.

    Returns ``X(e)``, ``X(v)``, the mismatch ``eta = sum v + t_hat - 1`` and the two residuals
    ``X(v) - X(e) - [(lambda - 1)(X(e) - t) + (t_hat - t)]`` and
    ``X(v) - X(e) - [eta - (lambda - 1)(1 - X(e))]``, both identically 0.
    """
    e = sp.symbols(f"e_1:{n_top + 1}", positive=True)
    lam, t_hat = sp.symbols("lambda t_hat", positive=True)
    t = 1 - sum(e)

    def x_of(vals, tail):
        g = sp.Mul(*vals[:pool]) ** sp.Rational(1, pool)
        return tail + sum(vals[pool:]) + pool * g

    x_e = x_of(list(e), t)
    x_v = x_of([lam * a for a in e], t_hat)
    eta = lam * sum(e) + t_hat - 1
    by_tail = sp.simplify(sp.powsimp(sp.expand(x_v - x_e - ((lam - 1) * (x_e - t) + (t_hat - t))), force=True))
    by_sum = sp.simplify(sp.powsimp(sp.expand(x_v - x_e - (eta - (lam - 1) * (1 - x_e))), force=True))
    return {"X_exact": x_e, "X_computed": x_v, "mismatch": eta, "residual_tail": by_tail, "residual_sum": by_sum}
