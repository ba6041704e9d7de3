"""Per-step statistics of target and drafter distributions, computed on the device from full logits.

:class:`StepStatistics` turns a block of target logits ``[N, V]`` (and the drafter's, same shape)
into the per-step trace columns of :mod:`companion.harvest.schema`. Nothing of size ``V`` leaves
the device or outlives the call; the results are ``[N]`` (or ``[N, top_k]``) tensors.

What is computed, and by whom:

* the target's top-``K`` summary and entropy: :func:`companion.certify.summary.summarize` (so every
  probability here is normalised exactly as the certificate engine normalises it);
* the certificates: :func:`companion.certify.certificates.certificates`, one call for all criteria,
  both divergences and all tree widths;
* the drafter side: ``KL(p||q)``, ``KL(q||p)`` and ``TV(p, q)`` in float64 from one pass over
  each row (below), argmaxes and ranks by comparisons on the logits, acceptance by each
  criterion's threshold test against the threshold of the same summary, plus its rank condition.

Ties. The certificates are the engine's default, the worst case over tie-breaks, so that a
certified step is accepted by every decoder that breaks exact ties in a fixed way. The verdicts
are those of the decoders, which break ties by token id (transformers, vLLM and TensorRT-LLM take
the target's token with ``argmax``, first index wins): ranks are
:func:`~companion.certify.criteria.index_rank` on the logits (``1 + #{z : l_z > l_y} + #{z < y : l_z == l_y}``,
the order of ``torch.argmax`` and of a stable sort), strict greedy accepts the draft ``d`` iff
``d == token`` (``draft_rank == 1``), top-m iff ``draft_rank <= m``, and a greedy tree of width
``m`` covers a step iff ``token`` is among the drafter's id-ordered top ``m``
(``token_rank_in_draft <= m``); ``mars:T`` accepts iff ``draft_rank <= 2`` on the steps whose
target logits relax it (:class:`~companion.certify.criteria.Mars`: ``z(1) > 0``, ``z(2) / z(1) > T``),
``draft_rank == 1`` elsewhere, decided on the harvested logits themselves. A step certified (tree-certified) under the worst case is
accepted (covered) under any fixed tie-break, this one included; ``torch.topk``'s own order among
exact ties is unspecified (on the CPU it does not follow ids), which the worst case covers too.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor

from companion.certify.certificates import certificates
from companion.certify.precision import SIGNIFICAND_BITS, U64, gamma, tie_band_tensor
from companion.certify.verdicts import kl_band
from companion.certify.criteria import Criterion, index_rank, parse_criteria
from companion.harvest.schema import column
from companion.certify.summary import DEFAULT_TOP, summarize
from companion.certify.validation import check_tree_width

FORWARD, REVERSE = "forward", "reverse"
DIVERGENCES = (FORWARD, REVERSE)

#: Largest finite float32: stands in for -inf logits so that 0 * log 0 terms vanish instead of NaN.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class StepStatistics:
    """Computes the trace columns of a block of steps.

    ``criteria``: specs or :class:`~companion.certify.criteria.Criterion` objects; ``tree_widths``:
    the ``m`` of the tree certificates; ``top_k``: how many of the target's largest
    probabilities are kept per step; ``vocab``: the models' vocabulary size (checked).
    ``logits_dtype``: whose kernel-path band counts as a tie in the certificate columns
    (:func:`~companion.certify.summary.summarize_partial`); ``"exact"`` (default): exact ties only,
    the paper's convention, whatever dtype the logits arrive in.
    ``path_dtype``: the dtype the model computed its logits in (``"bfloat16"``, ``"float32"``...),
    whose band the ``path_cert_*``, ``path_tree_cert_*`` and their ``certified`` columns count as ties; None: the dtype
    of the logits tensor each call receives (float64: no band, the path columns equal the others).
    """

    def __init__(self, criteria: Sequence[str | Criterion], tree_widths: Sequence[int], *, vocab: int,
                 top_k: int = DEFAULT_TOP, logits_dtype: str | None = "exact", path_dtype: str | None = None) -> None:
        self.logits_dtype = logits_dtype
        if path_dtype is not None and path_dtype not in SIGNIFICAND_BITS:
            raise ValueError(f"path_dtype must be one of {', '.join(SIGNIFICAND_BITS)} or None, got {path_dtype!r}")
        self.path_dtype = path_dtype
        self.criteria: list[Criterion] = parse_criteria(list(criteria)) if criteria else []
        self.specs = [str(c) for c in self.criteria]
        if len(set(self.specs)) != len(self.specs):
            raise ValueError(f"duplicate criteria: {self.specs}")
        for c in self.criteria:
            c.check_vocab(vocab)
        self.widths = [check_tree_width(m, vocab) for m in tree_widths]
        if len(set(self.widths)) != len(self.widths):
            raise ValueError(f"duplicate tree widths: {self.widths}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 10 <= top_k <= vocab:
            raise ValueError(f"top_k must be an integer in [10, V={vocab}], got {top_k!r} (top10_mass needs 10)")
        self.vocab = vocab
        self.top_k = top_k
        self._ws = Workspace()
        # One summary serves the stored top-k, the thresholds and the margins.
        # It also serves the certificates (so it holds what certificates() would take itself).
        self.k_summary = min(vocab, max([top_k, 2, DEFAULT_TOP] + [c.top_needed("worst") + 1 for c in self.criteria]
                                        + [m + 1 for m in self.widths]))

    # ------------------------------------------------------------------------------------------
    def target(self, logits_p: Tensor, token: Tensor | None = None) -> dict[str, Tensor]:
        """Target-only columns for logits ``[N, V]`` (plus the summary under ``"_summary"``).

        ``token``: the greedy tokens if the caller already has them (``argmax`` of these logits).
        """
        if logits_p.dim() != 2 or logits_p.shape[1] != self.vocab:
            raise ValueError(f"target logits must have shape [N, {self.vocab}], got {tuple(logits_p.shape)}")
        s = summarize(logits_p, from_logits=True, k=self.k_summary, with_entropy=True, logits_dtype=self.logits_dtype)
        values, idx = s.values, s.indices
        out: dict[str, Tensor] = {}
        out["token"] = logits_p.argmax(-1) if token is None else token  # id-based: the first maximal index
        out["p_top1"] = values[:, 0]
        out["margin"] = values[:, 0] - values[:, 1]
        out["entropy"] = s.entropy
        out["top10_mass"] = values[:, :10].sum(1)
        top2 = logits_p.gather(1, idx[:, :2])
        out["top2_tie"] = top2[:, 0] == top2[:, 1]
        out["logit_top1"] = top2[:, 0].double()
        out["logit_gap"] = top2[:, 0].double() - top2[:, 1].double()
        out["top_probs"] = values[:, : self.top_k]
        out["top_ids"] = idx[:, : self.top_k]
        # Mass beyond the stored top-k, summed on its own scale (never 1 - sum of the top-k).
        out["top_tail"] = s.tail + values[:, self.top_k:].sum(1)
        certs = certificates(logits_p, self.criteria, DIVERGENCES, tree_widths=self.widths,
                             from_logits=True, summary=s)
        for spec in self.specs:
            for d in DIVERGENCES:
                out[column("cert", spec, d)] = certs[(spec, d)]
        for m in self.widths:
            for d in DIVERGENCES:
                out[column("tree_cert", m, d)] = certs[(f"tree:{m}", d)]
        # The kernel-path convention: the same summary with the band of the model's dtype.
        dtype = self.path_dtype or str(logits_p.dtype).removeprefix("torch.")
        if (self.criteria or self.widths) and dtype != "float64" and dtype in SIGNIFICAND_BITS:
            band = tie_band_tensor(s.top_logits[:, 0], dtype)
            path = certificates(logits_p, self.criteria, DIVERGENCES, tree_widths=self.widths, from_logits=True,
                                summary=replace(s, band=band))
        else:
            path = certs
        for spec in self.specs:
            for d in DIVERGENCES:
                out[column("path_cert", spec, d)] = path[(spec, d)]
        for m in self.widths:
            for d in DIVERGENCES:
                out[column("path_tree_cert", m, d)] = path[(f"tree:{m}", d)]
        out["_summary"] = s  # type: ignore[assignment]
        return out

    def drafter(self, logits_p: Tensor, logits_q: Tensor, target_cols: dict[str, Tensor]) -> dict[str, Tensor]:
        """Drafter columns, given the target's columns of the same rows (from :meth:`target`)."""
        if logits_q.shape != logits_p.shape:
            raise ValueError(f"drafter logits {tuple(logits_q.shape)} and target logits {tuple(logits_p.shape)} differ in shape")
        s = target_cols["_summary"]
        out: dict[str, Tensor] = {}
        kl_fwd, kl_rev, tv, band_fwd, band_rev = divergences(logits_p, logits_q, self._ws, with_bands=True)
        out["kl_fwd"], out["kl_rev"], out["tv"] = kl_fwd, kl_rev, tv

        d = logits_q.argmax(-1)  # id-based: the first maximal index
        out["draft_token"] = d
        top2_q = logits_q.topk(2, dim=-1).values.double()
        out["draft_logit_top1"] = top2_q[:, 0]
        out["draft_logit_gap"] = top2_q[:, 0] - top2_q[:, 1]
        # Ranks on the logits (the same order as the probabilities), exact ties to the lowest id.
        draft_rank = index_rank(logits_p, d)
        out["draft_rank"] = draft_rank
        rank_in_draft = index_rank(logits_q, target_cols["token"])
        out["token_rank_in_draft"] = rank_in_draft

        p_d = self._prob_of(logits_p, s, d)
        out["draft_p"] = p_d
        for c, spec in zip(self.criteria, self.specs):
            tau = c.threshold_from_summary(s)
            accepted = c.accept_from(p_d, tau)
            limits = c.rank_limits_from_summary(s)  # per row: MARS's is 2 on relaxed rows, 1 elsewhere
            if limits is not None:
                accepted = accepted & (draft_rank <= limits)
            out[column("accepted", spec)] = accepted
            for d, kl in ((FORWARD, kl_fwd + band_fwd), (REVERSE, kl_rev + band_rev)):
                out[column("certified", spec, d)] = kl < target_cols[column("cert", spec, d)]
                out[column("path_certified", spec, d)] = kl < target_cols[column("path_cert", spec, d)]
        for m in self.widths:
            out[column("covered", m)] = rank_in_draft <= m
            for d, kl in ((FORWARD, kl_fwd + band_fwd), (REVERSE, kl_rev + band_rev)):
                out[column("tree_certified", m, d)] = kl < target_cols[column("tree_cert", m, d)]
                out[column("path_tree_certified", m, d)] = kl < target_cols[column("path_tree_cert", m, d)]
        return out

    def __call__(self, logits_p: Tensor, logits_q: Tensor | None = None, *, token: Tensor | None = None) -> dict[str, Tensor]:
        """All columns for a block of steps (drafter columns only when ``logits_q`` is given)."""
        out = self.target(logits_p, token)
        if logits_q is not None:
            out.update(self.drafter(logits_p, logits_q, out))
        del out["_summary"]
        return out

    @staticmethod
    def _prob_of(logits_p: Tensor, s, tok: Tensor) -> Tensor:
        """``p_tok`` (float64) normalised exactly as the summary: the summary's own value when ``tok``
        is among its top-K (so ties compare equal bit for bit), else ``p(1) exp(l_tok - l_1)``."""
        hit = s.indices == tok.unsqueeze(1)
        found = hit.any(1)
        pos = hit.to(torch.float32).argmax(1, keepdim=True)  # first hit
        from_summary = s.values.gather(1, pos).squeeze(1)
        l_tok = logits_p.gather(1, tok.unsqueeze(1)).squeeze(1).to(torch.float64)
        l_top = logits_p.gather(1, s.indices[:, :1]).squeeze(1).to(torch.float64)
        ratio = s.values[:, 0] * torch.exp(l_tok - l_top)
        return torch.where(found, from_summary, ratio)


