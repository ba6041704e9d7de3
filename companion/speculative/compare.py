"""Drafting policies compared on the same prompts: forwards, acceptance, modelled cost, wall clock.

:func:`compare_policies` decodes every prompt under transformers' built-in schedules and under
the calibrated cost rule (driven by the drafter-side certificate, by ``q(1)`` alone and by the
plain margin ``q(1) - q(2)``), checks that every run reproduced the target's greedy decoding, and
returns a :class:`PolicyComparison`: per-policy summaries and a paired bootstrap over prompts
of cost ratios. :func:`hf_agreement` runs transformers' own assisted generation under the
built-ins and counts the runs that match our decoder round for round. The chapter on decode
time and ``benchmarks/bench_speculative.py`` both call these.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from companion.speculative.costs import CostModel, costs_from_results, modelled_cost
from companion.speculative.decoder import SpeculativeResult, generate
from companion.speculative.hf import hf_assisted_generate
from companion.speculative.policies import Policy, parse_policy

CONFIDENCE_GRID: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
"""Thresholds swept for ``confidence:T``."""
DEFAULTS: tuple[str, ...] = ("confidence:0.4", "heuristic:20,0.4")
"""transformers 4.57 out of the box (constant 20 drafts with the 0.4 confidence stop) and its heuristic
schedule with the default threshold left on."""
CALIBRATED: tuple[str, ...] = ("certificate", "top1", "margin", "certificate:cal=kl")
"""The calibrated cost rule driven by the certificate, by ``q(1)``, by ``q(1) - q(2)``, and the certificate
calibrated through the running law of ``KL(p || q)``."""


def builtin_policies(quick: bool = False) -> list[str]:
    """transformers' built-ins to tune over: ``constant:K`` (K = 0..8), ``confidence:T`` on a grid, the heuristic.

    ``quick``: K in {0, 2, 3, 4, 5} and T in {0.2, 0.4, 0.6}. ``constant:0`` (plain decoding) comes first:
    it is the reference every other run must reproduce.
    """
    ks = (0, 2, 3, 4, 5) if quick else tuple(range(9))
    grid = (0.2, 0.4, 0.6) if quick else CONFIDENCE_GRID
    return ([f"constant:{k}" for k in ks] + [f"confidence:{t}" for t in grid]
            + ["heuristic", "heuristic:5", "heuristic:20,0.4"])


def display_name(spec: str) -> str:
    """Row label of a calibrated policy spec (``certificate:cal=kl`` -> ``certificate (kl)``)."""
    return spec.replace(":cal=kl", " (kl)")


@dataclass(frozen=True)
class PolicySummary:
    """One policy over all prompts: forwards and drafts per generated token, cost, speed."""

    policy: str
    tokens: int
    target_per_token: float
    drafter_per_token: float
    mean_accepted: float  # accepted drafts per verification round
    cost_per_token: float  # (sum_r V(k_r) + c * drafter forwards) / tokens
    tokens_per_s: float


@dataclass(frozen=True)
class RatioEstimate:
    """A cost-per-token ratio and its 95 % paired-bootstrap percentile interval over prompts."""

    point: float
    lo: float
    hi: float


@dataclass
class PolicyComparison:
    """Runs of every policy on the same prompts and the cost model they are priced with."""

    results: dict[str, list[SpeculativeResult]]
    builtins: list[str]
    costs: CostModel
    fitted: CostModel
    lossless_failures: list[str] = field(default_factory=list)
    # prompt_costs per policy, with the run list and cost model it was computed from
    _priced: dict[str, tuple[list, int, CostModel, np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    @property
    def policies(self) -> list[str]:
        """The policies compared, in the order they ran."""
        return list(self.results)

    @property
    def lossless(self) -> bool:
        """Whether every policy's output was the target's greedy decoding."""
        return not self.lossless_failures

    def tokens(self) -> np.ndarray:
        """Tokens generated per prompt (the same under every policy: decoding is lossless)."""
        return np.array([len(r.tokens) for r in self.results[self.builtins[0]]], dtype=float)

    def prompt_costs(self, policy: str) -> np.ndarray:
        """Modelled cost of each prompt's generation under ``policy`` (cost per token x tokens).

        Kept per policy while ``results[policy]`` is the same list of the same length and ``costs``
        the same model (a summary and every bootstrap ratio read it; replace a policy's list, not
        its items, to change its runs). A copy is returned."""
        runs = self.results[policy]
        kept = self._priced.get(policy)
        if kept is None or kept[0] is not runs or kept[1] != len(runs) or kept[2] is not self.costs:
            kept = (runs, len(runs), self.costs,
                    np.array([modelled_cost(r, self.costs) * len(r.tokens) for r in runs]))
            self._priced[policy] = kept
        return kept[3].copy()

    def summary(self, policy: str) -> PolicySummary:
        """One policy over all prompts: tokens, forwards per token, accepted per round, cost, speed."""
        rs = self.results[policy]
        n_tok = sum(len(r.tokens) for r in rs)
        rounds = sum(r.rounds for r in rs)
        wall = sum(r.timings.wall_s for r in rs)
        return PolicySummary(
            policy=policy, tokens=n_tok,
            target_per_token=sum(r.target_forwards for r in rs) / n_tok,
            drafter_per_token=sum(r.drafter_forwards for r in rs) / n_tok,
            mean_accepted=sum(sum(r.accepted) for r in rs) / rounds if rounds else float("nan"),
            cost_per_token=float(self.prompt_costs(policy).sum() / n_tok),
            tokens_per_s=n_tok / wall if wall > 0 else float("nan"),
        )

    def summaries(self) -> list[PolicySummary]:
        """:meth:`summary` of every policy, in order."""
        return [self.summary(p) for p in self.policies]

    def best_builtin(self) -> str:
        """The built-in with the lowest modelled cost per token on these prompts."""
        return min(self.builtins, key=lambda b: self.prompt_costs(b).sum())

    def ratio(self, policy: str, baselines: Sequence[str], *, n_boot: int = 2000, seed: int = 0) -> RatioEstimate:
        """``rate(policy) / min_b rate(b)`` over ``baselines`` with a paired bootstrap over prompts.

        ``rate`` is modelled cost per token (total cost / total tokens). The best baseline is
        re-selected in every resample, so against all built-ins the baseline is tuned on the very
        prompts it is compared on (an advantage to the baseline).
        """
        tokens = self.tokens()
        costs = {name: self.prompt_costs(name) for name in {policy, *baselines}}
        n = len(tokens)
        rng = np.random.default_rng(seed)
        # Each resample as multiplicities of the prompts ([n_boot, n]): every total is then one
        # matrix product instead of a Python loop over resamples.
        draws = rng.integers(0, n, (n_boot, n))
        # (a bincount of the flat indices: the counts np.add.at made, whole numbers, at a fraction of its time)
        counts = np.bincount((np.arange(n_boot)[:, None] * n + draws).reshape(-1),
                             minlength=n_boot * n).reshape(n_boot, n).astype(float)
        weights = np.vstack([np.ones(n), counts])  # row 0: the sample itself

        def rates(name: str) -> np.ndarray:
            return (weights @ costs[name]) / (weights @ tokens)

        best = np.min(np.stack([rates(b) for b in baselines]), axis=0)
        boots = rates(policy) / best
        lo, hi = np.percentile(boots[1:], [2.5, 97.5])
        return RatioEstimate(float(boots[0]), float(lo), float(hi))


def compare_policies(
    target: Any,
    drafter: Any,
    prompts: Sequence[Tensor],
    calibration_prompts: Sequence[Tensor] = (),
    *,
    max_new_tokens: int = 64,
    builtins: Sequence[str] | None = None,
    calibrated: Sequence[str] = CALIBRATED,
    costs: CostModel | None = None,
    progress: bool = False,
) -> PolicyComparison:
    """Decode every prompt under every policy; price the runs with one cost model.

    1. The built-ins (``builtins``, default :func:`builtin_policies`; ``constant:0`` first, the
       reference that every other run must reproduce token for token).
    2. The cost model is fitted on the built-ins' own rounds
       (``costs_from_results``), unless ``costs`` pins one.
    3. The calibrated policies, given that model's ``c, v1, dv``: each is warmed on
       ``calibration_prompts`` (other prompts), and every evaluated prompt starts from that same
       snapshot, so prompts stay independent; a ``certificate (cold)`` row starts from the prior.

    ``prompts`` and ``calibration_prompts`` are token-id tensors of shape ``(1, n)``.
    """
    names = list(builtins) if builtins is not None else builtin_policies()
    if not names or names[0] != "constant:0":
        raise ValueError(f"the built-ins must start with 'constant:0' (the reference decoding), got {names[:1]}")
    if not prompts:
        raise ValueError("no prompts to decode")
    results: dict[str, list[SpeculativeResult]] = {}
    failures: list[str] = []
    reference: list[Tensor] = []

    def record(name: str, i: int, r: SpeculativeResult) -> None:
        results.setdefault(name, []).append(r)
        if name == "constant:0":
            reference.append(r.tokens)
        elif not torch.equal(r.tokens, reference[i]):
            failures.append(f"{name} on prompt {i}")

    total = len(prompts) * (len(names) + len(calibrated) + 1) + len(calibration_prompts) * len(calibrated)
    bar = tqdm(total=total, desc="decoding", disable=not progress)
    for i, ids in enumerate(prompts):
        for spec in names:
            record(spec, i, generate(target, drafter, ids, policy=spec, max_new_tokens=max_new_tokens))
            bar.update()
    fitted = costs_from_results([r for spec in names for r in results[spec]])
    used = costs if costs is not None else fitted
    knobs = used.policy_defaults()
    warmed: dict[str, Policy] = {}
    for spec in calibrated:
        pol = parse_policy(spec, **knobs)
        for ids in calibration_prompts:
            generate(target, drafter, ids, policy=pol, max_new_tokens=max_new_tokens)
            bar.update()
        warmed[spec] = pol
    for i, ids in enumerate(prompts):
        for spec in calibrated:
            record(display_name(spec), i,
                   generate(target, drafter, ids, policy=warmed[spec].fresh(), max_new_tokens=max_new_tokens))
            bar.update()
        record("certificate (cold)", i,
               generate(target, drafter, ids, policy=parse_policy("certificate", **knobs), max_new_tokens=max_new_tokens))
        bar.update()
    bar.close()
    return PolicyComparison(results, names, used, fitted, failures)


@dataclass(frozen=True)
class HFAgreement:
    """transformers' assisted generation against our decoder under the same built-in policies."""

    matched: int  # (prompt, policy) runs identical in tokens, drafts submitted and drafts accepted per round
    total: int
    tokens_per_s: float  # transformers' wall clock over all its runs
    mean_accepted: float  # its accepted drafts per round, over all runs
    mismatches: list[str] = field(default_factory=list)
    runs: dict[tuple[str, int], SpeculativeResult] = field(default_factory=dict)  # transformers' run by (policy, prompt)


