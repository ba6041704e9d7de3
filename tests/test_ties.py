"""Exact ties (issue 24, item 1): certificates are the worst case over tie-breaks by default, so that
``KL < rho*`` implies acceptance by every decoder that breaks ties in a fixed way, in particular by
the decoders' own rule (``torch.argmax``: first index wins; ``torch.topk`` for trees and top-m).

* the counter-example of the issue;
* bfloat16 logits with forced exact top-2 ties against ``torch.argmax`` / ``torch.topk`` decoders
  (no certified step rejected; the counts are printed with ``-s``);
* off ties the worst case equals the level-set certificate bit for bit;
* on an exhaustive dyadic grid of V = 3, 4 targets (exact in float64, ties and exact thresholds
  everywhere) the worst-case certificate equals a brute-force infimum over drafters that some
  tie-break rejects (:mod:`tests.tie_oracle`).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from companion import certificate, certificates, certified, kl_divergence, tree_certificate, tree_witness, witness
from companion.certify.criteria import index_rank, parse_criterion
from companion.certify.certificates import exact_top_tie
from tests.tie_oracle import worst_certificate, worst_rejected_tokens, worst_tree_certificate

SPECS = ["greedy", "additive:0.1", "additive:0.3", "additive:0", "multiplicative:0.5", "multiplicative:1",
         "topm:1", "topm:2", "topm:4", "topk-delta:2,0.2", "topk-delta:10,0.6", "typical:0.09,0.3"]
DIVS = ["forward", "reverse"]


# -- (a) the counter-example ------------------------------------------------------------------------

def test_counter_example() -> None:
    p = torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64)
    q = torch.tensor([0.39, 0.41, 0.2], dtype=torch.float64)
    assert int(torch.argmax(p)) == 0 and int(torch.argmax(q)) == 1  # every real decoder rejects
    kl = float(kl_divergence(p, q))
    assert 2e-4 < kl < 4e-4
    level = certified(p, q, ["greedy"], ties="level-set")["greedy"]
    assert bool(level.certified) and not bool(level.accepted)  # the old promise, broken
    assert float(level.certificate) == pytest.approx(0.0437, abs=1e-4)
    worst = certified(p, q, ["greedy"])["greedy"]
    assert float(worst.certificate) == 0.0 and not bool(worst.certified) and not bool(worst.accepted)
    assert float(certificate(p, "greedy")) == 0.0 == float(certificate(p, "greedy", "reverse"))
    assert float(tree_certificate(p, 1)) == 0.0
    # the witness is p itself: the tie is there already
    assert torch.equal(witness(p, "greedy"), p) and torch.equal(tree_witness(p, 1), p)
    # a drafter that agrees with the decoder is accepted, but not certified
    agree = certified(p, torch.tensor([0.41, 0.39, 0.2], dtype=torch.float64), ["greedy"])["greedy"]
    assert bool(agree.accepted) and not bool(agree.certified)


def test_ties_keyword_is_checked() -> None:
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    calls = [lambda t: certificates(p, ["greedy"], ties=t), lambda t: certificate(p, "greedy", ties=t),
             lambda t: tree_certificate(p, 1, ties=t), lambda t: witness(p, "greedy", ties=t),
             lambda t: tree_witness(p, 1, ties=t), lambda t: certified(p, p, "greedy", ties=t),
             lambda t: parse_criterion("greedy").rejection_mask(p, ties=t)]
    for call in calls:
        for bad in ("best", "levelset", None, 1):
            with pytest.raises(ValueError, match="ties must be 'worst'"):
                call(bad)
        call("worst"), call("level-set")


def test_worst_thresholds_at_ties() -> None:
    """Tied top, and a token exactly at a threshold (dyadic numbers: exact in float64)."""
    p = torch.tensor([0.375, 0.375, 0.125, 0.125], dtype=torch.float64)
    mask = {s: parse_criterion(s).rejection_mask(p, ties="worst").tolist() for s in
            ("greedy", "topm:1", "topm:2", "topm:3", "additive:0", "additive:0.25", "multiplicative:1",
             "topk-delta:2,0.25", "topk-delta:3,0.5")}
    assert mask["greedy"] == mask["topm:1"] == [True] * 4  # a tied top: either may lose the argmax
    # No rank condition: every decoder accepts p_y >= p(1) - 0 (resp. >= 1 * p(1)), both maximisers.
    assert mask["additive:0"] == mask["multiplicative:1"] == [False, False, True, True]
    assert mask["topm:2"] == [False, False, True, True]
    assert mask["topm:3"] == [False, False, True, True]  # p(3) = p(4): the third place may go to either
    # 0.125 sits exactly at 0.375 - 0.25: the decoders' p_y >= tau accepts it, and so does the worst case
    assert mask["additive:0.25"] == [False, False, False, False]
    # topk-delta:2,0.25: 0.125 passes the threshold but no tie-break puts it in the top 2
    assert mask["topk-delta:2,0.25"] == [False, False, True, True]
    # topk-delta:3,0.5: p(3) = p(4), so either may fall outside the top 3
    assert mask["topk-delta:3,0.5"] == [False, False, True, True]
    # a unique maximiser stays accepted at additive:0 / multiplicative:1
    u = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    for s in ("greedy", "additive:0", "multiplicative:1"):
        assert parse_criterion(s).rejection_mask(u, ties="worst").tolist() == [False, True, True]
    for s, want in (("additive:0", [True, True, False, False]), ("additive:0.25", [True] * 4),
                    ("multiplicative:1", [True, True, False, False])):
        got = [bool(parse_criterion(s).decoder_accepts(p, y)) for y in range(4)]
        assert got == want, (s, got)
    # the decoders' verdict: first index wins
    for s, want in (("greedy", [True, False, False, False]), ("topm:2", [True, True, False, False]),
                    ("topm:3", [True, True, True, False])):
        got = [bool(parse_criterion(s).decoder_accepts(p, y)) for y in range(4)]
        assert got == want, s


# -- (b) bfloat16 ties against torch.argmax / torch.topk decoders -------------------------------------

def _bf16_pairs(v: int = 50, n_targets: int = 200, n_drafters: int = 20, seed: int = 0):
    """``(target logits, drafter logits, tied)``: bfloat16, ``[N, V]``; half the targets with an exact
    top-2 tie (the runner-up copied onto the top), every target with drafters at several distances."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(2 * n_targets, v, generator=gen, dtype=torch.float64) * 2.5
    tied = torch.zeros(2 * n_targets, dtype=torch.bool)
    tied[:n_targets] = True
    top2 = base.topk(2, dim=1).indices
    rows = torch.arange(n_targets)
    base[rows, top2[:n_targets, 1]] = base[rows, top2[:n_targets, 0]]
    lp = base.to(torch.bfloat16)
    scales = torch.tensor([0.003, 0.01, 0.03, 0.1, 0.3], dtype=torch.float64).repeat(n_drafters // 5 + 1)[:n_drafters]
    noise = torch.randn(2 * n_targets, n_drafters, v, generator=gen, dtype=torch.float64) * scales[None, :, None]
    lq = (lp.double()[:, None, :] + noise).to(torch.bfloat16)
    lp_rep = lp[:, None, :].expand(-1, n_drafters, -1).reshape(-1, v)
    tied_rep = tied[:, None].expand(-1, n_drafters).reshape(-1)
    return lp_rep, lq.reshape(-1, v), tied_rep


def test_bf16_ties_no_certified_step_is_rejected_by_torch_decoders() -> None:
    lp, lq, tied = _bf16_pairs()
    assert bool(exact_top_tie(lp, from_logits=True)[tied].all())
    g, d = torch.argmax(lp, -1), torch.argmax(lq, -1)
    widths = [1, 2, 4]
    cover = {m: (torch.topk(lq, m, dim=-1).indices == g[:, None]).any(-1) for m in widths}
    topm = {m: (torch.topk(lp, m, dim=-1).indices == d[:, None]).any(-1) for m in (2, 4)}
    accept = {"greedy": d == g, "topm:2": topm[2], "topm:4": topm[4], "tree:1": cover[1], "tree:2": cover[2],
              "tree:4": cover[4]}
    report = {}
    for div in DIVS:
        kl = kl_divergence(lp, lq, div, from_logits=True)
        for ties in ("worst", "level-set"):
            rho = certificates(lp, ["greedy", "topm:2", "topm:4"], div, tree_widths=widths, from_logits=True, ties=ties)
            for key, ok in accept.items():
                name = key if key.startswith("tree") else key
                cert = kl < rho[(name, div)]
                bad = cert & ~ok
                report[(key, div, ties)] = (int(cert.sum()), int((cert & tied).sum()), int(bad.sum()))
                if ties == "worst":
                    assert not bool(bad.any()), (key, div, report[(key, div, ties)])
    print(f"\nbf16 V=50, {int(tied.sum())} tied and {int((~tied).sum())} untied steps")
    for (key, div, ties), (n_cert, n_cert_tied, n_bad) in report.items():
        print(f"  {key:8s} {div:8s} {ties:9s}: certified {n_cert:5d} (tied {n_cert_tied:5d}), rejected after certified {n_bad}")
    # the test has teeth: the level-set convention certifies rejected steps here, the worst case
    # still certifies plenty (trees and top-m on tied steps too)
    assert report[("greedy", "forward", "level-set")][2] > 100
    assert report[("greedy", "forward", "worst")][0] > 1000
    assert report[("tree:2", "forward", "worst")][1] > 100 and report[("topm:2", "forward", "worst")][1] > 100
    assert report[("greedy", "forward", "worst")][1] == 0  # a tied top certifies nothing for greedy


def test_bf16_ties_verdicts_api() -> None:
    """``certified(...)``: certified implies accepted, and accepted is the torch decoders' verdict."""
    lp, lq, tied = _bf16_pairs(n_targets=60, n_drafters=10, seed=1)
    specs = ["greedy", "topm:2", "topk-delta:2,0.6", "additive:0.3", "typical:0.09,0.3"]
    d, g = torch.argmax(lq, -1), torch.argmax(lp, -1)
    in_top2 = (torch.topk(lp, 2, dim=-1).indices == d[:, None]).any(-1)
    for div in DIVS:
        res = certified(lp, lq, specs, from_logits=True, divergence=div)
        for spec in specs:
            v = res[spec]
            assert not bool((v.certified & ~v.accepted).any()), (spec, div)
        assert torch.equal(res["greedy"].accepted, d == g)
        # top-2: membership in the id-ordered top 2; where no tie straddles the 2nd place, torch.topk's
        s = torch.sort(lp.float(), dim=-1, descending=True).values
        clean = s[:, 1] != s[:, 2]
        assert torch.equal(res["topm:2"].accepted[clean], in_top2[clean])
        assert torch.equal(res["topm:2"].accepted, index_rank(lp, d) <= 2)


# -- (c) off ties: worst == level-set, bit for bit ---------------------------------------------------

def test_off_ties_worst_equals_level_set_float64() -> None:
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(400, 12, generator=gen, dtype=torch.float64) * 2, -1)
    s = p.sort(-1, descending=True).values
    assert bool((s[:, :-1] > s[:, 1:]).all())  # no tie anywhere
    specs = [x for x in SPECS if x not in ("additive:0", "multiplicative:1")] + ["additive:0", "multiplicative:1"]
    for div in DIVS:
        w = certificates(p, specs, div, tree_widths=[1, 2, 4])
        lv = certificates(p, specs, div, tree_widths=[1, 2, 4], ties="level-set")
        for key in w:
            assert torch.equal(w[key], lv[key]), key
        for spec in ("greedy", "topm:2", "additive:0.3"):
            torch.testing.assert_close(witness(p, spec, div), witness(p, spec, div, ties="level-set"),
                                       rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(tree_witness(p, 2, div), tree_witness(p, 2, div, ties="level-set"),
                                   rtol=0, atol=0, equal_nan=True)


def test_off_ties_worst_equals_level_set_large_bf16() -> None:
    """Qwen-sized bfloat16 rows: wherever the rank boundaries are untied and no token sits exactly at a
    threshold, both conventions give the same certificates, batched."""
    v = 151_936
    gen = torch.Generator().manual_seed(4)
    lp = (torch.randn(6, v, generator=gen) * 3).to(torch.bfloat16)
    lp[:, 17] = lp.float().amax(1).to(torch.bfloat16) + 2  # a clear top
    specs = ["greedy", "additive:0.3", "multiplicative:0.1", "topm:4", "topk-delta:10,0.6", "typical:0.09,0.3"]
    # exact ties only (logits_dtype="exact"): the default also counts bfloat16 near ties as ties
    w = certificates(lp, specs, DIVS, tree_widths=[1, 2, 4], from_logits=True, logits_dtype="exact")
    lv = certificates(lp, specs, DIVS, tree_widths=[1, 2, 4], from_logits=True, ties="level-set")
    banded = certificates(lp, specs, DIVS, tree_widths=[1, 2, 4], from_logits=True)
    for key in w:
        assert bool((banded[key] <= w[key]).all()), key
    s = lp.float().sort(-1, descending=True).values
    checked = 0
    for key in w:
        spec = key[0]
        if spec in ("topm:4", "topk-delta:10,0.6", "tree:4"):
            m = {"topm:4": 4, "topk-delta:10,0.6": 10, "tree:4": 4}[spec]
            ok = s[:, m - 1] != s[:, m]
        else:
            ok = s[:, 0] != s[:, 1]
        if not spec.startswith("tree"):
            c = parse_criterion(spec)
            tau = c.threshold(lp, from_logits=True)
            probs = torch.softmax(lp.double(), -1)
            ok = ok & ~(probs == tau[:, None]).any(-1)
        assert torch.equal(w[key][ok], lv[key][ok]), key
        checked += int(ok.sum())
    assert checked > 0.9 * len(w) * lp.shape[0]


# -- (d) brute force on an exact grid: some tie-break rejects the draft ------------------------------

def _grid(v: int, n: int = 16) -> list[np.ndarray]:
    """Every sorted composition of 1 into ``v`` positive multiples of ``1/n`` (dyadic: exact), each
    shuffled by a fixed permutation (certificates do not depend on the order; the decoders do)."""
    rng = np.random.default_rng(v)
    out = []
    for parts in itertools.combinations_with_replacement(range(1, n), v):
        if sum(parts) == n:
            out.append(rng.permutation(np.array(parts[::-1], dtype=np.float64) / n))
    return out


GRID_SPECS = ["greedy", "additive:0", "additive:0.125", "multiplicative:1", "multiplicative:0.5", "topm:1", "topm:2",
              "topk-delta:1,0.5", "topk-delta:2,0.125", "typical:0.09,0.3"]


def _agree(ours: float, oracle: float) -> bool:
    if math.isinf(ours) or math.isinf(oracle):
        return ours == oracle
    return abs(ours - oracle) <= 1e-10 + 1e-6 * abs(oracle)


@pytest.mark.slow
@pytest.mark.parametrize("v, n", [(3, 32), (4, 16)])
def test_grid_worst_case_against_brute_force(v: int, n: int) -> None:
    grid = _grid(v, n)
    tied = differ = 0
    bad = []
    for p in grid:
        pt = torch.tensor(p)
        tied += len(set(p.tolist())) < v
        for spec in GRID_SPECS:
            if spec.startswith("topm") and int(spec.split(":")[1]) >= v:
                continue
            differ += set(worst_rejected_tokens(p, spec).tolist()) != set(np.nonzero(
                parse_criterion(spec).rejection_mask(pt).numpy())[0].tolist())
            for div in DIVS:
                ours = float(certificate(pt, spec, div))
                oracle, _ = worst_certificate(p, spec, div, restarts=2)
                if not _agree(ours, oracle):
                    bad.append((p.tolist(), spec, div, ours, oracle))
        for m in range(1, v):
            for div in DIVS:
                ours = float(tree_certificate(pt, m, div))
                oracle = worst_tree_certificate(p, m, div, restarts=2)
                if not _agree(ours, oracle):
                    bad.append((p.tolist(), f"tree:{m}", div, ours, oracle))
    print(f"\nV={v}: {len(grid)} grid targets, {tied} with an exact tie, {differ} (target, criterion) pairs "
          f"where the worst case rejects more than the level set")
    assert not bad, f"{len(bad)} disagreements, first: {bad[0]}"
    assert tied >= 7 and differ >= 20
