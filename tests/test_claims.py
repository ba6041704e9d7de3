"""The guard beside every claim of the hand-written prose: strict fails the build, note shows it."""
import pytest

from companion.book import claims as C
from companion.book.parameters import load_profile
from companion.book.layout import ReproduceError


def test_strict_raises_with_name_statement_and_numbers():
    c = C.Claims("07", mode="strict")
    assert c.check("tree above greedy", 0.3 > 0.1, "the tree's median is above greedy's", tree=0.3, greedy=0.1)
    with pytest.raises(AssertionError) as err:
        c.check("mult raises", 0.5011 > 0.5011, "multiplicative raises the median", mult=0.5011, greedy=0.5011)
    text = str(err.value)
    assert "chapter 07" in text and "'mult raises'" in text and "multiplicative raises the median" in text
    assert "mult = 0.5011" in text and "greedy = 0.5011" in text


def test_note_shows_each_failure_and_summary_lists_them():
    shown = []
    c = C.Claims("10", mode="note", show=shown.append)
    assert c.check("pays", 1.4 > 1.0, "drafting pays", ratio=1.4)
    assert not c.check("faster", 0.96 > 1.0, "the rule is faster than confidence:0.8", ratio=0.96)
    assert len(shown) == 1 and "'faster'" in shown[0] and "ratio = 0.96" in shown[0]
    s = c.summary()
    assert s.startswith("1 of the 2 claims") and "the rule is faster" in s
    ok = C.Claims("10", mode="note", show=shown.append)
    ok.check("a", True, "a")
    assert ok.summary() == "All 1 claims this chapter's prose makes hold for this run."


def test_numpy_and_torch_truth_values():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    c = C.Claims("x", mode="strict")
    assert c.check("np", np.bool_(True), "numpy")
    assert c.check("torch", torch.tensor(True), "torch")
    with pytest.raises(AssertionError):
        c.check("np false", np.float64(1.0) > 2.0, "numpy false")


def test_a_name_checked_twice_is_refused():
    c = C.Claims("x", mode="note", show=lambda _: None)
    c.check("same", True, "once")
    with pytest.raises(ValueError, match="checked twice"):
        c.check("same", True, "twice")


def test_mode_from_environment(monkeypatch):
    monkeypatch.delenv(C.ENV, raising=False)
    assert C.Claims("x").mode == "note"
    monkeypatch.setenv(C.ENV, "strict")
    assert C.Claims("x").mode == "strict"
    monkeypatch.setenv(C.ENV, "loud")
    with pytest.raises(ValueError, match="COMPANION_CLAIMS='loud'"):
        C.Claims("x")


def test_profiles_declare_their_mode(tmp_path):
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    assert load_profile(root, "cpu").claims == "strict"      # the book's own build
    assert load_profile(root, "ci").claims == "note"         # test sizes: the prose was not written for them
    bad = tmp_path / "bad.yml"
    bad.write_text("claims: sometimes\n")
    with pytest.raises(ReproduceError, match="claims must be 'strict'"):
        load_profile(root, str(bad))
