"""The log 2 ceiling of forward certificates, checked on random and adversarial targets.

For every target ``p`` and token ``y`` the drafter ``q = (p + e_y)/2`` makes ``y`` a maximiser at
forward cost ``KL(p || q) = (1 - p_y) log 2 + p_y log(2 p_y / (1 + p_y)) <= (1 - p_y) log 2``, so
every finite forward certificate of a single-token criterion satisfies

    rho*(p) = C(p, y*) <= KL(p || (p + e_{y*})/2) <= (1 - p_{y*}) log 2 <= log 2,

and ``rho*(p) = +inf`` exactly when the criterion rejects nothing. :func:`check_ceiling` asserts
each of these inequalities on every target of a sweep (it raises ``AssertionError`` naming the
criterion, vocabulary and family that break one) and returns per-criterion counts for a table.
Chapter 2 runs it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from companion.checks import check_all, check_le
from companion.certify.certificates import certificates
from companion.certify.criteria import parse_criterion
from companion.certify.targets import random_targets

LOG2 = math.log(2)


def fits(criterion, vocab: int) -> bool:
    """Whether the criterion makes sense on a vocabulary of ``vocab`` tokens (top-m needs m < V)."""
    try:
        criterion.check_vocab(vocab)
    except ValueError:
        return False
    return True


def adversarial_targets(vocab: int, gen: torch.Generator, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Families of float64 targets over ``vocab`` tokens that stress the ceiling.

    Near point masses (``p_(1) = 1 - eps``, eps from 1e-1 down to 1e-12, geometric tail), two-point
    masses from a tie to a point mass, the uniform row with jittered and Dirichlet(200) neighbours,
    and (V >= 3) rows whose boundary token has probability 1e-10.
    """
    f64 = dict(dtype=torch.float64, device=device)
    eps = torch.logspace(-1, -12, 12, **f64)
    tail = 0.5 ** torch.arange(vocab - 1, **f64)
    near_point = torch.cat([(1 - eps)[:, None], eps[:, None] * tail / tail.sum()], -1)
    a = torch.linspace(0.5, 1.0, 11, **f64)
    two_point = torch.zeros(len(a), vocab, **f64)
    two_point[:, 0], two_point[:, 1] = a, 1 - a
    jitter = 1 + 1e-9 * torch.randn(20, vocab, generator=gen, dtype=torch.float64).to(device)
    dirichlet = torch.distributions.Dirichlet(torch.full((vocab,), 200.0, **f64)).sample((20,))
    uniformish = torch.cat([torch.full((1, vocab), 1 / vocab, **f64),
                            jitter / jitter.sum(-1, keepdim=True), dirichlet])
    families = {"near point mass": near_point, "two-point": two_point, "uniform-ish": uniformish}
    if vocab >= 3:
        tiny = 1e-10
        top = torch.tensor([0.35, 0.5, 0.7, 0.95, 1 - vocab * tiny], **f64)
        rows = torch.full((len(top), vocab), tiny, **f64)
        rows[:, 0] = top
        rows[:, 1] = 1 - top - tiny * (vocab - 2)
        families["tiny boundary"] = rows
    return families


@dataclass
class CeilingStats:
    """Per criterion spec: targets seen, finite and infinite certificates, the largest finite one."""

    targets: dict[str, int] = field(default_factory=dict)
    finite: dict[str, int] = field(default_factory=dict)
    infinite: dict[str, int] = field(default_factory=dict)
    largest: dict[str, float] = field(default_factory=dict)
    # (spec, V) -> whether the exactly uniform row has rho* = +inf
    uniform_inf: dict[tuple[str, int], bool] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.targets.values())

    def add(self, spec: str, rho: torch.Tensor, nonempty: torch.Tensor) -> None:
        self.targets[spec] = self.targets.get(spec, 0) + len(rho)
        self.finite[spec] = self.finite.get(spec, 0) + int(nonempty.sum())
        self.infinite[spec] = self.infinite.get(spec, 0) + int((~nonempty).sum())
        top = float(rho[nonempty].max()) if bool(nonempty.any()) else 0.0
        self.largest[spec] = max(self.largest.get(spec, 0.0), top)


