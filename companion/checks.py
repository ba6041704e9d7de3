"""Assertions that say what failed, with the numbers: for the chapters' claims.

Every claim a chapter makes is checked by an assertion in the cell that computes it. A bare
``assert`` stops a run with ``AssertionError:`` and nothing else; these helpers raise an
``AssertionError`` whose message names the claim, how many entries break it, the worst entry
and its values, so that a failure on another machine, model or dtype can be read from the log.

* :func:`check_close` -- ``|a - b| <= atol + rtol |b|`` elementwise (NaN equal to NaN only if
  ``equal_nan``; ``inf`` equal to ``inf`` of the same sign).
* :func:`check_all` -- every entry of a boolean array is true.
* :func:`check_le` -- ``a <= b`` elementwise, with a relative and absolute slack.
* :func:`check_identical` -- two sympy expressions simplify to the same thing.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def _array(x: Any) -> np.ndarray:
    """A float64 (or bool) numpy view of a tensor, array or number, detached and on the CPU."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bool":
            return x.numpy()
        return x.double().numpy()
    arr = np.asarray(x)
    return arr if arr.dtype == bool else arr.astype(np.float64)


def _num(x: Any) -> str:
    """A scalar as Python writes it (``2.5``, ``inf``, ``True``), not as numpy's repr."""
    value = x.item() if hasattr(x, "item") else x
    return repr(value)


def _where(mask: np.ndarray, limit: int = 3) -> str:
    idx = np.argwhere(mask)[:limit]
    return ", ".join(str(tuple(int(i) for i in row)) if len(row) != 1 else str(int(row[0])) for row in idx)


def check_close(actual: Any, expected: Any, what: str, *, rtol: float = 1e-12, atol: float = 0.0,
                equal_nan: bool = False) -> None:
    """Raise ``AssertionError`` unless ``|actual - expected| <= atol + rtol |expected|`` everywhere."""
    a, b = np.broadcast_arrays(_array(actual), _array(expected))
    both_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    both_nan = np.isnan(a) & np.isnan(b) if equal_nan else np.zeros(a.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        err = np.abs(a - b)
        finite = np.isfinite(a) & np.isfinite(b)
        ok = (finite & (err <= atol + rtol * np.abs(b))) | both_inf | both_nan
    if ok.all():
        return
    bad = ~ok
    err = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
    worst = np.unravel_index(int(np.argmax(err)), err.shape) if err.ndim else ()
    raise AssertionError(
        f"{what}: {int(bad.sum())} of {bad.size} entries differ beyond rtol={rtol:g}, atol={atol:g}; "
        f"worst at {tuple(int(i) for i in worst)}: {_num(a[worst])} vs {_num(b[worst])} (difference {a[worst] - b[worst]:.3g}); "
        f"first failing at {_where(bad)}")


def check_all(condition: Any, what: str, *values: Any) -> None:
    """Raise ``AssertionError`` unless every entry of ``condition`` is true.

    ``values``: arrays of the same shape whose entries at the first failing positions are shown.
    """
    ok = _array(condition).astype(bool)
    if ok.all():
        return
    bad = ~ok
    shown = ""
    if values:
        idx = tuple(np.argwhere(bad)[0]) if bad.ndim else ()
        shown = "; values there: " + ", ".join(_num(_array(v)[idx] if np.ndim(v) else _array(v)) for v in values)
    raise AssertionError(f"{what}: fails on {int(bad.sum())} of {bad.size} entries (first at {_where(bad)}){shown}")


def check_le(smaller: Any, larger: Any, what: str, *, rtol: float = 1e-12, atol: float = 0.0) -> None:
    """Raise ``AssertionError`` unless ``smaller <= larger (1 + rtol) + atol`` everywhere (``inf <= inf``)."""
    a, b = np.broadcast_arrays(_array(smaller), _array(larger))
    with np.errstate(invalid="ignore"):
        slack = np.where(np.isinf(b), 0.0, rtol * np.abs(b) + atol)
        ok = (a <= b + slack) | (np.isinf(a) & np.isinf(b) & (a == b))
    if ok.all():
        return
    bad = ~ok
    with np.errstate(invalid="ignore"):
        excess = np.where(bad, a - b, -np.inf)
    worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.ndim else ()
    raise AssertionError(
        f"{what}: {int(bad.sum())} of {bad.size} entries break <= (rtol={rtol:g}, atol={atol:g}); "
        f"worst at {tuple(int(i) for i in worst)}: {_num(a[worst])} > {_num(b[worst])}")


def check_identical(expr: Any, target: Any, what: str) -> None:
    """Raise ``AssertionError`` unless ``simplify(expr - target) == 0`` (sympy expressions)."""
    import sympy as sp

    diff = sp.simplify(sp.sympify(expr) - sp.sympify(target))
    if diff != 0:
        raise AssertionError(f"{what}: {expr} and {target} differ by {diff}")
