"""MARS (``mars:THETA``, margin-aware verification): the rule, its logit dependence, its
certificates against the SLSQP oracle, ties, witnesses, soundness against an independent
argmax/topk decoder, the harvest's columns and the refusals (probabilities, drafter side)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import Mars, certificate, certificates, certified, kl_divergence, parse_criterion, witness
from companion.certify.criteria import PAPER_CRITERIA, SPEC_FORMS, index_rank
from companion.harvest.stats import StepStatistics
from tests.tie_oracle import worst_certificate

THETA = 0.87
RTOL, ATOL = 1e-6, 1e-10  # as tests/test_certificates_oracle.py: SLSQP's own accuracy


def relaxed_reference(z: list[float], theta: float = THETA) -> bool:
    """The rule written out in plain Python floats: the two largest logits, ``z(1) > 0`` and
    ``z(2) / z(1) > theta`` (the authors' ratio, without their 1e-10 guard); no runner-up, no relaxation."""
    top = sorted(z, reverse=True)
    return len(top) >= 2 and top[0] > 0 and top[1] / top[0] > theta


def mars_decoder(z: torch.Tensor, d: int, theta: float = THETA) -> bool:
    """A decoder that implements MARS's greedy verification with torch's own argmax/topk."""
    top = torch.topk(z, min(2, z.shape[-1]))
    vals = [float(v) for v in top.values]
    if len(vals) >= 2 and vals[0] > 0 and vals[1] / vals[0] > theta:
        return d in top.indices.tolist()
    return d == int(torch.argmax(z))


# -- spec, parameters, refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["mars:0.87", "mars:0.5", "mars:1", "mars:1e-05"])
def test_spec_round_trip(spec: str) -> None:
    c = parse_criterion(spec)
    assert isinstance(c, Mars) and str(c) == spec and parse_criterion(str(c)) == c


def test_default_spec_forms_and_paper_criteria() -> None:
    assert parse_criterion("mars") == Mars() == Mars(0.87) and str(Mars()) == "mars:0.87"
    assert any(f.startswith("mars:THETA") for f in SPEC_FORMS)
    assert not any(s.startswith("mars") for s in PAPER_CRITERIA)


@given(theta=st.floats(min_value=1e-6, max_value=1.0, allow_nan=False))
@settings(max_examples=100, deadline=None)
def test_round_trip_property(theta: float) -> None:
    c = Mars(theta)
    assert parse_criterion(str(c)) == c and str(parse_criterion(str(c))) == str(c)


@pytest.mark.parametrize("bad", ["mars:0", "mars:1.5", "mars:", "mars:-0.5", "mars:x", "mars:0.5,1", "Mars:0.5"])
def test_bad_specs(bad: str) -> None:
    with pytest.raises(ValueError, match="criterion spec|must be"):
        parse_criterion(bad)


def test_probabilities_are_refused_in_one_line() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    calls = [lambda: certificate(p, "mars:0.87"), lambda: certificates(p, ["greedy", "mars:0.87"]),
             lambda: witness(p, "mars:0.87"), lambda: Mars().threshold(p), lambda: Mars().accepts(p, 0),
             lambda: Mars().decoder_accepts(p, 0), lambda: certified(p, p, "mars:0.87")]
    for call in calls:
        with pytest.raises(ValueError, match=r"needs the target's logits \(from_logits=True\)") as err:
            call()
        assert "\n" not in str(err.value)


def test_no_drafter_side_certificate() -> None:
    """The drafter side ranges over targets given q and knows no logit scale for them: refused."""
    from companion.drafter.certificates import drafter_certificate

    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    with pytest.raises(ValueError, match="no drafter-side certificate for mars:0.87: .* use .greedy."):
        drafter_certificate(q, "mars:0.87")


# -- the rule ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("z, theta, expected", [
    ([10.0, 9.0, 1.0], 0.87, True),  # 0.9 > 0.87
    ([10.0, 8.0, 1.0], 0.87, False),  # 0.8
    ([10.0, 8.75, 1.0], 0.87, True),  # 0.875
    ([8.0, 7.0, 1.0], 0.875, False),  # exactly theta: not above it
    ([5.0, 5.0, 1.0], 0.87, True),  # tied top, positive: ratio 1
    ([5.0, 5.0, 1.0], 1.0, False),  # theta = 1 never relaxes
    ([1.0, -1.0, -2.0], 0.87, False),  # z(2) < 0 < z(1): negative ratio
    ([0.0, -0.01, -3.0], 0.87, False),  # z(1) = 0: no relaxation (ratio undefined)
    ([0.0, 0.0, -3.0], 0.87, False),
    ([-1.0, -1.05, -3.0], 0.87, False),  # z(1) < 0: no relaxation (the raw ratio 1.05 would relax)
    ([-1.0, -100.0, -300.0], 0.87, False),  # (the raw ratio 100 would relax, however far apart)
    ([3.0], 0.87, False),  # V = 1: no runner-up
])
def test_relaxation_rule(z: list[float], theta: float, expected: bool) -> None:
    c = Mars(theta)
    assert bool(c.relaxed(torch.tensor(z, dtype=torch.float64))) is expected
    assert relaxed_reference(z, theta) is expected


