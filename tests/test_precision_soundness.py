"""Certificates at the precisions models return: never above the exact rho*, never certified-and-rejected.

The oracle is independent of the engine and exact to far below the engine's rounding: the input as
given (float32, bfloat16, float16 or float64 logits or probabilities) is normalised with every tail
term summed exactly (``math.fsum`` of float64 terms, each within one ulp) and the head in 40 digits
(mpmath); strict greedy's certificate is its closed form in mpmath, the other criteria are the
literal pooled scan of ``tests/test_large_vocab.reference`` on those probabilities. Drafters are
put at the library's own witness and 1, 2, 4 ... 4096 float32 ulps beyond it (the rejected token's
logit raised), in the input's dtype: none may be certified and rejected, by the exact rule or by
the library's decoder.
"""
from __future__ import annotations

import functools
import math

import mpmath
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import companion as cp
from companion.certify.criteria import parse_criterion
from companion.certify.precision import chunked_sum, chunked_sum_error, xlog2_bound, xlog_bound
from tests.test_large_vocab import reference

MP_DPS = 40  # digits of this module's mpmath oracle (set per test by conftest.py)
V = 151_936
SPECS = ["greedy", "multiplicative:0.1", "topm:4", "additive:0.3", "typical:0.09,0.3"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


@functools.lru_cache(maxsize=64)
def _exact(key: bytes, dtype: str, from_logits: bool) -> tuple[np.ndarray, tuple]:
    """The exact distribution of one row as given, rounded once to float64, and its two largest
    probabilities in 40 digits (cached: the rows are reread for every criterion)."""
    v = np.frombuffer(key, dtype=np.float64)
    order = np.argsort(-v, kind="stable")
    head = order[:64]
    in_head = np.zeros(len(v), dtype=bool)
    in_head[head] = True
    if from_logits:
        finite = np.isfinite(v)
        m = v[finite].max()
        tail = math.fsum(math.exp(t - m) for t in v[finite & ~in_head])
        head_mp = {int(i): mpmath.exp(mpmath.mpf(float(v[i])) - mpmath.mpf(float(m))) for i in head if np.isfinite(v[i])}
        total = mpmath.fsum(head_mp.values()) + mpmath.mpf(tail)
        out = np.exp(np.where(finite, v - m, -np.inf)) / float(total)
    else:
        tail = math.fsum(v[~in_head])
        head_mp = {int(i): mpmath.mpf(float(v[i])) for i in head}
        total = mpmath.fsum(head_mp.values()) + mpmath.mpf(tail)
        out = v / float(total)
    for i, t in head_mp.items():
        out[i] = float(t / total)
    top2 = tuple(head_mp.get(int(i), mpmath.mpf(0)) / total for i in order[:2])
    return out, top2


def exact_probs(x: torch.Tensor, from_logits: bool) -> np.ndarray:
    return _exact(x.double().numpy().tobytes(), str(x.dtype), from_logits)[0]


def greedy_exact(x: torch.Tensor, from_logits: bool, divergence: str) -> float:
    """Strict greedy's worst-case certificate in 40 digits (0 at an exact top tie)."""
    v = x.double().numpy()
    order = np.argsort(-v, kind="stable")
    if v[order[0]] == v[order[1]]:
        return 0.0
    p1, p2 = _exact(v.tobytes(), str(x.dtype), from_logits)[1]
    if divergence == "forward":
        s = p1 + p2
        return float(p1 * mpmath.log(2 * p1 / s) + (p2 * mpmath.log(2 * p2 / s) if p2 > 0 else 0))
    return float(-mpmath.log(1 - (mpmath.sqrt(p1) - mpmath.sqrt(p2)) ** 2))


def exact_cert(x: torch.Tensor, from_logits: bool, spec: str, divergence: str) -> float:
    if spec == "greedy":
        return greedy_exact(x, from_logits, divergence)
    return reference(exact_probs(x, from_logits), spec, divergence)


def exact_accepts(x: torch.Tensor, from_logits: bool, spec: str, token: int) -> bool:
    """The rule as written on the exact distribution, with the decoders' first-index rank rule."""
    p = exact_probs(x, from_logits)
    c = parse_criterion(spec)
    s = np.sort(p)[::-1]
    name = spec.split(":")[0]
    if name == "greedy":
        return token == int(np.argmax(x.double().numpy()))
    if name == "topm":
        ranks = np.argsort(-x.double().numpy(), kind="stable")
        return token in set(int(i) for i in ranks[: c.m])
    if name == "multiplicative":
        return p[token] >= c.alpha * s[0]
    if name == "additive":
        return p[token] >= s[0] - c.delta
    if name == "typical":
        h = -math.fsum(float(a) * math.log(a) for a in p if a > 0)
        return p[token] > min(c.eps, c.delta * math.exp(-h))
    raise AssertionError(spec)


def lm_rows(n: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows shaped like a language model's logits: a lognormal-ish body, a few leading tokens,
    peaked rows (p1 = 1 - 1e-12), long flat tails, exact and near ties, -inf entries."""
    g = torch.Generator().manual_seed(seed)
    z = 2.5 * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    rows = [z[0].clone()]
    peaked = z[1].clone(); peaked[7] = peaked.max() + 27.6 + math.log(vocab)    # p1 ~ 1 - 1e-12
    flat = 0.02 * z[2]; flat[3] = 1.0                                              # long flat tail
    tie = z[3].clone(); tie[11] = tie[12] = tie.max() + 1.0                        # exact tie
    near = z[4].clone(); near[5] = near.max() + 2.0; near[6] = near[5] - 0.07      # near tie
    masked = z[5].clone(); masked[vocab // 2:] = -math.inf; masked[1] = masked.max() + 3.0
    rows += [peaked, flat, tie, near, masked]
    return torch.stack(rows[:n])


def drafters_beyond_witness(p: torch.Tensor, spec: str, divergence: str, dtype: torch.dtype) -> torch.Tensor:
    """Logits of drafters at the witness q* and 1, 2, 4 ... 4096 float32 ulps beyond it: the
    rejected token y* (the one q* ties with its top) raised by k ulps of its logit."""
    q = cp.witness(p, spec, divergence, from_logits=True)
    if not bool(torch.isfinite(q).all()):
        return torch.empty(0, p.shape[-1], dtype=dtype)
    base = torch.log(q)
    p64 = torch.softmax(p.double(), -1)
    top = base.max()
    tied = torch.nonzero(base >= top - 1e-12).squeeze(1)
    rejected = [int(i) for i in tied if not exact_accepts(p, True, spec, int(i))] if spec != "typical:0.09,0.3" \
        else [int(tied[torch.argmin(p64[tied])])]
    if not rejected:
        return torch.empty(0, p.shape[-1], dtype=dtype)
    y = rejected[0]
    out = []
    for k in [0] + [2**j for j in range(13)]:
        row = base.clone()
        row[y] = top + k * 2.0**-23 * max(1.0, abs(float(top)))
        out.append(row)
    return torch.stack(out).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab", [97, V])  # the oracle scan reads the top 12: V >= 13
def test_certificates_never_above_the_exact_value(dtype: torch.dtype, vocab: int) -> None:
    logits = lm_rows(6, vocab, seed=vocab % 1000).to(dtype)
    for from_logits in (True, False):
        x = logits if from_logits else torch.softmax(logits.double(), -1).to(dtype)
        ours = cp.certificates(x, SPECS, ("forward", "reverse"), from_logits=from_logits, logits_dtype="exact")
        for spec in SPECS:
            for div in ("forward", "reverse"):
                for i in range(x.shape[0]):
                    want = exact_cert(x[i], from_logits, spec, div)
                    got = float(ours[(spec, div)][i])
                    if math.isinf(want):
                        continue
                    assert got <= want * (1 + 1e-9) + 1e-300, (dtype, vocab, from_logits, spec, div, i, got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_drafter_beyond_the_witness_is_certified_and_rejected(dtype: torch.dtype) -> None:
    """At V = 151,936: drafters at the witness and a few ulps beyond it, every criterion, both
    divergences: certified implies accepted by the exact rule and by the library's decoder."""
    logits = lm_rows(6, V, seed=3).to(dtype)
    for spec in SPECS:
        for div in ("forward", "reverse"):
            for i in range(logits.shape[0]):
                q = drafters_beyond_witness(logits[i], spec, div, dtype)
                if q.shape[0] == 0:
                    continue
                p = logits[i].expand(q.shape[0], -1)
                v = cp.certified(p, q, [spec], from_logits=True, divergence=div)[spec]
                for j in range(q.shape[0]):
                    if bool(v.certified[j]):
                        tok = int(v.token[j])
                        assert bool(v.accepted[j]), (dtype, spec, div, i, j)
                        assert exact_accepts(logits[i], True, spec, tok), (dtype, spec, div, i, j)
    # the drafters inside the budget (the witness's mixtures) are certified: the check is not vacuous
    p = logits[0].unsqueeze(0)
    inside = 0.9 * torch.softmax(p.double(), -1) + 0.1 * cp.witness(p, "multiplicative:0.1", from_logits=True)
    v = cp.certified(p, torch.log(inside).to(dtype), ["multiplicative:0.1"], from_logits=True)["multiplicative:0.1"]
    assert bool(v.certified.all()) and bool(v.accepted.all()), (v.kl.tolist(), v.certificate.tolist())


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(13, 40), scale=st.sampled_from([0.5, 3.0, 12.0]),
       dtype=st.sampled_from(DTYPES), spec=st.sampled_from(SPECS), div=st.sampled_from(["forward", "reverse"]),
       from_logits=st.booleans())
def test_small_vocabularies_sound_in_every_dtype(seed, vocab, scale, dtype, spec, div, from_logits) -> None:
    g = torch.Generator().manual_seed(seed)
    z = scale * torch.randn(4, vocab, generator=g, dtype=torch.float64)
    z[1, 1] = z[1, 0]                              # an exact tie
    z[2, 0] = z[2].max() + 40.0                    # peaked
    x = z.to(dtype) if from_logits else torch.softmax(z, -1).to(dtype)
    if not from_logits and bool((x.double().sum(-1) <= 0).any()):
        return
    try:
        ours = cp.certificates(x, [spec], [div], from_logits=from_logits, logits_dtype="exact")[(spec, div)]
    except ValueError:
        return  # rows the validation refuses (a float16 row that underflows to zeros)
    for i in range(4):
        want = exact_cert(x[i], from_logits, spec, div)
        if not math.isinf(want):
            assert float(ours[i]) <= want * (1 + 1e-9) + 1e-300, (i, float(ours[i]), want)


def test_near_ties_of_bfloat16_are_ties() -> None:
    """A 1-ulp bfloat16 tie (top logit 20, gap 0.125) with the drafter equal to the target: the
    certificate is 0 and nothing is certified (another kernel path may take the other token);
    declared as exact, the old certificate comes back."""
    logits = torch.zeros(1, 1000, dtype=torch.bfloat16)
    logits[0, :100] = torch.linspace(-5, 5, 100).to(torch.bfloat16)
    logits[0, 500] = 20.0
    logits[0, 501] = 19.875
    rho = cp.certificates(logits, ["greedy"], "forward", from_logits=True)[("greedy", "forward")]
    assert float(rho[0]) == 0.0
    v = cp.certified(logits, logits, ["greedy"], from_logits=True)["greedy"]
    assert not bool(v.certified[0]) and bool(v.accepted[0])
    exact = cp.certificates(logits, ["greedy"], "forward", from_logits=True, logits_dtype="exact")
    assert float(exact[("greedy", "forward")][0]) > 1e-4
    # a float32 copy of the same logits: exact by default, the band when declared
    f32 = logits.float()
    assert float(cp.certificates(f32, ["greedy"], "forward", from_logits=True)[("greedy", "forward")][0]) > 1e-4
    assert float(cp.certificates(f32, ["greedy"], "forward", from_logits=True,
                                 logits_dtype="bfloat16")[("greedy", "forward")][0]) == 0.0
    # a gap of one ulp more than the band is outside it: a positive certificate
    from companion.harvest.ties import TIE_ULPS

    logits[0, 501] = 20.0 - (TIE_ULPS + 1) * 0.125
    assert float(cp.certificates(logits, ["greedy"], "forward", from_logits=True)[("greedy", "forward")][0]) > 0


def test_chunked_sum_within_its_bound_in_any_order() -> None:
    """The chunked float32 sum against math.fsum: within chunked_sum_error of sum |x|, for rows
    whose terms span many scales, and for the same terms in a permuted order."""
    g = torch.Generator().manual_seed(5)
    x = torch.exp(4 * torch.randn(3, V, generator=g)).float()
    for row in (x, x[:, torch.randperm(V, generator=g)]):
        got = chunked_sum(row)
        for i in range(row.shape[0]):
            exact = math.fsum(row[i].double().tolist())
            assert abs(float(got[i]) - exact) <= chunked_sum_error(V, torch.float32) * exact


def test_jensen_bounds_hold() -> None:
    """sum x log(1/x) <= T log(n/T) and sum x log(x)^2 <= n h(T/n) on random rows in [0, 1]."""
    g = torch.Generator().manual_seed(9)
    for scale in (0.5, 3.0, 10.0):
        x = torch.exp(-scale * torch.rand(20, 5000, generator=g, dtype=torch.float64) ** 2 * 10)
        t = x.sum(1)
        assert bool(((-x * x.log()).sum(1) <= xlog_bound(t, 5000) * (1 + 1e-12)).all())
        assert bool(((x * x.log() ** 2).sum(1) <= xlog2_bound(t, 5000) * (1 + 1e-12)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_typical_entropy_interval_contains_the_exact_entropy(dtype: torch.dtype) -> None:
    """From logits and from probabilities: |H - exact H| <= entropy_err, every row."""
    from companion.certify.summary import summarize
    logits = lm_rows(6, V, seed=11).to(dtype)
    for from_logits in (True, False):
        x = logits if from_logits else torch.softmax(logits.double(), -1).to(dtype)
        s = summarize(x, from_logits=from_logits, k=64, with_entropy=True)
        for i in range(x.shape[0]):
            p = exact_probs(x[i], from_logits)
            h = -math.fsum(float(a) * math.log(a) for a in p if a > 0)
            assert abs(float(s.entropy[i]) - h) <= float(s.entropy_err[i]), (from_logits, i, float(s.entropy[i]), h)


def test_a_gap_of_exactly_the_band_is_a_tie() -> None:
    """bfloat16 logits TIE_ULPS ulps apart (20 and 19.5 for a band of 4: the band at 20, whose ulp
    is 0.125) count as tied, whatever the rounding of p(1) / p(2); one ulp further they do not."""
    from companion.harvest.ties import TIE_ULPS, near_ties

    for second, tied in ((20.0 - TIE_ULPS * 0.125, True), (20.0 - (TIE_ULPS + 1) * 0.125, False)):
        logits = torch.full((1, 512), -4.0, dtype=torch.bfloat16)
        logits[0, 0], logits[0, 1] = 20.0, second
        cert = float(cp.certificates(logits, ["greedy"], ("forward",), from_logits=True)[("greedy", "forward")])
        assert bool(near_ties(np.array([20.0]), np.array([20.0 - second]), "bfloat16")[0]) == tied
        assert (cert == 0.0) == tied, (second, cert)
