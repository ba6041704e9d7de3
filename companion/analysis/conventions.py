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
