"""The held-out comparison (companion.speculative.heldout): a built-in chosen on calibration recordings, compared
on held-out ones, and its verdict as data (cheaper, dearer, no difference, the same), one value per outcome.

Oracles: the choice is the built-in whose replayed runs cost least per token by hand (modelled_cost times
tokens, summed, over the tokens); the held-out ratio is the comparison's paired bootstrap against that one
built-in; the outcome is read from the side of 1 of the whole interval.
"""
from __future__ import annotations

import pytest

from companion.speculative import CostModel, DraftStep, RecordedChains, modelled_cost, replay, replay_comparison
from companion.speculative.compare import RatioEstimate
from companion.speculative.heldout import (
    HeldOut,
    choose_builtin,
    held_out_comparison,
    ratio_text,
)

COSTS = CostModel(c=0.1, verify=(1.0,) + tuple(1.2 + 0.05 * k for k in range(40)))
BUILTINS = ["constant:0", "constant:1", "constant:2", "constant:8"]


def recording(n: int, match: int, seed: int) -> RecordedChains:
    """A text of n tokens (ids 1..3); from every position the drafter's chain matches ``match`` tokens, then
    drafts 9s (never the text's), to the length budget."""
    text = tuple(1 + (seed * 7 + 3 * s) % 3 for s in range(n))
    chains = []
    for s in range(n):
        cap = n - s - 1
        L = min(match, cap, n - s)
        tokens = list(text[s:s + L]) + [9] * (cap - L)
        chains.append(tuple(DraftStep(t, 0.9, 0.05, 1.0) for t in tokens))
    return RecordedChains(text, tuple(chains), (0.0,) * n, n, None, frozenset(), False)


def by_hand(chains, spec) -> float:
    runs = [replay(ch, spec) for ch in chains]
    return sum(modelled_cost(r, COSTS) * len(r.tokens) for r in runs) / sum(len(r.tokens) for r in runs)


def test_the_built_in_is_chosen_on_calibration_and_compared_on_held_out_prompts():
    # the calibration prompts reward long drafts, the held-out ones do not: the choice and hindsight differ
    calibration = [recording(30, 30, i) for i in range(2)]
    held_out = [recording(30, 1 + i % 2, i) for i in range(6)]
    chosen, cost = choose_builtin(calibration, BUILTINS, COSTS)
    assert cost == pytest.approx({b: by_hand(calibration, b) for b in BUILTINS}, rel=1e-12)
    assert chosen == min(BUILTINS, key=lambda b: by_hand(calibration, b)) == "constant:8"
    cmp = replay_comparison(held_out, [], COSTS, builtins=BUILTINS, calibrated=(), cold=False)
    h = held_out_comparison(cmp, calibration, "constant:1", n_boot=300, seed=3)
    assert (h.chosen, h.n_calibration, h.n_held_out) == ("constant:8", 2, 6)
    assert h.hindsight == cmp.best_builtin() != "constant:8"
    assert h.ratio == cmp.ratio("constant:1", ["constant:8"], n_boot=300, seed=3)
    assert h.ratio.point == pytest.approx(by_hand(held_out, "constant:1") / by_hand(held_out, "constant:8"), rel=1e-12)
    assert h.outcome == "cheaper" and h.ratio.hi < 1
    # a policy the comparison did not run, and nothing to choose on, are refused in one line
    with pytest.raises(ValueError, match="was not run"):
        held_out_comparison(cmp, calibration, "certificate")
    with pytest.raises(ValueError, match="no calibration recordings"):
        choose_builtin([], BUILTINS, COSTS)


def held(point: float, lo: float, hi: float) -> HeldOut:
    return HeldOut("certificate", "confidence:0.6", {}, 2, 14, RatioEstimate(point, lo, hi), "constant:1")


@pytest.mark.parametrize("ratio, outcome", [
    ((0.957, 0.921, 0.99976), "cheaper"),
    ((1.08, 1.02, 1.15), "dearer"),
    ((0.991, 0.978, 1.012), "no difference"),
    ((1.004, 0.978, 1.012), "no difference"),
    ((1.0, 0.99, 1.0), "no difference"),   # an interval that reaches 1 resolves nothing
    ((1.0, 1.0, 1.0), "same"),
])
def test_the_verdict_is_data_with_a_value_per_outcome(ratio, outcome):
    """The held-out verdict as the chapters read it: cheaper / dearer only when the whole interval is on one side."""
    assert held(*ratio).outcome == outcome


def test_ratio_text_keeps_a_ratio_off_one():
    assert ratio_text(0.957) == "0.957" and ratio_text(1.0) == "1.000"
    assert ratio_text(0.99976) == "0.9998" and ratio_text(1.0000004) == "1.000000"
    assert ratio_text(1.00004) == "1.00004"


def test_the_choice_can_be_restricted_to_the_constant_schedules():
    calibration = [recording(30, 30, i) for i in range(2)]
    held_out = [recording(30, 1 + i % 2, i) for i in range(6)]
    cmp = replay_comparison(held_out, [], COSTS, builtins=BUILTINS + ["confidence:0.4"], calibrated=(), cold=False)
    h = held_out_comparison(cmp, calibration, "confidence:0.4", among=["constant:0", "constant:1", "constant:2"],
                            kind="constant schedule", n_boot=200)
    assert h.chosen == min(["constant:0", "constant:1", "constant:2"], key=lambda b: by_hand(calibration, b))
    assert set(h.calibration_cost) == {"constant:0", "constant:1", "constant:2"}
    assert h.hindsight in h.calibration_cost
    assert h.kind == "constant schedule"
    with pytest.raises(ValueError, match="not among the comparison's built-ins"):
        held_out_comparison(cmp, calibration, "confidence:0.4", among=["constant:9"])