def test_nonpositive_top_logit_is_strict_greedy() -> None:
    """z(1) <= 0: the certificate, the witness and the decoder are strict greedy's, whatever theta."""
    z = torch.tensor([[-1.0, -1.05, -3.0, -4.0], [0.0, -0.01, -2.0, -2.5], [-2.0, -2.0, -2.5, -9.0]],
                     dtype=torch.float64)
    for theta in (0.1, 0.87, 1.0):
        for div in ("forward", "reverse"):
            for ties in ("worst", "level-set"):
                got = certificate(z, f"mars:{theta}", div, from_logits=True, ties=ties)
                ref = certificate(z, "greedy", div, from_logits=True, ties=ties)
                assert torch.equal(got, ref), (theta, div, ties)
        assert [bool(Mars(theta).decoder_accepts(z, 1, from_logits=True)[r]) for r in range(3)] == [False, False, False]
    assert float(certificate(z[2], "mars:0.87", from_logits=True)) == 0.0  # tied top: worst case 0
    # the raw ratio of row 0 is 1.05 > 0.87: the authors' formula would have accepted token 1 there
    assert relaxed_reference([-1.0, -1.05]) is False and (-1.05 / -1.0) > THETA


def test_shift_of_logits_changes_the_verdict() -> None:
    """Adding a constant to the logits leaves p unchanged and moves the ratio across theta: the
    same target is certified as top-2 at one shift and as strict greedy at another."""
    base = torch.tensor([2.0, 1.5, -1.0, -2.0], dtype=torch.float64)
    q = torch.tensor([1.4, 2.0, -1.0, -2.0], dtype=torch.float64)  # the drafter proposes token 1
    verdicts = {}
    for shift in (0.0, 10.0, -5.0):
        z = base + shift
        torch.testing.assert_close(torch.softmax(z, -1), torch.softmax(base, -1), rtol=1e-15, atol=0)
        c = certified(z, q, "mars:0.87", from_logits=True)["mars:0.87"]
        verdicts[shift] = (bool(c.accepted), float(c.certificate))
        assert bool(c.accepted) == mars_decoder(z, int(q.argmax()))
    # ratio 1.5/2 = 0.75 (greedy), 11.5/12 = 0.958 (relaxed), z(1) = -3 < 0 (greedy)
    assert verdicts[0.0][0] is False and verdicts[10.0][0] is True and verdicts[-5.0][0] is False
    greedy = float(certificate(base, "greedy", from_logits=True))
    top2 = float(certificate(base, "topm:2", from_logits=True))
    # (shifted logits normalise to the same p up to float64 rounding)
    assert verdicts[0.0][1] == greedy and verdicts[-5.0][1] == pytest.approx(greedy, rel=1e-13)
    assert verdicts[10.0][1] == pytest.approx(top2, rel=1e-13) and greedy < 0.6 * top2


# -- certificates: per row strict greedy's or top-2's, against the oracle ------------------------------------


