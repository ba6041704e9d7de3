"""The drafter-side soundness check of one recorded answer, step by step (chapter 10's pass).

:func:`step_rows` takes the target's and the drafter's teacher-forced logits over one answer (the
rows :func:`companion.speculative.record_chains` hands its ``inspect`` callback) and returns the
soundness counts of every criterion and the per-step columns the chapter's tables and figures read.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from companion.certify.certificates import kl_divergence
from companion.certify.criteria import parse_criterion
from companion.drafter.certificates import drafter_certificate, drafter_path_certificate, drafter_soundness
from companion.speculative.parting import tie_rows


def step_rows(lp: torch.Tensor, lq: torch.Tensor, specs: list[str], dtype: str, path_band: float
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``(soundness counts per criterion, per-step columns)`` of one answer's rows ``lp``, ``lq`` ``[n, V]``.

    Counts: :func:`~companion.drafter.certificates.drafter_soundness` of ``specs`` and the trees of
    width 2 and 4, on ``p = softmax(lp)``, ``q = softmax(lq)`` in float64. Columns, per step:
    ``accepted`` (the drafter's argmax kept iff it is the target's, first index winning ties, as a
    decoder decides), ``certified`` (``KL(p||q) < rho~_greedy(q)``), ``q1``, ``q2``, ``rho``,
    ``tied`` (an exact tie at the top of either model's logits), ``near_target`` / ``near_drafter``
    (a near tie of the top-2 logits in ``dtype``), ``path_certified`` (certified under kernel paths:
    against every target whose top-2 gap may be within ``path_band``, and the drafter's own near
    ties) and ``path_rejected`` (rejected on this path, or the target's top-2 gap within ``path_band``).
    """
    lp, lq = lp.cpu(), lq.cpu()
    p_rows, q_rows = torch.softmax(lp.double(), -1), torch.softmax(lq.double(), -1)
    kl = kl_divergence(p_rows, q_rows)   # once: the soundness counts and the columns share it
    counts = drafter_soundness(p_rows, q_rows, specs, tree_widths=[2, 4], kl=kl)
    top = q_rows.topk(2, -1).values
    top_p = lp.double().topk(2, -1).values
    rho = drafter_certificate(q_rows, "greedy")
    tied = ((lp == lp.amax(-1, keepdim=True)).sum(-1) > 1) | ((lq == lq.amax(-1, keepdim=True)).sum(-1) > 1)
    path_rho = drafter_path_certificate(lq, path_band, from_logits=True, drafter_dtype=dtype)
    columns = {
        "accepted": parse_criterion("greedy").decoder_accepts(lp, lq.argmax(-1), from_logits=True).numpy(),
        "certified": (kl < rho).numpy(), "q1": top[:, 0].numpy(), "q2": top[:, 1].numpy(), "rho": rho.numpy(),
        "tied": tied.numpy(), "near_target": tie_rows(lp, dtype), "near_drafter": tie_rows(lq, dtype),
        "path_certified": (kl < path_rho).numpy(),
        "path_rejected": ((lp.argmax(-1) != lq.argmax(-1)) | (top_p[:, 0] - top_p[:, 1] <= path_band)).numpy(),
    }
    return counts, columns
