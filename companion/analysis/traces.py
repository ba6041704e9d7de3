"""Analysis of harvested traces: every number and curve of the experiment chapters (7 and 8).

A harvest (:mod:`companion.harvest`) stores one row per decoding step. Here a *trajectory* is
one prompt's rows (steps ``t = 0 .. T_i - 1`` along the target's greedy continuation), ``p_t``
and ``q_t`` are the target's and the drafter's next-token distributions at step ``t``,
``rho_c(t)`` is criterion ``c``'s exact certificate (``cert_fwd[c]``, in ``KL(p||q)``) and
``kl(t) = KL(p_t || q_t)``. Every function below states the formula it computes; all of them
are plain numpy on the trace columns (plus :mod:`companion.certify.runs` for run lengths and the
certificate engine for tree certificates of widths the harvest did not store).

**Definitions used by the chapters.**

*Summary statistics* (:func:`summarize_values`). For a column ``x_1..x_N``: the mean over the
steps where ``x`` is finite (a certificate is ``+inf`` when the criterion rejects nothing, e.g.
``additive:0.3`` whenever ``p(1) <= 0.3``; the share of such steps is reported beside it), and
the median and 5th percentile as order statistics over *all* steps,
``Q(a) = x_(ceil(a N))`` (``numpy.quantile(..., method="inverted_cdf")``), which are well
defined with infinite values.

*Margin bins* (:func:`margin_bin_edges`, :func:`bin_index`). Edges are quantiles of the target
margin ``p(1) - p(2)`` (equal-count bins; repeated edges merged); bin ``b`` holds the steps with
``e_b <= margin < e_{b+1}`` (the last bin also holds ``margin = e_B``).

*Certified fraction at a KL budget* ``eps`` (:func:`certified_fraction_by_bin`): the share of a
bin's steps with ``rho_c(t) > eps``, i.e. the steps whose draft is guaranteed to be accepted by
every drafter whose per-step ``KL(p||q)`` is at most ``eps``.

*Certified run length* (:func:`mean_run_length`): with a per-step budget ``eps``, the run from
step ``t`` of trajectory ``i`` is ``run_t = min{f >= t : rho_c(f) <= eps} - t`` (``f = T_i`` when
none: runs are cut at the trajectory's end), the number of consecutive tokens guaranteed to be
accepted from ``t``; the curve is its mean over every step of every trajectory
(:func:`companion.certify.runs.certified_run_lengths`).

*Acceptance, certification, soundness, tightness* (:func:`acceptance_table`,
:func:`soundness`, :func:`tightness_by_bin`). ``accepted_c(t)``: a decoder accepts the
drafter's greedy token ``d_t`` under ``c``: ``p_t(d_t) >= tau_c(p_t)`` and, for the rank
conditions (greedy, top-m, top-k-delta), ``draft_rank <= m`` with exact ties going to the lowest
id, as ``argmax`` breaks them (:meth:`~companion.certify.criteria.Criterion.decoder_accepts`).
``certified_c(t)``: ``kl(t) < rho_c(t)``, the certificates being the worst case over tie-breaks. Soundness: no step has ``certified_c(t)`` and not ``accepted_c(t)``.
Tightness: the share of accepted steps that are certified,
``#{t : certified_c(t) and accepted_c(t)} / #{t : accepted_c(t)}`` (per margin bin or overall);
1 means the certificate explains every acceptance, 0 none.

*Tree coverage* (:func:`tree_coverage`). A greedy tree of width ``m`` drafts the drafter's top
``m`` tokens; it covers step ``t`` when the target's greedy token ``g_t`` (first index wins) is
among them, exact ties in the drafter going to the lowest id (``token_rank_in_draft <= m``), and
the step is tree-certified when ``kl(t) < rho_tree,m(t)`` (worst case over tie-breaks, so
certified implies covered). Widths the harvest did not store get their certificate from the
stored top-64 target probabilities (the worst-case tree certificate only depends on ``p(1..m+1)``).

*Accepted length per round* (:func:`accepted_length_per_round`). A round drafts ``K`` tokens
greedily and the verifier keeps the longest accepted prefix. Along the trajectories of the
harvest (the target's greedy path, on which the drafter was run teacher-forced), a round
starting at step ``t`` of trajectory ``i`` accepts

    A_c(t; K) = min(K, T_i - t, max{l >= 0 : accepted_c(t) = ... = accepted_c(t+l-1) = True})

draft tokens (the *measured* length), and the certificates *predict*

    C_c(t; K) = the same with certified_c in place of accepted_c,

i.e. the prediction with a per-step KL budget equal to the drafter's own measured ``kl(t)``.
Soundness makes it a guaranteed lower bound, ``C_c(t; K) <= A_c(t; K)`` at every ``t``. A
second prediction uses one number for the drafter, a scalar budget ``eps`` (by default the
median of its per-step ``kl``): ``B_c(t; K, eps)`` counts steps with ``rho_c > eps``. It needs
only the target's certificates and a summary of the drafter, and is *not* a bound (steps with
``kl > eps`` can be counted). Each is averaged over every start ``t`` of every trajectory (a
round starting at a uniformly random step); the token the target adds after each round is not
counted. For strict greedy the harvest's path is exactly the path speculative decoding
follows; a relaxed criterion that accepts ``d_t != g_t`` would continue from ``d_t`` in a real
run, so for relaxed criteria these are per-step acceptances chained along the target's greedy
path, the same trajectories on which the certificates are computed.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from companion.certify.costs import tree_cost
from companion.certify.criteria import parse_criterion
from companion.harvest.schema import column as column_name
from companion.harvest.schema import short_divergence
from companion.certify.runs import certified_run_lengths, run_lengths
from companion.certify.summary import TopSummary

__all__ = [
    "AcceptanceRow",
    "BinnedCurves",
    "EPS_GRID",
    "Enlargement",
    "REGIME_QUANTILES",
    "RoundLengths",
    "SoundnessReport",
    "Summary",
    "SummaryRow",
    "Traces",
    "TreeCoverage",
    "accepted_length_per_round",
    "acceptance_table",
    "bin_index",
    "certified_fraction_by_bin",
    "enlargement_by_bin",
    "fraction_by_bin",
    "markdown_table",
    "margin_bin_edges",
    "mean_run_length",
    "median_by_bin",
    "quantile",
    "regime_table",
    "round_lengths",
    "run_length_curves",
    "soundness",
    "summarize_values",
    "summary_markdown",
    "target_summary",
    "thresholds_from_top",
    "tightness_by_bin",
    "tree_certificates_from_top",
    "tree_coverage",
]

EPS_GRID: np.ndarray = np.logspace(-3, 0, 25)
"""Per-step KL budgets (nats) of the run-length curves: 1e-3 to 1, log-spaced."""


# ---------------------------------------------------------------------------------------------
# Traces


class Traces:
    """A harvest's rows with numpy access by column, trajectories and the criteria present.

    ``table`` is what :func:`companion.harvest.load_traces` returns (or any table with the
    columns a function needs: tests build small synthetic ones). Rows of a trajectory must be
    contiguous and ordered by ``step`` from 0, as the harvest writes them (checked).
    """

    def __init__(self, table: pa.Table, manifest: Mapping[str, Any] | None = None) -> None:
        self.table = table
        self.manifest = dict(manifest) if manifest is not None else None
        self._cache: dict[str, np.ndarray] = {}
        #: The kernel-path band per step (logit units) that tree certificates computed from the
        #: stored top-k apply (:meth:`tree_cert`); set by :meth:`under_kernel_paths`, else None.
        self.tree_band: np.ndarray | None = None
        names = table.column_names
        self.criteria: list[str] = [n[len("cert_fwd["):-1] for n in names if n.startswith("cert_fwd[")]
        self.tree_widths: list[int] = [int(n[len("tree_cert_fwd["):-1]) for n in names if n.startswith("tree_cert_fwd[")]
        self.has_drafter: bool = "kl_fwd" in names
        if "prompt_id" in names and "step" in names:
            self._index_trajectories()
        else:  # one trajectory holding every row
            self.starts = np.array([0], dtype=np.int64)
            self.lengths = np.array([table.num_rows], dtype=np.int64)

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any], manifest: Mapping[str, Any] | None = None) -> "Traces":
        """Traces from plain arrays (``{"prompt_id": [...], "step": [...], "cert_fwd[greedy]": [...]}``)."""
        return cls(pa.table({k: (v if isinstance(v, pa.Array) else pa.array(list(v) if isinstance(v, np.ndarray) and v.ndim > 1 else v))
                             for k, v in columns.items()}), manifest)

    def _index_trajectories(self) -> None:
        ids = self.table.column("prompt_id").to_pylist()
        step = self.column("step").astype(np.int64)
        n = len(ids)
        if n == 0:
            self.starts = np.zeros(0, dtype=np.int64)
            self.lengths = np.zeros(0, dtype=np.int64)
            return
        change = np.ones(n, dtype=bool)
        change[1:] = [a != b for a, b in zip(ids[1:], ids[:-1])]
        starts = np.flatnonzero(change)
        if len({ids[s] for s in starts}) != len(starts):
            raise ValueError("the rows of a prompt are not contiguous")
        lengths = np.diff(np.append(starts, n))
        expected = np.arange(n) - np.repeat(starts, lengths)
        if not np.array_equal(step, expected):
            raise ValueError("steps of a prompt must run 0, 1, 2, ... in row order")
        self.starts = starts.astype(np.int64)
        self.lengths = lengths.astype(np.int64)

    @property
    def n_rows(self) -> int:
        """The number of rows (decoding steps) in the traces."""
        return self.table.num_rows

    @property
    def n_trajectories(self) -> int:
        """The number of trajectories (decoded answers) in the traces."""
        return len(self.lengths)

    def column(self, name: str) -> np.ndarray:
        """A column as a numpy array (cached): ``[N]``, or ``[N, k]`` for a list column such as ``top_probs``."""
        if name not in self._cache:
            if name not in self.table.column_names:
                raise KeyError(f"the traces have no column {name!r}")
            col = self.table.column(name)
            if pa.types.is_list(col.type) or pa.types.is_fixed_size_list(col.type) or pa.types.is_large_list(col.type):
                flat = col.combine_chunks()
                values = flat.flatten().to_numpy(zero_copy_only=False)
                self._cache[name] = values.reshape(self.n_rows, -1) if self.n_rows else values.reshape(0, 0)
            else:
                self._cache[name] = np.asarray(col.to_numpy())
        return self._cache[name]

    def has(self, name: str) -> bool:
        """Whether the traces hold a column named ``name``."""
        return name in self.table.column_names

    def padded(self, values: np.ndarray, fill: float) -> np.ndarray:
        """``values`` (one per row) as ``[trajectories, max length]``, ``fill`` past each trajectory's end."""
        values = np.asarray(values)
        t_max = int(self.lengths.max()) if len(self.lengths) else 0
        out = np.full((len(self.lengths), t_max), fill, dtype=np.result_type(values.dtype, np.asarray(fill).dtype))
        mask = self.valid_mask()
        out[mask] = values
        return out

    def valid_mask(self) -> np.ndarray:
        """``[trajectories, max length]``: True on the positions that are steps."""
        t_max = int(self.lengths.max()) if len(self.lengths) else 0
        return np.arange(t_max)[None, :] < self.lengths[:, None]

    def under_kernel_paths(self) -> "Traces":
        """These traces with every criterion's certificate and certified columns taken from the
        kernel-path convention (``path_cert_*``, ``path_certified_*``: near ties of the model's dtype
        count as ties), so that every function reading ``cert_*``/``certified_*`` reports that
        convention. Tree columns are swapped too where the harvest stored their kernel-path versions
        (``path_tree_cert_*``: every token within the band must be in the drafter's top ``m``); a
        harvest made before those existed keeps its exact-ties tree columns. Raises ``KeyError`` when
        the traces were harvested without the kernel-path columns (before they existed)."""
        names = self.table.column_names
        stems = ("cert_fwd[", "cert_rev[", "certified_fwd[", "certified_rev[")
        trees = any(n.startswith("path_tree_cert_") for n in names)
        if trees:
            stems += ("tree_cert_fwd[", "tree_cert_rev[", "tree_certified_fwd[", "tree_certified_rev[")
        swapped = [n for n in names if n.startswith(stems)]
        missing = [n for n in swapped if "path_" + n not in names]
        if missing:
            raise KeyError(f"the traces have no kernel-path column for {', '.join(missing[:3])}"
                           f"{' ...' if len(missing) > 3 else ''}: harvest them again with this version")
        keep = [n for n in names if not n.startswith("path_")]
        table = pa.table({n: self.table.column("path_" + n if n in swapped else n) for n in keep})
        out = Traces(table, self.manifest)
        dtype = self._logits_dtype()
        if trees and dtype is not None and "logit_top1" in names:
            # widths the harvest did not store are computed from the top-k under the same band
            from companion.harvest.ties import tie_band

            out.tree_band = np.asarray(tie_band(self.column("logit_top1"), dtype), dtype=np.float64)
        return out

    def _logits_dtype(self) -> str | None:
        """The dtype the target computed its logits in, as the manifest records it (None: unknown)."""
        m = self.manifest or {}
        dtype = (m.get("config") or {}).get("dtype") or m.get("dtype")
        return str(dtype) if dtype else None

    def has_kernel_paths(self) -> bool:
        """Whether :meth:`under_kernel_paths` can be used (the harvest stored the kernel-path columns)."""
        return any(n.startswith("path_cert_fwd[") for n in self.table.column_names)

    # convenience ------------------------------------------------------------------------------
    def cert(self, criterion: str, divergence: str = "forward") -> np.ndarray:
        """The certificate column of ``criterion`` in ``divergence``, one value per step."""
        return self.column(column_name("cert", criterion, divergence))

    def kl(self, divergence: str = "forward") -> np.ndarray:
        """The per-step KL column in ``divergence`` (``kl_fwd`` or ``kl_rev``), one value per step."""
        return self.column(f"kl_{short_divergence(divergence)}")

    def tree_cert(self, m: int, divergence: str = "forward") -> np.ndarray:
        """``rho_tree,m`` per step: the stored column, else from ``top_probs`` (:func:`tree_certificates_from_top`,
        under :attr:`tree_band` when set, so that every width follows the same tie convention)."""
        name = column_name("tree_cert", m, divergence)
        if self.has(name):
            return self.column(name)
        key = f"_computed:{name}"
        if key not in self._cache:
            tail = self.column("top_tail") if self.has("top_tail") else None
            self._cache[key] = tree_certificates_from_top(self.column("top_probs"), m, divergence, tail=tail,
                                                          band=self.tree_band)
        return self._cache[key]


