"""Peaked rows (top-1 gaps of tens to hundreds of nats), ties and extreme dynamic range: every
criterion and tree width, both divergences, certificates and witnesses against an independent
mpmath reference at 80 digits.

The reference uses none of the engine's structure (no sorted scan, no level argmax, no
monotonicity): it enumerates every candidate pool ``A`` (for a level-set criterion: the token
``y`` to lift, for every rejected ``y``, plus any subset of the other tokens; for a tree: any
``m`` non-maximisers as competitors and any subset of them pooled with all maximisers), keeps
the pools whose flat-on-``A`` minimiser satisfies the constraints, and takes the least cost:
the exact certificate is attained by one of them. Rows of a large vocabulary are given as
blocks of equal logits, where the reference pools whole tie blocks (ties pool together).

Both tie conventions: ``ties="level-set"`` takes the rule as written; the default, the worst case
over tie-breaks, rejects a token when the rule rejects it after the perturbation most
unfavourable to it (its probability lowered, every other raised, by a relative 1e-40: exact at
80 digits, far below every gap that is not a tie), and a tree may have to serve any one
maximiser, the others being competitors.
"""
from __future__ import annotations

import itertools
import math
import zlib

import mpmath as mp
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from companion import certificate, certificates, parse_criterion, tree_certificate, tree_witness, witness
from companion.certify.criteria import AdditiveRelaxed, MultiplicativeRelaxed, StrictGreedy, TopKDelta, TopM, Typical
from companion.certify.summary import summarize

MP_DPS = 80  # digits of this module's mpmath oracle (set per test by conftest.py)
INF = mp.inf
SPECS = ["greedy", "additive:0.3", "multiplicative:0.1", "multiplicative:1e-20", "topm:2", "topm:3",
         "topk-delta:3,0.6", "typical:0.09,0.3", "typical:0.5,0.9"]
DIVS = ["forward", "reverse"]
WIDTHS = [1, 2, 3]
RTOL = 1e-9


# -- the reference ---------------------------------------------------------------------------------

def exact_distribution(x: np.ndarray, from_logits: bool) -> list:
    """The exact distribution of float64 inputs (logits: softmax; probabilities: x / sum x)."""
    if from_logits:
        top = max(float(v) for v in x if v != -math.inf)
        w = [mp.exp(mp.mpf(float(v)) - top) if v != -math.inf else mp.mpf(0) for v in x]
    else:
        w = [mp.mpf(float(v)) for v in x]
    total = mp.fsum(w)
    return [v / total for v in w]


def threshold(p: list, spec: str):
    """``(tau, strict)`` of a criterion, from its definition."""
    c = parse_criterion(spec)
    s = sorted(p, reverse=True)
    if isinstance(c, StrictGreedy):
        return s[0], False
    if isinstance(c, AdditiveRelaxed):
        return s[0] - mp.mpf(c.delta), False
    if isinstance(c, MultiplicativeRelaxed):
        return mp.mpf(c.alpha) * s[0], False
    if isinstance(c, TopM):
        return s[c.m - 1], False
    if isinstance(c, TopKDelta):
        return max(s[c.k - 1], s[0] - mp.mpf(c.delta)), False
    if isinstance(c, Typical):
        h = -mp.fsum(v * mp.log(v) for v in p if v > 0)
        return min(mp.mpf(c.eps), mp.mpf(c.delta) * mp.exp(-h)), True
    raise TypeError(c)


def _level_rejected(p: list, spec: str) -> list[int]:
    tau, strict = threshold(p, spec)
    return [i for i, v in enumerate(p) if (v <= tau if strict else v < tau)]


PERTURB = mp.mpf("1e-40")


def against(p: list, y: int) -> list:
    """``p`` perturbed against ``y``: ``p_y`` lowered, every other entry raised, by a relative
    1e-40 (zeros by 1e-40 of the smallest positive entry), renormalised."""
    tiny = min(v for v in p if v > 0) * PERTURB
    q = [(v * (1 + PERTURB) if v > 0 else tiny) if i != y else (v * (1 - PERTURB) if v > 0 else -tiny)
         for i, v in enumerate(p)]
    total = mp.fsum(q)
    return [v / total for v in q]


