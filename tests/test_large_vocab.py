"""Qwen3-sized vocabularies (V = 151,936): peaked, flat and tied rows, float32 and bfloat16,
probabilities and logits, against a literal float64/mpmath implementation of the scan."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from scipy.special import entr

from companion import certificates, parse_criterion, tree_certificate
from companion.certify.precision import tie_band
from companion.certify.summary import summarize
from companion.certify.criteria import AdditiveRelaxed, MultiplicativeRelaxed, StrictGreedy, TopKDelta, TopM, Typical

V = 151_936
SPECS = ["greedy", "additive:0.3", "multiplicative:0.1", "topm:4", "topk-delta:10,0.6", "typical:0.09,0.3",
         "multiplicative:0.001", "typical:0.5,0.9"]
MP_DPS = 40  # digits of this module's mpmath oracle (set per test by conftest.py)


def _tau(p: np.ndarray, s: np.ndarray, c) -> float:
    if isinstance(c, StrictGreedy):
        return s[0]
    if isinstance(c, AdditiveRelaxed):
        return s[0] - c.delta
    if isinstance(c, MultiplicativeRelaxed):
        return c.alpha * s[0]
    if isinstance(c, TopM):
        return s[c.m - 1]
    if isinstance(c, TopKDelta):
        return max(s[c.k - 1], s[0] - c.delta)
    if isinstance(c, Typical):
        return min(c.eps, c.delta * math.exp(-float(entr(p).sum())))
    raise TypeError(c)


def _level_rejects(p: np.ndarray, y: int, c) -> bool:
    """The rule as written rejects token ``y`` of ``p`` (top 11 by a partition, entropy in full)."""
    top = -np.sort(np.partition(-p, 11)[:12])
    tau = _tau(p, top, c)
    return bool(p[y] <= tau) if c.strict else bool(p[y] < tau)


def _worst_count(p: np.ndarray, order: np.ndarray, r: int, c) -> int:
    """How many of the top ``r`` (the tokens the rule as written accepts) stay accepted under the
    perturbation most unfavourable to each: its probability lowered, every other raised, by a
    relative 1e-9 (far below every gap that is not an exact tie). Accepted sets are prefixes of
    the sorted row, so the scan runs up from position ``r - 1`` to the first that stays accepted."""
    while r > 0:
        y = int(order[r - 1])
        q = p * (1 + 1e-9)
        q[y] = p[y] * (1 - 1e-9)
        if not _level_rejects(q / q.sum(), y, c):
            break
        r -= 1
    return r


def reference(p: np.ndarray, spec: str, divergence: str, ties: str = "worst") -> float:
    """The pooled scan, literally: sort, find y* (of the rule as written, or, ``ties="worst"``, of
    the rule under the most unfavourable tie-breaks and roundings), grow the pool from the top
    while the next token exceeds the pool's mean (arithmetic or geometric), then evaluate in 40
    digits."""
    c = parse_criterion(spec)
    order = np.argsort(-p, kind="stable")
    s = p[order]
    tau = _tau(p, s, c)
    r = int((s > tau).sum() if c.strict else (s >= tau).sum())
    if ties == "worst":
        r = _worst_count(p, order, r, c)
    if r == len(s):
        return math.inf
    pool = [mpmath.mpf(s[r])]
    if divergence == "reverse" and s[r] == 0:
        return math.inf
    i = 0
    while i < r:
        level = (sum(pool) / len(pool) if divergence == "forward"
                 else mpmath.exp(sum(mpmath.log(x) for x in pool) / len(pool)))
        if s[i] > level:
            pool.append(mpmath.mpf(s[i]))
            i += 1
        else:
            break
    if divergence == "forward":
        level = sum(pool) / len(pool)
        return float(sum(x * mpmath.log(x / level) for x in pool if x > 0))
    g = mpmath.exp(sum(mpmath.log(x) for x in pool) / len(pool))
    return float(-mpmath.log(1 - (sum(pool) - len(pool) * g)))


def _rows(seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(6, V, generator=gen, dtype=torch.float64)
    logits = torch.empty(6, V, dtype=torch.float64)
    logits[0] = 2.0 * z[0]; logits[0, 17] = 30.0                # peaked: p(1) close to 1
    logits[1] = 0.05 * z[1]                                      # flat: nearly uniform
    logits[2] = 3.0 * z[2]                                       # lognormal body, no dominant token
    logits[3] = 2.0 * z[3]; logits[3, 5] = logits[3, 9] = 22.0  # exact tie at the top
    logits[4] = 2.0 * z[4]; logits[4, 1] = 20.0; logits[4, 2] = 20.0 - 1e-6  # near tie
    logits[5] = 1.5 * z[5]; logits[5, :40] = 12.0                # 40-way tie: deep pools
    return logits


def _stated_error(x: torch.Tensor, from_logits: bool) -> np.ndarray:
    """Per row, the sum of the rounding bounds the summary states for ``x`` (0 for float64 rows)."""
    s = summarize(x, from_logits=from_logits, with_entropy=True)
    if not s.guarded():
        return np.zeros(x.shape[0])
    return (s.log_err + s.tail_err + s.entropy_err).numpy()


def _check(rows_p64: np.ndarray, ours: dict, specs=SPECS, ties: str = "worst", err: np.ndarray | None = None) -> None:
    """Never above the exact value; below it by at most what the stated bounds allow (computed
    within them, then lowered by them: twice; the reverse direction divides the tail's error by a
    normaliser ``~ e^-rho``)."""
    err = np.zeros(len(rows_p64)) if err is None else err
    for spec in specs:
        for div in ("forward", "reverse"):
            got = ours[(spec, div)].numpy()
            for i, p in enumerate(rows_p64):
                want = reference(p, spec, div, ties)
                if math.isinf(want):
                    assert math.isinf(got[i]), (spec, div, i, got[i])
                else:
                    assert math.isfinite(got[i]), (spec, div, i)
                    price = 4 * err[i] * (1 + want) * math.exp(want)
                    assert got[i] <= want + 1e-6 * abs(want) + 1e-13, (spec, div, i, "above", got[i], want)
                    assert want - got[i] <= 1e-6 * abs(want) + 1e-13 + price, (spec, div, i, got[i], want, price)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_probabilities_large_vocab(dtype: torch.dtype) -> None:
    p = torch.softmax(_rows(), -1).to(dtype)
    p64 = p.double()
    p64 = (p64 / p64.sum(-1, keepdim=True)).numpy()
    err = _stated_error(p, False)
    for ties in ("worst", "level-set"):
        _check(p64, certificates(p, SPECS, ("forward", "reverse"), ties=ties), ties=ties, err=err)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_large_vocab(dtype: torch.dtype) -> None:
    logits = _rows(1).to(dtype)
    p64 = torch.softmax(logits.double(), -1).numpy()
    err = _stated_error(logits, True)
    # the exact-ties convention: the certificates of the logits as given
    exact = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True, logits_dtype="exact")
    _check(p64, exact, err=err)
    _check(p64, certificates(logits, SPECS, ("forward", "reverse"), from_logits=True, ties="level-set"),
           ties="level-set", err=err)
    ours = certificates(logits, SPECS, ("forward", "reverse"), from_logits=True)
    for out in ours.values():
        assert out.dtype == torch.float64 and out.shape == (6,)
    # the default: float32 tensors get no kernel-path band; bfloat16 ones count a top-2 gap of
    # at most 2 ulps of the top logit as a tie (strict greedy 0 there), never above the exact-ties values
    top2 = logits.double().topk(2, -1).values
    near = (top2[:, 0] - top2[:, 1]).numpy() <= tie_band(top2[:, 0].numpy(), "bfloat16")
    for key, value in ours.items():
        if dtype == torch.float32:
            assert torch.equal(value, exact[key]), key
        else:
            assert bool((value <= exact[key]).all()), key
    if dtype == torch.bfloat16:
        assert near.any() and not near.all(), near  # the rows exercise both branches
        for div in ("forward", "reverse"):
            g = ours[("greedy", div)].numpy()
            assert (g[near] == 0).all() and (g[~near] == exact[("greedy", div)].numpy()[~near]).all(), (div, g)


@pytest.mark.slow
def test_bf16_ties_are_exact() -> None:
    """bf16 rounding creates exact ties at the top. Worst case (default): the decoder takes one of
    the two maximisers and the other already ties with it, so strict greedy and the width-1 tree
    certify nothing (0), and width 2 prices lifting the third token to the decoder's. Level-set:
    both maximisers are accepted, so greedy and the width-1 tree price lifting the third token:
    equal, finite, positive, never NaN."""
    logits = _rows(2)
    logits[:, 0] = 40.0
    logits[:, 1] = 40.0 + 1e-3  # distinct in float64, equal after bf16 rounding
    p = torch.softmax(logits.to(torch.bfloat16).float(), -1).to(torch.bfloat16)
    assert bool((p[:, 0] == p[:, 1]).all())
    worst = certificates(p, ["greedy"], ("forward", "reverse"), tree_widths=[1, 2])
    out = certificates(p, ["greedy"], ("forward", "reverse"), tree_widths=[1, 2], ties="level-set")
    for div in ("forward", "reverse"):
        assert bool((worst[("greedy", div)] == 0).all()) and bool((worst[("tree:1", div)] == 0).all())
        assert torch.all(torch.isfinite(worst[("tree:2", div)])) and torch.all(worst[("tree:2", div)] > 0)
        assert torch.all(worst[("tree:2", div)] < out[("greedy", div)])  # one token to lift, not two
        tree, greedy = out[("tree:1", div)], out[("greedy", div)]
        assert torch.equal(tree, greedy)
        assert torch.all(torch.isfinite(tree)) and torch.all(tree > 0)
        assert torch.equal(tree, tree_certificate(p, 1, div, ties="level-set"))
        # width 2 must beat both maximisers with two other tokens: harder than width 1
        assert torch.all(out[("tree:2", div)] > tree)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    logits = _rows(3).float()
    cpu = certificates(logits, SPECS, ("forward", "reverse"), tree_widths=[1, 2, 4, 8], from_logits=True)
    gpu = certificates(logits.cuda(), SPECS, ("forward", "reverse"), tree_widths=[1, 2, 4, 8], from_logits=True)
    for key, value in cpu.items():
        assert gpu[key].device.type == "cuda"
        torch.testing.assert_close(gpu[key].cpu(), value, rtol=1e-6, atol=1e-12)