# ---------------------------------------------------------------------------------------------
# Summary statistics


def quantile(x: np.ndarray, q: float) -> float:
    """The order statistic ``x_(ceil(q N))`` (1-based; ``x_(1)`` for ``q = 0``): well defined with ``inf``."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return math.nan
    if np.isnan(x).any():
        raise ValueError("quantile of data with NaN")
    return float(np.quantile(x, q, method="inverted_cdf"))


@dataclass(frozen=True)
class Summary:
    """Mean over finite values, median and 5th percentile over all values, counts."""

    mean: float
    median: float
    p5: float
    n: int
    n_infinite: int

    @property
    def infinite_share(self) -> float:
        """The share of infinite values, ``n_infinite / n`` (NaN when empty)."""
        return self.n_infinite / self.n if self.n else math.nan


def summarize_values(x: np.ndarray) -> Summary:
    """``Summary(mean of finite x, Q(0.5), Q(0.05), N, #{x = +inf})`` with ``Q`` as in :func:`quantile`."""
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    mean = float(x[finite].mean()) if finite.any() else math.nan
    return Summary(mean, quantile(x, 0.5), quantile(x, 0.05), int(x.size), int(np.count_nonzero(np.isposinf(x))))


@dataclass(frozen=True)
class SummaryRow:
    """One row of the target-side table: what, from which column, its summary, its ceiling if any."""

    label: str
    column: str
    summary: Summary
    ceiling: float | None = None


def target_summary(traces: Traces, criteria: Sequence[str] | None = None, tree_widths: Sequence[int] = (2, 4, 8),
                   divergence: str = "forward") -> list[SummaryRow]:
    """The paper's table: ``p(1)``, top-10 mass, each criterion's certificate, tree certificates.

    Tree rows carry their ceiling ``log(m + 1)``, the supremum of the width-``m`` certificate
    (approached as ``p(1) -> 1``).
    """
    rows = [SummaryRow("target top-1 probability $p_{(1)}$", "p_top1", summarize_values(traces.column("p_top1"))),
            SummaryRow("target top-10 mass", "top10_mass", summarize_values(traces.column("top10_mass")))]
    for c in (traces.criteria if criteria is None else criteria):
        col = column_name("cert", c, divergence)
        rows.append(SummaryRow(f"certificate `{c}`", col, summarize_values(traces.column(col))))
    for m in tree_widths:
        rows.append(SummaryRow(f"tree certificate, $m = {m}$", column_name("tree_cert", m, divergence),
                               summarize_values(traces.tree_cert(m, divergence)), math.log(m + 1)))
    return rows


def _fmt(v: float, spec: str = ".4g") -> str:
    if v is None:
        return ""
    if isinstance(v, float) and math.isnan(v):
        return "n/a"
    if isinstance(v, float) and math.isinf(v):
        return "$+\\infty$" if v > 0 else "$-\\infty$"
    return format(v, spec)


REGIME_QUANTILES: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)