def _check_family(c, rho: torch.Tensor, targets: torch.Tensor, ties: str, what: str) -> torch.Tensor:
    """Assert the ceiling's inequalities for one criterion on one family; return the non-empty mask."""
    rejected = c.rejection_mask(targets, ties=ties)   # the certificates' own tie-break
    nonempty = rejected.any(-1)
    check_all(torch.isfinite(rho) == nonempty,
              f"{what}: certificate finite exactly where something is rejected (values: rho*)", rho)
    boundary = torch.where(rejected, targets, torch.full_like(targets, -1.0)).amax(-1)[nonempty]
    mixture_kl = (1 - boundary) * LOG2 + torch.special.xlogy(boundary, 2 * boundary / (1 + boundary))
    check_le(rho[nonempty], mixture_kl, f"{what}: rho* <= KL(p || (p + e_y*)/2)", rtol=1e-12, atol=1e-15)
    check_le(mixture_kl, (1 - boundary) * LOG2, f"{what}: KL(p || (p + e_y*)/2) <= (1 - p_y*) log 2",
             rtol=1e-15, atol=1e-16)
    check_le(rho[nonempty], torch.full_like(boundary, LOG2), f"{what}: rho* <= log 2", rtol=1e-12)
    if str(c).startswith("additive:"):
        # additive rejects nothing once p(1) <= delta (a token at the threshold 0 is accepted)
        flat = targets.amax(-1) <= c.delta
        check_all(torch.isinf(rho[flat]), f"{what}: +inf (nothing rejected) where p(1) <= delta", rho[flat])
    limit = c.index_rank_limit()
    if limit is not None and limit < targets.shape[-1] and ties == "worst":
        # a rank rule (m < V) always rejects the token at the (m+1)-th place: rho* finite
        check_all(torch.isfinite(rho), f"{what}: rank rule, rho* finite on every row", rho)
    return nonempty


def check_ceiling(specs: list[str], vocabs: list[int], n_random: int, seed: int, ties: str,
                  device: str = "cpu") -> CeilingStats:
    """Forward certificates of ``specs`` on random targets (``n_random`` per vocabulary size, with
    exact and near ties) and on :func:`adversarial_targets`; assert the ceiling on each, and that
    the exactly uniform row is ``+inf`` exactly when no rank condition binds (``ties="worst"``)."""
    gen = torch.Generator().manual_seed(seed + 2)
    crits = [parse_criterion(s) for s in specs]
    stats = CeilingStats()
    for v in vocabs:
        rows = np.stack(random_targets(n_random, seed=seed + v, v_min=v, v_max=v))
        families = {"random": torch.tensor(rows, dtype=torch.float64, device=device)}
        families.update(adversarial_targets(v, gen, device))
        for family, targets in families.items():
            crits_v = [c for c in crits if fits(c, v)]
            fwd = certificates(targets, crits_v, ("forward",))
            for c in crits_v:
                rho = fwd[(str(c), "forward")]
                nonempty = _check_family(c, rho, targets, ties, f"{c}, V={v}, {family}")
                if family == "uniform-ish":
                    stats.uniform_inf[(str(c), v)] = bool(torch.isinf(rho[0]))   # row 0: uniform
                stats.add(str(c), rho, nonempty)
    if ties == "worst":
        for (spec, v), inf in stats.uniform_inf.items():
            limit = parse_criterion(spec).index_rank_limit()
            binds = limit is not None and limit < v
            assert inf == (not binds), \
                f"{spec}, V={v}: uniform row rho* = +inf is {inf}, expected {not binds}"
    return stats


def uniform_always_infinite(stats: CeilingStats, specs: list[str]) -> list[str]:
    """The specs whose certificate is ``+inf`` on the exactly uniform row at every size they fit."""
    return [s for s in specs
            if all(inf for (spec, _), inf in stats.uniform_inf.items() if spec == s)]
