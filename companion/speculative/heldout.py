"""A drafting policy against transformers' built-ins, the built-in chosen on calibration prompts and compared on held-out ones.

Picking the cheapest built-in on the very prompts it is compared on favours it (its cost there is
the minimum of many noisy costs). :func:`held_out_comparison` separates the two: every built-in
is replayed on the calibration recordings (the ones that also warm the calibrated rules), the
cheapest there is chosen, and the policy is compared with that one built-in on the held-out
recordings, with a paired bootstrap over the held-out prompts (the choice is fixed, not redone
per resample). :func:`held_out_sentence` and :func:`held_out_summary` say what that comparison
resolves and nothing more: cheaper, dearer, not resolved, or exactly the same cost.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from companion.speculative.compare import PolicyComparison, RatioEstimate
from companion.speculative.costs import CostModel, modelled_cost
from companion.speculative.grid import ratio_outcome
from companion.speculative.policy_replay import replay
from companion.speculative.recording import RecordedChains, _check_chains


@dataclass(frozen=True)
class HeldOut:
    """``policy`` against ``chosen``, the built-in cheapest on the calibration prompts, on the held-out prompts.

    ``calibration_cost``: every built-in's modelled cost per token on the calibration prompts (total
    cost over total tokens), in the order given; ``chosen`` is the first of the cheapest.
    ``ratio``: the policy's cost per token over ``chosen``'s on the held-out prompts, with its 95 %
    paired-bootstrap interval over those prompts. ``hindsight``: the built-in cheapest on the held-out
    prompts themselves (what an in-sample comparison would have picked), for the reader.
    """

    policy: str
    chosen: str
    calibration_cost: dict[str, float]
    n_calibration: int
    n_held_out: int
    ratio: RatioEstimate
    hindsight: str
    kind: str = "built-in"   # what was chosen among, in words ("built-in", "constant schedule")

    @property
    def outcome(self) -> str:
        """``cheaper``, ``dearer``, ``no difference`` (the interval contains 1) or ``same`` (1 in every resample)."""
        r = self.ratio
        if r.lo == r.point == r.hi == 1.0:
            return "same"
        return ratio_outcome(r)


def choose_builtin(calibration_chains: Sequence[RecordedChains], builtins: Sequence[str], costs: CostModel
                   ) -> tuple[str, dict[str, float]]:
    """``(the cheapest built-in, every built-in's cost per token)`` on ``calibration_chains``, priced with ``costs``.

    Cost per token is the total modelled cost over the total tokens of the recordings; among equal
    costs the first in ``builtins`` is chosen."""
    if not builtins:
        raise ValueError("no built-ins to choose from")
    if not calibration_chains:
        raise ValueError("no calibration recordings to choose a built-in on")
    chains = [_check_chains(ch, f"calibration_chains[{i}]") for i, ch in enumerate(calibration_chains)]
    tokens = sum(len(ch.tokens) for ch in chains)
    if tokens == 0:
        raise ValueError("the calibration recordings hold no token to price")
    cost: dict[str, float] = {}
    for spec in builtins:
        runs = [replay(ch, spec) for ch in chains]
        cost[spec] = sum(modelled_cost(r, costs) * len(r.tokens) for r in runs if len(r.tokens)) / tokens
    chosen = min(builtins, key=lambda b: cost[b])
    return chosen, cost


def held_out_comparison(comparison: PolicyComparison, calibration_chains: Sequence[RecordedChains],
                        policy: str = "certificate", *, among: Sequence[str] | None = None, kind: str = "built-in",
                        n_boot: int = 2000, seed: int = 0) -> HeldOut:
    """``policy`` on the held-out prompts of ``comparison`` against the built-in of ``among`` (default: all of
    ``comparison.builtins``) cheapest on ``calibration_chains`` at ``comparison.costs``: see :class:`HeldOut`.
    ``kind`` names what ``among`` holds in the sentences (``"constant schedule"`` for the constants only)."""
    if policy not in comparison.results:
        raise ValueError(f"policy {policy!r} was not run in the comparison (runs: {comparison.policies})")
    names = list(comparison.builtins) if among is None else list(among)
    missing = [b for b in names if b not in comparison.builtins]
    if missing:
        raise ValueError(f"{missing} are not among the comparison's built-ins {comparison.builtins}")
    chosen, cost = choose_builtin(calibration_chains, names, comparison.costs)
    ratio = comparison.ratio(policy, [chosen], n_boot=n_boot, seed=seed)
    hindsight = min(names, key=lambda b: comparison.prompt_costs(b).sum())
    return HeldOut(policy=policy, chosen=chosen, calibration_cost=cost, n_calibration=len(calibration_chains),
                   n_held_out=len(comparison.tokens()), ratio=ratio, hindsight=hindsight, kind=kind)


def ratio_text(x: float) -> str:
    """A cost ratio to three decimals, or to as many more (up to six) as keep it off ``1.000`` when it is not 1."""
    for digits in range(3, 7):
        text = f"{x:.{digits}f}"
        if x == 1.0 or float(text) != 1.0:
            return text
    return f"{x:.6f}"


def _pct(x: float) -> str:
    """``|1 - x|`` as a percentage: one decimal, two below 0.1 % (so that a resolved difference never reads 0.0 %)."""
    d = abs(1.0 - x)
    return f"{d:.2%}" if d < 0.001 else f"{d:.1%}"


def _interval(r: RatioEstimate) -> str:
    return f"{ratio_text(r.point)} [{ratio_text(r.lo)}, {ratio_text(r.hi)}]"


def _chosen_words(h: HeldOut) -> str:
    return (f"`{h.chosen}`, the {h.kind} cheapest on the {h.n_calibration} calibration "
            f"prompt{'s' if h.n_calibration != 1 else ''}")


def held_out_sentence(h: HeldOut, name: str = "the certificate policy") -> str:
    """The held-out verdict as one sentence (the chapter's headline): what the comparison resolves, with its numbers."""
    n = f"{h.n_held_out} held-out prompt{'s' if h.n_held_out != 1 else ''}"
    ci = (f"ratio {_interval(h.ratio)}, 95 % paired bootstrap over the held-out prompts")
    kind = h.outcome
    if kind == "same":
        return f"On the {n}, {name} cost exactly what {_chosen_words(h)}, cost on every one of them."
    if kind == "cheaper":
        return (f"On the {n}, {name} cost {_pct(h.ratio.point)} less per token than {_chosen_words(h)} "
                f"({ci}: the whole interval is below 1).")
    if kind == "dearer":
        return (f"On the {n}, {name} cost {_pct(h.ratio.point)} more per token than {_chosen_words(h)} "
                f"({ci}: the whole interval is above 1).")
    side = "below" if h.ratio.point < 1 else "above"
    return (f"On the {n}, {name} is not resolved from {_chosen_words(h)}: the ratio is {side} 1 by "
            f"{_pct(h.ratio.point)}, but its interval contains 1 ({ci}).")


def held_out_summary(h: HeldOut) -> str:
    """The held-out verdict as a clause to follow "the certificate policy" (the summary and the book's landing page)."""
    n = f"{h.n_held_out} held-out prompt{'s' if h.n_held_out != 1 else ''}"
    chosen = f"`{h.chosen}` (the {h.kind} chosen on calibration prompts)"
    ci = f"ratio {_interval(h.ratio)}"
    kind = h.outcome
    if kind == "same":
        return f"cost exactly what {chosen} cost on each of {n}"
    if kind == "cheaper":
        return f"cost {_pct(h.ratio.point)} less per token than {chosen} on {n} ({ci}, wholly below 1)"
    if kind == "dearer":
        return f"cost {_pct(h.ratio.point)} more per token than {chosen} on {n} ({ci}, wholly above 1)"
    return f"showed no resolved difference in cost per token from {chosen} on {n} ({ci}, which contains 1)"


def held_out_goal_summary(best_vs_oracle: RatioEstimate, h: HeldOut, *, within: float = 0.10,
                          cheaper_by: float = 0.05) -> str:
    """At one replayed cost model, a clause for the summary: is the cheapest policy replayed within ``within`` of
    the oracle (the caveat when only its point estimate is), and how the certificate rule compares, on the
    held-out prompts, with the constant schedule chosen on the calibration prompts (``h``), against the
    ``cheaper_by`` saving asked."""
    limit = 1.0 + within
    if best_vs_oracle.hi <= limit:
        first = f"the cheapest policy replayed is within {within:.0%} of the oracle, its whole 95 % interval included"
    elif best_vs_oracle.point <= limit:
        first = (f"the cheapest policy replayed is within {within:.0%} of the oracle by its point estimate "
                 f"({ratio_text(best_vs_oracle.point)}), though its 95 % interval reaches above {limit:.2f} "
                 f"(to {ratio_text(best_vs_oracle.hi)})")
    else:
        first = (f"none of the policies replayed is within {within:.0%} of the oracle (the cheapest costs "
                 f"{ratio_text(best_vs_oracle.point)} times its cost)")
    kind = h.outcome
    against = f"`{h.chosen}`, the {h.kind} chosen on the calibration prompts, on {h.n_held_out} held-out prompts"
    ci = f"ratio {_interval(h.ratio)}"
    if kind == "same":
        second = f"costs exactly what {against} costs"
    elif kind == "cheaper":
        size = 1.0 - h.ratio.point
        second = (f"is {_pct(h.ratio.point)} cheaper than {against} ({ci}, wholly below 1), "
                  + (f"at least the {cheaper_by:.0%} asked" if size >= cheaper_by else f"less than the {cheaper_by:.0%} asked"))
    elif kind == "dearer":
        second = f"is {_pct(h.ratio.point)} dearer than {against} ({ci}, wholly above 1)"
    else:
        second = f"is not resolved from {against} ({ci}, which contains 1)"
    return f"{first}, and the certificate rule {second}"
