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
