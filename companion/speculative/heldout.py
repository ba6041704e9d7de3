"""A drafting policy against transformers' built-ins, the built-in chosen on calibration prompts and compared on held-out ones.

Picking the cheapest built-in on the very prompts it is compared on favours it (its cost there is
the minimum of many noisy costs). :func:`held_out_comparison` separates the two: every built-in
is replayed on the calibration recordings (the ones that also warm the calibrated rules), the
cheapest there is chosen, and the policy is compared with that one built-in on the held-out
recordings, with a paired bootstrap over the held-out prompts (the choice is fixed, not redone
per resample). :attr:`HeldOut.outcome` is the verdict as data (cheaper, dearer, no difference, or
exactly the same cost); the chapters state it in their own words, checked against it.
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
