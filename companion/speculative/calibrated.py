"""The calibrated cost rule (``certificate``, ``top1``, ``margin``).

Costs are in units of one single-token target forward. A round that calls the drafter ``i``
times and submits ``k <= i`` drafts to one verification forward costs ``C = V(k) + c * i``, where
``c`` is the drafter/target forward-time ratio and ``V(k)`` the cost of a target forward over
``k`` drafts (``V(0) = 1``; modelled affine ``V(k) = v1 + dv * (k - 1)`` for ``k >= 1``; measure
them with :func:`companion.speculative.costs.measure_costs`). It yields ``N = 1 + A`` tokens,
``A`` the accepted length. If ``s_t`` is the predicted probability that draft ``t`` is accepted
given that drafts ``1..t-1`` were, the whole draft ``1..j`` survives with probability
``S_j = s_1 s_2 ... s_j`` and ``E[A] = S_1 + ... + S_k``.

*Objective.* Long-run throughput is ``E[N] / E[C]`` per round (renewal-reward), and a policy
maximises it iff it maximises ``E[N] - lam* E[C]`` round by round, ``lam*`` the optimal rate in
tokens per unit of cost (Dinkelbach).

*Marginal rule.* After ``i`` drafter calls the draft survives whole with probability ``S_i``;
one more call costs ``lam (c + V(i+1) - V(i))`` and adds ``S_i s`` expected tokens, ``s`` the
next step's survival, still unknown. With ``W_i(S)`` the value of being free to keep drafting,

    ``W_i(S) = max(0, E_s[S s + W_{i+1}(S s)] - lam (c + V(i+1) - V(i)))``,  ``W_kmax = 0``,

the policy makes one more call iff the second argument is positive at ``S = S_i``: the predicted
probability that the whole draft survives still pays for one more drafter call. If drafting
could not continue after that call (``W_{i+1} = 0``) this is ``S_i E[s] > lam (c + dv)``: draft
one more token iff the expected accepted tokens it adds per unit of cost it adds exceed the rate,
i.e. iff it increases the expected tokens per unit cost; ``W_{i+1}`` adds the option of drafting
further, which matters when the first draft carries a jump in verification cost
(``v1 - 1 > dv``, as with transformers' multi-token attention mask on the CPU): one draft may
not pay while several do. The law of ``s`` is the empirical distribution of the calibrated
survival over verified steps, separately for a round's first draft and for later ones (plus
``n0`` pseudo-steps at ``prior``); ``lam = lam*`` under that model, the root of
``1 - lam + W_0(1; lam) = 0`` (see :func:`optimal_rate`). When drafting stops after ``i`` calls the
policy submits ``k* = argmax_{k <= i} S_1 + ... + S_k - lam V(k)``, so a draft the drafter was unsure
of is not verified when checking it costs more than it is expected to bring.

*Calibration* (online, from verified steps only: the decoder sees the target's ``p`` only at
positions it verified, namely the accepted drafts and the first rejected one):

* ``cal=bins`` (default): ``s_t`` is the acceptance frequency of verified steps whose score lies
  in the same bin as step ``t``'s score: at most ``bins`` quantile bins of the verified scores
  (at least 8 steps each), each with ``n0`` pseudo-steps at ``prior``, made non-decreasing in the
  score by weighted pool-adjacent-violators. Scores: ``certificate`` ``u = 1 - exp(-rho~(q))``
  (for strict greedy ``(sqrt q(1) - sqrt q(2))^2``), ``top1`` ``u = q(1)``, ``margin``
  ``u = q(1) - q(2)``. ``window=W`` calibrates on the last ``W`` verified steps only.
* ``cal=kl``: ``s_t = F(rho(q_t))`` with ``F`` the running empirical CDF of ``KL(p || q)`` over
  verified steps: literally the predicted probability that the step's certificate holds, which
  (when the divergence is independent of ``q``) is a lower bound on its acceptance probability,
  since ``KL < rho~`` implies acceptance. ``top1`` uses the strict-greedy certificate with
  ``q(2)`` at its worst case ``min(q(1), 1 - q(1))``, ``margin`` the worst case over ``q`` with the
  given margin, ``-log(1 - m^2) / 2``: the certificates one can state knowing only that statistic.
  On the embedded pair this bound is far below the acceptance rate (the certificate holds at
  about a quarter of the steps, drafts are accepted at four fifths), so ``cal=kl`` drafts too
  little; it is kept for comparison.

Exploration: a round that submits nothing teaches nothing, so after ``explore`` such rounds in a
row one draft is made and verified regardless; the wait doubles after every forced draft until
the policy drafts of its own accord again (so a pair on which drafting never pays costs only a
logarithmic number of forced drafts). The calibration and the plan are refreshed every 8 newly
verified steps.

Knobs (``name=value``, comma separated): ``c`` (0.28), ``v1`` (1.5), ``dv`` (0.025), ``kmax`` (16),
``prior`` (0.8), ``n0`` (4), ``bins`` (16), ``cal`` (``bins`` or ``kl``), ``explore`` (8, 0 = never),
``window`` (0 = all verified steps). Ranges: ``c``, ``dv`` finite and >= 0; ``v1``, ``n0`` finite and
> 0; ``prior`` in [0, 1]; ``kmax``, ``bins`` integers >= 1; ``explore``, ``window`` integers >= 0.
One check (:func:`check_knob`, run by :class:`Calibrated` itself) serves a spec string, the keyword
defaults of :func:`parse_policy` and a direct construction alike; a value out of range, NaN or
infinite (``c=1e400`` reads as infinity) is refused in one line.
"""
from __future__ import annotations