def rejected(p: list, spec: str, ties: str = "worst") -> list[int]:
    if ties == "level-set":
        return _level_rejected(p, spec)
    return [y for y in range(len(p)) if y in _level_rejected(against(p, y), spec)]


def flat_on(p: list, pool: list[int], div: str):
    """``(cost, level)`` of the minimiser that is flat on ``pool`` and proportional to ``p`` off it
    (forward: level = mean; reverse: level = geometric mean, cost = -log(T_A + |A| G))."""
    vals = [p[i] for i in pool]
    if div == "forward":
        level = mp.fsum(vals) / len(vals)
        return mp.fsum(v * mp.log(v / level) for v in vals if v > 0), level
    level = mp.mpf(0) if any(v == 0 for v in vals) else mp.exp(mp.fsum(mp.log(v) for v in vals) / len(vals))
    outside = mp.fsum(p[i] for i in range(len(p)) if i not in set(pool))
    den = outside + len(vals) * level
    return (INF if den == 0 else -mp.log(den)), level


def ref_level_set(p: list, spec: str, div: str, ties: str = "worst"):
    best = INF
    for y in rejected(p, spec, ties):
        others = [i for i in range(len(p)) if i != y]
        for size in range(len(others) + 1):
            for extra in itertools.combinations(others, size):
                pool = [y, *extra]
                cost, level = flat_on(p, pool, div)
                if div == "reverse" and level == 0:
                    continue  # q_y = 0 cannot be the maximum of a distribution
                # every token off the pool must stay at or below q_y
                if all(p[z] <= level for z in range(len(p)) if z not in pool):
                    best = min(best, cost)
    return best


def ref_tree(p: list, m: int, div: str, ties: str = "worst"):
    top = max(p)
    if ties == "worst":
        # the decoder's token may be any one maximiser g: the others compete with it
        return min(_ref_tree(p, m, div, [g], [i for i in range(len(p)) if i != g])
                   for g in range(len(p)) if p[g] == top)
    maxim = [i for i, v in enumerate(p) if v == top]
    non = [i for i, v in enumerate(p) if v != top]
    return _ref_tree(p, m, div, maxim, non)


def _ref_tree(p: list, m: int, div: str, maxim: list[int], non: list[int]):
    """Least cost of ``m`` tokens of ``non`` tying with or beating every token of ``maxim``."""
    best = INF
    for comp in itertools.combinations(non, m):
        for size in range(1, m + 1):
            for pooled in itertools.combinations(comp, size):
                cost, level = flat_on(p, maxim + list(pooled), div)
                # competitors left out of the pool must stay at or above the maximisers' level
                if all(p[z] >= level for z in comp if z not in pooled):
                    best = min(best, cost)
    return best


# -- comparison ----------------------------------------------------------------------------------

def close(got: float, want, rtol: float = RTOL) -> bool:
    """``got`` within ``rtol`` of ``want``; plus ``1e-14 sqrt(want)``: near exact ties the float64
    normalisation rounds each probability by 1e-16 relative, which moves a certificate of
    ``Delta^2`` order by about ``1e-16 sqrt(rho)`` (invisible at the costs of peaked rows)."""
    if want == INF:
        return math.isinf(got) and got > 0
    want = float(want)
    return abs(got - want) <= rtol * abs(want) + 1e-14 * math.sqrt(abs(want)) + 1e-300


def near_boundary(p: list, spec: str) -> bool:
    """A token within relative 1e-7 of a computed threshold: float64 may decide either way."""
    c = parse_criterion(spec)
    if isinstance(c, (StrictGreedy, TopM)):
        return False
    tau, _ = threshold(p, spec)
    return any(v != tau and abs(v - tau) <= mp.mpf("1e-7") * tau for v in p)


def peaked_row(rng: np.random.Generator, v: int, max_gap: float) -> np.ndarray:
    """Float64 logits: the top at 0, the rest at gaps spread up to ``max_gap`` nats, with an exact
    copy of some entry (a tie) half of the time."""
    gaps = np.sort(rng.uniform(0, max_gap, size=v - 1))
    gaps[0] = rng.uniform(20, min(60.0, max_gap))  # a real peak
    x = np.concatenate([[0.0], -gaps])
    if rng.random() < 0.5:
        i, j = rng.choice(v, size=2, replace=False)
        x[j] = x[i]
    rng.shuffle(x)
    return x