def hf_agreement(target: Any, drafter: Any, prompts: Sequence[Tensor], policies: Sequence[str], *,
                 max_new_tokens: int = 64, reference: Callable[[str, int], SpeculativeResult] | None = None
                 ) -> HFAgreement:
    """Run ``transformers``' assisted generation under each built-in policy and compare round by round.

    ``reference(policy, i)`` gives our decoder's run (default: decode it here).
    """
    matched = total = n_tok = 0
    wall = 0.0
    acc = rounds = 0
    mismatches: list[str] = []
    runs: dict[tuple[str, int], SpeculativeResult] = {}
    for i, ids in enumerate(prompts):
        for spec in policies:
            ours = reference(spec, i) if reference is not None else generate(
                target, drafter, ids, policy=spec, max_new_tokens=max_new_tokens)
            theirs = hf_assisted_generate(target, drafter, ids, policy=spec, max_new_tokens=max_new_tokens)
            runs[(spec, i)] = theirs
            total += 1
            same = (ours.accepted == theirs.accepted and ours.submitted == theirs.submitted
                    and torch.equal(ours.tokens, theirs.tokens))
            matched += same
            if not same:
                mismatches.append(f"{spec} on prompt {i}")
            wall += theirs.timings.wall_s
            n_tok += len(theirs.tokens)
            acc += sum(theirs.accepted)
            rounds += len(theirs.accepted)
    return HFAgreement(matched, total, n_tok / wall if wall > 0 else float("nan"),
                       acc / rounds if rounds else float("nan"), mismatches, runs)


def greedy_step_logits(target: Any, drafter: Any, prompts: Sequence[Tensor], n_steps: int
                       ) -> tuple[Tensor, Tensor]:
    """``(target logits, drafter logits)`` at every step of the target's greedy continuation of each prompt.

    Each prompt (``(1, n)`` token ids) is continued greedily by the target for at most ``n_steps``
    tokens (stopping at its end-of-sequence token, that step included); both models then score
    the whole sequence in one forward, and the rows that predicted the continuation are kept:
    ``[total steps, V]`` float32 each, the ``(p, q)`` pairs a greedy decoder meets (what a
    drafter-side certificate is tested on).
    """
    eos = target.generation_config.eos_token_id
    pad = eos[0] if isinstance(eos, (list, tuple)) else eos
    ps, qs = [], []
    with torch.inference_mode():
        for ids in prompts:
            n = ids.shape[1]
            seq = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n_steps,
                                  pad_token_id=pad)
            ps.append(target(seq).logits[0, n - 1:-1].float())
            qs.append(drafter(seq).logits[0, n - 1:-1].float())
    return torch.cat(ps), torch.cat(qs)
