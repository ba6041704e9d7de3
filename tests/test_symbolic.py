"""The sympy derivations of ``companion.symbolic`` against independent numerics.

Each symbolic result is evaluated at numbers and compared with something computed another way
(scipy minimisation, the certificate engine, finite sums), so a wrong derivation fails here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch
from scipy.optimize import minimize

from companion import per_token_cost, tree_certificate
from companion import symbolic as S
from companion.bounds import margin_only_bound
from companion.figures.theory import tree_quadratic_constant as tree_c_float

u = sp.Symbol("u", positive=True)
g = sp.Symbol("gamma", positive=True)
s_sym, d_sym = sp.symbols("s Delta", positive=True)
m_sym = sp.Symbol("m", positive=True)


def _scan_pool(p_sorted: np.ndarray, r: int, geometric: bool) -> list[int]:
    """Pool for the token at sorted position r: top tokens added while above the current level."""
    pool = [r]
    for j in range(r):
        vals = p_sorted[pool]
        level = math.exp(np.log(vals).mean()) if geometric else vals.mean()
        if p_sorted[j] > level:
            pool.append(j)
        else:
            break
    return sorted(pool)


def _numeric_forward_cost(p: np.ndarray, y: int) -> float:
    """min KL(p||q) s.t. q_y >= q_z by SLSQP on softmax logits (independent of the pooling)."""
    v = len(p)
    cons = [{"type": "ineq", "fun": (lambda t, z=z: t[y] - t[z])} for z in range(v) if z != y]

    def f(t: np.ndarray) -> float:
        lq = t - np.log(np.exp(t - t.max()).sum()) - t.max()
        return float(np.sum(p * (np.log(p) - lq)))

    res = minimize(f, np.log(p), method="SLSQP", constraints=cons, options={"ftol": 1e-14, "maxiter": 500})
    return float(res.fun)


# -- chapter 2: KKT ------------------------------------------------------------------------


def test_forward_pool_kkt_solution():
    fwd = S.forward_pool_kkt()
    assert fwd.multiplier == 1
    assert sp.simplify(fwd.level - S.P_A / S.k) == 0
    assert sp.simplify(fwd.off_pool - S.p_i) == 0


@pytest.mark.parametrize("seed", range(4))
def test_forward_pool_cost_matches_numeric_minimum(seed):
    rng = np.random.default_rng(seed)
    p = np.sort(rng.dirichlet(np.full(6, 0.7)))[::-1].copy()
    fwd = S.forward_pool_kkt()
    for r in range(1, 6):
        pool = _scan_pool(p, r, geometric=False)
        kk = len(pool)
        expr = fwd.cost.subs(S.k, kk).doit()
        expr = expr.subs({S.p_idx[i + 1]: sp.Float(p[a], 30) for i, a in enumerate(pool)})
        expr = expr.subs(S.P_A, sp.Float(p[pool].sum(), 30))
        assert float(expr) == pytest.approx(_numeric_forward_cost(p, r), abs=2e-7)


def test_reverse_pool_kkt_cost_and_level():
    rev = S.reverse_pool_kkt()
    target = -sp.log(1 - (S.P_A - S.k * S.G_A))
    assert sp.simplify(rev.cost - target) == 0
    assert sp.simplify(rev.level - rev.multiplier * S.G_A) == 0


@pytest.mark.parametrize("seed", range(3))
def test_reverse_pool_cost_matches_engine(seed):
    rng = np.random.default_rng(100 + seed)
    p = np.sort(rng.dirichlet(np.full(7, 0.8)))[::-1].copy()
    rev = S.reverse_pool_kkt()
    pt = torch.tensor(p, dtype=torch.float64)
    for r in range(1, 7):
        pool = _scan_pool(p, r, geometric=True)
        val = rev.cost.subs({S.k: len(pool), S.P_A: float(p[pool].sum()),
                             S.G_A: float(np.exp(np.log(p[pool]).mean()))})
        assert float(val) == pytest.approx(float(per_token_cost(pt, r, "reverse")), rel=1e-9, abs=1e-12)


def test_explicit_kkt_multipliers():
    ex = S.forward_kkt_explicit(4, 3)
    sol, ps, qs, mus = ex["solution"], ex["p"], ex["q"], ex["mu"]
    mean = ex["pool_mean"]
    assert sol[S.lam] == 1
    for i in range(3):
        assert sp.simplify(sol[qs[i]] - mean) == 0
    for z in range(2):
        assert sp.simplify(sol[mus[z]] - (ps[z] / mean - 1)) == 0
    assert sp.simplify(sol[qs[3]] - ps[3].subs(ex["subs"])) == 0


def test_explicit_tree_kkt_multipliers():
    ex = S.tree_kkt_explicit(5, 3, 2)
    sol, ps, qs, mus = ex["solution"], ex["p"], ex["q"], ex["mu"]
    assert sol[S.lam] == 1
    for i in [0] + ex["active"]:
        assert sp.simplify(sol[qs[i]] - ex["pool_mean"]) == 0
    for mu, z in zip(mus, ex["active"]):
        assert sp.simplify(sol[mu] - (1 - ps[z] / ex["pool_mean"])) == 0
    assert sol[qs[1]] == ps[1]


# -- monotonicity ----------------------------------------------------------------------------


def test_two_point_derivatives():
    a, b = sp.symbols("a b", positive=True)
    d = sp.diff(S.two_point_forward(a, b), b)
    assert sp.simplify(d - sp.log(2 * b / (a + b))) == 0
    x, y = sp.symbols("x y", positive=True)
    dr = sp.diff(S.two_point_reverse(a, b), b).subs({a: x**2, b: y**2})
    assert sp.simplify(dr + (x - y) / (y * (1 - (x - y) ** 2))) == 0


def test_exchange_gains():
    py, pz, qy, qz = sp.symbols("p_y p_z q_y q_z", positive=True)
    fwd = S.exchange_gain_forward(py, pz, qy, qz)
    rev = S.exchange_gain_reverse(py, pz, qy, qz)
    assert sp.simplify(sp.expand_log(fwd - (py - pz) * (sp.log(qy) - sp.log(qz)), force=True)) == 0
    assert sp.simplify(sp.expand_log(rev - (qz - qy) * (sp.log(pz) - sp.log(py)), force=True)) == 0
    rng = np.random.default_rng(0)
    for _ in range(50):
        vals = rng.uniform(0.01, 1, size=4)
        p_hi, p_lo = sorted(vals[:2], reverse=True)
        q_lo, q_hi = sorted(vals[2:])
        assert float(fwd.subs({py: p_hi, pz: p_lo, qy: q_lo, qz: q_hi})) <= 1e-12
        assert float(rev.subs({py: p_hi, pz: p_lo, qy: q_lo, qz: q_hi})) <= 1e-12


# -- chapter 3 -------------------------------------------------------------------------------


def test_greedy_closed_form_is_two_point_cost():
    expr = S.greedy_forward(s_sym, d_sym) - S.two_point_forward((s_sym + d_sym) / 2, (s_sym - d_sym) / 2)
    assert sp.simplify(sp.expand_log(expr, force=True)) == 0
    for s_val, d_val in [(0.3, 0.1), (1.0, 0.5), (0.7, 0.69)]:
        direct = S.greedy_forward(s_sym, d_sym).subs({s_sym: s_val, d_sym: d_val})
        assert float(direct) == pytest.approx(s_val * float(S.phi(1, d_val / s_val)), rel=1e-12)


def test_margin_series_general_term():
    series = S.margin_series(S.greedy_forward(s_sym, d_sym), d_sym, 11)
    expected = sum(d_sym ** (2 * k) / (2 * k * (2 * k - 1) * s_sym ** (2 * k - 1)) for k in range(1, 6))
    assert sp.simplify(series - expected) == 0


def test_phi1_bounds_by_convexity():
    f = S.phi(1, u)
    assert sp.simplify(sp.diff(f, u, 2) - 1 / (1 - u**2)) == 0
    h = u * sp.diff(f, u) - 2 * f
    assert sp.simplify(sp.diff(h, u, 2) - 2 * u**2 / (1 - u**2) ** 2) == 0
    assert sp.limit(f, u, 1, "-") == sp.log(2)
    grid = np.linspace(1e-4, 1 - 1e-9, 2000)
    vals = np.array([float(f.subs(u, x)) for x in grid[::50]])
    assert np.all(vals >= grid[::50] ** 2 / 2 - 1e-15)
    assert np.all(vals <= math.log(2) * grid[::50] ** 2 + 1e-15)


def test_perspective_slope():
    assert S.identical(S.perspective_slope(u), sp.log(1 - u**2) / 2)
    assert not S.identical(S.perspective_slope(u), sp.log(1 - u**2))


# -- chapter 4 -------------------------------------------------------------------------------


def test_multiplicative_floors():
    a, p1 = sp.symbols("alpha p1", positive=True)
    assert sp.simplify(S.multiplicative_floor_expr(a, p1) - (1 - a) ** 2 * p1 / (2 * (1 + a))) == 0
    exact = S.multiplicative_floor_exact(a, p1)
    via_phi = (1 + a) * p1 * S.phi(1, (1 - a) / (1 + a))
    for av, pv in [(0.1, 0.5), (0.3, 0.7), (0.9, 0.2)]:
        assert float(exact.subs({a: av, p1: pv})) == pytest.approx(float(via_phi.subs({a: av, p1: pv})), rel=1e-12)
        assert float(exact.subs({a: av, p1: pv})) >= float(S.multiplicative_floor_expr(av, pv))


def test_additive_floor_exact_is_limit_of_targets():
    delta = 0.3
    eps = 1e-10
    p = torch.tensor([(1 + delta) / 2, (1 - delta) / 2 - eps, eps], dtype=torch.float64)
    from companion import certificate

    assert float(certificate(p, f"additive:{delta}")) == pytest.approx(float(S.additive_floor_exact(delta)), abs=1e-8)
    assert float(S.additive_floor_exact(delta)) > delta**2 / 2


# -- chapter 5 -------------------------------------------------------------------------------


def test_phi_series_coefficients_symbolic_m():
    series = S.margin_series(S.phi(m_sym, g), g, 7)
    for n in range(2, 7):
        assert sp.simplify(series.coeff(g, n) - S.phi_series_coefficient(m_sym, n)) == 0
    assert sp.simplify(series.coeff(g, 2) - m_sym / 2) == 0


def test_phi_matches_engine_and_extremal_target():
    for m in (1, 2, 4, 8):
        for gam in (0.05, 0.4, 0.9):
            top = (1 + m * gam) / (m + 1)
            comp = (1 - gam) / (m + 1)
            p = torch.tensor([top] + [comp] * m + [0.0], dtype=torch.float64)
            assert float(tree_certificate(p, m)) == pytest.approx(float(S.phi(m, gam)), rel=1e-10)
            assert float(S.tree_extremal_cost(m, gam)) == pytest.approx(float(S.phi(m, gam)), rel=1e-12)
            assert float(margin_only_bound(gam, m)) == pytest.approx(float(S.phi(m, gam)), rel=1e-12)


def test_tree_perspective_slope_nonpositive():
    expr = S.tree_perspective_slope(m_sym, u)
    assert S.identical(expr, (sp.log(1 + m_sym * u) + m_sym * sp.log(1 - u)) / (m_sym + 1))
    for m in (1, 2, 8):
        for x in (0.01, 0.5, 0.99):
            assert float(expr.subs({m_sym: m, u: x})) < 0


@pytest.mark.parametrize("m", [2, 3, 5, 8, 16])
def test_tree_quadratic_constant_is_global_minimum(m):
    ratio = S.phi(m, g) / g**2
    star = sp.Rational(m - 1, m)
    assert sp.simplify(sp.diff(ratio, g).subs(g, star)) == 0
    c_m = S.tree_quadratic_constant(m)
    assert sp.simplify(ratio.subs(g, star) - c_m) == 0
    grid = np.linspace(1e-4, 1 - 1e-12, 20001)
    phi_num = margin_only_bound(torch.tensor(grid), m).numpy()
    assert np.min(phi_num / grid**2) >= float(c_m) - 1e-9
    assert tree_c_float(m) == pytest.approx(float(c_m), rel=1e-14)


def test_secondary_quadratic_valid_exactly_for_m_up_to_6():
    for m in range(1, 17):
        valid_symbolic = bool((m + 1) / sp.Integer(4) <= S.tree_quadratic_constant(m))
        grid = torch.linspace(0, 1, 100001, dtype=torch.float64)
        diff = margin_only_bound(grid, m) - S.tree_secondary_leading(m, grid)
        valid_numeric = bool((diff >= -1e-12).all())
        assert valid_symbolic == valid_numeric == (m <= 6)
    # m = 8 fails already at the one-hot target.
    assert sp.log(9) < sp.Rational(9, 4)
