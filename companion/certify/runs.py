"""Certified runs: consecutive tokens guaranteed to be accepted under a per-step KL budget.

If a drafter's per-step divergence is at most ``eps`` at every step, every step whose
certificate exceeds ``eps`` (``rho*_t > eps``) is certified accepted. The certified run from
position ``t`` is the number of consecutive certified steps starting at ``t``:

    run_t(eps) = min{ f >= t : rho*_f <= eps } - t     (f = T when none),

and its mean over positions is the expected number of guaranteed tokens a round starting at
a random position gets. Computed without loops: the next failure index is a reversed
cumulative minimum.
"""
from __future__ import annotations

import torch
from torch import Tensor


def certified_run_lengths(certs: Tensor, eps: float | Tensor) -> Tensor:
    """Run length from each position: ``certs`` ``[..., T]``, ``eps`` scalar or ``[E]``.

    Returns int64 ``[..., T]`` for a scalar ``eps`` and ``[E, ..., T]`` for a vector of budgets.
    NaN certificates (missing steps) count as not certified.
    """
    if certs.dim() < 1:
        raise ValueError("certs must have shape [..., T]")
    eps_t = torch.as_tensor(eps, dtype=torch.float64, device=certs.device)
    if eps_t.dim() > 1:
        raise ValueError("eps must be a scalar or a 1-d tensor of budgets")
    if bool((eps_t < 0).any()) or bool(torch.isnan(eps_t).any()):
        raise ValueError("eps must be non-negative")
    c = certs.to(torch.float64)
    e = eps_t.reshape(eps_t.shape + (1,) * c.dim())
    return run_lengths(c > e)  # NaN compares False: not certified


def run_lengths(flags: Tensor) -> Tensor:
    """Length of the run of ``True`` starting at each position of ``flags`` ``[..., T]`` (bool).

    ``run_t = min{ f >= t : not flags_f } - t`` (``f = T`` when none), int64, same shape: the
    next failure index is a reversed cumulative minimum, so there is no loop.
    """
    if flags.dtype != torch.bool:
        raise ValueError(f"flags must be a bool tensor, got {flags.dtype}")
    if flags.dim() < 1:
        raise ValueError("flags must have shape [..., T]")
    t_len = flags.shape[-1]
    pos = torch.arange(t_len, device=flags.device)
    fail_at = torch.where(flags, torch.full_like(pos, t_len), pos)
    # Next failure at or after t: cumulative minimum from the right.
    next_fail = fail_at.flip(-1).cummin(-1).values.flip(-1)
    return next_fail - pos


def mean_certified_run_length(certs: Tensor, eps: float | Tensor, dim: int | tuple[int, ...] | None = None) -> Tensor:
    """Mean of :func:`certified_run_lengths` over positions (``dim=None``: over every position of
    every trajectory, per budget). ``certs``: ``[..., T]``."""
    runs = certified_run_lengths(certs, eps).to(torch.float64)
    e_dims = 1 if torch.as_tensor(eps).dim() == 1 else 0
    if dim is None:
        dims = tuple(range(e_dims, runs.dim()))
        return runs.mean(dim=dims)
    return runs.mean(dim=dim)