import bisect
import copy
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from companion.speculative.policy_base import DraftStep, Policy, RoundOutcome, _num
from companion.speculative.survival import SURVIVAL_GRID, Law, optimal_rate, pava


SCORES = ("certificate", "top1", "margin")


def greedy_rho(q1: float, q2: float) -> float:
    """Strict-greedy drafter-side certificate ``-log(1 - (sqrt q1 - sqrt q2)^2)``."""
    g = (math.sqrt(q1) - math.sqrt(q2)) ** 2
    return math.inf if g >= 1.0 else -math.log1p(-g)


def kl_scale_score(kind: str, step: DraftStep) -> float:
    """The certificate (nats) a ``cal=kl`` policy compares with the KL distribution.

    ``certificate``: ``step.rho``; ``top1``: the strict-greedy form with ``q(2)`` at its worst case
    ``min(q1, 1 - q1)``; ``margin``: ``-log(1 - m^2) / 2``, the least strict-greedy certificate
    over all ``q`` with margin ``m = q1 - q2`` (attained at ``q1 = (1 + m) / 2``, ``q2 = (1 - m) / 2``).
    """
    if kind == "certificate":
        return step.rho
    if kind == "top1":
        return greedy_rho(step.q1, min(step.q1, 1.0 - step.q1))
    m = min(max(step.q1 - step.q2, 0.0), 1.0)
    return math.inf if m >= 1.0 else -0.5 * math.log1p(-m * m)


def unit_score(kind: str, step: DraftStep) -> float:
    """The score in ``[0, 1]`` a ``cal=bins`` policy bins: ``1 - exp(-rho)``, ``q1`` or ``q1 - q2``."""
    if kind == "certificate":
        return 1.0 if math.isinf(step.rho) else -math.expm1(-step.rho)
    if kind == "top1":
        return step.q1
    return step.q1 - step.q2


