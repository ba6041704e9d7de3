"""The cost model of speculative decoding, measured on the models at hand.

Unit: one single-token target forward with a warm KV cache. Then

* ``c`` = (single-token drafter forward time) / (single-token target forward time);
* ``V(k)`` = (time of a target forward over ``k + 1`` new tokens, i.e. verifying ``k`` drafts) /
  (single-token target forward time); ``V(0) = 1``.

Two ways to measure them: :func:`measure_costs`, a microbenchmark of isolated forwards at a fixed
context length, and :func:`costs_from_results`, a fit on the per-round forward times of actual
decoding runs (steadier on a shared machine, and measured under the decoder's own conditions).

A generation whose rounds verified ``k_1, k_2, ...`` drafts with ``D`` drafter forwards in all
has modelled cost ``sum_r V(k_r) + c D``, reported per generated token by :func:`modelled_cost`.
The prompt's prefill is counted as an ordinary forward for both models (it is the same for
every policy). ``V(k)`` is not ``1``: on the embedded pair with transformers on the CPU the
multi-token forward builds an explicit attention mask, a fixed cost that a one-token forward
skips, so ``V`` jumps at ``k = 1`` and then grows slowly.
"""
from __future__ import annotations

import math
import numbers
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from companion.speculative.decoder import SpeculativeResult, logit_count


@dataclass(frozen=True)
class CostModel:
    """Measured costs in single-token target forwards (see the module docstring).

    ``verify[k]`` is ``V(k)`` for ``k = 0 .. len(verify) - 1``: ``V(0) = 1`` and every entry a
    finite number > 0 (a forward never costs nothing, let alone less). The table may dip (timing
    noise does that); beyond it :meth:`verify_cost` extrapolates from the last two entries with
    the slope clamped at 0, ``V(k) = V(n-1) + max(0, V(n-1) - V(n-2)) (k - n + 1)`` for
    ``k >= n = len(verify)``, so that costs past the table stay positive and never decrease: a
    longer draft never looks cheaper to verify than the last measured one. ``c`` is a finite
    number >= 0. ``target_s`` and ``drafter_s`` are the measured single-token forward times
    (median seconds) at ``context`` cached tokens (``nan``: not measured).
    """

    c: float
    verify: tuple[float, ...]
    target_s: float = math.nan
    drafter_s: float = math.nan
    context: int = 0

    def __post_init__(self) -> None:
        # Checked here, for every way of making one: a cost model the oracle and the policy grid
        # trust must not price long drafts as free (negative costs) or every policy as NaN.
        if isinstance(self.c, bool) or not isinstance(self.c, numbers.Real):
            raise ValueError(f"CostModel cost ratio c (drafter/target forward time) must be a number, got {self.c!r}")
        if not (math.isfinite(self.c) and self.c >= 0):
            raise ValueError(f"CostModel cost ratio c must be a finite number >= 0, got {self.c!r}")
        if isinstance(self.verify, (str, bytes)) or not isinstance(self.verify, Sequence):
            raise ValueError(f"CostModel verify must be a sequence of numbers V(0), V(1), ... starting with 1, "
                            f"got {self.verify!r}")
        for k, v in enumerate(self.verify):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise ValueError(f"CostModel verify[{k}] must be a number, got {v!r}")
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"CostModel verify[{k}] = V({k}) must be a finite number > 0 (a target forward "
                                 f"over {k + 1} tokens, in single-token forwards), got {v!r}")
        if not self.verify or self.verify[0] != 1.0:
            raise ValueError(f"CostModel verify costs must start with V(0) = 1, got {tuple(self.verify[:1])}")
        object.__setattr__(self, "c", float(self.c))
        object.__setattr__(self, "verify", tuple(float(v) for v in self.verify))

    def verify_cost(self, k: int) -> float:
        """``V(k)``: the table, then the clamped linear extrapolation of the class docstring (positive, non-decreasing)."""
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
            raise ValueError(f"number of drafts k must be an integer >= 0, got {k!r}")
        n = len(self.verify)
        if k < n:
            return self.verify[k]
        if n < 2:
            return self.verify[-1]
        slope = max(self.verify[-1] - self.verify[-2], 0.0)
        return self.verify[-1] + slope * (k - n + 1)

    def affine(self) -> tuple[float, float]:
        """Least-squares ``(v1, dv)`` with ``V(k) ~ v1 + dv (k - 1)`` over the measured ``k >= 1``."""
        ks = list(range(1, len(self.verify)))
        if not ks:
            return 1.0, 0.0
        if len(ks) == 1:
            return self.verify[1], 0.0
        xs = [k - 1 for k in ks]
        ys = [self.verify[k] for k in ks]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        dv = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        dv = max(dv, 0.0)
        return my - dv * mx, dv

    def policy_defaults(self) -> dict[str, Any]:
        """Values ``c, v1, dv`` and ``verify`` (this model's ``V`` table) for the calibrated policies: the rule
        then optimises this cost model's own ``V(k)`` (``v1, dv``, its least-squares line, describe it)."""
        v1, dv = self.affine()
        return {"c": self.c, "v1": v1, "dv": dv, "verify": self.verify}