def regime_table(traces: Traces, qs: Sequence[float] = REGIME_QUANTILES) -> list[tuple[str, list[float]]]:
    """The target's regime on its own greedy steps: quantiles ``Q(q)`` (as :func:`quantile`) of its
    top-1 probability, top-10 mass and strict-greedy certificate (forward, nats), and the mean.

    A chat LLM decoding greedily is near-certain on most steps; these rows say how confident
    the target of a run is, which decides how large its certificates can be.
    """
    rows = []
    for label, values in (("top-1 probability $p_{(1)}$", traces.column("p_top1")),
                          ("top-10 mass", traces.column("top10_mass")),
                          ("strict-greedy certificate $\\rho^*$ (nats)", traces.cert("greedy"))):
        v = np.asarray(values, dtype=np.float64)
        finite = v[np.isfinite(v)]
        rows.append((label, [quantile(v, q) for q in qs] + [float(finite.mean()) if finite.size else math.nan]))
    return rows


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], spec: str = ".4g") -> str:
    """A Markdown table; floats formatted with ``spec`` (``inf`` as ``+\\infty``, NaN as n/a)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in rows:
        cells = [_fmt(v, spec) if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary_markdown(rows: Sequence[SummaryRow]) -> str:
    """:func:`target_summary` as Markdown: mean (finite), median, 5th percentile, share ``+inf``, ceiling."""
    return markdown_table(
        ["quantity", "mean (finite steps)", "median", "5th percentile", "share $+\\infty$", "ceiling $\\log(m+1)$"],
        [[r.label, r.summary.mean, r.summary.median, r.summary.p5, f"{r.summary.infinite_share:.1%}",
          "" if r.ceiling is None else f"{r.ceiling:.4g}"] for r in rows])


# ---------------------------------------------------------------------------------------------
# Margin bins


def margin_bin_edges(margin: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-count bin edges: the quantiles ``Q(b / n_bins)``, ``b = 0..n_bins`` (``Q(0)`` = min), repeats merged."""
    if n_bins < 1:
        raise ValueError("n_bins must be >= 1")
    margin = np.asarray(margin, dtype=np.float64)
    if margin.size == 0:
        raise ValueError("no steps to bin")
    edges = np.array([quantile(margin, b / n_bins) for b in range(n_bins + 1)])
    edges[0], edges[-1] = margin.min(), margin.max()
    return np.unique(edges)


