"""The sympy derivations of ``companion.symbolic.drafter_side``: identities proved symbolically, and
each derived expression evaluated at numbers against the library and independent numerics."""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp
import torch

from companion.symbolic import certificates as target_side
from companion.symbolic import drafter_side as S
from companion.drafter.certificates import drafter_certificate
from companion.symbolic.certificates import identical


def _rows(seed: int = 0, n: int = 12, v: int = 6) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    scale = torch.exp(torch.linspace(-1, 2, n, dtype=torch.float64)).unsqueeze(1)
    return torch.softmax(scale * torch.randn(n, v, generator=gen, dtype=torch.float64), -1)


def _top2_rest(q: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s = q.sort(-1, descending=True).values
    return s[:, 0].numpy(), s[:, 1].numpy(), s[:, 2:].sum(-1).numpy()


def test_greedy_is_the_target_side_reverse_formula_on_q() -> None:
    a, b = sp.symbols("a b", positive=True)
    assert identical(S.greedy_drafter(a, b), target_side.two_point_reverse(a, b))


def test_multiplicative_tilt() -> None:
    tilt = S.multiplicative_tilt()
    assert identical(tilt.multiplier, sp.log(S.q_d / (S.alpha * S.q_z)) / (1 + S.alpha))
    # the optimum sits on the constraint: p_d = alpha p_z
    gap = (tilt.masses["d"] - S.alpha * tilt.masses["z"]).subs({S.q_d: 0.6, S.q_z: 0.3, S.R: 0.1, S.alpha: 0.37})
    assert abs(float(gap)) < 1e-14
    # alpha = 1 is strict greedy (R = 1 - q_d - q_z)
    at_one = tilt.cost.subs(S.alpha, 1).subs(S.R, 1 - S.q_d - S.q_z)
    assert sp.simplify(sp.exp(-at_one) - sp.exp(-S.greedy_drafter())) == 0
    # the tilt's value, its weighted-AM-GM closed form and the library agree
    f_tilt = sp.lambdify((S.q_d, S.q_z, S.R, S.alpha), tilt.cost, "numpy")
    f_closed = sp.lambdify((S.q_d, S.q_z, S.R, S.alpha), S.multiplicative_closed_form(), "numpy")
    q = _rows()
    qd, qz, rest = _top2_rest(q)
    for a in (0.05, 0.3, 0.8):
        ours = drafter_certificate(q, f"multiplicative:{a}").numpy()
        np.testing.assert_allclose(f_tilt(qd, qz, rest, a), ours, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(f_closed(qd, qz, rest, a), ours, rtol=1e-10, atol=1e-14)


def test_additive_tilt() -> None:
    tilt = S.additive_tilt()
    x = sp.exp(tilt.multiplier)
    # the root solves the stationarity quadratic, and E_p[1_z - 1_d] = delta there
    vals = {S.q_d: 0.5, S.q_z: 0.3, S.R: 0.2, S.delta: 0.25}
    assert abs(float(tilt.masses["quadratic"].subs(S.x, x).subs(vals))) < 1e-14
    assert abs(float((tilt.masses["z"] - tilt.masses["d"]).subs(vals)) - 0.25) < 1e-14
    # delta = 0 recovers strict greedy
    at_zero = tilt.cost.subs(S.delta, 0).subs(S.R, 1 - S.q_d - S.q_z)
    assert sp.simplify(sp.exp(-at_zero) - sp.exp(-S.greedy_drafter())) == 0
    f = sp.lambdify((S.q_d, S.q_z, S.R, S.delta), tilt.cost, "numpy")
    q = _rows(1)
    qd, qz, rest = _top2_rest(q)
    for d in (0.05, 0.3, 0.7):
        np.testing.assert_allclose(f(qd, qz, rest, d), drafter_certificate(q, f"additive:{d}").numpy(),
                                   rtol=1e-9, atol=1e-14)


def test_bernoulli_branch() -> None:
    tilt = S.bernoulli_branch()
    bern = S.eps * sp.log(S.eps / S.q_d) + (1 - S.eps) * sp.log((1 - S.eps) / (1 - S.q_d))
    for qd, e in ((0.9, 0.09), (0.5, 0.3), (0.31, 0.3)):
        assert float(tilt.cost.subs({S.q_d: qd, S.eps: e})) == pytest.approx(float(bern.subs({S.q_d: qd, S.eps: e})),
                                                                              rel=1e-13)
    # With a loose entropy cap the typical certificate is this Bernoulli projection.
    q = torch.tensor([[0.7, 0.2, 0.1]], dtype=torch.float64)
    assert float(drafter_certificate(q, "typical:0.2,50")) == pytest.approx(
        float(bern.subs({S.q_d: 0.7, S.eps: 0.2})), rel=1e-12)


@pytest.mark.parametrize("lift", [False, True])
def test_pool_kkt(lift: bool) -> None:
    sol = S.pool_kkt(3, lift=lift)
    q1, q2, q3 = sol["q"]
    assert identical(sol["log_level"], (sp.log(q1) + sp.log(q2) + sp.log(q3)) / 3)
    # dual feasibility: mu_z >= 0 iff q_z <= G (top-m) or q_z >= G (trees)
    g = sol["geometric_mean"]
    for mu_z, qz in zip(sol["mu"].values(), (q2, q3)):
        sign = -1 if lift else 1
        assert identical(mu_z, sign * (sp.log(g) - sp.log(qz)))
    # The library on a case whose pool is exactly these three tokens. top-m:2 pools d with both
    # competitors (both below the level G); tree:2 lifts q(3) with both top tokens (both above).
    vals = [0.40, 0.35, 0.15, 0.10] if lift else [0.50, 0.20, 0.20, 0.10]
    spec = "tree:2" if lift else "topm:2"
    pooled = vals[:3]
    gm = math.exp(sum(math.log(x) for x in pooled) / 3)
    others = pooled[:2] if lift else pooled[1:]
    assert all((x >= gm) if lift else (x <= gm) for x in others)
    expr = sol["cost"].subs(S.R, 1 - sum(pooled)).subs(dict(zip(sol["q"], pooled)))
    q = torch.tensor([vals], dtype=torch.float64)
    assert float(drafter_certificate(q, spec)) == pytest.approx(float(expr), rel=1e-12)


def test_swap_gain() -> None:
    pa, pb, qa, qb = sp.symbols("p_a p_b q_a q_b", positive=True)
    assert identical(S.swap_gain(pa, pb, qa, qb), -(pa - pb) * (sp.log(qb) - sp.log(qa)))


def test_typical_structure() -> None:
    st = S.typical_stationarity()
    assert sp.simplify(st["beta"] - 1 / (1 - S.mu)) == 0
    assert S.typical_constraint_split()["difference"] == 0
    curve = S.gibbs_curve()
    b = sp.Symbol("beta", positive=True)
    assert sp.simplify(curve["slope"] + (1 - 1 / b)) == 0
    # numerically: entropy and cost of r_beta along beta, slope by finite differences
    rng = np.random.default_rng(0)
    qbar = rng.dirichlet(np.ones(7))

    def h_and_kl(beta: float) -> tuple[float, float]:
        r = qbar ** beta / np.sum(qbar ** beta)
        return float(-np.sum(r * np.log(r))), float(np.sum(r * np.log(r / qbar)))

    for beta in (1.3, 2.0, 5.0):
        (h1, k1), (h2, k2) = h_and_kl(beta - 1e-5), h_and_kl(beta + 1e-5)
        assert (k2 - k1) / (h2 - h1) == pytest.approx(-(1 - 1 / beta), rel=1e-6)
