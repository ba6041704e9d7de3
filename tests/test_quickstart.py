"""The quickstart of README.md and book/intro.md runs as written, and `companion.certified` is right.

The quickstart's code blocks are read from both files (they must agree) and executed, so the
documentation cannot rot. The Hugging Face bridge runs on a tiny random Qwen3 pair saved to a
temporary folder in place of the hub ids. `certified` is checked against an independent
per-row computation of the acceptance rule and of the KL divergence.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import companion as cp
from companion.certify.precision import U64, gamma
from companion.harvest.toy import save_pair, toy_pair
from tests.conftest import ROOT

HUB_TARGET, HUB_DRAFTER = "Qwen/Qwen3-1.7B", "Qwen/Qwen3-0.6B"


def quickstart_blocks(path: Path) -> list[str]:
    """The ```python blocks of the "## Quickstart" section of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    match = re.search(r"^## Quickstart\n(.*?)(?=^## )", text, re.S | re.M)
    assert match, f"{path.name} has no '## Quickstart' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), re.S | re.M)


BLOCKS = quickstart_blocks(ROOT / "README.md")


def _run(code: str) -> tuple[dict, str]:
    namespace: dict = {"__name__": "__quickstart__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<quickstart>", "exec"), namespace)
    return namespace, out.getvalue()


def test_readme_and_intro_share_one_quickstart() -> None:
    assert len(BLOCKS) == 3
    assert quickstart_blocks(ROOT / "book" / "intro.md") == BLOCKS
    # about ten lines each, as promised
    assert all(len(b.strip().splitlines()) <= 16 for b in BLOCKS)


def test_quickstart_logits_batch() -> None:
    ns, out = _run(BLOCKS[0])
    target, verdict, rho, q_star = ns["target"], ns["verdict"], ns["rho"], ns["q_star"]
    assert set(verdict) == set(cp.PAPER_CRITERIA) and len(out.splitlines()) == 2 + len(cp.PAPER_CRITERIA)
    p = target.double().softmax(-1)
    # the witness sits at the certificate: the certificate of float32 logits is rounded down by the
    # bound on their float32 normaliser (companion.certify.precision), a few 1e-6 on these flat rows
    kl_w, cert = cp.kl_divergence(p, q_star), rho[("greedy", "forward")]
    assert bool((cert <= kl_w * (1 + 1e-12)).all()), (cert, kl_w)
    torch.testing.assert_close(kl_w, cert, rtol=5e-6, atol=1e-12)
    for v in verdict.values():
        assert v.certified.shape == (4,) and bool((~v.certified | v.accepted).all())
    # the example shows both outcomes, so a reader sees what each looks like
    assert any(bool(v.certified.any()) for v in verdict.values())
    assert any(bool((v.accepted & ~v.certified).any()) for v in verdict.values())


@pytest.fixture(scope="module")
def toy_checkpoints(tmp_path_factory) -> dict[str, Path]:
    torch.manual_seed(0)
    target, drafter, tok = toy_pair(vocab=300, hidden=32, layers=1, seed=3)
    return save_pair(tmp_path_factory.mktemp("toy"), target, drafter, tok)


def test_quickstart_hugging_face_bridge(toy_checkpoints, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = BLOCKS[1]
    assert HUB_TARGET in code and HUB_DRAFTER in code
    code = code.replace(HUB_TARGET, str(toy_checkpoints["target"])).replace(HUB_DRAFTER, str(toy_checkpoints["drafter"]))
    ns, out = _run(code)
    ids, out_gen, p_logits, q_logits = ns["ids"], ns["out"], ns["p_logits"], ns["q_logits"]
    steps = out_gen.sequences.shape[1] - ids.shape[1]
    assert steps >= 1 and p_logits.shape == q_logits.shape == (1, steps, 300)
    with torch.no_grad():   # the bridge's pairing, recomputed without generate: both models, same prefixes
        full_p = ns["target"](out_gen.sequences).logits[:, ids.shape[1] - 1 : -1]
        full_q = ns["drafter"](out_gen.sequences).logits[:, ids.shape[1] - 1 : -1]
    torch.testing.assert_close(p_logits, full_p, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q_logits, full_q, rtol=0, atol=0)
    assert torch.equal(p_logits.argmax(-1), out_gen.sequences[:, ids.shape[1]:])   # greedy decoding
    for v in ns["verdict"].values():
        assert v.certified.shape == (1, steps) and bool((~v.certified | v.accepted).all())
    assert "certified" in out


def test_quickstart_server_logprobs() -> None:
    ns, _ = _run(BLOCKS[2])
    res = ns["res"]
    assert set(res) == {(c, d) for c in ("greedy", "additive:0.3") for d in ("forward", "reverse")}
    greedy = res[("greedy", "forward")]
    assert greedy.exact.all()          # strict greedy needs only the top two
    # exact value: the two-point formula on the top two of each step
    for i, step in enumerate(ns["steps"]):
        a, b = sorted((math.exp(x) for x in step.values()), reverse=True)[:2]
        s = a + b
        want = a * math.log(2 * a / s) + b * math.log(2 * b / s)
        assert math.isclose(float(greedy.value[i]), want, rel_tol=1e-12)


# --- companion.certified against an independent computation ---------------------------------

def _threshold(spec: str, p: torch.Tensor) -> float:
    """``tau(p)`` from the definitions, one row (float64)."""
    s = sorted(p.tolist(), reverse=True)
    name, _, args = spec.partition(":")
    a = [float(x) for x in args.split(",")] if args else []
    if name == "greedy":
        return s[0]
    if name == "additive":
        return s[0] - a[0]
    if name == "multiplicative":
        return a[0] * s[0]
    if name == "topm":
        return s[int(a[0]) - 1]
    if name == "topk-delta":
        return max(s[int(a[0]) - 1], s[0] - a[1])
    if name == "typical":
        entropy = -sum(x * math.log(x) for x in s if x > 0)
        return min(a[0], a[1] * math.exp(-entropy))
    raise AssertionError(spec)


SPECS = ["greedy", "additive:0.2", "multiplicative:0.4", "topm:3", "topk-delta:3,0.1", "typical:0.09,0.3"]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), vocab=st.integers(4, 40), scale=st.sampled_from([0.3, 2.0, 6.0]),
       noise=st.sampled_from([0.0, 0.05, 0.5, 3.0]), divergence=st.sampled_from(["forward", "reverse"]))
def test_certified_matches_the_definitions(seed, vocab, scale, noise, divergence) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = scale * torch.randn(5, vocab, generator=g, dtype=torch.float64)
    lq = lp + noise * torch.randn(5, vocab, generator=g, dtype=torch.float64)
    res = cp.certified(lp, lq, SPECS, from_logits=True, divergence=divergence)
    p, q = lp.softmax(-1), lq.softmax(-1)
    rho = cp.certificates(p, SPECS, [divergence])
    for spec in SPECS:
        v = res[spec]
        assert v.criterion == spec and v.divergence == divergence
        for i in range(5):
            d = int(torch.argmax(q[i]))
            a, b = (p[i], q[i]) if divergence == "forward" else (q[i], p[i])
            kl = float((a * (a / b).log()).sum())
            tau = _threshold(spec, p[i])
            accepted = p[i, d] > tau if spec.startswith("typical") else p[i, d] >= tau
            assert int(v.token[i]) == d
            assert math.isclose(float(v.kl[i]), kl, rel_tol=1e-9, abs_tol=1e-12)
            if abs(float(p[i, d]) - tau) > 1e-12:          # away from the threshold itself
                assert bool(v.accepted[i]) == bool(accepted), (spec, i)
            # from logits or from probabilities: the same number to rounding
            assert math.isclose(float(v.certificate[i]), float(rho[(spec, divergence)][i]), rel_tol=1e-9, abs_tol=1e-15)
            # within the rounding band below rho* (float64 rows: gamma_{V+2} of the terms' magnitudes, plus
            # the normalisers' own bounds, ~1e-15 here) a KL is not certified
            band = gamma(vocab + 2, U64) * float((a * a.log()).nan_to_num().abs().sum()
                                                 + (a * b.log()).nan_to_num().abs().sum()) + 1e-14
            assert bool(v.certified[i]) == (kl < float(v.certificate[i]) or math.isinf(float(v.certificate[i]))) \
                or abs(kl - float(v.certificate[i])) < 2 * band + 1e-12
            if v.certified[i]:
                assert v.accepted[i], (spec, i)                # the rule: KL < rho* => accepted


def test_certified_at_the_witness_and_inside_the_budget() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(2 * torch.randn(6, 50, generator=g, dtype=torch.float64), -1)
    for spec in ("greedy", "multiplicative:0.3", "topm:2"):
        w = cp.witness(p, spec)
        rho = cp.certificate(p, spec)
        inside = 0.98 * w + 0.02 * p       # just inside the budget: KL < rho*
        far = 0.5 * w + 0.5 * p
        v_in = cp.certified(p, inside, spec)[spec]
        assert bool((v_in.kl < rho).all()) and v_in.certified.all() and v_in.accepted.all()
        v_p = cp.certified(p, p, spec)[spec]
        assert v_p.certified.all() and v_p.accepted.all() and torch.all(v_p.kl == 0)
        v_far = cp.certified(p, far, spec)[spec]
        assert bool((~v_far.certified | v_far.accepted).all())
        # just beyond the witness: its rejected token y* (the least likely of its tied maxima) on top
        tied = w == w.amax(-1, keepdim=True)
        y_star = torch.where(tied, p, torch.full_like(p, 2.0)).argmin(-1, keepdim=True)
        beyond = torch.softmax(torch.log(w).scatter_add(-1, y_star, torch.full_like(y_star, 1e-3, dtype=p.dtype)), -1)
        v_out = cp.certified(p, beyond, spec)[spec]
        assert not v_out.certified.any() and not v_out.accepted.any()


def test_certifications_mapping_and_errors() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2], [0.4, 0.35, 0.25]])
    q = torch.tensor([[0.45, 0.35, 0.2], [0.3, 0.45, 0.25]])
    res = cp.certified(p, q, "greedy;additive:0.3")
    assert list(res) == ["greedy", "additive:0.3"] and len(res) == 2
    assert res[cp.AdditiveRelaxed(0.3)] is res["additive:0.3"] is res["additive:.3"]
    assert res["greedy"].accepted.tolist() == [True, False] and "1/2 accepted" in repr(res)
    with pytest.raises(KeyError, match="computed: greedy, additive:0.3"):
        res["topm:2"]
    for call, message in [
        (lambda: cp.certified(p, q[:, :2], "greedy"), "same shape"),
        (lambda: cp.certified(p, q, []), "criteria is empty"),
        (lambda: cp.certified(p, q, "greedy", divergence="both"), "divergence"),
        (lambda: cp.certified(p, [[0.5, 0.5, 0.0]], "greedy"), "torch.Tensor"),
        (lambda: cp.certified(p, q * 2, "greedy"), "q must sum to 1"),
        (lambda: cp.certified(p, q, "gready"), "malformed criterion"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message) as err:
            call()
        assert "\n" not in str(err.value)