def bin_index(x: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bin of each value: ``b`` with ``e_b <= x < e_{b+1}``; the last bin is closed; values outside go to the end bins."""
    n_bins = max(len(edges) - 1, 1)
    return np.clip(np.searchsorted(edges, np.asarray(x, dtype=np.float64), side="right") - 1, 0, n_bins - 1)


def fraction_by_bin(flags: np.ndarray, bins: np.ndarray, n_bins: int, where: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(fraction, count)`` per bin: ``#{t in b : where_t and flags_t} / #{t in b : where_t}`` (NaN if 0)."""
    flags = np.asarray(flags, dtype=bool)
    sel = np.ones_like(flags) if where is None else np.asarray(where, dtype=bool)
    count = np.bincount(bins[sel], minlength=n_bins).astype(np.int64)
    hits = np.bincount(bins[sel & flags], minlength=n_bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(count > 0, hits / np.maximum(count, 1), np.nan)
    return frac, count


def median_by_bin(values: np.ndarray, bins: np.ndarray, n_bins: int) -> np.ndarray:
    """Median (order statistic ``Q(0.5)``) of ``values`` in each bin (NaN if empty)."""
    values = np.asarray(values, dtype=np.float64)
    return np.array([quantile(values[bins == b], 0.5) if np.any(bins == b) else math.nan for b in range(n_bins)])


@dataclass(frozen=True)
class BinnedCurves:
    """Curves over margin bins: ``values[label]`` has shape ``[..., n_bins]``."""

    edges: np.ndarray
    counts: np.ndarray  # steps per bin (the denominators' population, before any ``where``)
    centers: np.ndarray  # median margin of each bin
    values: dict[str, np.ndarray] = field(default_factory=dict)
    eps: np.ndarray | None = None  # budgets along the first axis, when there is one

    @property
    def n_bins(self) -> int:
        """The number of margin bins, ``len(edges) - 1``."""
        return len(self.edges) - 1


def _bins(margin: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_bins = len(edges) - 1
    b = bin_index(margin, edges)
    counts = np.bincount(b, minlength=n_bins)
    return b, counts, median_by_bin(margin, b, n_bins)


def certified_fraction_by_bin(margin: np.ndarray, certs: Mapping[str, np.ndarray], eps: Sequence[float],
                              edges: np.ndarray) -> BinnedCurves:
    """``values[label][e, b] = #{t in b : rho_label(t) > eps_e} / #{t in b}``."""
    b, counts, centers = _bins(margin, edges)
    n_bins = len(edges) - 1
    eps_arr = np.asarray(eps, dtype=np.float64)
    values = {label: np.stack([fraction_by_bin(np.asarray(c) > e, b, n_bins)[0] for e in eps_arr])
              for label, c in certs.items()}
    return BinnedCurves(edges, counts, centers, values, eps_arr)


def tightness_by_bin(traces: Traces, edges: np.ndarray, criteria: Sequence[str] | None = None,
                     divergence: str = "forward") -> BinnedCurves:
    """``values[c][b] = #{t in b : certified_c and accepted_c} / #{t in b : accepted_c}``.

    ``certified_c(t) = kl(t) < rho_c(t)`` recomputed from the columns (see :func:`soundness`).
    ``counts`` are all steps per bin; ``values["accepted:" + c]`` holds the accepted counts.
    """
    margin = traces.column("margin")
    b, counts, centers = _bins(margin, edges)
    n_bins = len(edges) - 1
    kl = traces.kl(divergence)
    values: dict[str, np.ndarray] = {}
    for c in (traces.criteria if criteria is None else criteria):
        acc = traces.column(column_name("accepted", c)).astype(bool)
        cert = kl < traces.cert(c, divergence)
        frac, n_acc = fraction_by_bin(cert, b, n_bins, where=acc)
        values[c] = frac
        values[f"accepted:{c}"] = n_acc
    return BinnedCurves(edges, counts, centers, values)


@dataclass(frozen=True)
class Enlargement:
    """How much each criterion or tree enlarges strict greedy's certified region, per margin bin."""

    edges: np.ndarray
    counts: np.ndarray
    centers: np.ndarray
    eps: np.ndarray
    gain: dict[str, np.ndarray]  # [E, n_bins]: certified share of the label minus strict greedy's
    median_ratio: dict[str, np.ndarray]  # [n_bins]: median of rho_label / rho_greedy over steps with rho_greedy > 0
    vacuous: dict[str, np.ndarray] = field(default_factory=dict)  # [n_bins]: share with rho_label = +inf

    def real_gain(self, label: str) -> np.ndarray:
        """``gain`` without the vacuous part: steps where the label rejects nothing (``rho = +inf``)
        are "certified" at every budget, whatever the drafter, and say nothing about it."""
        return self.gain[label] - self.vacuous[label][None, :]


def enlargement_by_bin(traces: Traces, edges: np.ndarray, eps: Sequence[float], criteria: Sequence[str] | None = None,
                       tree_widths: Sequence[int] = (2, 4, 8), divergence: str = "forward") -> Enlargement:
    """Per margin bin ``b`` and budget ``eps``: ``gain = share(rho_c > eps) - share(rho_greedy > eps)``, and
    ``median_ratio = Q(0.5)`` of ``rho_c / rho_greedy`` over the bin's steps with ``rho_greedy > 0``.

    ``vacuous``: the share of the bin's steps where the criterion rejects nothing (``rho_c =
    +inf``); they count as certified at every budget, so :meth:`Enlargement.real_gain` takes them
    out (strict greedy always rejects something unless every token ties for the top).

    ``rho_greedy`` is the strict greedy certificate, which equals the width-1 tree certificate
    (taken from whichever the traces have). The abstract's claim, "relaxed and tree criteria
    enlarge the certified region most where the margin is small", reads: gain and ratio are
    larger in the low-margin bins than in the high-margin ones.
    """
    margin = traces.column("margin")
    b, counts, centers = _bins(margin, edges)
    n_bins = len(edges) - 1
    greedy = traces.cert("greedy", divergence) if "greedy" in traces.criteria else traces.tree_cert(1, divergence)
    labels = {c: traces.cert(c, divergence) for c in (traces.criteria if criteria is None else criteria) if c != "greedy"}
    labels |= {f"tree:{m}": traces.tree_cert(m, divergence) for m in tree_widths if m != 1}
    eps_arr = np.asarray(eps, dtype=np.float64)
    base = np.stack([fraction_by_bin(greedy > e, b, n_bins)[0] for e in eps_arr])
    positive = greedy > 0
    gain, ratio, vacuous = {}, {}, {}
    for label, rho in labels.items():
        gain[label] = np.stack([fraction_by_bin(rho > e, b, n_bins)[0] for e in eps_arr]) - base
        vacuous[label] = fraction_by_bin(np.isposinf(rho), b, n_bins)[0] - fraction_by_bin(np.isposinf(greedy), b, n_bins)[0]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(positive, rho / np.where(positive, greedy, 1.0), np.nan)
        ratio[label] = np.array([quantile(r[(b == k) & positive], 0.5) if np.any((b == k) & positive) else math.nan
                                 for k in range(n_bins)])
    return Enlargement(edges, counts, centers, eps_arr, gain, ratio, vacuous)


# ---------------------------------------------------------------------------------------------
# Certified runs


def mean_run_length(traces: Traces, certs: np.ndarray, eps: Sequence[float] | float) -> np.ndarray:
    """Mean over every step of every trajectory of ``run_t(eps)`` (module docstring), per budget.

    Trajectories are padded with NaN, which :func:`companion.certify.runs.certified_run_lengths` counts
    as not certified, so a run stops at its trajectory's end; padded positions are not averaged.
    """
    c = torch.from_numpy(traces.padded(np.asarray(certs, dtype=np.float64), np.nan))
    eps_t = torch.as_tensor(np.atleast_1d(np.asarray(eps, dtype=np.float64)))
    runs = certified_run_lengths(c, eps_t).numpy()  # [E, P, T]
    mask = traces.valid_mask()
    out = runs[:, mask].mean(axis=1) if mask.any() else np.full(len(eps_t), np.nan)
    return out if np.ndim(eps) else out[0]


def run_length_curves(traces: Traces, eps: Sequence[float] = tuple(EPS_GRID), criteria: Sequence[str] | None = None,
                      tree_widths: Sequence[int] = (2, 4, 8), divergence: str = "forward") -> dict[str, np.ndarray]:
    """``{label: mean run length per budget}`` for each criterion and ``"tree:m"`` for each width."""
    out = {c: mean_run_length(traces, traces.cert(c, divergence), eps) for c in (traces.criteria if criteria is None else criteria)}
    for m in tree_widths:
        out[f"tree:{m}"] = mean_run_length(traces, traces.tree_cert(m, divergence), eps)
    return out


# ---------------------------------------------------------------------------------------------
# Tree certificates of any width, thresholds: from the stored top-k


def tree_certificates_from_top(top_probs: np.ndarray, m: int, divergence: str = "forward",
                               tail: np.ndarray | None = None, ties: str = "worst",
                               band: np.ndarray | None = None) -> np.ndarray:
    """``rho_tree,m`` from the target's sorted top probabilities ``[N, k]``.

    The worst-case width-``m`` certificate (``ties="worst"``, the harvest's) pools ``p(1)`` with
    the lowest of the competitors ``p(2..m+1)``, so the top ``m + 1`` probabilities determine it
    (``"level-set"``: the ``t`` tied maximisers with the lowest of ``p(t+1..t+m)``, chapter 5);
    this calls the engine's :func:`companion.certify.costs.tree_cost` on every stored value,
    which is what the harvest does on its full summary (equal bit for bit on the stored widths;
    tested). ``tail``: the mass beyond the stored values (the ``top_tail`` column); without it,
    ``1 - sum`` stands in, which loses the digits of reverse certificates above ~30 nats.
    Level-set rows whose ``t + m`` exceeds the stored ``k`` get NaN. ``band``: the kernel-path
    band per row (logit units, :func:`companion.harvest.ties.tie_band` of the top logit), as the
    harvest's ``path_tree_cert_*`` columns; ``None``: exact ties only.
    """
    top = np.asarray(top_probs, dtype=np.float64)
    if top.ndim != 2 or top.shape[1] < m + 1:
        raise ValueError(f"tree width {m} needs the top {m + 1} probabilities, the traces keep {top.shape[-1]}")
    if m < 1:
        raise ValueError("tree width m must be >= 1")
    if top.shape[0] == 0:
        return np.zeros(0)
    tail_t = None if tail is None else torch.tensor(np.asarray(tail, dtype=np.float64))
    div = "forward" if short_divergence(divergence) == "fwd" else "reverse"
    band_t = None if band is None else torch.tensor(np.asarray(band, dtype=np.float64))
    cost, _ = tree_cost(torch.tensor(top), m, div, tail=tail_t, ties=ties, band=band_t)
    return cost.numpy()


def thresholds_from_top(traces: Traces, criterion: str) -> np.ndarray:
    """``tau_c(p_t)`` per step from the stored top-k and entropy, by the criterion's own rule (level set:
    the threshold test a decoder applies; its rank condition is :func:`soundness`'s ``draft_rank``)."""
    c = parse_criterion(criterion)
    top = torch.tensor(traces.column("top_probs"), dtype=torch.float64)
    if c.top_needed() > top.shape[1]:
        raise ValueError(f"{criterion} needs the top {c.top_needed()} probabilities, the traces keep {top.shape[1]}")
    entropy = torch.tensor(traces.column("entropy"), dtype=torch.float64) if c.needs_entropy else None
    s = TopSummary(values=top, indices=torch.zeros_like(top, dtype=torch.long), vocab=max(top.shape[1], 1),
                   lead_shape=torch.Size([top.shape[0]]), norm=torch.ones(top.shape[0], dtype=torch.float64), entropy=entropy)
    return c.threshold_from_summary(s).numpy()


# ---------------------------------------------------------------------------------------------
# Real drafter: acceptance, soundness, tightness, trees, rounds


@dataclass(frozen=True)
class AcceptanceRow:
    """Per criterion: rates over all steps, tightness, soundness violations, recomputation mismatches."""

    criterion: str
    accepted: float  # share of steps where c accepts the drafter's token
    certified_fwd: float  # share with kl_fwd < rho_fwd
    certified_rev: float  # share with kl_rev < rho_rev
    tightness_fwd: float  # certified_fwd & accepted / accepted
    tightness_rev: float
    violations: int  # steps certified (either direction) but rejected


def acceptance_table(traces: Traces, criteria: Sequence[str] | None = None) -> list[AcceptanceRow]:
    """Per criterion ``c``: ``mean(accepted_c)``, ``mean(kl < rho_c)`` both ways, tightness both ways, violations."""
    rows = []
    for c in (traces.criteria if criteria is None else criteria):
        acc = traces.column(column_name("accepted", c)).astype(bool)
        cf = traces.kl("forward") < traces.cert(c, "forward")
        cr = traces.kl("reverse") < traces.cert(c, "reverse")
        n_acc = int(acc.sum())
        rows.append(AcceptanceRow(
            c, float(acc.mean()), float(cf.mean()), float(cr.mean()),
            float((cf & acc).sum() / n_acc) if n_acc else math.nan,
            float((cr & acc).sum() / n_acc) if n_acc else math.nan,
            int(((cf | cr) & ~acc).sum())))
    return rows


@dataclass(frozen=True)
class SoundnessReport:
    """What :func:`soundness` checked and found."""

    steps: int  # steps (rows) checked
    checks: int  # (step, criterion or width, divergence) implications checked
    violations: dict[str, int]  # label -> steps certified but not accepted / not covered
    flag_mismatches: dict[str, int]  # label -> steps where a stored flag differs from its recomputation

    @property
    def total_violations(self) -> int:
        """Certified-but-rejected steps, summed over criteria."""
        return sum(self.violations.values())

    @property
    def total_mismatches(self) -> int:
        """Stored flags that disagree with their recomputation, summed over flags."""
        return sum(self.flag_mismatches.values())


def soundness(traces: Traces, tree_widths: Sequence[int] = tuple(range(1, 9))) -> SoundnessReport:
    """Check ``certified => accepted`` for every criterion and ``tree-certified => covered`` for every width.

    Nothing is taken from the stored flags: ``certified`` is recomputed as ``kl < rho``,
    ``accepted`` as ``p_t(d_t) >= tau_c(p_t)`` (``>`` for typical) from the stored top-k
    (:func:`thresholds_from_top`) and, for the rank conditions, ``draft_rank <= m`` (the
    decoders' rule, exact ties to the lowest id), ``covered`` as ``token_rank_in_draft <= m``, in both
    divergences. Where the harvest stored the flag itself, the recomputation must agree with
    it; disagreements are counted in ``flag_mismatches`` (they would mean the columns are
    inconsistent).

    Exception: a criterion that reads the target's raw logits (``needs_logits``: MARS) cannot be
    decided from stored top-k probabilities (its relaxation depends on the logits' offset, which
    ``p`` does not record); for it ``accepted`` is the stored ``accepted[...]`` column (the
    decoders' verdict on the logits at harvest time), and no ``accepted`` mismatch is counted.
    """
    violations: dict[str, int] = {}
    mismatches: dict[str, int] = {}
    checks = 0
    draft_p = traces.column("draft_p")
    for c in traces.criteria:
        crit = parse_criterion(c)
        if crit.needs_logits:
            acc = traces.column(column_name("accepted", c)).astype(bool)
        else:
            tau = thresholds_from_top(traces, c)
            acc = crit.accept_from(torch.tensor(draft_p, dtype=torch.float64), torch.tensor(tau)).numpy()
            limit = crit.index_rank_limit()
            if limit is not None:
                acc = acc & (traces.column("draft_rank") <= limit)
            mismatches[column_name("accepted", c)] = int((acc != traces.column(column_name("accepted", c)).astype(bool)).sum())
        for div in ("fwd", "rev"):
            cert = traces.kl(div) < traces.cert(c, div)
            violations[f"{c} ({div})"] = int((cert & ~acc).sum())
            mismatches[column_name("certified", c, div)] = int((cert != traces.column(column_name("certified", c, div)).astype(bool)).sum())
            checks += len(cert)
    rank = traces.column("token_rank_in_draft")
    for m in tree_widths:
        covered = rank <= m
        if traces.has(column_name("covered", m)):
            mismatches[column_name("covered", m)] = int((covered != traces.column(column_name("covered", m)).astype(bool)).sum())
        for div in ("fwd", "rev"):
            cert = traces.kl(div) < traces.tree_cert(m, div)
            violations[f"tree m={m} ({div})"] = int((cert & ~covered).sum())
            name = column_name("tree_certified", m, div)
            if traces.has(name):
                mismatches[name] = int((cert != traces.column(name).astype(bool)).sum())
            checks += len(cert)
    return SoundnessReport(traces.n_rows, checks, violations, mismatches)


@dataclass(frozen=True)
class TreeCoverage:
    """Per width ``m``: share of steps covered, share tree-certified, tightness, violations."""

    widths: np.ndarray
    covered: np.ndarray
    certified: np.ndarray
    tightness: np.ndarray  # certified & covered / covered
    violations: np.ndarray  # certified & not covered
    ceilings: np.ndarray  # log(m + 1)


def tree_coverage(traces: Traces, widths: Sequence[int] = tuple(range(1, 9)), divergence: str = "forward") -> TreeCoverage:
    """``covered = mean(token_rank_in_draft <= m)``, ``certified = mean(kl < rho_tree,m)`` for each ``m``."""
    rank = traces.column("token_rank_in_draft")
    kl = traces.kl(divergence)
    cov, cer, tight, viol = [], [], [], []
    for m in widths:
        covered = rank <= m
        cert = kl < traces.tree_cert(m, divergence)
        cov.append(covered.mean())
        cer.append(cert.mean())
        tight.append((cert & covered).sum() / covered.sum() if covered.any() else math.nan)
        viol.append(int((cert & ~covered).sum()))
    w = np.asarray(list(widths))
    return TreeCoverage(w, np.array(cov, dtype=float), np.array(cer, dtype=float), np.array(tight, dtype=float),
                        np.array(viol), np.log(w + 1.0))


def round_lengths(traces: Traces, flags: np.ndarray, draft_length: int | None) -> np.ndarray:
    """``min(K, run of True from t)`` at every step (row order), the run cut at the trajectory's end.

    ``draft_length`` None means ``K = inf``. Uses :func:`companion.certify.runs.run_lengths`, with the
    padding after each trajectory's end counted as False so that no run crosses it.
    """
    x = traces.padded(np.asarray(flags, dtype=bool).astype(np.float64), 0.0) > 0
    runs = run_lengths(torch.from_numpy(x)).numpy()[traces.valid_mask()]
    return runs if draft_length is None else np.minimum(runs, draft_length)


@dataclass(frozen=True)
class RoundLengths:
    """Mean accepted draft tokens per round against the draft length ``K`` (module docstring)."""

    draft_lengths: np.ndarray
    measured: dict[str, np.ndarray]  # A_c
    certified: dict[str, np.ndarray]  # C_c: per-step budget kl(t), a lower bound
    budget: dict[str, np.ndarray]  # B_c: scalar budget eps
    eps: float
    min_gap: dict[str, int]  # min over steps and K of A_c - C_c (>= 0 by soundness)


def accepted_length_per_round(traces: Traces, draft_lengths: Sequence[int] = tuple(range(1, 17)),
                              criteria: Sequence[str] | None = None, eps: float | None = None,
                              divergence: str = "forward") -> RoundLengths:
    """Measured ``A_c``, certified ``C_c`` and scalar-budget ``B_c`` mean lengths for each ``K``.

    ``eps`` None: the median of the drafter's per-step ``kl`` (order statistic ``Q(0.5)``).
    """
    kl = traces.kl(divergence)
    budget_eps = quantile(kl, 0.5) if eps is None else float(eps)
    ks = np.asarray(list(draft_lengths))
    meas, cert, bud, gap = {}, {}, {}, {}
    for c in (traces.criteria if criteria is None else criteria):
        acc = traces.column(column_name("accepted", c)).astype(bool)
        rho = traces.cert(c, divergence)
        a_inf = round_lengths(traces, acc, None)
        c_inf = round_lengths(traces, kl < rho, None)
        b_inf = round_lengths(traces, rho > budget_eps, None)
        meas[c] = np.array([np.minimum(a_inf, k).mean() for k in ks])
        cert[c] = np.array([np.minimum(c_inf, k).mean() for k in ks])
        bud[c] = np.array([np.minimum(b_inf, k).mean() for k in ks])
        gap[c] = int((a_inf - c_inf).min()) if len(a_inf) else 0  # min over K is at K = inf
    return RoundLengths(ks, meas, cert, bud, budget_eps, gap)