def modelled_cost(result: SpeculativeResult, costs: CostModel) -> float:
    """Modelled cost per generated token: ``(sum_r V(k_r) + c * drafter_forwards) / len(tokens)``."""
    n = len(result.tokens)
    if n == 0:
        return math.nan
    total = sum(costs.verify_cost(k) for k in result.submitted) + costs.c * result.drafter_forwards
    return total / n


def costs_from_results(results: list[SpeculativeResult], *, min_rounds: int = 5, overhead: bool = True) -> CostModel:
    """The cost model fitted on decoding runs themselves, from their per-round times.

    A round's target-side time is its wall time minus its drafter forwards (``overhead=True``: the
    decoder's own per-round and per-draft bookkeeping counts with the verification, so that the
    model predicts wall-clock time; it is not negligible next to a few-millisecond forward) or its
    target forward alone (``overhead=False``). The first round of every run (it carries the
    prompt's prefill) is left out. ``V(k)`` is the median target-side time of rounds that verified
    ``k`` drafts over the median of rounds that verified none; ``c`` the median drafter forward
    time per call over that same median.
    Draft counts seen in fewer than ``min_rounds`` rounds are filled by linear interpolation
    between measured neighbours (and the table stops at the largest measured count). Needs rounds
    without drafts (e.g. a ``constant:0`` run) and rounds with drafts.
    """
    by_k: dict[int, list[float]] = {}
    per_call: list[float] = []
    for r in results:
        for i in range(1, len(r.round_target_s)):
            t = r.round_wall_s[i] - r.round_drafter_s[i] if overhead else r.round_target_s[i]
            by_k.setdefault(r.submitted[i], []).append(t)
            if r.drafted[i]:
                per_call.append(r.round_drafter_s[i] / r.drafted[i])
    measured = {k: statistics.median(v) for k, v in by_k.items() if len(v) >= min_rounds}
    if 0 not in measured or not per_call or len(measured) < 2:
        raise ValueError(
            f"cannot fit a cost model: need >= {min_rounds} rounds without drafts and with drafts "
            f"(rounds per draft count: { {k: len(v) for k, v in sorted(by_k.items())} })")
    t1 = measured[0]
    ks = sorted(measured)
    verify = [1.0]
    for k in range(1, ks[-1] + 1):
        if k in measured:
            verify.append(measured[k] / t1)
        else:
            lo = max(j for j in ks if j < k)
            hi = min(j for j in ks if j > k)
            v_lo, v_hi = measured[lo] / t1, measured[hi] / t1
            verify.append(v_lo + (v_hi - v_lo) * (k - lo) / (hi - lo))
    d1 = statistics.median(per_call)
    return CostModel(c=d1 / t1, verify=tuple(verify), target_s=t1, drafter_s=d1)


