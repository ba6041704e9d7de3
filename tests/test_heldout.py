"""The held-out comparison (companion.speculative.heldout): a built-in chosen on calibration recordings, compared
on held-out ones, and the sentences that say what that comparison resolves, one test per branch.

Oracles: the choice is the built-in whose replayed runs cost least per token by hand (modelled_cost times
tokens, summed, over the tokens); the held-out ratio is the comparison's paired bootstrap against that one
built-in; each sentence is read for its direction, its numbers and the side of 1 of its interval.
"""
from __future__ import annotations

import pytest

from companion.speculative import CostModel, DraftStep, RecordedChains, modelled_cost, replay, replay_comparison
from companion.speculative.compare import RatioEstimate
from companion.speculative.heldout import (
    HeldOut,
    choose_builtin,
    held_out_comparison,
    held_out_goal_summary,
    held_out_sentence,
    held_out_summary,
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


def test_cheaper_branch_states_the_size_and_an_interval_end_that_does_not_round_to_one():
    h = held(0.957, 0.921, 0.99976)
    s, summary = held_out_sentence(h), held_out_summary(h)
    assert h.outcome == "cheaper"
    assert "4.3% less per token than `confidence:0.6`, the built-in cheapest on the 2 calibration prompts" in s
    assert "0.957 [0.921, 0.9998]" in s and "below 1" in s and "14 held-out prompts" in s
    assert summary == ("cost 4.3% less per token than `confidence:0.6` (the built-in chosen on calibration prompts) "
                       "on 14 held-out prompts (ratio 0.957 [0.921, 0.9998], wholly below 1)")


def test_dearer_branch():
    h = held(1.08, 1.02, 1.15)
    assert h.outcome == "dearer"
    s = held_out_sentence(h)
    assert "8.0% more per token than `confidence:0.6`" in s and "above 1" in s and "less" not in s
    assert held_out_summary(h).startswith("cost 8.0% more per token than `confidence:0.6`")


@pytest.mark.parametrize("point, side", [(0.991, "below"), (1.004, "above")])
def test_unresolved_branch_names_the_side_and_claims_no_direction(point, side):
    h = held(point, 0.978, 1.012)
    assert h.outcome == "no difference"
    s = held_out_sentence(h)
    assert f"is not resolved from `confidence:0.6`" in s and f"{side} 1 by" in s and "contains 1" in s
    assert "cheaper" not in s and "less per token" not in s and "more per token" not in s
    assert held_out_summary(h).startswith("showed no resolved difference in cost per token from `confidence:0.6`")
    assert f"ratio {ratio_text(point)} [0.978, 1.012], which contains 1" in held_out_summary(h)


def test_same_branch():
    h = held(1.0, 1.0, 1.0)
    assert h.outcome == "same"
    assert "cost exactly what `confidence:0.6`" in held_out_sentence(h)
    assert held_out_summary(h) == ("cost exactly what `confidence:0.6` (the built-in chosen on calibration prompts) "
                                   "cost on each of 14 held-out prompts")


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
    assert "the constant schedule cheapest on the 2 calibration prompts" in held_out_sentence(h)
    with pytest.raises(ValueError, match="not among the comparison's built-ins"):
        held_out_comparison(cmp, calibration, "confidence:0.4", among=["constant:9"])


@pytest.mark.parametrize("ratio, words", [
    ((0.93, 0.90, 0.96), "is 7.0% cheaper than `constant:5`, the constant schedule chosen on the calibration prompts, "
                         "on 14 held-out prompts (ratio 0.930 [0.900, 0.960], wholly below 1), at least the 5% asked"),
    ((0.957, 0.92, 0.99976), "is 4.3% cheaper than `constant:5`, the constant schedule chosen on the calibration "
                             "prompts, on 14 held-out prompts (ratio 0.957 [0.920, 0.9998], wholly below 1), "
                             "less than the 5% asked"),
    ((1.04, 1.01, 1.07), "is 4.0% dearer than `constant:5`"),
    ((0.991, 0.978, 1.004), "is not resolved from `constant:5`, the constant schedule chosen on the calibration "
                            "prompts, on 14 held-out prompts (ratio 0.991 [0.978, 1.004], which contains 1)"),
    ((1.0, 1.0, 1.0), "costs exactly what `constant:5`"),
])
def test_goal_summary_states_the_held_out_constant_comparison_in_every_branch(ratio, words):
    h = HeldOut("certificate", "constant:5", {}, 2, 14, RatioEstimate(*ratio), "constant:4", kind="constant schedule")
    within = held_out_goal_summary(RatioEstimate(1.05, 1.02, 1.08), h)
    assert within.startswith("the cheapest policy replayed is within 10% of the oracle, its whole 95 % interval "
                             "included, and the certificate rule ")
    assert words in within
    assert "best constant" not in within


def test_goal_summary_keeps_the_oracle_caveats():
    h = HeldOut("certificate", "constant:5", {}, 2, 14, RatioEstimate(0.99, 0.97, 1.01), "constant:5",
                kind="constant schedule")
    point_only = held_out_goal_summary(RatioEstimate(1.08, 1.03, 1.14), h)
    assert "by its point estimate (1.080), though its 95 % interval reaches above 1.10 (to 1.140)" in point_only
    assert held_out_goal_summary(RatioEstimate(1.3, 1.2, 1.4), h).startswith(
        "none of the policies replayed is within 10% of the oracle (the cheapest costs 1.300 times its cost)")
