"""Speculative decoding at decode time: a greedy speculative decoder, drafting policies, a measured cost model.

``generate(target, drafter, input_ids, policy="certificate", max_new_tokens=64)`` decodes one
sequence and returns a :class:`SpeculativeResult` (tokens, forwards, per-round accepted
lengths, timings). ``policy`` is a spec string (:data:`POLICY_FORMS`, parsed by
:func:`parse_policy`): transformers' built-in schedules (``constant:K``, ``heuristic``,
``confidence:T``) and the calibrated cost rule (``certificate``, ``top1``, ``margin``).
:func:`measure_costs` and :func:`modelled_cost` give the cost model (:func:`measure_cost_samples`
keeps every timing; :func:`committed_costs` and :func:`committed_wallclock` read the measurements
committed for a preset), and
:func:`hf_assisted_generate` runs transformers' own assisted generation under the same spec
for a round-by-round comparison. :func:`compare_policies` runs the whole comparison (built-ins,
calibrated rules, lossless check, paired bootstrap of cost ratios) and :func:`hf_agreement` the
round-by-round check against transformers. :func:`record_chains` records once per prompt all
that a lossless policy can observe (the target's greedy text, the drafter's greedy chain from
every position of it), :func:`replay` runs any policy on such a recording without a model, and
:func:`oracle_cost` is the least modelled cost any lossless chain policy reaches on it.
:func:`~companion.speculative.tree.generate_tree` (:mod:`companion.speculative.tree`) verifies a tree of drafts in one forward.
"""
from companion.speculative.compare import (
    CALIBRATED,
    DEFAULTS,
    HFAgreement,
    PolicyComparison,
    PolicySummary,
    RatioEstimate,
    builtin_policies,
    compare_policies,
    greedy_step_logits,
    hf_agreement,
)
from companion.speculative.clock import committed_costs, committed_wallclock
from companion.speculative.costs import (
    CostModel,
    CostSamples,
    costs_from_results,
    measure_cost_samples,
    measure_costs,
    modelled_cost,
)
from companion.speculative.decoder import (
    SpeculativeResult,
    Timings,
    drafter_rho,
    generate,
)
from companion.speculative.hf import hf_assisted_generate, hf_settings
from companion.speculative.replay import (
    GRID_CONSTANTS,
    ChainsTooShort,
    fits,
    ORACLE,
    GridRow,
    RecordedChains,
    grid_builtins,
    grid_row,
    oracle_cost,
    oracle_plan,
    oracle_result,
    ratio_outcome,
    record_chains,
    record_many,
    replay,
    replay_comparison,
    replay_grid,
    submit_replay_grid,
)
from companion.speculative.tree import TREE_FORMS, TreeResult, generate_tree, parse_tree_policy
from companion.speculative.policies import (
    POLICY_FORMS,
    Calibrated,
    Confidence,
    Constant,
    DraftStep,
    Heuristic,
    Policy,
    RoundOutcome,
    parse_policy,
)

__all__ = [
    "CALIBRATED",
    "DEFAULTS",
    "HFAgreement",
    "PolicyComparison",
    "PolicySummary",
    "RatioEstimate",
    "builtin_policies",
    "compare_policies",
    "greedy_step_logits",
    "hf_agreement",
    "POLICY_FORMS",
    "Calibrated",
    "Confidence",
    "Constant",
    "CostModel",
    "CostSamples",
    "committed_costs",
    "committed_wallclock",
    "DraftStep",
    "Heuristic",
    "Policy",
    "RoundOutcome",
    "SpeculativeResult",
    "Timings",
    "costs_from_results",
    "drafter_rho",
    "generate",
    "hf_assisted_generate",
    "hf_settings",
    "measure_cost_samples",
    "measure_costs",
    "modelled_cost",
    "parse_policy",
    "GRID_CONSTANTS",
    "ChainsTooShort",
    "fits",
    "ORACLE",
    "GridRow",
    "RecordedChains",
    "grid_builtins",
    "grid_row",
    "ratio_outcome",
    "replay_comparison",
    "replay_grid",
    "submit_replay_grid",
    "oracle_cost",
    "oracle_plan",
    "oracle_result",
    "record_chains",
    "record_many",
    "replay",
]
# The tree decoder's names are importable from here too; their reference is companion.speculative.tree's page.
