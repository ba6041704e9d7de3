"""The sympy derivations of ``companion.symbolic.certificates`` against independent numerics.

Each symbolic result is evaluated at numbers and compared with something computed another way
(scipy minimisation, the certificate engine, finite sums), so a wrong derivation fails here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import minimize

from companion import certificates, parse_criterion, per_token_cost, tree_certificate
from companion.symbolic import certificates as S
from companion.certify.bounds import margin_only_bound
from companion.certify.bounds import tree_quadratic_constant as tree_c_float

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


# -- chapter 2: the log 2 ceiling of every single-token criterion ---------------------------------

CEILING_SPECS = ["greedy", "additive:0.05", "additive:0.3", "multiplicative:0.1", "multiplicative:0.9", "topm:2",
                 "topk-delta:2,0.2", "typical:0.09,0.3", "typical:0.3,0.9", "typical:1,5"]


def test_ceiling_drafter_symbolic():
    for n in (2, 3, 5):
        ex = S.ceiling_drafter(n)
        ps = ex["p"]
        for i, gap in enumerate(ex["gaps"], start=1):
            # q_y - q_i - p_y is half the mass of the tokens other than y and i: a sum of positives
            assert sp.simplify(gap - (sum(ps) - ps[0] - ps[i]) / 2) == 0
        assert S.identical(ex["kl"], S.ceiling_kl(ps[0]))
        assert S.identical(ex["reverse_kl"], S.ceiling_reverse_kl(ps[0]))
    py = sp.Symbol("p_y", positive=True)
    assert S.identical(S.ceiling_slack(py), py * sp.log((1 + py) / (2 * py)))
    assert sp.simplify((1 + py) / (2 * py) - 1 - (1 - py) / (2 * py)) == 0
    assert sp.limit(S.ceiling_kl(py), py, 0, "+") == sp.log(2)
    assert S.ceiling_kl(py).subs(py, 1) == 0
    assert sp.limit(S.ceiling_reverse_kl(py), py, 0, "+") == sp.oo
    assert not S.identical(S.ceiling_kl(py), (1 - py) * sp.log(2))


def test_ceiling_drafter_numeric():
    """The mixture drafter, computed in numpy: y is a maximiser, the KLs are the closed forms,
    and the exact per-token cost (engine and SLSQP) never exceeds them."""
    py = sp.Symbol("p_y", positive=True)
    fwd = sp.lambdify(py, S.ceiling_kl(py), "math")
    rev = sp.lambdify(py, S.ceiling_reverse_kl(py), "math")
    rng = np.random.default_rng(7)
    for trial in range(12):
        v = int(rng.integers(2, 7))
        p = rng.dirichlet(np.full(v, [0.1, 1.0, 5.0][trial % 3]))
        p = np.clip(p, 1e-9, None)
        p /= p.sum()
        pt = torch.tensor(p, dtype=torch.float64)
        for y in range(v):
            q = p / 2
            q[y] += 0.5
            assert q[y] == q.max() and np.all(q[y] - np.delete(q, y) >= p[y] - 1e-15)
            kl = float(np.sum(p * np.log(p / q)))
            assert kl == pytest.approx(fwd(p[y]), rel=1e-10, abs=1e-14)
            assert float(np.sum(q * np.log(q / p))) == pytest.approx(rev(p[y]), rel=1e-10)
            assert kl <= (1 - p[y]) * math.log(2) + 1e-15
            assert float(per_token_cost(pt, y)) <= kl * (1 + 1e-12) + 1e-15
            if v <= 4 and trial < 6:
                assert _numeric_forward_cost(p, y) <= kl + 1e-9


def _hyp_targets():
    """Distributions over 2..10 tokens, half of them from a grid with zeros and tiny entries
    (point masses, exact ties, tiny boundary tokens)."""
    return st.integers(2, 10).flatmap(
        lambda v: st.one_of(
            arrays(np.float64, v, elements=st.floats(0.0, 1.0)),
            arrays(np.float64, v, elements=st.sampled_from([0.0, 1e-12, 1e-6, 0.05, 0.3, 1.0])),
        )
    ).filter(lambda a: a.sum() > 0).map(lambda a: a / a.sum())


@given(p=_hyp_targets())
@settings(max_examples=200, deadline=None)
def test_every_finite_certificate_below_ceiling_property(p):
    """rho* <= KL(p || (p + e_{y*})/2) <= (1 - p_{y*}) log 2 <= log 2 for every criterion; +inf
    exactly when nothing is rejected. Under each tie convention, against the rejection region of
    that same convention (``y*`` its most likely token)."""
    pt = torch.tensor(p, dtype=torch.float64)
    crits = [c for c in map(parse_criterion, CEILING_SPECS) if _fits(c, len(p))]
    for ties in ("worst", "level-set"):
        certs = certificates(pt, crits, ("forward",), ties=ties)
        for c in crits:
            rho = float(certs[(str(c), "forward")])
            rejected = c.rejection_mask(pt, ties=ties)
            assert math.isinf(rho) == (not bool(rejected.any())), (ties, str(c))
            if math.isinf(rho):
                continue
            boundary = float(pt[rejected].max())
            mix = (1 - boundary) * math.log(2) + (boundary * math.log(2 * boundary / (1 + boundary))
                                                  if boundary else 0.0)
            assert rho <= mix * (1 + 1e-12) + 1e-15, (ties, str(c))
            assert mix <= (1 - boundary) * math.log(2) * (1 + 1e-15) + 1e-15
            assert rho <= math.log(2) * (1 + 1e-12), (ties, str(c))


def _fits(c, vocab: int) -> bool:
    try:
        c.check_vocab(vocab)
    except ValueError:
        return False
    return True


# -- chapter 4: the two-point lemma ----------------------------------------------------------------


def _numeric_pair_relaxation(p: np.ndarray, y: int) -> tuple[float, np.ndarray]:
    """min KL(p||q) s.t. q_y >= q_0 only, by SLSQP on softmax logits."""
    cons = [{"type": "ineq", "fun": lambda t: t[y] - t[0]}]

    def f(t: np.ndarray) -> float:
        lq = t - t.max() - np.log(np.exp(t - t.max()).sum())
        return float(np.sum(p * (np.log(p) - lq)))

    res = minimize(f, np.log(p), method="SLSQP", constraints=cons, options={"ftol": 1e-15, "maxiter": 500})
    q = np.exp(res.x - res.x.max())
    return float(res.fun), q / q.sum()


def test_pair_relaxation_kkt_symbolic():
    for n in (3, 4, 5):
        ex = S.pair_relaxation_kkt(n)
        sol, ps, qs = ex["solution"], ex["p"], ex["q"]
        assert sol[S.lam] == 1
        assert sp.simplify(sol[qs[0]] - (ps[0] + ps[1]) / 2) == 0
        assert sp.simplify(sol[qs[1]] - (ps[0] + ps[1]) / 2) == 0
        for i in range(2, n - 1):
            assert sol[qs[i]] == ps[i]
        assert sp.simplify(sol[ex["mu"]] - (ps[0] - ps[1]) / (ps[0] + ps[1])) == 0
        assert S.identical(ex["cost"], S.two_point_forward(ps[0], ps[1]))
        assert S.identical(ex["cost"], S.greedy_forward(ps[0] + ps[1], ps[0] - ps[1]))


@pytest.mark.parametrize("seed", range(3))
def test_pair_relaxation_matches_slsqp(seed):
    rng = np.random.default_rng(300 + seed)
    p = np.sort(rng.dirichlet(np.full(6, 0.8)))[::-1].copy()
    for y in range(1, 6):
        val, q = _numeric_pair_relaxation(p, y)
        pair = float(S.two_point_forward(sp.Float(p[0], 30), sp.Float(p[y], 30)))
        assert val == pytest.approx(pair, abs=1e-8)
        mean = (p[0] + p[y]) / 2
        expected_q = p.copy()
        expected_q[[0, y]] = mean
        assert np.max(np.abs(q - expected_q)) < 1e-4
        # the full problem (all constraints) costs at least as much
        assert float(per_token_cost(torch.tensor(p, dtype=torch.float64), y)) >= pair - 1e-12


@pytest.mark.parametrize("k", [3, 4, 5])
def test_pool_excess_identity(k):
    excess, kl, _ = S.pool_excess(k)
    assert S.identical(excess, kl)


@pytest.mark.parametrize("seed", range(3))
def test_pool_excess_against_engine(seed):
    """C(p, y) - pair cost, from the engine, equals P_A KL(grouped || (2, 1, ..)/k) on the scanned pool."""
    rng = np.random.default_rng(400 + seed)
    p = np.sort(rng.dirichlet(np.full(7, 30.0)))[::-1].copy()   # flat: big pools
    pt = torch.tensor(p, dtype=torch.float64)
    seen = 0
    for r in range(1, 7):
        pool = _scan_pool(p, r, geometric=False)
        k = len(pool)
        if k < 3:
            continue
        seen += 1
        between = [i for i in pool if i not in (0, r)]
        _, kl, syms = S.pool_excess(k)
        val = float(kl.subs(dict(zip(syms, [p[0], p[r], *p[between]]))))
        pair = float(S.two_point_forward(sp.Float(p[0], 30), sp.Float(p[r], 30)))
        assert float(per_token_cost(pt, r)) - pair == pytest.approx(val, rel=1e-9, abs=1e-13)
        assert val > 0
    assert seen >= 3


def test_threshold_floor_exact_bounds_and_is_attained():
    from companion import certificate, parse_criterion

    p1s, taus = sp.symbols("p1 tau", positive=True)
    floor = sp.lambdify((p1s, taus), S.threshold_floor_exact(p1s, taus), "math")
    # the multiplicative exact floor is the special case tau = alpha p1
    a = sp.Symbol("alpha", positive=True)
    assert S.identical(S.threshold_floor_exact(p1s, a * p1s).subs(sp.Min(a * p1s, 1 - p1s), a * p1s),
                       S.multiplicative_floor_exact(a, p1s))
    rng = np.random.default_rng(5)
    for spec in ("additive:0.3", "multiplicative:0.1", "multiplicative:0.5", "typical:0.09,0.3"):
        c = parse_criterion(spec)
        p = torch.tensor(rng.dirichlet(np.full(16, 0.3), size=400), dtype=torch.float64)
        rho = certificate(p, c)
        tau, top1 = c.threshold(p), p.max(-1).values
        ok = torch.isfinite(rho) & (tau <= top1) & (tau > 0)
        lower = torch.tensor([floor(float(x), float(t)) for x, t in zip(top1[ok], tau[ok])], dtype=torch.float64)
        assert bool((lower <= rho[ok] * (1 + 1e-9) + 1e-15).all())
        assert int(ok.sum()) > 50
    # attained: top token p1, boundary token just below min(tau, 1 - p1), the rest spread thinly
    for p1, alpha in ((0.5, 0.1), (0.8, 0.5), (0.3, 0.9)):
        b = min(alpha * p1, 1 - p1) - 1e-9
        rest = 1 - p1 - b
        n_rest = 400
        target = torch.tensor([p1, b] + [rest / n_rest] * n_rest, dtype=torch.float64)
        if rest / n_rest >= b:
            continue
        rho = float(certificate(target, f"multiplicative:{alpha}"))
        assert rho == pytest.approx(floor(p1, alpha * p1), abs=1e-6)


# -- chapter 6: speculative sampling and Pinsker ---------------------------------------------------


def test_speculative_sampling_cases_all_zero():
    cases = S.speculative_sampling_cases(3)
    assert len(cases) == 12   # 3^3 patterns minus those without an up or without a down token
    for case in cases:
        assert case["accept_minus_summin"] == 0
        assert case["accept_minus_one_minus_tv"] == 0
        assert all(d == 0 for d in case["output_minus_p"])


def test_speculative_sampling_law_numeric():
    """The same formulas in numpy on random pairs: acceptance = 1 - TV (library), output law = p."""
    from companion.certify.stochastic import acceptance_probability, total_variation

    rng = np.random.default_rng(9)
    for _ in range(50):
        v = int(rng.integers(2, 9))
        p, q = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
        accept = float(np.sum(q * np.minimum(1, p / q)))
        resid = np.clip(p - q, 0, None)
        law = q * np.minimum(1, p / q) + (1 - accept) * resid / resid.sum()
        assert np.max(np.abs(law - p)) < 1e-14
        pt, qt = torch.tensor(p), torch.tensor(q)
        assert accept == pytest.approx(float(acceptance_probability(pt, qt)), abs=1e-14)
        assert accept == pytest.approx(1 - float(total_variation(pt, qt)), abs=1e-14)


def test_kl_chain_rule():
    for n, group in ((3, 2), (4, 2), (4, 3)):
        diff, within, syms = S.kl_chain_rule(n, group)
        assert S.identical(diff, within)
        rng = np.random.default_rng(n + group)
        vals = rng.uniform(0.01, 1, size=2 * n)
        sub = dict(zip(syms, vals))
        ps, qs = vals[:n], vals[n:]
        direct = np.sum(ps * np.log(ps / qs))
        pg, qg = ps[:group].sum(), qs[:group].sum()
        grouped = pg * np.log(pg / qg) + np.sum(ps[group:] * np.log(ps[group:] / qs[group:]))
        assert float(within.subs(sub)) == pytest.approx(direct - grouped, rel=1e-10)
        assert float(within.subs(sub)) >= 0


def test_swap_example_against_library():
    from companion import certificate, kl_divergence
    from companion.certify.stochastic import acceptance_probability, total_variation

    eta = sp.Symbol("eta", positive=True)
    ex = S.swap_example(eta)
    # sympy cannot see 1 - 2 eta > 0; with eta = (1 - w)/(2 (1 + w)), w = p_2/p_1 in (0, 1), it can
    w = sp.Symbol("w", positive=True)
    closed = 2 * eta * sp.log((1 + 2 * eta) / (1 - 2 * eta))
    assert S.identical((ex["kl"] - closed).subs(eta, (1 - w) / (2 * (1 + w))), 0)
    assert not S.identical((ex["kl"] - closed / 2).subs(eta, (1 - w) / (2 * (1 + w))), 0)
    assert ex["tv"] == 2 * eta and ex["accept"] == 1 - 2 * eta
    kl_series = sp.series(ex["kl"], eta, 0, 6).removeO()
    assert sp.limit(ex["kl"] / ex["certificate"], eta, 0) == 4
    # sqrt(KL/2) from the KL series (its O(eta^6) remainder moves it by O(eta^5)); also numerically below
    assert sp.series(1 - sp.sqrt(kl_series / 2) - ex["accept"], eta, 0, 5).removeO() == -sp.Rational(4, 3) * eta**3
    for e in (1e-3, 0.05, 0.3):
        p = torch.tensor([0.5 + e, 0.5 - e], dtype=torch.float64)
        q = p.flip(0)
        assert float(kl_divergence(p, q)) == pytest.approx(float(ex["kl"].subs(eta, e)), rel=1e-10)
        assert float(kl_divergence(p, q, "reverse")) == pytest.approx(float(ex["kl"].subs(eta, e)), rel=1e-10)
        assert float(total_variation(p, q)) == pytest.approx(2 * e, rel=1e-12)
        assert float(acceptance_probability(p, q)) == pytest.approx(1 - 2 * e, rel=1e-12)
        assert float(certificate(p, "greedy")) == pytest.approx(float(ex["certificate"].subs(eta, e)), rel=1e-9)
        assert float(ex["pinsker"].subs(eta, e)) <= 1 - 2 * e
        if e < 0.01:
            gap = float(ex["pinsker"].subs(eta, sp.Float(e, 40))) - (1 - 2 * e)
            assert gap == pytest.approx(-4 / 3 * e**3, rel=1e-3)


# --- Topsoe's discriminations (chapter 3) ------------------------------------------------------

def test_capacitory_and_triangular_discrimination_match_numerics() -> None:
    import math

    P, Q = [0.7, 0.2, 0.1], [0.1, 0.3, 0.6]
    M = [(a + b) / 2 for a, b in zip(P, Q)]
    kl = lambda x, y: sum(a * math.log(a / b) for a, b in zip(x, y))  # noqa: E731
    assert math.isclose(float(S.capacitory_discrimination(P, Q)), kl(P, M) + kl(Q, M), rel_tol=1e-12)
    tri = sum((a - b) ** 2 / (a + b) for a, b in zip(P, Q))
    assert math.isclose(float(S.triangular_discrimination(P, Q)), tri, rel_tol=1e-12)
    # Topsoe's inequality Delta_tri/2 <= C <= (ln 2) Delta_tri on this pair
    c = float(S.capacitory_discrimination(P, Q))
    assert tri / 2 <= c <= math.log(2) * tri, (tri, c)


def test_greedy_certificate_is_half_s_times_the_capacitory_discrimination_of_the_swapped_pair() -> None:
    p1, p2 = sp.symbols("p_1 p_2", positive=True)
    s = p1 + p2
    P, Q = [p1 / s, p2 / s], [p2 / s, p1 / s]
    assert S.identical(s / 2 * S.capacitory_discrimination(P, Q), S.two_point_forward(p1, p2))
    assert sp.simplify(S.triangular_discrimination(P, Q) - 2 * (p1 - p2) ** 2 / s**2) == 0


def test_brute_force_oracle_tie_conventions_on_the_counter_example():
    """``companion.certify.oracle`` with ``ties`` on ``p = [0.4, 0.4, 0.2]`` against closed forms: the
    worst case rejects every token under greedy (tied top: some tie-break rejects each maximiser),
    so its certificate is 0 and the width-1 tree's too; the level-set rule rejects only the third
    token, whose cost pools all three: ``0.8 log 1.2 + 0.2 log 0.6`` (forward) and
    ``-log(3 (0.4 * 0.4 * 0.2)^(1/3))`` (reverse). The engine agrees under each convention."""
    from companion.certify.oracle import brute_force_certificate, brute_force_tree_certificate, rejected_tokens

    p = np.array([0.4, 0.4, 0.2])
    assert rejected_tokens(p, "greedy", ties="worst").tolist() == [0, 1, 2]
    assert rejected_tokens(p, "greedy").tolist() == [2]
    closed = {"forward": 0.8 * math.log(1.2) + 0.2 * math.log(0.6),
              "reverse": -math.log(3 * (0.4 * 0.4 * 0.2) ** (1 / 3))}
    pt = torch.tensor(p, dtype=torch.float64)
    for div, value in closed.items():
        assert brute_force_certificate(p, "greedy", div) == pytest.approx(0.0, abs=1e-9)
        assert brute_force_tree_certificate(p, 1, div, ties="worst") == pytest.approx(0.0, abs=1e-9)
        assert brute_force_certificate(p, "greedy", div, ties="level-set") == pytest.approx(value, abs=1e-8)
        assert brute_force_tree_certificate(p, 1, div) == pytest.approx(value, abs=1e-8)
        engine = certificates(pt, ["greedy"], [div], tree_widths=[1], ties="level-set")
        assert float(engine[("greedy", div)]) == pytest.approx(value, rel=1e-12)
        assert float(engine[("tree:1", div)]) == pytest.approx(value, rel=1e-12)
        assert float(certificates(pt, ["greedy"], [div])[("greedy", div)]) == 0.0
    with pytest.raises(ValueError, match="ties must be"):
        rejected_tokens(p, "greedy", ties="first")
