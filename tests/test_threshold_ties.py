"""Certificates exactly at a threshold, against an exact oracle; and certified => accepted on
every row, zeros and -inf logits included.

A token exactly at an additive, multiplicative or top-k-delta threshold is accepted by every
decoder (``p_y >= tau``, :meth:`Criterion.decoder_accepts`), so the worst case over tie-breaks
accepts it too: only ties across a rank boundary count against a token. The oracle
(:mod:`tests.exact_oracle`) decides the rejected set in exact rational arithmetic and prices it
by enumeration of pools at 60 digits, so its values are exact to far below float64; the library
works in float64, and the comparison asks for 1e-12 relative (the engine's error on these rows
is a few ulps of the logs it sums) and +inf exactly where the oracle says +inf.
"""
from __future__ import annotations

import math

import mpmath
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from companion import certificates, certified
from companion.certify.criteria import parse_criterion
from tests.exact_oracle import exact_certificate, exact_rejected

# Engine (float64, a few ulps per log) against a 60-digit oracle: 1e-12 relative, and 1e-15
# absolute for certificates near 0.
RTOL, ATOL = 1e-12, 1e-15

BF16_ROW = ["0.5078125", "0.05078125", "0.0810546875", "0.052978515625", "0.306640625"]
# (spec, row as decimal strings, divergence -> the exact certificate when the issue states it)
ISSUE_CASES = [
    ("additive:0", ["0.4", "0.4", "0.2"], {"forward": 0.043692120681965}),
    ("additive:0.25", ["0.5", "0.25", "0.25"], {"forward": math.inf, "reverse": math.inf}),
    ("multiplicative:0.1", ["0.5", "0.05", "0.45"], {"forward": math.inf, "reverse": math.inf}),
    # a plain bf16 row (every value a bfloat16; the row sums to 0.99927, normalised as given)
    ("multiplicative:0.1", BF16_ROW, {"forward": math.inf, "reverse": math.inf}),
    # additive:0.3 with p(1) = 0.3: the threshold is 0, and p = 0 is at it: nothing is rejected
    ("additive:0.3", ["0.3", "0.25", "0.25", "0.2", "0"], {"forward": math.inf}),
    # a tie across the rank boundary stays the worst case: topm:2 with three tokens tied second
    ("topm:2", ["0.4", "0.2", "0.2", "0.2"], {}),
    ("topk-delta:3,0.25", ["0.5", "0.25", "0.15", "0.1"], {}),
    ("topk-delta:2,0.5", ["0.4", "0.3", "0.3"], {}),
    ("topk-delta:2,0.125", ["0.375", "0.25", "0.25", "0.125"], {}),
    ("multiplicative:0.5", ["0.5", "0.25", "0.25"], {"forward": math.inf}),
    ("multiplicative:1", ["0.375", "0.375", "0.25"], {}),
]


