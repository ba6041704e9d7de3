"""Two conventions for ties, side by side: the paper's (exact ties only) and the kernel paths' one.

A harvest stores every criterion's certificate under both (``cert_*`` and ``path_cert_*``,
:mod:`companion.harvest.schema`). Under the kernel-path convention two logits whose gap lies within
:func:`companion.harvest.ties.tie_band` of the model's dtype count as tied, so a certificate there is
never larger. Traces harvested before the kernel-path columns existed still allow strict greedy's:
its rejection region under the band is that of the exact rule unless the top-2 gap is within the
band, where the certificate is 0 (:func:`kernel_path_greedy`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from companion.analysis.traces import Traces, quantile
from companion.harvest.schema import column
from companion.harvest.ties import near_ties

#: Relative room when comparing the two conventions' certificates (a few float64 ulps, convention_rows).
ULP_ROOM = 1e-15


def kernel_path_greedy(cert: np.ndarray, z1: np.ndarray, gap: np.ndarray, dtype: str) -> np.ndarray:
    """Strict greedy's certificate under kernel paths from its exact-ties one: 0 where the top-2
    logit gap is a near tie of ``dtype``, unchanged elsewhere (the band moves the threshold
    ``p(2)`` to ``p(2) e^b``, which changes the rejection region only when ``p(1)`` falls below it)."""
    return np.where(near_ties(z1, gap, dtype), 0.0, np.asarray(cert, dtype=np.float64))


@dataclass(frozen=True)
class ConventionRow:
    """One criterion's forward certificate under both conventions over a run's steps."""

    criterion: str
    median_exact: float
    median_paths: float
    p5_exact: float
    p5_paths: float
    lowered: int  # steps whose certificate is smaller under kernel paths
    steps: int


def convention_rows(traces: Traces, criteria: list[str], dtype: str) -> list[ConventionRow]:
    """Per criterion, the forward certificate's median and 5th percentile under exact ties and under
    kernel paths, and how many steps the band lowers; then, labelled ``tree:m``, every tree width the
    harvest stored under both (``path_tree_cert_fwd``). Criteria other than strict greedy need the
    harvest's ``path_cert_fwd`` columns; without them they are left out."""
    pairs = []
    for c in criteria:
        exact = traces.cert(c)
        if traces.has(column("path_cert", c, "forward")):
            pairs.append((c, exact, traces.column(column("path_cert", c, "forward"))))
        elif c == "greedy":
            pairs.append((c, exact, kernel_path_greedy(exact, traces.column("logit_top1"), traces.column("logit_gap"),
                                                       dtype)))
    for m in traces.tree_widths:
        if traces.has(column("path_tree_cert", m, "forward")):
            pairs.append((f"tree:{m}", traces.column(column("tree_cert", m, "forward")),
                          traces.column(column("path_tree_cert", m, "forward"))))
    rows = []
    for c, exact, paths in pairs:
        # A relative ulp of room: the committed full profile's tree columns were harvested before the engine
        # took the smaller of the two on exact ties (the same pool summed in two orders: 89 rows of tree:8
        # exceed it by at most 2.5e-16 relative); anything more is a kernel-path certificate above the other.
        if bool(np.any(paths > exact * (1 + ULP_ROOM))):
            raise ValueError(f"{c}: a kernel-path certificate above the exact-ties one")
        rows.append(ConventionRow(c, quantile(exact, 0.5), quantile(paths, 0.5), quantile(exact, 0.05),
                                  quantile(paths, 0.05), int(np.sum(paths < exact * (1 - ULP_ROOM))), len(exact)))
    return rows


def near_tie_count(traces: Traces, dtype: str) -> int:
    """Steps whose target top-2 logit gap is within the band of ``dtype`` (exact ties included)."""
    return int(near_ties(traces.column("logit_top1"), traces.column("logit_gap"), dtype).sum())


def kernel_path_values(traces: Traces, col: str, dtype: str) -> np.ndarray | None:
    """A statistic column's per-step values under the kernel-path convention.

    ``cert_fwd[c]``: the stored ``path_cert_fwd[c]`` (strict greedy's from its top-2 logits,
    :func:`kernel_path_greedy`, when the harvest predates those columns); ``tree_cert_fwd[m]``: the
    stored ``path_tree_cert_fwd[m]``; a column that is not a certificate (top-1 probability, top-10
    mass) is the same under both conventions. None: the harvest holds no kernel-path value for it.
    """
    if col.startswith("cert_fwd[") or col.startswith("tree_cert_fwd["):
        path_col = "path_" + col
        if traces.has(path_col):
            return traces.column(path_col)
        if col == column("cert", "greedy", "forward"):
            return kernel_path_greedy(traces.column(col), traces.column("logit_top1"), traces.column("logit_gap"),
                                      dtype)
        return None
    return traces.column(col)


@dataclass(frozen=True)
class Lowering:
    """Where the kernel-path convention lowers one criterion's certificate: on near ties of the top two
    logits, and elsewhere; and by how much elsewhere (``1 - paths / exact``, relative)."""

    criterion: str
    on_near_ties: int
    elsewhere: int
    largest_drop_elsewhere: float  # 0 when nothing is lowered elsewhere
    median_drop_elsewhere: float


def lowering(traces: Traces, criterion: str, dtype: str) -> Lowering | None:
    """:class:`Lowering` of ``criterion`` (a criterion spec or ``tree:m``); None without kernel-path values.

    A criterion that compares two probabilities (``multiplicative``: ``p(x) >= alpha p(1)``; a tree:
    the ``m``-th against the ``m+1``-th) has that comparison moved by the band's factor on every step,
    so its certificate can drop a little on steps that are not near ties of the top two; strict
    greedy's drops only on near ties (:func:`kernel_path_greedy`).
    """
    col = (column("tree_cert", int(criterion[5:]), "forward") if criterion.startswith("tree:")
           else column("cert", criterion, "forward"))
    paths = kernel_path_values(traces, col, dtype)
    if paths is None:
        return None
    exact = traces.column(col) if traces.has(col) else traces.tree_cert(int(criterion[5:]))
    low = paths < exact * (1 - ULP_ROOM)
    near = near_ties(traces.column("logit_top1"), traces.column("logit_gap"), dtype)
    off = low & ~near
    with np.errstate(divide="ignore", invalid="ignore"):
        drop = np.where(np.isfinite(exact) & (exact > 0), 1 - paths / exact, 1.0)[off]
    return Lowering(criterion, int(np.sum(low & near)), int(np.sum(off)),
                    float(drop.max()) if drop.size else 0.0, quantile(drop, 0.5) if drop.size else 0.0)


def zero_share(x: np.ndarray) -> float:
    """The share of steps whose certificate is exactly 0 (no drafter is guaranteed there)."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.mean(x == 0.0)) if x.size else float("nan")