@dataclass(frozen=True)
class CostSamples:
    """Every timing of an interleaved cost measurement, and the ratios read from them.

    ``target_s[n][r]`` is the seconds of repeat ``r``'s target forward over ``n`` new tokens
    (``n = 1 .. kmax + 1``, so ``n = k + 1`` verifies ``k`` drafts) and ``drafter_s[r]`` its
    one-token drafter forward, all at ``context`` cached tokens with ``threads`` torch threads
    (CPU; 0: not set). :meth:`model` gives the :class:`CostModel` of the medians
    (``V(k) = median target_s[k + 1] / median target_s[1]``, ``c`` likewise);
    :meth:`ratio_spread` the min, median and max over repeats of the *paired* ratios (each
    repeat's forward over that repeat's one-token target forward), the spread a reader checks.
    """

    target_s: dict[int, tuple[float, ...]]
    drafter_s: tuple[float, ...]
    context: int
    threads: int = 0

    @property
    def kmax(self) -> int:
        """The longest draft timed, the largest forward length minus one."""
        return max(self.target_s) - 1

    @property
    def repeats(self) -> int:
        """How many times each forward was timed."""
        return len(self.drafter_s)

    def model(self) -> CostModel:
        """The cost model of the median times (``V(0) .. V(kmax)`` and ``c``)."""
        t1 = statistics.median(self.target_s[1])
        d1 = statistics.median(self.drafter_s)
        verify = (1.0,) + tuple(statistics.median(self.target_s[k + 1]) / t1 for k in range(1, self.kmax + 1))
        return CostModel(c=d1 / t1, verify=verify, target_s=t1, drafter_s=d1, context=self.context)

    def ratio_spread(self, k: int | None) -> tuple[float, float, float]:
        """(min, median, max) over repeats of ``V(k)`` (``k`` drafts verified) or, for ``k=None``, of ``c``."""
        num = self.drafter_s if k is None else self.target_s[k + 1]
        ratios = [a / b for a, b in zip(num, self.target_s[1])]
        return min(ratios), statistics.median(ratios), max(ratios)

    def outliers(self, k: int | None, factor: float = 2.0) -> list[int]:
        """The repeats whose paired ratio for ``V(k)`` (``c`` for ``k=None``) rests on an outlying timing: the
        numerator's or the one-token target forward's more than ``factor`` times the median of its column
        (a machine shared with other work stalls a forward now and then; the medians ignore such stalls,
        the paired min and max do not)."""
        num = self.drafter_s if k is None else self.target_s[k + 1]
        den = self.target_s[1]
        m_num, m_den = statistics.median(num), statistics.median(den)
        return [r for r, (a, b) in enumerate(zip(num, den)) if a > factor * m_num or b > factor * m_den]

    def to_json(self) -> dict[str, Any]:
        """The samples as a JSON-ready dict."""
        return {"context": self.context, "threads": self.threads, "drafter_s": list(self.drafter_s),
                "target_s": {str(n): list(v) for n, v in sorted(self.target_s.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CostSamples":
        """The samples that :meth:`to_json` wrote; a ValueError on a malformed dict."""
        try:
            target = {int(n): tuple(float(x) for x in v) for n, v in data["target_s"].items()}
            samples = cls(target_s=target, drafter_s=tuple(float(x) for x in data["drafter_s"]),
                          context=int(data["context"]), threads=int(data.get("threads", 0)))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise ValueError(f"not a cost measurement (context, threads, drafter_s, target_s): {err}") from None
        if 1 not in target or sorted(target) != list(range(1, len(target) + 1)) or \
                any(len(v) != samples.repeats or not v for v in target.values()):
            raise ValueError("a cost measurement needs target_s for 1 .. kmax + 1 new tokens, as many repeats as drafter_s")
        return samples


def measure_cost_samples(
    target: Any,
    drafter: Any,
    *,
    context: int = 128,
    kmax: int = 24,
    repeats: int = 30,
    seed: int = 0,
) -> CostSamples:
    """Time ``c`` and ``V(0 .. kmax)`` with ``context`` tokens in both caches, every repeat kept.

    Every repeat times, interleaved, one single-token drafter forward, one single-token target
    forward and one target forward over ``k + 1`` tokens for each ``k``; each forward is undone
    by cropping the cache. A first pass warms up and is not kept. Interleaving keeps a shared
    machine's load changes from biasing one measurement against another.
    """
    for name, value, lo in (("context", context, 1), ("kmax", kmax, 1), ("repeats", repeats, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    vocab = min(logit_count(target), logit_count(drafter))
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, context + kmax + 1), generator=gen)
    caches = {}
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        for name, model in (("target", target), ("drafter", drafter)):
            cache = DynamicCache()
            model(input_ids=ids[:, :context].to(model.device), past_key_values=cache, use_cache=True, logits_to_keep=1)
            caches[name] = cache
        plan = [("drafter", drafter, 1), ("target", target, 1)] + [("target", target, k + 1) for k in range(1, kmax + 1)]
        for rep in range(repeats + 1):
            for name, model, n in plan:
                x = ids[:, context:context + n].to(model.device)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(input_ids=x, past_key_values=caches[name], use_cache=True, logits_to_keep=n)
                if model.device.type == "cuda":
                    torch.cuda.synchronize()
                dt = time.perf_counter() - t0
                caches[name].crop(context)
                if rep:  # the first pass warms up
                    times.setdefault((name, n), []).append(dt)
    on_cpu = getattr(target, "device", torch.device("cpu")).type == "cpu"
    return CostSamples(target_s={n: tuple(times[("target", n)]) for n in range(1, kmax + 2)},
                       drafter_s=tuple(times[("drafter", 1)]), context=context,
                       threads=torch.get_num_threads() if on_cpu else 0)


def measure_costs(
    target: Any,
    drafter: Any,
    *,
    context: int = 128,
    kmax: int = 24,
    repeats: int = 30,
    seed: int = 0,
) -> CostModel:
    """Measure ``c`` and ``V(0 .. kmax)`` with ``context`` tokens in both caches.

    The medians over ``repeats`` interleaved repeats of :func:`measure_cost_samples` (its
    :meth:`CostSamples.model`).
    """
    return measure_cost_samples(target, drafter, context=context, kmax=kmax, repeats=repeats, seed=seed).model()
