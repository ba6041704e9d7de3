"""Drafting policies: how many tokens the drafter proposes in each round.

A policy is written as a spec string and parsed by :func:`parse_policy`:

==============================  ==========================================================================
spec                            rule
==============================  ==========================================================================
``constant:K``                  always draft ``K`` tokens (``K = 0``: plain autoregressive decoding)
``heuristic[:K0[,T]]``          transformers' schedule: start at ``K0`` (default 20, transformers 4.57's
                                ``num_assistant_tokens``); after a round whose drafts were all accepted
                                ``K += 2``, otherwise ``K = max(1, K - 1)``; optional confidence stop ``T``
``confidence:T[,K]``            draft up to ``K`` (default 20) tokens, stop after a draft whose drafter
                                probability is below ``T`` (transformers' ``assistant_confidence_threshold``)
``certificate[:knobs]``         the calibrated cost rule below, driven by the drafter-side certificate
``top1[:knobs]``                the same rule driven by the drafter's top probability ``q(1)`` alone
``margin[:knobs]``              the same rule driven by the plain margin ``q(1) - q(2)``
==============================  ==========================================================================

transformers 4.57 defaults, for reference: ``num_assistant_tokens = 20``, schedule ``"constant"``,
``assistant_confidence_threshold = 0.4``; so ``confidence:0.4`` *is* its out-of-the-box assisted
generation, and ``heuristic:20,0.4`` its heuristic schedule with the default threshold left on.
The three built-in policies reproduce ``transformers.generation.candidate_generator``
(``AssistedCandidateGenerator``) exactly:

* the round's draft budget is ``min(int(K), max_length - cur_len - 1)``: the last position is left
  to the target's bonus token, so no round ever overshoots ``max_new_tokens``;
* the confidence stop is checked *after* a token is drafted (``ConfidenceCriteria``): the
  low-confidence token is still proposed, and ``T = 0`` disables it;
* the heuristic counts a round as fully accepted when the accepted length equals the number of
  tokens actually drafted (which the budget, the confidence stop or an end-of-sequence token can
  make smaller than ``K``); ``K`` is a float, truncated by ``int`` when used;
* transformers' heuristic state persists across ``generate`` calls on the same assistant
  (schedule ``"heuristic"``); a spec string gives a fresh policy per call (``"heuristic_transient"``
  behaviour); pass a :class:`Policy` object to keep its state across calls.
* with scikit-learn installed, transformers also retunes the confidence threshold online from an
  ROC curve; the policies here (and :func:`companion.speculative.hf.hf_assisted_generate`) use the
  fixed threshold.

The calibrated cost rule (``certificate``, ``top1``, ``margin``), its objective, calibration and knobs
are described in :mod:`companion.speculative.calibrated`; its survival plan (value functions and the
optimal rate) is in :mod:`companion.speculative.survival`. The interface and the built-ins live in
:mod:`companion.speculative.policy_base`; every name stays importable from here.
"""
from __future__ import annotations

import math
import re
from typing import Any

from companion.speculative.calibrated import (  # noqa: F401  (re-exported: importable from here as before)
    _CAL_DEFAULTS,
    _KNOB_RANGES,
    SCORES,
    Calibrated,
    _verify_table,
    check_knob,
    greedy_rho,
    kl_scale_score,
    knob_rule,
    unit_score,
)
from companion.speculative.policy_base import (  # noqa: F401
    DEFAULT_CONFIDENCE_THRESHOLD,
    DEFAULT_NUM_ASSISTANT_TOKENS,
    Confidence,
    Constant,
    DraftStep,
    Heuristic,
    Policy,
    RoundOutcome,
    _num,
)
from companion.speculative.survival import (  # noqa: F401
    SURVIVAL_GRID,
    Law,
    _bellman,
    _expectation,
    _step_costs,
    bellman,
    optimal_rate,
    pava,
)

POLICY_FORMS = (
    "constant:K",
    "heuristic[:K0[,T]]",
    "confidence:T[,K]",
    "certificate[:knob=value,...]",
    "top1[:knob=value,...]",
    "margin[:knob=value,...]",
)
"""The accepted spec forms; knobs of the calibrated policies: ``c, v1, dv, kmax, prior, n0, bins, cal, explore, window``."""

_NUM = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


def _int(spec: str, name: str, text: str, lo: int) -> int:
    if not re.fullmatch(r"[0-9]+", text) or int(text) < lo:
        raise ValueError(f"policy {spec!r}: {name} must be an integer >= {lo}, got {text!r}")
    return int(text)