ISSUE_CASES = [
    # (input, from_logits, criterion or tree width, divergence)
    (torch.tensor([1.0, 1e-35, 0.0]), False, "greedy", "reverse"),
    (torch.tensor([0., -30, -120, -125], dtype=torch.float64), True, "topm:2", "reverse"),
    (torch.tensor([0., -60, -65, -150], dtype=torch.float64), True, "greedy", "reverse"),
    (torch.tensor([0., -34, -120, -125], dtype=torch.float64), True, 2, "reverse"),
]


@pytest.mark.parametrize("x, from_logits, what, div", ISSUE_CASES)
def test_issue_cases_against_reference(x, from_logits, what, div) -> None:
    p = exact_distribution(x.double().numpy(), from_logits)
    for d in DIVS:
        if isinstance(what, int):
            got = float(tree_certificate(x, what, d, from_logits=from_logits))
            want = ref_tree(p, what, d)
        else:
            got = float(certificate(x, what, d, from_logits=from_logits))
            want = ref_level_set(p, what, d)
        assert close(got, want), (d, got, float(want))


def test_issue_values() -> None:
    assert abs(float(certificate(torch.tensor([1.0, 1e-35, 0.0]), "greedy", "reverse")) - 39.60) < 5e-3
    t = torch.tensor([0., -30, -120, -125], dtype=torch.float64)
    assert abs(float(certificate(t, "topm:2", "reverse", from_logits=True)) - 48.90) < 5e-3
    t = torch.tensor([0., -60, -65, -150], dtype=torch.float64)
    assert abs(float(certificate(t, "greedy", "reverse", from_logits=True)) - 29.30685) < 1e-5
    t = torch.tensor([0., -34, -120, -125], dtype=torch.float64)
    assert abs(float(tree_certificate(t, 2, "reverse", from_logits=True)) - 34.00) < 5e-3


def test_zero_boundary_token_gives_inf_and_nan_witness() -> None:
    p = torch.tensor([0.7, 0.3, 0.0], dtype=torch.float64)
    assert math.isinf(float(certificate(p, "topm:2", "reverse")))
    assert torch.isnan(witness(p, "topm:2", "reverse")).all()
    # forward reaches the zero token at a finite cost, and its witness attains it
    rho = float(certificate(p, "topm:2", "forward"))
    want = ref_level_set(exact_distribution(p.numpy(), False), "topm:2", "forward")
    assert close(rho, want)
    q = witness(p, "topm:2", "forward")
    assert abs(float(q.sum()) - 1) < 1e-12 and torch.allclose(q, torch.tensor([0.35, 0.3, 0.35], dtype=torch.float64), rtol=0, atol=1e-16)


# -- float64 logits and probabilities, every criterion and width, both directions ---------------

def _seed(*parts) -> int:
    return zlib.crc32(repr(parts).encode())