class Workspace:
    """Reusable device buffers: fresh ``[N, V]`` float64 tensors every step cost page faults on the CPU."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, like: Tensor, dtype: torch.dtype) -> Tensor:
        """A reusable buffer named ``name`` of ``like``'s shape and device in ``dtype`` (allocated on a change)."""
        buf = self._bufs.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != dtype or buf.device != like.device:
            buf = torch.empty(like.shape, dtype=dtype, device=like.device)
            self._bufs[name] = buf
        return buf


def divergences(logits_p: Tensor, logits_q: Tensor, workspace: Workspace | None = None,
                with_bands: bool = False) -> tuple[Tensor, ...]:
    """``(KL(p||q), KL(q||p), TV(p, q))`` of softmax rows ``[N, V]``, float64 ``[N]`` each.

    Everything in float64 with the normalisers computed in float64 (an error of 1e-7 in a
    float32 log-sum-exp would shift every KL by about as much, which is the size of the
    certificates of near-tied steps). Five ``[N, V]`` float64 buffers, reused across calls,
    and no other temporaries of that size. Rows with ``-inf`` logits (masked tokens) are redone
    with those logits clamped to the most negative float32, which leaves ``p`` unchanged
    (``exp`` underflows to 0) and turns ``0 * log 0`` into ``0 * finite``; a KL that is infinite
    in exact arithmetic then comes out above 1e30 and is reported as ``+inf``. NaN or ``+inf``
    logits raise ``ValueError``.

    ``with_bands``: also how far each exact divergence may lie above the computed one
    (:func:`companion.certify.verdicts.kl_band`, float64 rows of ``V`` terms: each normaliser
    within ``gamma_{V+4}``, each log-probability within ``24 U64 (|l|max + |l|max' + 2 log V + 2)``
    of both sides), so that the certified columns compare an upper bound of the divergence with the
    certificate.
    """
    ws = workspace if workspace is not None else Workspace()
    kl_fwd, kl_rev, tv, mags = _divergences(logits_p, logits_q, ws, clamp=False)
    bad = ~(torch.isfinite(kl_fwd) & torch.isfinite(kl_rev) & torch.isfinite(tv))
    if bool(bad.any()):
        idx = torch.nonzero(bad).squeeze(1)
        sub_p, sub_q = logits_p.index_select(0, idx), logits_q.index_select(0, idx)
        for what, rows in (("target", sub_p), ("drafter", sub_q)):
            if bool((torch.isnan(rows) | torch.isposinf(rows)).any()):
                raise ValueError(f"{what} logits contain NaN or +inf")
        f, r, t, mg = _divergences(sub_p, sub_q, Workspace(), clamp=True)
        kl_fwd, kl_rev, tv = kl_fwd.index_copy(0, idx, f), kl_rev.index_copy(0, idx, r), tv.index_copy(0, idx, t)
        mags = mags.index_copy(0, idx, mg)
    inf = torch.full_like(kl_fwd, torch.inf)
    kl_fwd = torch.where(kl_fwd > 1e30, inf, kl_fwd.clamp(min=0.0))
    kl_rev = torch.where(kl_rev > 1e30, inf, kl_rev.clamp(min=0.0))
    if not with_bands:
        return kl_fwd, kl_rev, tv
    vocab = logits_p.shape[-1]
    eta = torch.full_like(kl_fwd, gamma(vocab + 4, U64))
    band_fwd = kl_band(kl_fwd, mags[:, 0], eta, eta, vocab) + mags[:, 2]
    band_rev = kl_band(kl_rev, mags[:, 1], eta, eta, vocab) + mags[:, 2]
    return kl_fwd, kl_rev, tv, band_fwd, band_rev