def _logit_rows(n: int, seed: int, v_range: tuple[int, int] = (3, 7)) -> list[torch.Tensor]:
    """Rows of logits: random scales and shifts (both signs of z(1)), ratios near theta, exact ties."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        v = int(rng.integers(v_range[0], v_range[1]))
        z = rng.normal(size=v) * rng.choice([0.3, 1.0, 3.0])
        z = z - z.max() + rng.choice([-2.0, 0.5, 3.0, 8.0, 20.0])
        if i % 4 == 1 and z.max() > 0:  # z(2) = theta z(1) (1 +- 1e-3): either side of the boundary
            order = np.argsort(-z)
            z[order[1]] = z[order[0]] * THETA * (1 + rng.choice([-1e-3, 1e-3]))
        if i % 5 == 2:  # exact tie at the top or at the second place
            order = np.argsort(-z)
            z[order[int(rng.integers(1, 3)) if v > 3 else 1]] = z[order[int(rng.integers(0, 2))]]
        rows.append(torch.tensor(z, dtype=torch.float64))
    return rows


@pytest.mark.parametrize("ties", ["worst", "level-set"])
@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_per_row_greedy_or_top2(divergence: str, ties: str) -> None:
    rows = _logit_rows(300, seed=1, v_range=(3, 12))
    relaxed = 0
    for z in rows:
        got = certificate(z, "mars:0.87", divergence, from_logits=True, ties=ties)
        which = "topm:2" if relaxed_reference(z.tolist()) else "greedy"
        relaxed += which == "topm:2"
        assert torch.equal(got, certificate(z, which, divergence, from_logits=True, ties=ties)), (z.tolist(), which)
        w = witness(z, "mars:0.87", divergence, from_logits=True, ties=ties)
        torch.testing.assert_close(w, witness(z, which, divergence, from_logits=True, ties=ties), rtol=0, atol=0,
                                   equal_nan=True)
    assert 50 <= relaxed <= 250, relaxed
    # batched: the same numbers as row by row (same V)
    batch = torch.stack([z for z in rows if z.numel() == 5])
    together = certificates(batch, ["mars:0.87"], divergence, from_logits=True, ties=ties)[("mars:0.87", divergence)]
    one_by_one = torch.stack([certificate(z, "mars:0.87", divergence, from_logits=True, ties=ties) for z in batch])
    torch.testing.assert_close(together, one_by_one, rtol=0, atol=0)


def test_two_tokens_relaxed_reject_nothing() -> None:
    z = torch.tensor([[4.0, 3.9], [4.0, 1.0]], dtype=torch.float64)
    for ties in ("worst", "level-set"):
        got = certificate(z, "mars:0.87", from_logits=True, ties=ties)
        assert math.isinf(float(got[0])) and math.isfinite(float(got[1]))


def _agree(ours: float, oracle: float) -> bool:
    if math.isinf(ours) or math.isinf(oracle):
        return ours == oracle
    return abs(ours - oracle) <= ATOL + RTOL * abs(oracle)


@pytest.mark.parametrize("divergence", ["forward", "reverse"])
def test_matches_slsqp_oracle(divergence: str) -> None:
    """Both tie conventions against the SLSQP oracle (``companion.certify.oracle.brute_force_cost`` over
    the rejected tokens, the worst case by ``tests.tie_oracle``), whose rejection region is taken
    from the rule's definition: top-2's on rows that :func:`relaxed_reference` relaxes, strict
    greedy's elsewhere."""
    rows = _logit_rows(40, seed=7 if divergence == "forward" else 8)
    bad, finite, kinds = [], 0, set()
    for z in rows:
        p = torch.softmax(z, -1).numpy()
        which = "topm:2" if relaxed_reference(z.tolist()) else "greedy"
        kinds.add(which)
        oracle_worst, oracle_level = worst_certificate(p, which, divergence, restarts=2)
        worst = float(certificate(z, "mars:0.87", divergence, from_logits=True))
        level = float(certificate(z, "mars:0.87", divergence, from_logits=True, ties="level-set"))
        finite += math.isfinite(oracle_level)
        if not (_agree(worst, oracle_worst) and _agree(level, oracle_level)):
            bad.append((z.tolist(), which, (worst, oracle_worst), (level, oracle_level)))
    assert not bad, f"{len(bad)} disagreements, first: {bad[0]}"
    assert kinds == {"topm:2", "greedy"} and finite >= 30


def test_worst_case_ties() -> None:
    """Relaxed rows with a tie at the second place: a decoder's topk(2) may keep either tied
    token, so the worst case is strict greedy's (the other tied token lifted to the top); a tied
    top on a non-relaxed row gives 0; the level-set convention keeps top-2's as written."""
    z = torch.tensor([
        [5.0, 4.8, 4.8, 1.0],  # relaxed (0.96), tie at places 2 and 3
        [5.0, 5.0, 1.0, 0.0],  # relaxed (tied top, ratio 1)
        [5.0, 5.0, 1.0, 0.0],  # theta = 1 below: not relaxed, tied top
    ], dtype=torch.float64)
    for div in ("forward", "reverse"):
        worst = certificate(z[:2], "mars:0.87", div, from_logits=True)
        level = certificate(z[:2], "mars:0.87", div, from_logits=True, ties="level-set")
        assert float(worst[0]) == float(certificate(z[0], "greedy", div, from_logits=True)) > 0
        assert float(level[0]) == float(certificate(z[0], "topm:2", div, from_logits=True, ties="level-set"))
        assert float(level[0]) > float(worst[0])
        assert float(worst[1]) == float(certificate(z[1], "topm:2", div, from_logits=True)) > 0
        assert float(certificate(z[2], "mars:1", div, from_logits=True)) == 0.0
        assert float(certificate(z[2], "mars:1", div, from_logits=True, ties="level-set")) > 0
    # the decoders' verdicts on row 0: token 1 (first of the tied pair) kept, token 2 not
    assert [bool(Mars().decoder_accepts(z[0], y, from_logits=True)) for y in range(4)] == [True, True, False, False]
    assert [mars_decoder(z[0], y) for y in range(4)].count(True) == 2


