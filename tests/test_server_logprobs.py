"""Certificates from top-k logprobs against the full-vocabulary engine.

Oracle: ``companion.certify.certificates`` on the whole distribution, with the same tie convention.
Where the top-k result says ``exact`` it must equal the full one; everywhere else it must not
exceed it (a lower bound), for random rows, LM-like rows, adversarial completions of the tail,
rows with exact ties (bf16 logits, forced ties at the top and across rank boundaries), and
hypothesis' examples, under both ``ties="worst"`` (the default) and ``ties="level-set"``.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from companion import PAPER_CRITERIA, certificates, certificates_from_logprobs

CRITERIA = list(PAPER_CRITERIA) + ["topm:2", "topm:30", "topk-delta:25,0.1", "additive:0.05", "multiplicative:0.5",
                                   "typical:0.3,0.9"]
WIDTHS = [1, 2, 4, 8, 30]
DIVS = ("forward", "reverse")


def _lm_like(n: int, vocab: int, seed: int) -> torch.Tensor:
    """Rows shaped like a language model's: Zipf-like base rates, varied temperature."""
    g = torch.Generator().manual_seed(seed)
    base = -1.1 * torch.log(torch.arange(1, vocab + 1, dtype=torch.float64))
    logits = torch.stack([base[torch.randperm(vocab, generator=g)] for _ in range(n)])
    scale = torch.rand(n, 1, generator=g, dtype=torch.float64) * 5
    logits = logits * (0.3 + torch.rand(n, 1, generator=g, dtype=torch.float64) * 2)
    logits = logits + scale * torch.randn(n, vocab, generator=g, dtype=torch.float64)
    return torch.softmax(logits, -1)


def _random_rows(n: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, vocab, generator=g, dtype=torch.float64) ** 4
    return x / x.sum(-1, keepdim=True)


def _check(p: torch.Tensor, k: int, vocab: int | None, criteria=CRITERIA, widths=WIDTHS, ties: str = "worst",
           **kw) -> dict[str, float]:
    """Compare with the full engine under the same ``ties``; return the share of exact rows per key."""
    widths = [m for m in widths if m < p.shape[-1]]
    criteria = [c for c in criteria if not (c.startswith(("topm:", "topk-delta:")) and
                                            int(c.split(":")[1].split(",")[0]) >= p.shape[-1])]
    full = certificates(p, criteria, DIVS, tree_widths=widths, ties=ties)
    top = torch.log(p).topk(k, -1).values
    got = certificates_from_logprobs(top, criteria, DIVS, tree_widths=widths, vocab=vocab, ties=ties, **kw)
    assert set(got) == set(full)
    shares = {}
    for key, res in got.items():
        truth, value, exact = full[key], res.value, res.exact
        assert value.dtype == torch.float64 and exact.dtype == torch.bool and value.shape == truth.shape
        assert not torch.isnan(value).any(), key
        # exact rows: equal (both infinite, or the same number to rounding)
        assert torch.equal(torch.isinf(value[exact]), torch.isinf(truth[exact])), key
        fin = exact & torch.isfinite(truth)
        torch.testing.assert_close(value[fin], truth[fin], rtol=1e-9, atol=1e-15, msg=lambda m: f"{key}: {m}")
        # every row: a lower bound (to float64 rounding)
        over = value > truth * (1 + 1e-9) + 1e-14
        assert not over.any(), (key, value[over][:3], truth[over][:3])
        shares[f"{key[0]}|{key[1]}"] = float(exact.double().mean())
    return shares


@pytest.mark.parametrize("ties", ["worst", "level-set"])
@pytest.mark.parametrize("k", [1, 2, 5, 20])
@pytest.mark.parametrize("rows", ["random", "lm"])
def test_exact_where_flagged_and_a_lower_bound_elsewhere(k: int, rows: str, ties: str) -> None:
    vocab = 300
    p = _random_rows(120, vocab, k) if rows == "random" else _lm_like(120, vocab, k)
    for v in (None, vocab):
        shares = _check(p, k, v, ties=ties)
        if k >= 2:
            # strict greedy needs only the top two: always exact
            assert shares["greedy|forward"] == 1.0 and shares["tree:1|forward"] == 1.0
        else:
            assert shares["greedy|forward"] == 0.0
        assert shares["tree:30|forward"] == 0.0              # needs the top 31
        if k == 20 and rows == "lm":
            assert shares["topm:4|forward"] == 1.0 and shares["tree:8|forward"] == 1.0
            assert shares["multiplicative:0.1|forward"] > 0.5
            if v is not None:   # the entropy bracket needs V
                assert shares["typical:0.09,0.3|forward"] > 0.1
            else:
                assert shares["typical:0.09,0.3|forward"] == 0.0