def _rows(seed: int, n: int, v_range=(4, 8), max_gap: float = 700.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [peaked_row(rng, int(rng.integers(*v_range)), max_gap) for _ in range(n)]


def _check_level_set(x: np.ndarray, from_logits: bool, spec: str, div: str, rtol: float = RTOL) -> None:
    p = exact_distribution(x, from_logits)
    if near_boundary(p, spec):
        return
    t = torch.tensor(x, dtype=torch.float64)
    for ties in ("worst", "level-set"):
        got = float(certificate(t, spec, div, from_logits=from_logits, ties=ties))
        want = ref_level_set(p, spec, div, ties)
        assert close(got, want, rtol), (x.tolist(), spec, div, ties, got, float(want))


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("spec", SPECS)
def test_peaked_logits_every_criterion(spec: str, div: str) -> None:
    for x in _rows(_seed(spec, div), 12):
        _check_level_set(x, True, spec, div)


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("spec", SPECS)
def test_peaked_probabilities_every_criterion(spec: str, div: str) -> None:
    # float64 probabilities reach e^-700 ~ 1e-304 (normal numbers)
    for x in _rows(1 + _seed(spec, div), 12):
        probs = torch.softmax(torch.tensor(x, dtype=torch.float64), 0).numpy()
        _check_level_set(probs, False, spec, div)


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("m", WIDTHS)
def test_peaked_trees(m: int, div: str) -> None:
    for from_logits in (True, False):
        for x in _rows(7 * m + (div == "reverse"), 12, v_range=(m + 2, 7)):
            if not from_logits:
                x = torch.softmax(torch.tensor(x, dtype=torch.float64), 0).numpy()
            p = exact_distribution(x, from_logits)
            for ties in ("worst", "level-set"):
                got = float(tree_certificate(torch.tensor(x, dtype=torch.float64), m, div, from_logits=from_logits,
                                             ties=ties))
                want = ref_tree(p, m, div, ties)
                assert close(got, want), (x.tolist(), m, div, ties, got, float(want))


# -- witnesses --------------------------------------------------------------------------------------

def _kl(p: list, q: list, div: str):
    a, b = (p, q) if div == "forward" else (q, p)
    total = mp.mpf(0)
    for x, y in zip(a, b):
        if x == 0:
            continue
        if y == 0:
            return INF
        total += x * mp.log(x / y)
    return total


def _check_witness(x: np.ndarray, from_logits: bool, q: torch.Tensor, rho: float, div: str) -> list:
    p = exact_distribution(x, from_logits)
    if math.isinf(rho):
        assert torch.isnan(q).all()
        return []
    assert bool((q >= 0).all()) and abs(float(q.sum()) - 1) <= 1e-12, q
    qm = [mp.mpf(float(v)) for v in q]
    total = mp.fsum(qm)
    qm = [v / total for v in qm]
    d = _kl(p, qm, div)
    assert close(rho, d, 1e-9), (x.tolist(), div, rho, float(d))
    return [i for i, v in enumerate(q.tolist()) if v >= max(q.tolist()) * (1 - 1e-12)]


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("spec", SPECS)
def test_peaked_witnesses(spec: str, div: str) -> None:
    c = parse_criterion(spec)
    for from_logits in (True, False):
        for x in _rows(3 + _seed(spec, div, from_logits), 8):
            if not from_logits:
                x = torch.softmax(torch.tensor(x, dtype=torch.float64), 0).numpy()
            t = torch.tensor(x, dtype=torch.float64)
            rho = float(certificate(t, c, div, from_logits=from_logits))
            q = witness(t, c, div, from_logits=from_logits)
            top = _check_witness(x, from_logits, q, rho, div)
            if top:
                rej = set(rejected(exact_distribution(x, from_logits), spec))
                assert rej & set(top), (x.tolist(), spec, div)


@pytest.mark.parametrize("div", DIVS)
@pytest.mark.parametrize("m", WIDTHS)
def test_peaked_tree_witnesses(m: int, div: str) -> None:
    for x in _rows(11 * m + (div == "reverse"), 10, v_range=(m + 2, 7)):
        t = torch.tensor(x, dtype=torch.float64)
        rho = float(tree_certificate(t, m, div, from_logits=True))
        q = tree_witness(t, m, div, from_logits=True)
        _check_witness(x, True, q, rho, div)
        if math.isfinite(rho):
            # worst case: for some maximiser g of p, m other tokens tie with or beat g under q
            beaten = [int((q >= float(q[g]) * (1 - 1e-12)).sum()) - 1 for g in np.nonzero(x == x.max())[0]]
            assert max(beaten) >= m
        rho = float(tree_certificate(t, m, div, from_logits=True, ties="level-set"))
        q = tree_witness(t, m, div, from_logits=True, ties="level-set")
        _check_witness(x, True, q, rho, div)
        if math.isfinite(rho):
            # level-set: m non-maximisers of p tie with or beat every maximiser of p under q
            maxim = x == x.max()
            best_max = float(q[torch.tensor(maxim)].max())
            rivals = int(((q >= best_max * (1 - 1e-12)) & ~torch.tensor(maxim)).sum())
            assert rivals >= m


def test_infeasible_tree_is_inf_with_nan_witness() -> None:
    p = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)  # one non-maximiser, m = 2
    for div in DIVS:
        assert math.isinf(float(tree_certificate(p, 2, div, ties="level-set")))
        assert torch.isnan(tree_witness(p, 2, div, ties="level-set")).all()
        # worst case: the other maximiser competes, so two tokens can beat the decoder's one
        want = ref_tree(exact_distribution(p.numpy(), False), 2, div)
        assert close(float(tree_certificate(p, 2, div)), want) and math.isfinite(float(want))


