"""Bad input gets a ValueError that names the problem and the row."""
from __future__ import annotations

import pytest
import torch

from companion import certificate, certificates, kl_divergence, parse_criterion, tree_certificate, witness
from companion.certify.validation import check_distribution_tensor, check_divergences, check_positive_int, check_tree_widths


def _ok(v: int = 6, rows: int = 4) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, v, dtype=torch.float64), -1)


@pytest.mark.parametrize("bad_value, message", [(float("nan"), "NaN or infinite"), (float("inf"), "NaN or infinite"),
                                                (-0.1, "negative")])
def test_bad_entries_name_the_row(bad_value: float, message: str) -> None:
    p = _ok()
    p[2, 3] = bad_value
    with pytest.raises(ValueError, match=f"{message}.*row 2"):
        certificate(p, "greedy")


def test_rows_not_summing_to_one() -> None:
    p = _ok(rows=3) * 1.01
    with pytest.raises(ValueError, match=r"sum to 1.*row 0.*1\.01.*from_logits"):
        certificate(p, "greedy")
    # within tolerance: accepted and renormalised
    q = _ok(rows=3) * (1 + 5e-5)
    torch.testing.assert_close(certificate(q, "greedy"), certificate(q / q.sum(-1, keepdim=True), "greedy"))


def test_bf16_tolerance_is_wider() -> None:
    p = (_ok(v=50, rows=2) * 1.005).to(torch.bfloat16)
    assert torch.isfinite(certificate(p, "greedy")).all()
    with pytest.raises(ValueError, match="tolerance 0.0001"):
        certificate(p.float(), "greedy")


def test_multi_dimensional_row_index() -> None:
    p = torch.softmax(torch.randn(2, 3, 5), -1)
    p[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match=r"row \(1, 2\)"):
        certificate(p, "additive:0.1")


def test_logits_checks() -> None:
    logits = torch.randn(3, 8)
    logits[1, 4] = float("nan")
    with pytest.raises(ValueError, match="logits has NaN entries in row 1"):
        certificate(logits, "greedy", from_logits=True)
    logits = torch.randn(3, 8)
    logits[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"\+inf entries in row 0"):
        certificate(logits, "greedy", from_logits=True)
    logits = torch.randn(3, 8)
    logits[2] = -float("inf")
    with pytest.raises(ValueError, match="every entry -inf in row 2"):
        certificate(logits, "greedy", from_logits=True)
    # -inf (masked tokens) is fine
    logits = torch.randn(3, 8)
    logits[:, 5:] = -float("inf")
    assert torch.isfinite(certificate(logits, "greedy", from_logits=True)).all()


def test_shapes_and_types() -> None:
    with pytest.raises(ValueError, match="scalar"):
        certificate(torch.tensor(1.0), "greedy")
    with pytest.raises(ValueError, match="empty"):
        certificate(torch.empty(0, 5), "greedy")
    with pytest.raises(ValueError, match="floating-point"):
        certificate(torch.ones(1, 4, dtype=torch.long), "greedy")
    with pytest.raises(TypeError, match="torch.Tensor"):
        certificate([0.5, 0.5], "greedy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same shape"):
        kl_divergence(_ok(5), _ok(6))


def test_parameters() -> None:
    p = _ok(v=5)
    with pytest.raises(ValueError, match="m=5 must be smaller than the vocabulary size V=5"):
        tree_certificate(p, 5)
    with pytest.raises(ValueError, match=">= 1"):
        tree_certificate(p, 0)
    with pytest.raises(ValueError, match="m < V"):
        certificate(p, "topm:5")
    with pytest.raises(ValueError, match="divergence must be one of"):
        certificate(p, "greedy", "kl")
    with pytest.raises(ValueError, match="malformed criterion spec"):
        certificates(p, ["greedy", "bogus"])
    with pytest.raises(ValueError, match="out of range"):
        parse_criterion("greedy").accepts(p, 7)
    with pytest.raises(ValueError, match="integers"):
        parse_criterion("greedy").accepts(p, torch.tensor([0.5] * 4))


def test_empty_rejection_region_is_inf_and_witness_nan() -> None:
    """A uniform p: the level-set rule accepts every token (nothing rejected: +inf, NaN witness);
    the worst case over tie-breaks rejects greedy's every token (a 4-way tied top: 0, and the
    witness is p itself), while additive:0.5 (tau_worst = min(p(1) - 0.5, p(2)) < 0) still
    rejects nothing."""
    p = torch.full((4,), 0.25, dtype=torch.float64)
    assert torch.isinf(certificate(p, "greedy", ties="level-set"))
    assert torch.isinf(certificate(p, "additive:0.5", ties="level-set"))
    assert torch.isnan(witness(p, "greedy", ties="level-set")).all()
    assert float(certificate(p, "greedy")) == 0.0
    assert torch.equal(witness(p, "greedy"), p)
    assert torch.isinf(certificate(p, "additive:0.5"))
    assert torch.isnan(witness(p, "additive:0.5")).all()


def test_results_stay_on_device_and_keep_shape() -> None:
    p = torch.softmax(torch.randn(2, 3, 40), -1)
    out = certificates(p, ["greedy", "typical:0.09,0.3"], tree_widths=[2], from_logits=False)
    for v in out.values():
        assert v.shape == (2, 3) and v.dtype == torch.float64 and v.device == p.device


SHARED_CHECKS = [
    ("meta-tensor", lambda: check_distribution_tensor(torch.zeros(2, 4, device="meta"), "q"),
     "q is on the meta device (a shape without values); load the weights or move the tensor to cpu or cuda first"),
    ("meta-logits", lambda: certificate(torch.zeros(2, 4, device="meta"), "greedy", from_logits=True),
     "logits is on the meta device"),
    ("positive-int-float", lambda: check_positive_int("top_k", 1.5), "top_k must be a positive integer, got 1.5"),
    ("positive-int-zero", lambda: check_positive_int("top_k", 0), "top_k must be a positive integer, got 0"),
    ("positive-int-bool", lambda: check_positive_int("top_k", True), "top_k must be a positive integer, got True"),
    ("divergences-misspelt", lambda: check_divergences("fwd"),
     "divergence must be one of ('forward', 'reverse'), got 'fwd'"),
    ("divergences-number", lambda: check_divergences(3),
     "divergences must be one of ('forward', 'reverse') or a list of them, got 3"),
    ("tree-widths-string", lambda: check_tree_widths("2"), "tree_widths must be an integer or a list of integers, "
                                                           "got '2'"),
    ("tree-widths-bool", lambda: check_tree_widths(True), "tree_widths must be an integer or a list of integers, "
                                                          "got True"),
]


@pytest.mark.parametrize("call, message", [c[1:] for c in SHARED_CHECKS], ids=[c[0] for c in SHARED_CHECKS])
def test_shared_checks_name_the_argument(call, message) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_shared_checks_accept_one_value_or_a_list() -> None:
    assert check_divergences("forward") == ["forward"]
    assert check_divergences(("reverse", "forward")) == ["reverse", "forward"]
    assert check_tree_widths(2) == [2] and check_tree_widths((1, 4)) == [1, 4]
    assert check_positive_int("top_k", 20) == 20