def test_lower_bound_holds_for_adversarial_tails() -> None:
    """The same top-k completed in several ways, including tails packed with tokens at p(k)."""
    g = torch.Generator().manual_seed(3)
    vocab, k = 60, 4
    for trial in range(20):
        head = torch.sort(torch.rand(k, generator=g, dtype=torch.float64), descending=True).values
        head = head / head.sum() * (0.4 + 0.55 * float(torch.rand(1, generator=g)))
        tail_mass = 1 - float(head.sum())
        cap = float(head[-1])
        completions = []
        n_full = min(int(tail_mass // cap), vocab - k - 1)          # as many tokens at p(k) as fit
        rest = tail_mass - n_full * cap
        if rest <= cap and n_full + 1 <= vocab - k:
            packed = [cap] * n_full + [rest] + [0.0] * (vocab - k - n_full - 1)
            completions.append(packed)
        completions.append([tail_mass / (vocab - k)] * (vocab - k))  # uniform
        w = torch.rand(vocab - k, generator=g, dtype=torch.float64) ** 6
        w = (w / w.sum() * tail_mass).tolist()
        if max(w) <= cap:
            completions.append(w)
        for tail in completions:
            p = torch.tensor([head.tolist() + tail], dtype=torch.float64)
            _check(p, k, vocab, criteria=["greedy", "additive:0.9", "multiplicative:0.05", "topm:8",
                                          "typical", "topk-delta:6,0.2"], widths=[2, 4, 9])


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.integers(2, 30),
    k=st.integers(1, 20),
    seed=st.integers(0, 2**31 - 1),
    power=st.sampled_from([0.5, 2.0, 6.0]),
    zeros=st.integers(0, 3),
    ties=st.booleans(),
    give_vocab=st.booleans(),
    give_tail=st.booleans(),
    criterion=st.sampled_from(["greedy", "additive:0.2", "additive:0.01", "multiplicative:0.3", "topm:3",
                               "topk-delta:4,0.1", "typical", "typical:0.2,0.8"]),
    convention=st.sampled_from(["worst", "level-set"]),
)
def test_property_exact_or_lower_bound(vocab, k, seed, power, zeros, ties, give_vocab, give_tail, criterion,
                                       convention) -> None:
    k = min(k, vocab)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(vocab, generator=g, dtype=torch.float64) ** power
    if ties:
        x = torch.round(x * 4) / 4 + 1e-3           # many exact ties
    x[torch.randperm(vocab, generator=g)[: min(zeros, vocab - 1)]] = 0.0
    p = (x / x.sum()).unsqueeze(0)
    if criterion.startswith(("topm:", "topk-delta:")) and int(criterion.split(":")[1].split(",")[0]) >= vocab:
        criterion = "greedy"
    kw = {}
    if give_tail:
        kw["tail_mass"] = float(1 - torch.log(p).topk(k, -1).values.exp().sum())
    _check(p, k, vocab if give_vocab else None, criteria=[criterion], widths=[1, 2, 3], ties=convention, **kw)


TIED_CRITERIA = ["greedy", "additive:0.3", "additive:0.02", "multiplicative:0.1", "multiplicative:0.6", "topm:2",
                 "topm:4", "topk-delta:3,0.2", "topk-delta:10,0.6", "typical", "typical:0.3,0.9"]


def _bf16_tied_rows(n: int, vocab: int, seed: int, top_ties: int, scale: float) -> torch.Tensor:
    """Softmax of bf16-rounded logits in which the argmax is copied to ``top_ties`` more tokens and
    the 4th largest logit to two more (ties at the top and across the ranks 2..6)."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64) * scale
    for i in range(n):
        row = logits[i]
        row[torch.randperm(vocab, generator=g)[:top_ties]] = row.max().item()
        row[torch.randperm(vocab, generator=g)[:2]] = row.sort(descending=True).values[3].item()
    return torch.softmax(logits.to(torch.bfloat16).to(torch.float64), -1)


@settings(max_examples=40, deadline=None)
@given(
    vocab=st.integers(6, 48),
    k=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    top_ties=st.integers(0, 3),
    scale=st.sampled_from([0.5, 2.0, 6.0]),
    give_vocab=st.booleans(),
    ties=st.sampled_from(["worst", "level-set"]),
)
def test_property_tied_rows_never_above_the_full_certificate(vocab, k, seed, top_ties, scale, give_vocab,
                                                             ties) -> None:
    """On rows with exact ties the logprob value never exceeds the full-vocabulary certificate of the
    same convention and equals it where flagged exact (``_check``); ties are really present. The
    tail mass is passed exactly: implied from ``1 - sum`` it carries ~1e-16 absolute rounding, which
    peaked rows (tails of 1e-13) turn into a relative error of the reverse bound (module docstring)."""
    k = min(k, vocab)
    p = _bf16_tied_rows(8, vocab, seed, min(top_ties, vocab - 1), scale)
    s = p.sort(-1, descending=True).values
    assert bool(((s[:, :-1] == s[:, 1:]) & (s[:, :-1] > 0)).any(-1).all())     # every row has an exact tie
    _check(p, k, vocab if give_vocab else None, criteria=TIED_CRITERIA, widths=[1, 2, 4], ties=ties,
           tail_mass=s[:, k:].sum(-1))


def test_tied_top_worst_case_from_logprobs() -> None:
    """The counter-example p = [0.4, 0.4, 0.2]: from the top 2 the worst-case greedy certificate and
    the width-1 tree are exactly 0 (the top is tied); the level-set one's boundary token is in the
    tail, so it is a bound (not flagged exact), here attained: the one tail token has ``u = T = 0.2``."""
    lp = torch.log(torch.tensor([[0.4, 0.4]], dtype=torch.float64))
    worst = certificates_from_logprobs(lp, ["greedy"], ["forward"], tree_widths=[1], vocab=3)
    level = certificates_from_logprobs(lp, ["greedy"], ["forward"], tree_widths=[1], vocab=3, ties="level-set")
    for key in (("greedy", "forward"), ("tree:1", "forward")):
        assert worst[key].exact.all() and float(worst[key].value) == 0.0
    # level-set: lift 0.2 onto the pool {0.4, 0.4, 0.2}: sum p_i log(p_i / (1/3))
    expected = 0.8 * math.log(0.4 * 3) + 0.2 * math.log(0.2 * 3)
    assert not level[("greedy", "forward")].exact.any()
    assert math.isclose(float(level[("greedy", "forward")].value), expected, rel_tol=1e-12)
    with pytest.raises(ValueError, match="ties must be"):
        certificates_from_logprobs(lp, ["greedy"], ties="first")


def test_list_inputs_match_the_tensor_path() -> None:
    p = _lm_like(6, 200, 11)
    lp = torch.log(p)
    top = lp.topk(6, -1)
    ref = certificates_from_logprobs(top.values[:, :5], ["greedy", "topm:3"], vocab=200)
    # vLLM offline: {token_id: Logprob(logprob=...)}, with the sampled token added beyond the top 5
    vllm_rows = [{int(i): SimpleNamespace(logprob=float(v)) for i, v in zip(ids, vals)}
                 for ids, vals in zip(top.indices.tolist(), top.values.tolist())]
    got = certificates_from_logprobs(vllm_rows, ["greedy", "topm:3"], vocab=200, top_k=5)
    # OpenAI: top_logprobs = [{"token": ..., "logprob": ...}, ...]
    openai_rows = [[{"token": f"t{i}", "logprob": float(v)} for i, v in zip(ids, vals)][:5]
                   for ids, vals in zip(top.indices.tolist(), top.values.tolist())]
    got2 = certificates_from_logprobs(openai_rows, ["greedy", "topm:3"], vocab=200)
    # legacy completions API: {token_string: logprob}, shuffled order
    legacy_rows = [{f"t{i}": float(v) for i, v in reversed(list(zip(ids, vals))[:5])}
                   for ids, vals in zip(top.indices.tolist(), top.values.tolist())]
    got3 = certificates_from_logprobs(legacy_rows, ["greedy", "topm:3"], vocab=200)
    for key, r in ref.items():
        for other in (got, got2, got3):
            torch.testing.assert_close(other[key].value, r.value, rtol=1e-12, atol=0)
            assert torch.equal(other[key].exact, r.exact)
    # an explicit tail mass equal to the implied one changes nothing
    tail = 1 - top.values[:, :5].exp().sum(-1)
    explicit = certificates_from_logprobs(top.values[:, :5], ["greedy", "topm:3"], vocab=200, tail_mass=tail)
    for key, r in ref.items():
        torch.testing.assert_close(explicit[key].value, r.value, rtol=1e-12, atol=0)


def test_leading_shape_and_float32_input() -> None:
    p = _lm_like(12, 300, 5).reshape(3, 4, 300)
    top = torch.log(p).topk(20, -1).values.float()      # as a server sends them: float32
    res = certificates_from_logprobs(top, ["greedy"], ["forward"], tree_widths=[4], vocab=300)
    assert res[("greedy", "forward")].value.shape == (3, 4) and res[("tree:4", "forward")].exact.all()
    truth = certificates(p, ["greedy"], ["forward"])[("greedy", "forward")]
    torch.testing.assert_close(res[("greedy", "forward")].value, truth, rtol=1e-4, atol=1e-7)


def test_no_tail_means_the_whole_distribution() -> None:
    p = _random_rows(50, 8, 2)
    got = certificates_from_logprobs(torch.log(p), ["additive:0.3", "typical", "topm:7"], vocab=8)
    full = certificates(p, ["additive:0.3", "typical", "topm:7"])
    for key, r in got.items():
        assert r.exact.all(), key
        fin = torch.isfinite(full[key])
        assert torch.equal(torch.isinf(r.value), ~fin)
        torch.testing.assert_close(r.value[fin], full[key][fin], rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("call, message", [
    (lambda: certificates_from_logprobs(torch.tensor([[0.5, -1.0]]), ["greedy"]), "<= 0"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.7, 0.6]])), ["greedy"]), "sum to 1.3"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], vocab=3), "does not fit"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], vocab=1), "vocab must be"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], tail_mass=0.9), "sum to 1.6"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], tail_mass=-0.1), ">= 0"),
    (lambda: certificates_from_logprobs(torch.tensor([[float("nan"), -1.0]]), ["greedy"]), "NaN"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], top_k=3), "top_k"),
    (lambda: certificates_from_logprobs([[-0.1, -3.0], [-0.2]], ["greedy"], top_k=2), "step 1 has 1"),
    (lambda: certificates_from_logprobs([["a"]], ["greedy"]), "expected a logprob"),
    (lambda: certificates_from_logprobs([], ["greedy"]), "empty"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["gredy"]), "malformed criterion"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), tree_widths=[0]), "tree width"),
    (lambda: certificates_from_logprobs(torch.log(torch.tensor([[0.5, 0.2]])), ["greedy"], ["sideways"]), "divergence"),
])
def test_errors_are_one_clear_line(call, message) -> None:
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_unseen_threshold_bound_is_not_vacuous() -> None:
    """topm:30 from the top 20 is never exact, but its bound tracks the truth on LM-like rows."""
    p = _lm_like(200, 500, 8)
    truth = certificates(p, ["topm:30"], ["forward"])[("topm:30", "forward")]
    got = certificates_from_logprobs(torch.log(p).topk(20, -1).values, ["topm:30"], ["forward"])
    bound = got[("topm:30", "forward")]
    assert not bound.exact.any()
    ratio = (bound.value / truth)[torch.isfinite(truth) & (truth > 0)]
    assert float(ratio.median()) > 0.5 and float(ratio.max()) <= 1 + 1e-9
    assert math.isfinite(float(bound.value.max()))


def test_mars_refused_with_the_reason_logprobs_cannot_decide_it() -> None:
    """MARS reads z(2)/z(1) of the raw logits; log-softmax has removed the offset it depends on."""
    row = {"a": math.log(0.6), "b": math.log(0.3), "c": math.log(0.1)}
    with pytest.raises(ValueError) as err:
        certificates_from_logprobs([row], ["mars:0.87"])
    assert str(err.value) == ("mars:0.87 needs the target's raw logits: a server's logprobs are normalised "
                              "(log-softmax), which removes the offset its ratio z(2)/z(1) depends on"), str(err.value)
    assert "\n" not in str(err.value)
