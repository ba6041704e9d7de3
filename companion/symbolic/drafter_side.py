"""Symbolic derivations (sympy) of the drafter-side certificates in :mod:`companion.drafter.certificates`.

The drafter knows its own ``q`` and asks how far (in ``KL(p||q)``, minimised over the target
``p``) a target must be to reject its greedy token ``d``. Every rejection region but typical
acceptance's is cut out by linear constraints on ``p``; the Lagrangian's stationarity then says
``log(p_i / q_i) = (multiplier terms on i) - log Z``: ``p`` is ``q`` exponentially tilted on
the constrained tokens, and with every constraint active (or its multiplier zero) the minimum
is ``-log Z``. Each function below derives one of these with sympy and returns the
expressions; ``tests/test_symbolic_drafter.py`` checks them against numerics and the library.

Notation: ``q_d = q(1)`` the draft, ``q_z`` a competitor (the runner-up ``q(2)`` is the best
one), ``R`` the drafter's mass on every other token, ``lambda`` the tilt.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

__all__ = [
    "H_r",
    "R",
    "Tilt",
    "additive_tilt",
    "alpha",
    "bernoulli_branch",
    "beta",
    "delta",
    "eps",
    "gibbs_curve",
    "greedy_drafter",
    "lam",
    "mu",
    "multiplicative_closed_form",
    "multiplicative_tilt",
    "pool_kkt",
    "q_d",
    "q_z",
    "s",
    "swap_gain",
    "typical_constraint_split",
    "typical_stationarity",
]

q_d, q_z, R = sp.symbols("q_d q_z R", positive=True)
alpha, delta, eps = sp.symbols("alpha delta epsilon", positive=True)
lam = sp.Symbol("lambda", positive=True)
x = sp.Symbol("x", positive=True)  # e^lambda
s, H_r = sp.symbols("s H_r", positive=True)
beta, mu, nu = sp.symbols("beta mu nu", real=True)


@dataclass(frozen=True)
class Tilt:
    """An exponential tilt ``p = q e^(lambda . a) / Z``: its multiplier, normaliser, the tilted
    masses of the constrained tokens, and the minimum ``KL(p||q)`` (the certificate)."""

    multiplier: sp.Expr
    normaliser: sp.Expr
    masses: dict[str, sp.Expr]
    cost: sp.Expr


def _stationary_masses(constraint_coeffs: dict[sp.Symbol, sp.Expr], multiplier: sp.Symbol) -> dict[sp.Symbol, sp.Expr]:
    """Solve ``d/dp_i [p_i log(p_i/q_i) - multiplier * a_i p_i + nu p_i] = 0`` for each ``p_i``.

    ``constraint_coeffs`` maps ``q_i`` to the coefficient ``a_i`` of ``p_i`` in the constraint
    ``sum_i a_i p_i >= c``. Returns ``{q_i: p_i}``: ``p_i = q_i e^(multiplier a_i - 1 - nu)``.
    """
    out = {}
    for qi, a in constraint_coeffs.items():
        pi = sp.Symbol("p", positive=True)
        lag = pi * sp.log(pi / qi) - multiplier * a * pi + nu * pi
        sol = sp.solve(sp.Eq(sp.diff(lag, pi), 0), pi)
        assert len(sol) == 1, sol
        out[qi] = sp.simplify(sol[0])
    return out


def greedy_drafter(q1: sp.Expr = q_d, q2: sp.Expr = q_z) -> sp.Expr:
    """``rho~_greedy = -log(1 - (sqrt q(1) - sqrt q(2))^2)``: :func:`multiplicative_tilt` at ``alpha = 1``."""
    return -sp.log(1 - (sp.sqrt(q1) - sp.sqrt(q2)) ** 2)


def multiplicative_tilt() -> Tilt:
    """``min KL(p||q)`` subject to ``alpha p_z - p_d >= 0``.

    Stationarity gives ``p_d = q_d e^-lambda / Z``, ``p_z = q_z e^(alpha lambda) / Z``,
    ``p_i = q_i / Z`` elsewhere, ``Z = R + q_d e^-lambda + q_z e^(alpha lambda)``. The active
    constraint ``alpha p_z = p_d`` fixes ``lambda = log(q_d / (alpha q_z)) / (1 + alpha)``, and
    ``KL = lambda (alpha p_z - p_d) - log Z = -log Z``.
    """
    other = sp.Symbol("q_i", positive=True)
    masses = _stationary_masses({q_d: -1, q_z: alpha, other: 0}, lam)
    # Every mass carries the common factor e^(-1-nu) = 1/Z.
    z_factor = sp.exp(-1 - nu)
    unnorm = {k: sp.simplify(v / z_factor) for k, v in masses.items()}
    assert sp.simplify(unnorm[other] - other) == 0
    big_z = R + unnorm[q_d] + unnorm[q_z]
    sol = sp.solve(sp.Eq(alpha * unnorm[q_z], unnorm[q_d]), lam)
    assert len(sol) == 1, sol
    lam_star = sp.simplify(sol[0])
    lam_star = sp.expand_log(lam_star, force=True)
    p_d, p_z = unnorm[q_d] / big_z, unnorm[q_z] / big_z
    # KL = lambda E_p[alpha 1_z - 1_d] - log Z; the first term vanishes on the active constraint.
    gap = sp.powsimp(sp.expand(sp.expand_log((alpha * unnorm[q_z] - unnorm[q_d]).subs(lam, lam_star), force=True)), force=True)
    assert sp.simplify(gap) == 0, gap
    big_z_star = big_z.subs(lam, lam_star)
    return Tilt(lam_star, big_z_star, {"d": p_d.subs(lam, lam_star), "z": p_z.subs(lam, lam_star)}, -sp.log(big_z_star))


def multiplicative_closed_form() -> sp.Expr:
    """``-log(R + (1 + 1/alpha) q_d^(alpha/(1+alpha)) (alpha q_z)^(1/(1+alpha)))``.

    At the optimum ``q_d e^-lambda = alpha q_z e^(alpha lambda)``, a weighted geometric mean of
    ``q_d`` and ``alpha q_z``; the tilted mass of the pair is a weighted AM-GM gap below
    ``q_d + q_z``, which the library evaluates term by term (no cancellation).
    """
    w = q_d ** (alpha / (1 + alpha)) * (alpha * q_z) ** (1 / (1 + alpha))
    return -sp.log(R + (1 + 1 / alpha) * w)


def additive_tilt() -> Tilt:
    """``min KL(p||q)`` subject to ``p_z - p_d >= delta`` (``0 < delta < 1``).

    The tilt ``p = q e^(lambda (1_z - 1_d)) / Z`` with the active constraint
    ``E_p[1_z - 1_d] = delta``; in ``x = e^lambda`` that is the quadratic
    ``q_z (1 - delta) x^2 - delta R x - q_d (1 + delta) = 0``, whose roots have a negative
    product: one positive root. ``KL = lambda delta - log Z``.
    """
    big_z = R + q_z * x + q_d / x
    mean = (q_z * x - q_d / x) / big_z
    numer = sp.numer(sp.together(mean - delta))
    poly = sp.Poly(sp.expand(numer), x)
    roots = [r for r in sp.solve(poly.as_expr(), x) if _positive_root(r)]
    assert len(roots) == 1, roots
    root = sp.simplify(roots[0])
    cost = delta * sp.log(root) - sp.log(big_z.subs(x, root))
    p_d, p_z = (q_d / x / big_z).subs(x, root), (q_z * x / big_z).subs(x, root)
    return Tilt(sp.log(root), big_z.subs(x, root), {"d": p_d, "z": p_z, "quadratic": poly.as_expr()}, cost)


def _positive_root(r: sp.Expr) -> bool:
    """Whether a root of the additive quadratic is the positive one, checked at a sample point."""
    val = r.subs({q_d: sp.Rational(1, 2), q_z: sp.Rational(1, 4), R: sp.Rational(1, 4), delta: sp.Rational(1, 10)})
    return bool(sp.N(val) > 0)


def bernoulli_branch() -> Tilt:
    """``min KL(p||q)`` subject to ``p_d <= eps`` (``q_d > eps``): a tilt on ``d`` alone.

    ``p_d = q_d e^-lambda / Z``, ``Z = 1 - q_d + q_d e^-lambda``; ``p_d = eps`` fixes
    ``e^-lambda = eps (1 - q_d) / (q_d (1 - eps))`` and the cost is the Bernoulli divergence
    ``eps log(eps/q_d) + (1-eps) log((1-eps)/(1-q_d))``.
    """
    t = sp.Symbol("t", positive=True)  # e^-lambda
    big_z = 1 - q_d + q_d * t
    sol = sp.solve(sp.Eq(q_d * t / big_z, eps), t)
    assert len(sol) == 1, sol
    t_star = sp.simplify(sol[0])
    # KL = lambda E_p[a] - log Z with a = -1_d, lambda = -log t: eps log t - log Z.
    kl = eps * sp.log(t_star) - sp.log(big_z.subs(t, t_star))
    return Tilt(-sp.log(t_star), sp.simplify(big_z.subs(t, t_star)), {"d": eps}, kl)


def pool_kkt(k: int = 3, lift: bool = False) -> dict[str, sp.Expr | dict]:
    """KKT solution of a pool of ``k`` tokens with every order constraint active.

    ``lift=False`` (top-m): token 1 is the draft ``d``, tokens ``2..k`` competitors with
    ``p_z >= p_d`` (multipliers ``mu_z``): ``p_d = q_1 e^(-sum mu) / Z``, ``p_z = q_z e^(mu_z) / Z``.
    ``lift=True`` (trees): token 1 is the lifted token ``y`` with ``p_y >= p_z`` for tokens
    ``2..k``: ``p_y = q_1 e^(sum mu) / Z``, ``p_z = q_z e^(-mu_z) / Z``.
    All pooled masses equal ``G / Z`` with ``G`` the geometric mean of the pooled ``q``, so
    ``Z = R + k G`` and the cost is ``-log(R + k G) = -log(1 - (Q - k G))``. Dual feasibility
    ``mu_z >= 0`` reads ``q_z <= G`` (top-m: pool the competitors below the level) or
    ``q_z >= G`` (trees: pool the tokens above it).
    """
    qs = sp.symbols(f"q1:{k + 1}", positive=True)
    mus = sp.symbols(f"mu2:{k + 1}", real=True)
    sign = 1 if lift else -1
    log_first = sp.log(qs[0]) + sign * sum(mus)
    eqs = [sp.Eq(sp.log(qs[i]) - sign * mus[i - 1], log_first) for i in range(1, k)]
    sol = sp.solve(eqs, list(mus), dict=True)
    assert len(sol) == 1, sol
    level_log = sp.simplify(sp.expand_log(log_first.subs(sol[0]), force=True))
    g = sp.exp(level_log)
    big_q = sum(qs)
    return {
        "q": qs,
        "mu": {m: sp.simplify(sp.expand_log(v, force=True)) for m, v in sol[0].items()},
        "log_level": level_log,
        "geometric_mean": sp.prod(qs) ** sp.Rational(1, k),
        "normaliser": R + k * g,
        "cost": -sp.log(R + k * g),
        "pooled_mass": big_q,
    }


def swap_gain(p_a: sp.Expr, p_b: sp.Expr, q_a: sp.Expr, q_b: sp.Expr) -> sp.Expr:
    """``KL(p'||q) - KL(p||q)`` when ``p'`` swaps the target masses of tokens ``a`` and ``b``.

    Equals ``-(p_a - p_b)(log q_b - log q_a)``: moving the larger target mass onto the token the
    drafter likes more never costs more, which is why the runner-up is the cheapest competitor.
    """
    before = p_a * sp.log(p_a / q_a) + p_b * sp.log(p_b / q_b)
    after = p_b * sp.log(p_b / q_a) + p_a * sp.log(p_a / q_b)
    return sp.expand_log(after - before, force=True)


def typical_stationarity() -> dict[str, sp.Expr]:
    """Stationarity of ``KL(p||q) + mu (log p_d + H(p) - log delta) + nu (sum p - 1)`` off ``d``.

    ``d/dp_i = log(p_i/q_i) + 1 - mu (log p_i + 1) + nu = 0`` gives
    ``log p_i = (log q_i - 1 - nu + mu) / (1 - mu)``: ``p_i`` proportional to ``q_i^beta``
    with ``beta = 1/(1 - mu)`` (``beta >= 1`` for ``0 <= mu < 1``): a power transform of ``q``.
    """
    pi, qi = sp.symbols("p_i q_i", positive=True)
    lag = pi * sp.log(pi / qi) + mu * (-pi * sp.log(pi)) + nu * pi
    sol = sp.solve(sp.Eq(sp.diff(lag, pi), 0), pi)
    assert len(sol) == 1, sol
    log_p = sp.expand(sp.expand_log(sp.log(sol[0]), force=True))
    return {"p_i": sol[0], "log_p_i": log_p, "beta": sp.simplify(log_p.coeff(sp.log(qi)))}


def typical_constraint_split() -> dict[str, sp.Expr]:
    """With ``p = (s, (1 - s) r)``: ``log s + H(p) = (1 - s)(log(s / (1 - s)) + H(r))``.

    So the constraint ``p_d <= delta e^-H(p)`` reads ``(1-s)(logit s + H(r)) <= log delta``,
    and ``KL(p||q) = KL_b(s || q_d) + (1 - s) KL(r || qbar)``.
    """
    h_p = -s * sp.log(s) - (1 - s) * sp.log(1 - s) + (1 - s) * H_r
    lhs = sp.log(s) + h_p
    rhs = (1 - s) * (sp.log(s / (1 - s)) + H_r)
    return {"lhs": lhs, "rhs": rhs, "difference": sp.simplify(sp.expand_log(lhs - rhs, force=True))}


def gibbs_curve() -> dict[str, sp.Expr]:
    """The power family ``r_beta`` proportional to ``qbar^beta``: entropy and cost along ``beta``.

    With ``Lambda(beta) = log sum qbar^beta`` (``Lambda(1) = 0``): ``H = Lambda - beta Lambda'``,
    ``KL(r_beta || qbar) = (beta - 1) Lambda' - Lambda``. Along the family
    ``dKL/dH = -(1 - 1/beta)`` (minus the multiplier ``mu``), and ``d^2 KL / dH^2 =
    1 / (beta^3 Lambda'') > 0``: the cheapest cost of an entropy cap is convex and decreasing.
    """
    b = sp.Symbol("beta", positive=True)
    lam_f = sp.Function("Lambda")(b)
    h = lam_f - b * sp.diff(lam_f, b)
    kl = (b - 1) * sp.diff(lam_f, b) - lam_f
    slope = sp.simplify(sp.diff(kl, b) / sp.diff(h, b))
    curvature = sp.simplify(sp.diff(slope, b) / sp.diff(h, b))
    return {"entropy": h, "cost": kl, "slope": slope, "curvature": curvature}