@dataclass
class Calibrated(Policy):
    """The calibrated cost rule of the module docstring, driven by ``kind`` (``certificate``, ``top1``, ``margin``)."""

    kind: str = "certificate"
    c: float = 0.28
    v1: float = 1.5
    dv: float = 0.025
    kmax: int = 16
    prior: float = 0.8
    n0: float = 4.0
    bins: int = 16
    cal: str = "bins"
    explore: int = 8
    window: int = 0
    verify: tuple[float, ...] = ()   # a measured V(0), V(1), ... table instead of v1, dv (see verify_cost)
    # running state
    idle: int = field(default=0, repr=False)  # consecutive rounds that verified no draft
    explore_after: int = field(default=-1, repr=False)  # idle rounds before the next forced draft
    fresh_steps: int = field(default=0, repr=False)  # verified steps since the plan was computed
    scores: list[float] = field(default_factory=list, repr=False)  # score of every verified step (u, or the certificate for cal=kl)
    accepted: list[float] = field(default_factory=list, repr=False)  # 1.0 / 0.0 per verified step
    position_one: list[bool] = field(default_factory=list, repr=False)  # whether it was a round's first draft
    kls: list[float] = field(default_factory=list, repr=False)  # cal=kl: sorted KL(p||q) of verified steps

    REFRESH: ClassVar[int] = 8
    """The calibration tables and the plan are recomputed after this many new verified steps."""

    def __post_init__(self) -> None:
        if self.kind not in SCORES:
            raise ValueError(f"calibrated policy kind must be one of {', '.join(SCORES)}, got {self.kind!r}")
        # Every knob, however it was given (spec string, parse_policy keywords, this constructor):
        # the one validation of check_knob.
        for name in _CAL_DEFAULTS:
            try:
                setattr(self, name, check_knob(name, getattr(self, name)))
            except ValueError as err:
                raise ValueError(f"{self.kind} knob {err}") from None
        self.verify = _verify_table(self.verify)
        self._table: tuple[np.ndarray, np.ndarray] | None = None
        self._last_rate: float | None = None
        if self.explore_after < 0:
            self.explore_after = self.explore
        self._plan: tuple[float, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]] | None = None
        self._steps: list[DraftStep] = []
        self._surv: list[float] = [1.0]
        self._exploring = False

    @property
    def needs_kl(self) -> bool:  # type: ignore[override]
        return self.cal == "kl"

    @property
    def needs_certificate(self) -> bool:  # type: ignore[override]
        return self.kind == "certificate"

    # -- calibration ---------------------------------------------------------------------------
    def verify_cost(self, k: int) -> float:
        """``V(k)``: 1 for ``k = 0``; ``v1 + dv (k - 1)`` otherwise, or, with a ``verify`` table (``V(0) = 1``
        first, made non-decreasing when the policy is built: its running maximum), the table's entry, and past
        the table its last entry plus the last step (``>= 0``) per further draft, as
        :meth:`companion.speculative.CostModel.verify_cost` extrapolates."""
        if k <= 0:
            return 1.0
        t = self.verify
        if not t:
            return self.v1 + self.dv * (k - 1)
        if k < len(t):
            return t[k]
        return t[-1] + (t[-1] - t[-2] if len(t) > 1 else 0.0) * (k - len(t) + 1)

    def _score(self, step: DraftStep) -> float:
        return kl_scale_score(self.kind, step) if self.cal == "kl" else unit_score(self.kind, step)

    def _cdf(self, x: float | np.ndarray) -> float | np.ndarray:
        """``F(x)`` from the verified KLs, with ``n0`` pseudo-observations at level ``prior``."""
        kept = self.__dict__.get("_kls_array")
        if kept is None or kept[0] is not self.kls or len(kept[1]) != len(self.kls):
            kept = (self.kls, np.asarray(self.kls))   # remade whenever a KL is added (end_round)
            self._kls_array = kept
        f = np.searchsorted(kept[1], x, side="left")
        return (f + self.n0 * self.prior) / (len(self.kls) + self.n0)

    def _bin_table(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inner edges, rate per bin)``: quantile bins of the verified scores (at most ``bins``, at
        least 8 steps each), rates with ``n0`` pseudo-steps at ``prior``, made non-decreasing."""
        if self._table is None:
            u = np.asarray(self.scores[-self.window:] if self.window else self.scores, dtype=float)
            flags = np.asarray(self.accepted[-self.window:] if self.window else self.accepted, dtype=float)
            nb = max(1, min(self.bins, len(u) // 8))
            edges = np.unique(np.quantile(u, np.linspace(0, 1, nb + 1)[1:-1])) if nb > 1 else np.zeros(0)
            b = np.searchsorted(edges, u, side="right")
            n = np.bincount(b, minlength=len(edges) + 1).astype(float)
            acc = np.bincount(b, weights=flags, minlength=len(edges) + 1)
            rates = (acc + self.n0 * self.prior) / (n + self.n0)
            self._table = (edges, np.array(pava(rates.tolist(), (n + self.n0).tolist())))
        return self._table

    def _lookup(self, x: float | np.ndarray) -> float | np.ndarray:
        if self.cal == "kl":
            return self._cdf(x)
        edges, rates = self._bin_table()
        return rates[np.searchsorted(edges, x, side="right")]

    def survival(self, step: DraftStep) -> float:
        """``s_t``: predicted acceptance probability of the drafted token (see ``cal``)."""
        return float(self._lookup(self._score(step)))

    def _survival_law(self, position_one: bool) -> tuple[np.ndarray, np.ndarray]:
        """Values and weights of ``s`` over verified steps of one position class, plus ``n0`` at ``prior``."""
        return self._survival_laws()[0 if position_one else 1]

    def _survival_laws(self) -> tuple[Law, Law]:
        """The laws of ``s`` over the verified steps that were a round's first draft, and over the others
        (each plus ``n0`` pseudo-steps at ``prior``); the survival lookup is elementwise, so it is run once
        over all the steps and split."""
        last = slice(-self.window, None) if self.window else slice(None)
        first = np.asarray(self.position_one[last], dtype=bool)
        xs = np.asarray(self.scores[last], dtype=float)
        looked = np.asarray(self._lookup(xs), dtype=float).reshape(-1)
        return self._law(looked[first]), self._law(looked[~first])

    def _law(self, looked: np.ndarray) -> Law:
        vals = np.concatenate([looked, [self.prior]])
        w = np.concatenate([np.ones(len(looked)), [self.n0]])
        # at most 65 support points: s rounded to the survival grid's resolution (1/64). The grid index
        # round(64 s) is an exact integer, so bincounts over it give np.unique's sorted values and, adding
        # the weights in the input's order, its per-value sums bit for bit.
        k = np.round(vals * 64).astype(np.intp)
        present = np.bincount(k, minlength=65) > 0
        w = np.bincount(k, weights=w, minlength=65)[present]
        return np.flatnonzero(present) / 64, w / w.sum()

    def plan(self) -> tuple[float, list[np.ndarray], list[tuple[np.ndarray, np.ndarray]]]:
        """``(lam*, [W_0 .. W_kmax], survival laws)`` for the current calibration (cached until new data)."""
        if self._plan is None:
            laws = list(self._survival_laws())
            lam, tables = optimal_rate(laws, self.c, self.verify_cost, self.kmax, tol=1e-3, guess=self._last_rate)
            self._last_rate = lam
            self._plan = (lam, tables, laws)
        return self._plan

    @property
    def rate(self) -> float:
        """``lam*``: the model's optimal tokens per unit cost."""
        return self.plan()[0]

    # -- the round ---------------------------------------------------------------------------
    def start_round(self, cap: int) -> None:
        super().start_round(min(cap, self.kmax))
        self._steps = []
        self._surv = [1.0]  # S_0, S_1, ...
        self._exploring = self.explore > 0 and self.idle >= self.explore_after

    def _objective(self, k: int, i: int) -> float:
        lam = self.plan()[0]
        return sum(self._surv[1:k + 1]) - lam * (self.verify_cost(k) + self.c * i)

    def continuation(self, i: int, surv: float) -> float:
        """``E_s[S s + W_{i+1}(S s)] - lam (c + V(i+1) - V(i))`` at ``S = surv``: > 0 iff one more call pays."""
        lam, tables, laws = self.plan()
        vals, w = laws[0] if i == 0 else laws[1]
        s_next = surv * vals
        step = self.c + self.verify_cost(i + 1) - self.verify_cost(i)
        return float(((s_next + np.interp(s_next, SURVIVAL_GRID, tables[i + 1])) * w).sum() - lam * step)

    def wants_draft(self, n_drafted: int) -> bool:
        i = n_drafted
        if i >= self._cap:
            return False
        if self._exploring:
            return i == 0
        return self.continuation(i, self._surv[-1]) > 0.0

    def observe(self, step: DraftStep) -> None:
        self._steps.append(step)
        self._surv.append(self._surv[-1] * self.survival(step))

    def submit(self, n_drafted: int) -> int:
        if self._exploring:
            return n_drafted
        # _objective(k, n_drafted) for every k, the survivals summed once, left to right as sum() does
        lam = self.plan()[0]
        values, total = [], 0
        for k in range(n_drafted + 1):
            if k:
                total += self._surv[k]
            values.append(total - lam * (self.verify_cost(k) + self.c * n_drafted))
        return max(range(n_drafted + 1), key=lambda k: (values[k], k))

    def end_round(self, outcome: RoundOutcome) -> None:
        self.idle = 0 if outcome.submitted else self.idle + 1
        if self._exploring:
            self.explore_after *= 2
        elif outcome.submitted:
            self.explore_after = self.explore
        for j in range(outcome.verified):
            self.scores.append(self._score(self._steps[j]))
            self.accepted.append(1.0 if j < outcome.accepted else 0.0)
            self.position_one.append(j == 0)
            if self.cal == "kl" and j < len(outcome.kl):
                bisect.insort(self.kls, outcome.kl[j])
        self.fresh_steps += outcome.verified
        if self.fresh_steps >= self.REFRESH or self._plan is None:
            self.fresh_steps = 0
            self._table = None
            self._plan = None

    def fresh(self) -> Calibrated:
        """An independent copy (same knobs and current state): the lists of verified steps copied, the
        cached tables and plan shared (they are replaced, never changed in place)."""
        twin = copy.copy(self)
        for name in ("scores", "accepted", "position_one", "kls", "_steps", "_surv"):
            setattr(twin, name, list(getattr(self, name)))
        return twin

    def __str__(self) -> str:
        knobs = []
        for name, default in _CAL_DEFAULTS.items():
            value = getattr(self, name)
            if value != default:
                knobs.append(f"{name}={value if isinstance(value, str) else _num(value)}")
        return self.kind + (":" + ",".join(knobs) if knobs else "")