def _divergences(logits_p: Tensor, logits_q: Tensor, ws: Workspace, clamp: bool) -> tuple[Tensor, Tensor, Tensor]:
    logp, p = _log_softmax64(logits_p, ws.get("x_p", logits_p, torch.float64), ws.get("e_p", logits_p, torch.float64), clamp)
    logq, q = _log_softmax64(logits_q, ws.get("x_q", logits_q, torch.float64), ws.get("e_q", logits_q, torch.float64), clamp)
    tmp = ws.get("tmp", logits_p, torch.float64)
    # every log-probability l - l(1) - log(total) within a few ulps of its parts: 24 U64 of them
    big_p = torch.where(torch.isfinite(logits_p), logits_p, 0).abs().amax(1).double()
    big_q = torch.where(torch.isfinite(logits_q), logits_q, 0).abs().amax(1).double()
    scale = 24 * U64 * (big_p + big_q + 2 * math.log(logits_p.shape[-1]) + 2)
    logp.sub_(logq)  # log(p/q), in place
    kl_fwd = torch.mul(p, logp, out=tmp).sum(1)
    mag_fwd = tmp.abs_().sum(1)
    kl_rev = -torch.mul(q, logp, out=tmp).sum(1)
    mag_rev = tmp.abs_().sum(1)
    tv = 0.5 * p.sub_(q).abs_().sum(1)
    return kl_fwd, kl_rev, tv, torch.stack([mag_fwd, mag_rev, scale], dim=1)


def _log_softmax64(logits: Tensor, x: Tensor, p: Tensor, clamp: bool) -> tuple[Tensor, Tensor]:
    """``(log p, p)`` in float64 for rows of logits, written into the buffers ``x`` and ``p``."""
    x.copy_(logits)
    if clamp:
        x.clamp_(min=-_FLOAT32_MAX)
    top = x.amax(1, keepdim=True)
    torch.sub(x, top, out=p)
    p.exp_()
    total = p.sum(1, keepdim=True)
    p.div_(total)
    x.sub_(top + torch.log(total))
    return x, p