def test_reverse_tree_with_zero_competitors() -> None:
    """A zero-probability competitor lets q put 0 on g: finite reverse cost -log(1 - p(1))."""
    p = torch.tensor([0.7, 0.3, 0.0], dtype=torch.float64)
    want = ref_tree(exact_distribution(p.numpy(), False), 2, "reverse")
    assert close(float(tree_certificate(p, 2, "reverse")), want)
    assert abs(float(want) + math.log(0.3)) < 1e-12
    p = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert math.isinf(float(tree_certificate(p, 2, "reverse")))


# -- large vocabularies: blocks of equal logits ---------------------------------------------------

V = 151_936


def block_row(blocks: list[tuple[float, int]]) -> np.ndarray:
    x = np.concatenate([np.full(n, v, dtype=np.float64) for v, n in blocks])
    assert len(x) == V
    return x


def _block_probs(blocks):
    """Exact probabilities of each block's tokens (one value per block) and the block sizes."""
    top = max(v for v, _ in blocks)
    w = [mp.exp(mp.mpf(v) - top) for v, _ in blocks]
    z = mp.fsum(wi * n for wi, (_, n) in zip(w, blocks))
    return [wi / z for wi in w], [n for _, n in blocks]


def _block_cost(vals, counts, pooled: dict[int, int], div: str):
    """Cost of the pool holding ``pooled[b]`` tokens of block ``b``; ``(cost, level)``."""
    size = sum(pooled.values())
    if div == "forward":
        level = mp.fsum(vals[b] * k for b, k in pooled.items()) / size
        return mp.fsum(k * vals[b] * mp.log(vals[b] / level) for b, k in pooled.items()), level
    level = mp.exp(mp.fsum(k * mp.log(vals[b]) for b, k in pooled.items()) / size)
    outside = mp.fsum(vals[b] * (counts[b] - pooled.get(b, 0)) for b in range(len(vals)))
    return -mp.log(outside + size * level), level


def _blocks_rejected(vals, counts, spec: str) -> list[int]:
    """Blocks the rule as written rejects, most likely first."""
    order = sorted(range(len(vals)), key=lambda b: -vals[b])
    c = parse_criterion(spec)
    s_desc = []
    for b in order:
        s_desc += [vals[b]] * min(counts[b], 16)
    if isinstance(c, Typical):
        h = -mp.fsum(counts[b] * vals[b] * mp.log(vals[b]) for b in range(len(vals)) if vals[b] > 0)
        tau, strict = min(mp.mpf(c.eps), mp.mpf(c.delta) * mp.exp(-h)), True
    else:
        tau, strict = threshold(s_desc, spec)
    return [b for b in order if (vals[b] <= tau if strict else vals[b] < tau)]


def ref_blocks_level_set(blocks, spec: str, div: str, ties: str = "worst"):
    vals, counts = _block_probs(blocks)
    order = sorted(range(len(vals)), key=lambda b: -vals[b])
    if ties == "level-set":
        rej = _blocks_rejected(vals, counts, spec)
    else:
        # one token of block b perturbed against (a block of its own), every other token raised
        rej = []
        for b in order:
            lowered = [v * (1 + PERTURB) for v in vals] + [vals[b] * (1 - PERTURB)]
            sizes = [n - (i == b) for i, n in enumerate(counts)] + [1]
            z = mp.fsum(v * n for v, n in zip(lowered, sizes))
            if len(vals) in _blocks_rejected([v / z for v in lowered], sizes, spec):
                rej.append(b)
    if not rej:
        return INF
    y = rej[0]  # the most likely rejected block; lift one of its tokens
    above = [b for b in order if vals[b] > vals[y]]
    best = INF
    for i in range(len(above) + 1):
        pooled = {b: counts[b] for b in above[:i]}
        pooled[y] = 1
        cost, level = _block_cost(vals, counts, pooled, div)
        if all(vals[b] <= level for b in above[i:]):
            best = min(best, cost)
    return best