def test_witness_attains_the_certificate_and_is_rejected_just_past_it() -> None:
    """D(p, q*) = rho*; q* ties the boundary token y* with its top; nudging y* up makes the draft
    y*, which a decoder with a fixed tie-break rejects (off ties: every MARS decoder), at a
    divergence that tends to rho*."""
    for z in _logit_rows(60, seed=3):
        for div in ("forward", "reverse"):
            rho = float(certificate(z, "mars:0.87", div, from_logits=True))
            w = witness(z, "mars:0.87", div, from_logits=True)
            if not math.isfinite(rho):
                assert bool(torch.isnan(w).all())
                continue
            p = torch.softmax(z, -1)
            assert abs(float(kl_divergence(p, w, div)) - rho) <= 1e-9 + 1e-9 * rho
            rejected = Mars().rejection_mask(z, from_logits=True, ties="worst")
            # y*: a most likely rejected token (any of them when they tie in p) that q* lifts to its top
            boundary = rejected & (p == torch.where(rejected, p, -1.0).max())
            lifted = boundary & (w >= w.max() * (1 - 1e-12))
            assert bool(lifted.any()), (z.tolist(), w.tolist())
            y_star = int(lifted.to(torch.int8).argmax())
            nudged = w.clone()
            nudged[y_star] *= 1 + 1e-6
            nudged /= nudged.sum()
            d = int(nudged.argmax())
            # rejected by a fixed tie-break: first index wins, or (at ties) last index wins
            first = bool(Mars().decoder_accepts(z, d, from_logits=True))
            last = bool(Mars().decoder_accepts(z.flip(-1), z.numel() - 1 - d, from_logits=True))
            assert d == y_star and not (first and last), (z.tolist(), d)
            if not _tie_at_topk(z, d) and torch.unique(z).numel() == z.numel():
                assert not first and not last and not mars_decoder(z, d)
            assert float(kl_divergence(p, nudged, div)) == pytest.approx(rho, rel=1e-4, abs=1e-9)


# -- soundness: certified implies accepted, by the library's verdict and by an independent decoder ------------


def _rounded_pairs(seed: int, n: int, v: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, v, generator=g, dtype=torch.float64) * 3 + torch.linspace(-4, 12, n).unsqueeze(1)
    top = torch.topk(z, 3, dim=-1)
    # every third row: an exact tie (top, or second place); every fourth: a ratio near theta
    rows = torch.arange(n)
    tie_rows = rows[rows % 3 == 0]
    z[tie_rows, top.indices[tie_rows, 1 + (tie_rows % 2)]] = z[tie_rows, top.indices[tie_rows, tie_rows % 2]]
    near = rows[(rows % 4 == 1) & (top.values[:, 0] > 0)]
    z[near, top.indices[near, 1]] = top.values[near, 0] * THETA * (1 + 1e-3 * torch.randn(near.numel(), generator=g,
                                                                                           dtype=torch.float64))
    z = z.to(dtype)
    noise = torch.randn(n, v, generator=g, dtype=torch.float64) * torch.logspace(-3, 0.6, n).unsqueeze(1)
    return z, (z.double() + noise).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_certified_implies_accepted(dtype: torch.dtype) -> None:
    zp, zq = _rounded_pairs(11, 600, 40, dtype)
    counts = {"certified": 0, "accepted": 0, "relaxed": 0}
    for div in ("forward", "reverse"):
        for ties in ("worst",):
            v = certified(zp, zq, ["mars:0.87", "greedy"], from_logits=True, divergence=div, ties=ties)["mars:0.87"]
            d = zq.argmax(-1)
            for r in range(zp.shape[0]):
                ref = mars_decoder(zp[r].double(), int(d[r]))  # exact upcast: the ratio of the values as stored
                assert bool(v.accepted[r]) == ref or _tie_at_topk(zp[r], int(d[r])), (r, zp[r].tolist())
                if bool(v.certified[r]):
                    assert bool(v.accepted[r]) and ref, (r, div, zp[r].tolist(), zq[r].tolist())
            counts["certified"] += int(v.certified.sum())
            counts["accepted"] += int(v.accepted.sum())
    counts["relaxed"] = int(Mars().relaxed(zp).sum())
    # the check is not vacuous: many certified steps, relaxed and not, and more accepted than certified
    assert counts["certified"] >= 200 and counts["accepted"] > counts["certified"] and 100 <= counts["relaxed"] <= 500, counts