def _verify_table(table: Any) -> tuple[float, ...]:
    """A calibrated policy's ``verify`` table checked (finite numbers > 0, ``V(0) = 1``; empty: none) and made
    non-decreasing (its running maximum: a draft never looks cheaper to verify than a shorter one, the
    monotonicity the plan's search relies on)."""
    if isinstance(table, (str, bytes)) or not isinstance(table, (tuple, list)):
        raise ValueError(f"verify must be a sequence of numbers V(0) = 1, V(1), ..., got {table!r}")
    out: list[float] = []
    for k, v in enumerate(table):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"verify[{k}] must be a finite number > 0, got {v!r}")
        out.append(max(float(v), out[-1]) if out else float(v))
    if out and out[0] != 1.0:
        raise ValueError(f"verify must start with V(0) = 1, got {out[0]!r}")
    return tuple(out)


_CAL_DEFAULTS: dict[str, Any] = {
    "c": 0.28, "v1": 1.5, "dv": 0.025, "kmax": 16, "prior": 0.8, "n0": 4.0, "bins": 16, "cal": "bins",
    "explore": 8, "window": 0,
}


#: The range of each calibrated knob: ``(integer?, low, high, low excluded?)``; every bound is finite
#: or ``inf`` meaning unbounded, and a number knob must itself be finite (``1e400`` reads as ``inf``).
_KNOB_RANGES: dict[str, tuple[bool, float, float, bool]] = {
    "c": (False, 0.0, math.inf, False), "v1": (False, 0.0, math.inf, True), "dv": (False, 0.0, math.inf, False),
    "prior": (False, 0.0, 1.0, False), "n0": (False, 0.0, math.inf, True),
    "kmax": (True, 1, math.inf, False), "bins": (True, 1, math.inf, False),
    "explore": (True, 0, math.inf, False), "window": (True, 0, math.inf, False),
}