def ref_blocks_tree(blocks, m: int, div: str, ties: str = "worst"):
    vals, counts = _block_probs(blocks)
    order = sorted(range(len(vals)), key=lambda b: -vals[b])
    # the tokens that must lose: all maximisers (level-set), or one (worst: the others compete)
    losers = counts[order[0]] if ties == "level-set" else 1
    comp = [order[0]] * (counts[order[0]] - losers)  # competitors, block ids, highest first
    for b in order[1:]:
        comp += [b] * counts[b]
        if len(comp) >= m:
            break
    comp = comp[:m]
    best = INF
    for j in range(1, m + 1):
        pooled = {order[0]: losers}
        for b in comp[m - j:]:
            pooled[b] = pooled.get(b, 0) + 1
        cost, level = _block_cost(vals, counts, pooled, div)
        if all(vals[b] >= level for b in comp[: m - j]):
            best = min(best, cost)
    return best


BLOCK_ROWS = [
    # the tail beyond the top 64 carries ~1% of T_A + |A| G
    [(0.0, 1), (-30.0, 100_000), (-200.0, V - 100_001)],
    # a 30-nat peak over a flat body: the reverse cost needs T_A from the tail
    [(0.0, 1), (-34.0, 1), (-45.0, 150_000), (-500.0, V - 150_002)],
    # exact ties at the top, a deep pool (multiplicative accepts 100 tokens)
    [(0.0, 3), (-0.5, 97), (-60.0, 40), (-61.0, V - 140)],
    # 700-nat gaps
    [(0.0, 1), (-350.0, 2), (-700.0, V - 3)],
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("row", range(len(BLOCK_ROWS)))
def test_large_vocab_blocks(row: int, dtype: torch.dtype) -> None:
    blocks = BLOCK_ROWS[row]
    x = torch.tensor(block_row(blocks), dtype=dtype)
    specs = ["greedy", "multiplicative:0.1", "multiplicative:1e-20", "topm:4", "typical:0.09,0.3", "additive:0.3"]
    # float32 logits here are exact copies of the float64 ones (integers and halves); only the
    # tail sums run in float32, with the rounding bounds the summary states (log_err on the
    # normaliser, tail_err on the tail, entropy_err on the entropy). A certificate is then never
    # above the exact value and below it by at most twice what those bounds move it (computed
    # within them, then lowered by them), ``price`` here.
    s = summarize(x.unsqueeze(0), from_logits=True, with_entropy=True)
    err = 0.0 if dtype == torch.float64 else float(s.log_err + s.tail_err + s.entropy_err)

    def check(got: float, want, what: tuple) -> None:
        if want == INF:
            assert got == INF, (what, got)
            return
        w = float(want)
        price = 4 * err * (1 + w) * math.exp(w)  # the reverse direction divides the tail's error by Z ~ e^-w
        assert got <= w + RTOL * w + 1e-300, (what, "above the exact value", got, w)
        assert w - got <= RTOL * w + 1e-14 * math.sqrt(w) + price, (what, "below by more than the stated bounds", got, w, price)

    for ties in ("worst", "level-set"):
        out = certificates(x, specs, DIVS, tree_widths=WIDTHS, from_logits=True, ties=ties)
        for spec in specs:
            for div in DIVS:
                check(float(out[(spec, div)]), ref_blocks_level_set(blocks, spec, div, ties), (row, spec, div, ties))
        for m in WIDTHS:
            for div in DIVS:
                check(float(out[(f"tree:{m}", div)]), ref_blocks_tree(blocks, m, div, ties), (row, m, div, ties))


# -- float32 and bfloat16 inputs ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("from_logits", [True, False])
def test_low_precision_inputs_against_upcast(dtype: torch.dtype, from_logits: bool) -> None:
    """The certificate of a float32/bf16 input is that of its exact float64 upcast."""
    rng = np.random.default_rng(5)
    for _ in range(12):
        x = peaked_row(rng, int(rng.integers(4, 7)), 80.0)
        t = torch.tensor(x, dtype=torch.float64)
        t = (t if from_logits else torch.softmax(t, 0)).to(dtype)
        up = t.double().numpy()
        p = exact_distribution(up, from_logits)
        for spec in ("greedy", "multiplicative:0.1", "topm:2", "typical:0.09,0.3"):
            if near_boundary(p, spec):
                continue
            for div in DIVS:
                got = float(certificate(t, spec, div, from_logits=from_logits))
                want = ref_level_set(p, spec, div)
                assert close(got, want, 1e-9), (up.tolist(), spec, div, got, float(want))
        for m in (1, 2):
            for div in DIVS:
                got = float(tree_certificate(t, m, div, from_logits=from_logits))
                assert close(got, ref_tree(p, m, div), 1e-9)


# -- ties: both conventions ---------------------------------------------------------------------------

@st.composite
def tied_rows(draw):
    """Rows with forced exact ties at the top (and elsewhere), as probabilities, float64
    logits, or bf16-cast logits. Logits lie on a 1/64 grid: distinct inputs stay distinct after
    the float64 normalisation (ties are decided on the float64 probabilities)."""
    v = draw(st.integers(3, 8))
    base = draw(st.lists(st.integers(-40 * 64, 5 * 64), min_size=v, max_size=v))
    x = np.array(base, dtype=np.float64) / 64
    n_tied = draw(st.integers(2, v))
    idx = draw(st.permutations(range(v)))[:n_tied]
    x[list(idx)] = x.max()  # n_tied maximisers exactly
    if draw(st.booleans()):
        j, k = draw(st.permutations(range(v)))[:2]
        x[k] = x[j]
    kind = draw(st.sampled_from(["probs", "logits", "bf16"]))
    t = torch.tensor(x, dtype=torch.float64)
    if kind == "probs":
        return torch.softmax(t, 0), False
    if kind == "bf16":
        return t.to(torch.bfloat16), True
    return t, True


@given(row=tied_rows())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_width_one_tree_equals_strict_greedy_with_ties(row) -> None:
    t, from_logits = row
    up = t.double().numpy()
    p = exact_distribution(up, from_logits)
    for ties in ("worst", "level-set"):
        out = certificates(t, ["greedy"], DIVS, tree_widths=[1], from_logits=from_logits, ties=ties)
        for div in DIVS:
            assert torch.equal(out[("tree:1", div)], out[("greedy", div)]), (t, div, ties)
            single = tree_certificate(t, 1, div, from_logits=from_logits, ties=ties)
            assert torch.equal(single, certificate(t, "greedy", div, from_logits=from_logits, ties=ties))
            # and both against the reference, tie convention included (worst: 0 on these tied rows)
            want = ref_tree(p, 1, div, ties)
            assert close(float(out[("tree:1", div)]), want, 1e-9), (up.tolist(), div, ties)
            assert close(float(out[("greedy", div)]), ref_level_set(p, "greedy", div, ties), 1e-9)
            if ties == "worst" and int((up == up.max()).sum()) > 1:
                assert float(out[("greedy", div)]) == 0.0


# -- the harvest's verdicts follow the decoders (first index wins) ----------------------------------------

def test_step_statistics_tree_coverage_with_ties() -> None:
    """On a tied step, the decoder's token is the first maximiser (id 3), and a tree covers the
    step iff that token is in the drafter's id-ordered top m; tree-certified implies covered, and
    the worst-case certificates certify nothing where the top of p is tied (width 1)."""
    from companion.harvest.stats import StepStatistics

    v = 50
    gen = torch.Generator().manual_seed(0)
    lp = torch.randn(6, v, generator=gen, dtype=torch.float64)
    lp[:, 3] = lp[:, 7] = 10.0  # two maximisers; the id-based greedy token is 3
    lq = lp.clone()
    lq[0, 7], lq[0, 3] = 12.0, 5.0  # the drafter's top-1 is the other maximiser: 3 comes second
    lq[1, 7], lq[1, 3], lq[1, 11] = 11.0, 5.0, 11.5  # 3 comes third
    lq[2, 7] = lq[2, 3] = 11.0
    lq[2, 11] = 11.0  # 3 tied with 7 and 11 at the drafter's top: the lowest id goes first
    lq[3:] += 0.05 * torch.randn(3, v, generator=gen, dtype=torch.float64)
    stats = StepStatistics(["greedy"], [1, 2, 3], vocab=v, top_k=10)
    cols = stats(lp, lq)
    assert cols["token"].tolist()[:3] == [3, 3, 3]
    assert cols["token_rank_in_draft"].tolist()[:3] == [2, 3, 1]
    assert cols["covered[1]"].tolist()[:3] == [False, False, True]
    assert cols["covered[2]"].tolist()[:3] == [True, False, True]
    assert cols["covered[3]"].tolist()[:3] == [True, True, True]
    for m in (1, 2, 3):
        assert not bool((cols[f"tree_certified_fwd[{m}]"] & ~cols[f"covered[{m}]"]).any())
        assert not bool((cols[f"tree_certified_rev[{m}]"] & ~cols[f"covered[{m}]"]).any())
    assert torch.equal(cols["tree_cert_fwd[1]"], cols["cert_fwd[greedy]"])
    assert torch.equal(cols["tree_cert_rev[1]"], cols["cert_rev[greedy]"])
    assert bool((cols["cert_fwd[greedy]"] == 0).all()) and not bool(cols["certified_fwd[greedy]"].any())
    # greedy: the draft is accepted iff it is the first maximiser
    assert cols["accepted[greedy]"].tolist() == (cols["draft_token"] == 3).tolist()


# -- the summary's tail: the mass beyond the top k, summed on its own scale -------------------------

@pytest.mark.parametrize("from_logits", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_summary_tail_is_the_mass_beyond_the_values(from_logits: bool, dtype: torch.dtype) -> None:
    from companion.certify.summary import summarize

    gen = torch.Generator().manual_seed(3)
    v = 3000
    logits = 4.0 * torch.randn(4, v, generator=gen, dtype=torch.float64)
    logits[0, 5] = 60.0  # peaked: the tail is ~e^-50 of the row
    logits[1, :200] = 9.0  # a deep tie block
    x = (logits if from_logits else torch.softmax(logits, -1)).to(dtype)
    p64 = torch.softmax(x.double(), -1) if from_logits else x.double() / x.double().sum(-1, keepdim=True)
    srt = p64.sort(-1, descending=True).values
    rtol = 1e-12 if dtype == torch.float64 else 1e-5
    for k in (1, 10, 64, 100, 500, v):
        s = summarize(x, from_logits=from_logits, k=k)
        want = srt[:, k:].sum(-1)  # tiny terms only: no cancellation in this reference
        torch.testing.assert_close(s.tail, want, rtol=rtol, atol=1e-300)
        torch.testing.assert_close(s.logs, torch.log(s.values), rtol=1e-12, atol=1e-13)
        # reusing the normaliser: same tail from a pass of its own
        again = summarize(x, from_logits=from_logits, k=k, norm=s.norm)
        torch.testing.assert_close(again.tail, s.tail, rtol=rtol, atol=1e-300)
        assert torch.equal(again.values, s.values)


@pytest.mark.parametrize("div", DIVS)
def test_logit_gaps_beyond_float64_probabilities(div: str) -> None:
    """Gaps of 800 to 10^4 nats: the probabilities underflow, the logits do not; the reverse
    certificates stay exact (never +inf above a finite truth), witnesses stay normalised."""
    for gap in (800.0, 1500.0, 1e4):
        x = np.array([0.0, -gap, -gap - 5.0, -2 * gap, -3.0])
        t = torch.tensor(x)
        p = exact_distribution(x, True)
        for spec in ("greedy", "topm:2", "multiplicative:0.1"):
            got = float(certificate(t, spec, div, from_logits=True))
            assert close(got, ref_level_set(p, spec, div)), (gap, spec, got)
            q = witness(t, spec, div, from_logits=True)
            assert abs(float(q.sum()) - 1) < 1e-12
        for m in (1, 2, 3):
            got = float(tree_certificate(t, m, div, from_logits=True))
            assert close(got, ref_tree(p, m, div)), (gap, m, got)