def _tie_at_topk(z: torch.Tensor, d: int) -> bool:
    """torch.topk's order among exact ties is unspecified: such rows may legitimately differ
    from the first-index verdict (the worst-case certificate covers either order)."""
    vals = sorted(z.double().tolist(), reverse=True)
    return len(vals) > 2 and vals[1] == vals[2] and float(z[d]) == vals[1]


@given(ints=st.lists(st.integers(-6, 6), min_size=3, max_size=8), shift=st.sampled_from([-3.0, 0.0, 0.25, 4.0]),
       theta=st.sampled_from([0.5, 0.87, 1.0]))
@settings(max_examples=300, deadline=None)
def test_worst_within_decoder_within_level_set(ints: list[int], shift: float, theta: float) -> None:
    """Dyadic logits (ties and boundary ratios everywhere): worst-case acceptance within the
    first-index decoder's within the rule as written; the decoder is argmax, or the stable sort's
    top 2 on relaxed rows, and the worst case equals it where no tie crosses the rank boundary."""
    z = torch.tensor(ints, dtype=torch.float64) / 4 + shift
    c = Mars(theta)
    worst = ~c.rejection_mask(z, from_logits=True, ties="worst")
    level = ~c.rejection_mask(z, from_logits=True)
    decoder = torch.stack([c.decoder_accepts(z, y, from_logits=True) for y in range(len(ints))])
    assert bool((worst <= decoder).all()) and bool((decoder <= level).all()), (z.tolist(), worst, decoder, level)
    m = 2 if relaxed_reference(z.tolist(), theta) else 1
    order = torch.sort(z, descending=True, stable=True).indices.tolist()
    assert decoder.tolist() == [y in order[:m] for y in range(len(ints))]
    s = sorted(z.tolist(), reverse=True)
    if m >= len(s) or s[m - 1] > s[m]:
        assert torch.equal(worst, decoder)


# -- the harvest's columns ---------------------------------------------------------------------------------------


