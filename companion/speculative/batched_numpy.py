"""numpy's float64 sum, linear interpolation and quantile, for many rows at once, bit for bit.

The calibrated cost rule (``companion.speculative.policies.Calibrated``) sums, interpolates and
takes quantiles of one small array at a time. Replaying it on many recordings at once
(``companion.speculative.calibrated_replay``) needs the same numbers for many arrays of different
lengths in one call, with the same bits, so that every decision is the one the policy object makes:

* :func:`row_sums`: ``np.sum`` of each row's first ``n`` entries. numpy adds a float64 array of
  ``n <= 128`` entries pairwise: for ``n < 8`` left to right from 0; otherwise eight running sums
  over the first ``8 * (n // 8)`` entries (entry ``i`` into sum ``i % 8``), combined as
  ``((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))``, then the last ``n % 8`` entries left to
  right. The same additions in the same order here, for every row at once.
* :func:`interp_unit_grid`: ``np.interp(x, SURVIVAL_GRID, fp)`` on the 65-point grid ``j / 64``,
  with a table ``fp`` per row: numpy's ``slope * (x - xp[j]) + fp[j]`` with
  ``slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])``, and ``fp[64]`` at ``x = 1``.
* :func:`sorted_quantiles`: ``np.quantile(u, q)`` (method ``linear``) of each row's first ``n``
  sorted values: the virtual index ``(n - 1) q``, and numpy's two-sided linear interpolation
  between its neighbours.

``tests/test_batched_numpy.py`` compares each with numpy's own function on random rows.
"""
from __future__ import annotations

import numpy as np

GRID_POINTS = 65
"""Points of the survival grid ``j / 64`` (``companion.speculative.policies.SURVIVAL_GRID``)."""
_GRID_STEP = 1.0 / (GRID_POINTS - 1)


def row_sums(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``np.sum(a[r, :n[r]])`` for every row ``r`` of the float64 ``a`` (``n[r] <= 128``), bit for bit.

    Entries at or past ``n[r]`` must be ``0.0``: the sums then read them as nothing (``x + 0.0 == x``).
    """
    rows, width = a.shape
    if np.any(n > 128):
        raise ValueError("row_sums reproduces numpy's pairwise sum of at most 128 entries")
    full = n // 8
    blocks = width // 8
    if blocks:
        # the eight running sums over a row's whole blocks, block after block (a row's later blocks add zeros)
        body = a[:, :blocks * 8].reshape(rows, blocks, 8)
        keep = np.arange(blocks)[None, :] < full[:, None]
        s = np.where(keep[:, :1], body[:, 0], 0.0)
        for b in range(1, blocks):
            s = s + np.where(keep[:, b:b + 1], body[:, b], 0.0)
        s = s[:, 0::2] + s[:, 1::2]     # (s0 + s1), (s2 + s3), ...: numpy's pairing
        s = s[:, 0::2] + s[:, 1::2]
        total = s[:, 0] + s[:, 1]
    else:
        total = np.zeros(rows)          # n < 8: numpy adds every entry, left to right, to 0
    # then the entries past the whole blocks, left to right (past n they are zeros)
    start = full * 8
    if width <= 16:
        for c in range(width):
            total = total + np.where(c >= start, a[:, c], 0.0)
    else:
        padded = np.concatenate([a, np.zeros((rows, 7))], axis=1)
        tail = np.take_along_axis(padded, start[:, None] + np.arange(7), axis=1)
        for t in range(7):
            total = total + tail[:, t]
    return total


def interp_unit_grid(x: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp(x[r], SURVIVAL_GRID, fp[r])`` for every row ``r``: ``x`` ``[rows, m]`` in ``[0, 1]``,
    ``fp`` ``[rows, 65]`` (finite), bit for bit."""
    j = np.minimum((x * (GRID_POINTS - 1)).astype(np.intp), GRID_POINTS - 2)   # x >= 0: the floor
    left = np.take_along_axis(fp, j, axis=1)
    right = np.take_along_axis(fp, j + 1, axis=1)
    xj = j * _GRID_STEP                 # j / 64 exactly: the grid point itself
    slope = (right - left) / ((xj + _GRID_STEP) - xj)
    out = slope * (x - xj) + left
    # x = 1 is the grid's last point, where numpy returns fp[64] itself (x == xp[j] elsewhere gives
    # slope * 0 + fp[j] = fp[j] through the formula)
    return np.where(x >= 1.0, fp[:, -1:], out)


def sorted_quantiles(srt: np.ndarray, n: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.quantile(srt[r, :n[r]], q[r])`` (method ``linear``) for every row ``r``, bit for bit.

    ``srt`` ``[rows, width]`` holds each row's values sorted in its first ``n[r] >= 1`` entries;
    ``q`` ``[rows, m]`` the levels in ``[0, 1]`` (a row's unused levels may be any level: the caller
    drops their results).
    """
    rows = np.arange(srt.shape[0])[:, None]
    last = (n - 1)[:, None]
    virtual = last.astype(float) * q
    below = np.floor(virtual)
    above = virtual >= last             # numpy takes the last value for both neighbours there
    prev_i = np.where(above, last, below.astype(np.intp))
    next_i = np.where(above, last, np.minimum(prev_i + 1, srt.shape[1] - 1))
    gamma = virtual - np.where(above, -1, prev_i)   # numpy's gamma uses index -1 for the last value
    a = srt[rows, prev_i]
    b = srt[rows, next_i]
    diff = b - a
    out = a + diff * gamma
    return np.where(gamma >= 0.5, b - diff * (1 - gamma), out)