def _tensor(row: list[str], dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor([float(x) for x in row], dtype=dtype)


@pytest.mark.parametrize("spec,row,stated", ISSUE_CASES, ids=[f"{c[0]}-{'/'.join(c[1])}" for c in ISSUE_CASES])
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_threshold_ties_exact(spec: str, row: list[str], stated: dict, divergence: str) -> None:
    # the bf16 row does not sum to 1 within float64's tolerance: pass it as the bfloat16 it is
    p = _tensor(row, torch.bfloat16 if row == BF16_ROW else torch.float64)
    c = parse_criterion(spec)
    # The exact rejected set is the decoders' own float64 verdict on these rows (first index wins,
    # every tie-break: no token the oracle accepts is rejected by a decoder, and each token the
    # oracle rejects is rejected by some tie-break, i.e. is not accepted under ties="worst").
    rejected = exact_rejected(row, spec)
    decoder = [bool(c.decoder_accepts(p, torch.tensor(y))) for y in range(len(row))]
    worst = c.rejection_mask(p, ties="worst").tolist()
    for y in range(len(row)):
        if y not in rejected:
            assert decoder[y] and not worst[y], (spec, row, y, decoder, worst, rejected)
        else:
            assert worst[y], (spec, row, y, worst, rejected)
    got = float(certificates(p, [c], [divergence])[(spec, divergence)])
    want = exact_certificate(row, spec, divergence)
    if want == mpmath.inf:
        assert got == math.inf, f"{spec} {divergence} on {row}: engine {got}, exact +inf"
    else:
        assert got == pytest.approx(float(want), rel=RTOL, abs=ATOL), f"{spec} {divergence} on {row}: {got} vs {want}"
    if divergence in stated:
        assert got == pytest.approx(stated[divergence], rel=1e-12), (spec, row, divergence, got)


# -- certified => accepted ----------------------------------------------------------------------

SPECS = ["greedy", "additive:0", "additive:0.25", "additive:0.5", "multiplicative:0.5", "multiplicative:0.25",
         "multiplicative:1", "topm:1", "topm:2", "topk-delta:2,0.25", "topk-delta:3,0", "typical:0.25,0.5",
         "typical:1,1"]


def _row_weights(v: int) -> st.SearchStrategy[list[int]]:
    # small integers: many exact ties, zeros, and rows where a token sits exactly at a threshold
    return st.lists(st.integers(min_value=0, max_value=8), min_size=v, max_size=v).filter(lambda w: sum(w) > 0)


@st.composite
def _batch(draw: st.DrawFn) -> tuple[list[list[int]], list[list[int]]]:
    """A batch of (target, drafter) weight rows of one vocabulary size (one call per batch keeps
    the test fast; every row is checked)."""
    v = draw(st.integers(min_value=3, max_value=6))
    n = draw(st.integers(min_value=1, max_value=24))
    rows = st.lists(_row_weights(v), min_size=n, max_size=n)
    return draw(rows), draw(rows)


def _check_sound(p: torch.Tensor, q: torch.Tensor, from_logits: bool, specs: list[str]) -> None:
    for div in ("forward", "reverse"):
        out = certified(p, q, specs, from_logits=from_logits, divergence=div)
        for spec in specs:
            v = out[spec]
            bad = (v.certified & ~v.accepted).nonzero().flatten().tolist()
            assert not bad, (f"{spec} {div}: certified but rejected on p={p[bad[0]].tolist()}, q={q[bad[0]].tolist()}: "
                             f"KL={float(v.kl[bad[0]])}, rho*={float(v.certificate[bad[0]])}")


def _probabilities(w: list[list[int]]) -> torch.Tensor:
    t = torch.tensor(w, dtype=torch.float64)
    return t / t.sum(-1, keepdim=True)


def _logits(w: list[list[int]]) -> torch.Tensor:
    t = torch.tensor(w, dtype=torch.float64) - 3
    return torch.where(t > -3, t, torch.full_like(t, -math.inf))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(_batch())
# q is strict greedy's witness for p (KL = rho* exactly) and its tie goes to the rejected token 0; with
# torch's plain kernels float64 put KL 6e-17 below rho*: certified() must not certify it (rounding band)
@example(([[5, 0, 6]], [[1, 0, 1]]))
def test_certified_implies_accepted_on_probabilities(batch: tuple[list[list[int]], list[list[int]]]) -> None:
    """Rows of small integers normalised: zeros, ties at the top, at a rank boundary and at
    thresholds (p(1) - D and A p(1) land on other tokens' values)."""
    _check_sound(_probabilities(batch[0]), _probabilities(batch[1]), False, SPECS)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(_batch())
def test_certified_implies_accepted_on_logits(batch: tuple[list[list[int]], list[list[int]]]) -> None:
    """Integer logits with -inf for zeros (MARS included: it reads logits)."""
    _check_sound(_logits(batch[0]), _logits(batch[1]), True, SPECS + ["mars:0.5", "mars"])


def test_certified_implies_accepted_exhaustively() -> None:
    """Every pair of rows with V = 3 and weights 0..3 (3,969 pairs, zeros and every kind of tie),
    as probabilities and as logits (-inf for a zero weight)."""
    import itertools
    rows = [list(w) for w in itertools.product(range(4), repeat=3) if sum(w) > 0]
    pairs = list(itertools.product(rows, rows))
    w_p, w_q = [a for a, _ in pairs], [b for _, b in pairs]
    _check_sound(_probabilities(w_p), _probabilities(w_q), False, SPECS)
    _check_sound(_logits(w_p), _logits(w_q), True, SPECS + ["mars:0.5", "mars"])


@pytest.mark.parametrize("p,q,spec,from_logits", [
    ([1.0, 0.0, 0.0], [0.0, 1.0, 0.0], "greedy", False),
    ([0.7, 0.3, 0.0], [0.1, 0.0, 0.9], "topm:2", False),
    ([2.0, 1.0, -math.inf], [0.0, 0.0, 5.0], "topm:2", True),
])
def test_reverse_infinite_certificate_is_not_a_certificate(p: list[float], q: list[float], spec: str,
                                                           from_logits: bool) -> None:
    """rho* = +inf in reverse because the rejected token has p = 0; a drafter on that token has
    KL(q || p) = +inf and is rejected, so it must not be certified."""
    pt, qt = torch.tensor(p, dtype=torch.float64), torch.tensor(q, dtype=torch.float64)
    v = certified(pt, qt, spec, from_logits=from_logits, divergence="reverse")[spec]
    assert float(v.certificate) == math.inf and float(v.kl) == math.inf, (float(v.certificate), float(v.kl))
    assert not bool(v.accepted), (p, q, spec)
    assert not bool(v.certified), f"{spec} on p={p}, q={q}: certified (rho*=+inf, KL=+inf) yet rejected"


def test_empty_rejection_region_certifies_even_infinite_kl() -> None:
    """Where nothing is rejected (additive:0.5 on a row with p(1) <= 0.5), every draft is accepted
    and certified, KL = +inf included."""
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    v = certified(p, q, "additive:0.5", divergence="reverse")["additive:0.5"]
    assert float(v.kl) == math.inf and float(v.certificate) == math.inf
    assert bool(v.accepted) and bool(v.certified), (bool(v.accepted), bool(v.certified))