def knob_rule(name: str) -> str:
    """What knob ``name`` must be, in words (the text of :func:`check_knob`'s refusals)."""
    if name == "cal":
        return "'bins' or 'kl'"
    integer, lo, hi, lo_open = _KNOB_RANGES[name]
    if integer:
        return f"an integer >= {int(lo)}"
    upper = f"{_num(hi)}]" if math.isfinite(hi) else "inf)"
    return f"a finite number in {'(' if lo_open else '['}{_num(lo)}, {upper}"


def check_knob(name: str, value: Any) -> Any:
    """``value`` if it is a valid value of the calibrated knob ``name`` (ranges in :data:`_KNOB_RANGES`), else
    ``ValueError`` naming the knob, its range and the value. Integer knobs refuse floats and bools (``kmax=1.5``
    is a mistake, not a count); number knobs refuse bools, text, NaN and infinities."""
    if name not in _CAL_DEFAULTS:
        raise ValueError(f"{name!r} is not a knob; knobs: {', '.join(_CAL_DEFAULTS)}")
    if name == "cal":
        if value not in ("bins", "kl"):
            raise ValueError(f"cal must be {knob_rule(name)}, got {value!r}")
        return value
    integer, lo, hi, lo_open = _KNOB_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, numbers.Integral if integer else numbers.Real):
        raise ValueError(f"{name} must be {knob_rule(name)}, got {value!r}")
    x = int(value) if integer else float(value)
    if not math.isfinite(x) or not (lo < x if lo_open else lo <= x) or x > hi:
        raise ValueError(f"{name} must be {knob_rule(name)}, got {value!r}")
    return x