def test_harvest_columns() -> None:
    """StepStatistics with mars among its criteria: certificates as the engine's, verdicts as the
    decoders' (argmax, or topk(2) on relaxed steps) on the harvested logits, certified => accepted."""
    zp, zq = _rounded_pairs(5, 64, 97, torch.float32)
    specs = ["greedy", "topm:2", "mars:0.87"]
    stats = StepStatistics(specs, [1, 2], vocab=97, top_k=16)
    cols = stats(zp, zq)
    ref = certificates(zp, specs, ("forward", "reverse"), from_logits=True)
    for d, name in (("forward", "cert_fwd"), ("reverse", "cert_rev")):
        torch.testing.assert_close(cols[f"{name}[mars:0.87]"], ref[("mars:0.87", d)], rtol=0, atol=0)
    relaxed = Mars().relaxed(zp)
    assert 0 < int(relaxed.sum()) < 64
    torch.testing.assert_close(cols["cert_fwd[mars:0.87]"],
                               torch.where(relaxed, cols["cert_fwd[topm:2]"], cols["cert_fwd[greedy]"]), rtol=0, atol=0)
    d = zq.argmax(-1)
    assert torch.equal(cols["accepted[mars:0.87]"], Mars().decoder_accepts(zp, d, from_logits=True))
    assert torch.equal(cols["accepted[mars:0.87]"],
                       torch.where(relaxed, index_rank(zp, d) <= 2, index_rank(zp, d) == 1))
    for name in ("certified_fwd[mars:0.87]", "certified_rev[mars:0.87]"):
        assert int(cols[name].sum()) > 0
        assert not bool((cols[name] & ~cols["accepted[mars:0.87]"]).any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_harvest_end_to_end(tmp_path, dtype: torch.dtype) -> None:
    """A harvest asked for mars:0.87 (criteria come from the caller or --criteria; the presets keep
    the paper's six) gets its columns from the harvested logits: per step top-2's or strict
    greedy's certificate, a verdict between greedy's and top-2's, certified => accepted."""
    from companion.harvest import harvest, load_traces
    from companion.harvest.toy import toy_pair

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, drafter, tok = toy_pair(vocab=512, hidden=64, layers=2)
        target, drafter = target.to(dtype), drafter.to(dtype)
        texts = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.", "hello"]
        manifest = harvest(target, drafter, tok, texts, tmp_path / "h", n_steps=16, batch_size=3, progress=False,
                           stop_at_eos=False, criteria=["greedy", "topm:2", "mars:0.87"], tree_widths=[1, 2])
    finally:
        torch.set_num_threads(before)
    assert "mars:0.87" in manifest["config"]["criteria"]
    table = load_traces(tmp_path / "h")
    col = {n: np.asarray(table.column(n)) for n in table.column_names if "[" in n}
    for d in ("fwd", "rev"):
        mars, greedy, top2 = col[f"cert_{d}[mars:0.87]"], col[f"cert_{d}[greedy]"], col[f"cert_{d}[topm:2]"]
        assert np.all((mars == greedy) | (mars == top2))
        assert not np.any(col[f"certified_{d}[mars:0.87]"] & ~col["accepted[mars:0.87]"])
    relaxed = col["cert_fwd[mars:0.87]"] == col["cert_fwd[topm:2]"]
    assert 0 < relaxed.sum() < len(relaxed)  # both kinds of steps occur
    acc_m, acc_g, acc_2 = col["accepted[mars:0.87]"], col["accepted[greedy]"], col["accepted[topm:2]"]
    assert np.all(acc_g <= acc_m) and np.all(acc_m <= acc_2)
    assert np.array_equal(acc_m[~relaxed & (col["cert_fwd[greedy]"] != col["cert_fwd[topm:2]"])],
                          acc_g[~relaxed & (col["cert_fwd[greedy]"] != col["cert_fwd[topm:2]"])])


def _greedy_drafter_rho(q: torch.Tensor) -> torch.Tensor:
    """Strict greedy's drafter-side certificate (forward KL), closed form: ``-log(1 - (sqrt q(1) - sqrt q(2))^2)``."""
    top = torch.topk(q, 2, dim=-1).values
    return -torch.log1p(-(top[..., 0].sqrt() - top[..., 1].sqrt()) ** 2)


def test_drafter_side_is_strict_greedys() -> None:
    """Why MARS has no drafter-side certificate of its own: (a) strict greedy's drafter-side
    certificate is sound for MARS whatever the target's logits (MARS rejects only where greedy
    does); (b) it is attained: its minimiser p*, pushed just past the boundary and given the
    logits log p* (z(1) < 0: never relaxed), is rejected by MARS at a KL just above it."""
    g = torch.Generator().manual_seed(21)
    zq = torch.randn(400, 6, generator=g, dtype=torch.float64) * 1.5
    q = torch.softmax(zq, -1)
    d = q.argmax(-1)
    rho = _greedy_drafter_rho(q)
    certified_steps = 0
    for shift in (-6.0, 0.0, 6.0, 30.0):  # (a): targets near q at several logit offsets
        zp = zq + 0.4 * torch.randn(zq.shape, generator=g, dtype=torch.float64) + shift
        kl = kl_divergence(zp, zq, from_logits=True)
        ok = kl < rho
        certified_steps += int(ok.sum())
        for r in torch.nonzero(ok).squeeze(1).tolist():
            assert mars_decoder(zp[r], int(d[r])) and bool(Mars().decoder_accepts(zp[r], int(d[r]), from_logits=True))
    assert certified_steps >= 100
    for r in range(20):  # (b): the minimiser pools d with the runner-up c at sqrt(q_d q_c), the rest as q
        qr = q[r]
        c = int(torch.topk(qr, 2).indices[1])
        p = qr.clone()
        p[[int(d[r]), c]] = torch.sqrt(qr[d[r]] * qr[c])
        p[c] *= 1 + 1e-7  # just past the boundary: c above d
        p /= p.sum()
        z = torch.log(p)
        assert float(z.max()) < 0 and not bool(Mars().relaxed(z))
        assert not bool(Mars().decoder_accepts(z, int(d[r]), from_logits=True)) and not mars_decoder(z, int(d[r]))
        assert float(kl_divergence(p, qr)) == pytest.approx(float(rho[r]), rel=1e-5, abs=1e-12)