def _float(spec: str, name: str, text: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if not re.fullmatch(_NUM, text):
        raise ValueError(f"policy {spec!r}: {name} must be a number, got {text!r}")
    x = float(text)
    if not (lo < x if lo_open else lo <= x) or x > hi:
        interval = f"{'(' if lo_open else '['}{_num(lo)}, {_num(hi) if math.isfinite(hi) else 'inf'}]"
        raise ValueError(f"policy {spec!r}: {name} must be in {interval}, got {text!r}")
    return x


def _knob_text(spec: str, key: str, text: str) -> Any:
    """A knob written in a spec, read as its kind (text, integer or number) and checked by :func:`check_knob`."""
    if key != "cal":
        integer = _KNOB_RANGES[key][0]
        if not re.fullmatch(r"[-+]?[0-9]+" if integer else r"[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|inf|nan)",
                            text, flags=0 if integer else re.IGNORECASE):
            raise ValueError(f"policy {spec!r}: {key} must be {knob_rule(key)}, got {text!r}")
        value: Any = int(text) if integer else float(text)
    else:
        value = text
    try:
        check_knob(key, value)
    except ValueError as err:
        raise ValueError(f"policy {spec!r}: {str(err).rsplit(', got ', 1)[0]}, got {text!r}") from None
    return value


def _calibrated(spec: str, kind: str, body: str | None, defaults: dict[str, Any]) -> Calibrated:
    values = dict(_CAL_DEFAULTS)
    values.update({k: v for k, v in defaults.items() if k in _CAL_DEFAULTS})
    if "verify" in defaults:
        values["verify"] = defaults["verify"]
    if body:
        for item in body.split(","):
            key, sep, text = item.partition("=")
            key = key.strip()
            text = text.strip()
            if not sep or key not in _CAL_DEFAULTS:
                raise ValueError(
                    f"policy {spec!r}: {item!r} is not a knob=value pair with a known knob; "
                    f"knobs: {', '.join(_CAL_DEFAULTS)}")
            values[key] = _knob_text(spec, key, text)
    return Calibrated(kind=kind, **values)


def parse_policy(spec: str | Policy, **defaults: Any) -> Policy:
    """Parse a policy spec (see the module docstring); a :class:`Policy` is returned unchanged.

    ``defaults`` override the calibrated policies' knob defaults (e.g. the measured ``c``,
    ``v1``, ``dv``, and ``verify``, a measured ``V(0), V(1), ...`` table that replaces ``v1, dv``:
    :meth:`companion.speculative.CostModel.policy_defaults` gives all four); knobs written in the spec win. Raises ``ValueError`` naming the bad spec and
    listing the valid forms.
    """
    if isinstance(spec, Policy):
        return spec
    if not isinstance(spec, str):
        raise ValueError(f"policy spec must be a string, got {type(spec).__name__}; expected one of: "
                         f"{', '.join(POLICY_FORMS)}")
    unknown = set(defaults) - set(_CAL_DEFAULTS) - {"verify"}
    if unknown:
        raise ValueError(f"unknown policy defaults {sorted(unknown)}; knobs: {', '.join(_CAL_DEFAULTS)} (and verify, "
                         f"a V(k) table)")
    s = spec.strip()
    name, _, body = s.partition(":")
    has_body = ":" in s
    if name == "constant" and has_body:
        return Constant(_int(spec, "K", body, 0))
    if name == "heuristic":
        if not has_body:
            return Heuristic()
        parts = body.split(",")
        if len(parts) > 2:
            raise ValueError(f"policy {spec!r}: expected heuristic[:K0[,T]]")
        k0 = _int(spec, "K0", parts[0], 1)
        t = _float(spec, "T", parts[1], 0.0, 1.0) if len(parts) == 2 else 0.0
        return Heuristic(k0=k0, threshold=t)
    if name == "confidence" and has_body:
        parts = body.split(",")
        if len(parts) > 2:
            raise ValueError(f"policy {spec!r}: expected confidence:T[,K]")
        t = _float(spec, "T", parts[0], 0.0, 1.0)
        k = _int(spec, "K", parts[1], 1) if len(parts) == 2 else DEFAULT_NUM_ASSISTANT_TOKENS
        return Confidence(threshold=t, k=k)
    if name in SCORES:
        return _calibrated(spec, name, body if has_body else None, defaults)
    raise ValueError(f"malformed policy spec {spec!r}; expected one of: {', '.join(POLICY_FORMS)}")
