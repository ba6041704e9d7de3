"""Record a lossless run once, replay any drafting policy on it, and price the best any policy can do.

Under strict-greedy (lossless) verification everything a drafting policy can observe is fixed in
advance. The output is the target's greedy text ``x_0 x_1 ...``; a round that starts after ``s``
emitted tokens drafts the drafter's greedy chain from the context ``prompt + x_0 .. x_{s-1}``,
whatever the policy; and the number ``L_s`` of leading drafts of that chain equal to
``x_s x_{s+1} ...`` decides how many of ``k`` submitted drafts are accepted: ``min(k, L_s)``.

* :func:`record_chains` computes all of it once per prompt: the target's greedy text (one
  single-token forward per token, as plain decoding), one teacher-forced drafter forward over
  prompt and text (its row at position ``t`` is the first draft from ``t``, and, as long as a
  chain agrees with the text, every later draft of every chain that has reached ``t``), one
  teacher-forced target forward over the same sequence (``KL(p || q)`` at every position, for
  the policies that read it), and, at each position ``m`` where the drafter's greedy token is not
  the text's, a cached greedy extension of the drafter past that mismatch (shared by every chain
  that diverges at ``m``). :func:`record_many` records many prompts, in several threads if asked.
* :func:`replay` runs a :class:`~companion.speculative.Policy` on the recording and
  returns the :class:`~companion.speculative.SpeculativeResult` that
  :func:`~companion.speculative.generate` would return (tokens, forwards, and per round
  the drafts made, submitted and accepted), without running a model: the policy sees the same
  ``start_round`` / ``wants_draft`` / ``observe`` / ``submit`` / ``end_round`` calls with the same
  arguments.
* :func:`oracle_cost` is the least modelled cost per token (the convention of
  :func:`~companion.speculative.modelled_cost`) of any lossless chain policy on the recorded
  text, by dynamic programming over positions; :func:`oracle_plan` and :func:`oracle_result`
  give the rounds that reach it.

Floating point: the recording computes the drafter's and the target's logits in other batch
shapes than a live decode does (one long forward instead of one or two tokens at a time), so
``q(1)``, ``q(2)`` and the certificate may differ from a live run's in their last bits. A
policy's decision can only differ where it sits exactly on such a boundary; the tests compare
replays with live decoding round for round.

The code lives in sibling modules, by concern: :mod:`companion.speculative.recording` (the
recording), :mod:`companion.speculative.policy_replay` (:func:`replay`),
:mod:`companion.speculative.replay_fast` (its array path for the built-ins, and the oracle's),
:mod:`companion.speculative.oracle` (the dynamic programme) and :mod:`companion.speculative.grid`
(the comparison from recordings, the cost-model grid and its sentences); the comparison replays
the calibrated rules on every recording at once with ``companion.speculative.calibrated_replay``
(the rounds), ``companion.speculative.calibrated_plan`` (the rule's refresh: calibration, laws,
rate, value tables) and ``companion.speculative.batched_numpy`` (numpy's sums, interpolation and
quantiles for many rows, bit for bit). Every name is importable from here, as before.
"""
from __future__ import annotations

from companion.speculative.grid import (
    GRID_CONSTANTS,
    ORACLE,
    GridRow,
    _grid_point,
    _grid_worker_row,
    _grid_worker_rows,
    _grid_worker_start,
    grid_builtins,
    grid_row,
    ratio_outcome,
    replay_comparison,
    replay_grid,
    submit_replay_grid,
)
from companion.speculative.oracle import _advance, _check_costs, _dp, oracle_cost, oracle_plan, oracle_result
from companion.speculative.policy_replay import fits, replay
from companion.speculative.replay_fast import ChainsTooShort
from companion.speculative.recording import (
    _GREEDY,
    _HEAD,
    _ROWS,
    RecordedChains,
    _check_chains,
    _extend_batched,
    _given_text,
    _last_rows,
    _steps,
    _steps_float64,
    record_chains,
    record_many,
)


__all__ = ["ChainsTooShort", "fits", "GRID_CONSTANTS", "ORACLE", "GridRow", "RecordedChains", "grid_builtins", "grid_row", "oracle_cost",
           "oracle_plan", "oracle_result", "ratio_outcome", "record_chains", "record_many", "replay",
           "replay_comparison", "replay_grid", "submit_replay_grid"]
