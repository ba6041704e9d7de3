"""Input checks shared by every certificate and criterion.

A row of ``p`` is one next-token distribution; ``p`` may carry any number of leading batch
dimensions. Bad rows are reported by their index in those leading dimensions, so that a user
who passes a ``[batch, steps, V]`` tensor learns which step of which prompt was malformed.

Row-sum tolerance (absolute, on the sum accumulated in float64):

* float64 / float32 input: ``|sum - 1| <= 1e-4``
* bfloat16 / float16 input: ``|sum - 1| <= 2e-2`` (each entry carries ~0.4% rounding)

Rows inside the tolerance are renormalised in float64 before any certificate is computed,
so the results are those of the exact distribution ``p / sum(p)``.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

DIVERGENCES = ("forward", "reverse")

ROW_SUM_TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-4,
    torch.float32: 1e-4,
    torch.bfloat16: 2e-2,
    torch.float16: 2e-2,
}


def _row_name(flat_index: int, lead_shape: torch.Size) -> str:
    if len(lead_shape) == 0:
        return "the distribution"
    idx = []
    rem = flat_index
    for size in reversed(lead_shape):
        idx.append(rem % size)
        rem //= size
    return f"row {tuple(reversed(idx)) if len(lead_shape) > 1 else idx[0]}"


def _first_bad(mask: Tensor, lead_shape: torch.Size) -> str:
    flat = int(torch.nonzero(mask.reshape(-1))[0, 0])
    return _row_name(flat, lead_shape)


def check_divergence(divergence: str) -> str:
    """``divergence`` if it is one of the known divergences, else a ValueError."""
    if divergence not in DIVERGENCES:
        raise ValueError(f"divergence must be one of {DIVERGENCES}, got {divergence!r}")
    return divergence


def check_tensor_device(x: Tensor, what: str) -> None:
    """A meta tensor has a shape but no values: refuse it before any arithmetic reads them."""
    if x.device.type == "meta":
        raise ValueError(f"{what} is on the meta device (a shape without values); "
                         "load the weights or move the tensor to cpu or cuda first")


def check_distribution_tensor(p: Tensor, what: str = "p") -> None:
    """Shape, dtype and device checks that need no pass over the data."""
    if not isinstance(p, Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(p).__name__}")
    check_tensor_device(p, what)
    if p.dim() < 1:
        raise ValueError(f"{what} must have shape [..., V] with V >= 1, got a scalar")
    if p.shape[-1] < 1:
        raise ValueError(f"{what} must have shape [..., V] with V >= 1, got {tuple(p.shape)}")
    if p.numel() == 0:
        raise ValueError(f"{what} is empty (shape {tuple(p.shape)})")
    if not p.is_floating_point():
        raise ValueError(f"{what} must be a floating-point tensor, got {p.dtype}")


def warn_if_probabilities(logits: Tensor, what: str = "logits", *, stacklevel: int = 2,
                          row_max: Tensor | None = None) -> bool:
    """Warn (and return True) when every row of ``logits`` lies in [0, 1] and sums to 1.

    Such rows are almost surely probabilities passed with ``from_logits=True``: softmax of
    them is nearly uniform and every certificate comes out wrong, with no error to show it.
    Only a heuristic (genuine logits can look like this), hence a warning, not an error.
    ``row_max``: each row's largest value, when the caller already has it (a ``topk``): a row
    above 1 settles the question without a pass over ``logits``. Otherwise the maximum is taken
    first and the minimum only when it is needed (real logits almost always exceed 1 somewhere).
    """
    if logits.numel() == 0 or logits.device.type == "meta":
        return False
    if row_max is not None and bool((row_max > 1).any()):
        return False
    if bool(logits.amax() > 1) or bool(logits.amin() < 0):
        return False
    sums = logits.sum(-1, dtype=torch.float64)
    tol = ROW_SUM_TOLERANCE.get(logits.dtype, 1e-4)
    if not bool(((sums - 1).abs() <= tol).all()):
        return False
    warnings.warn(f"{what}: every row lies in [0, 1] and sums to 1, so these look like probabilities, "
                  "not logits; pass them with from_logits=False", UserWarning, stacklevel=stacklevel)
    return True


def check_probability_rows(p: Tensor, sums: Tensor, what: str = "p") -> None:
    """Raise ``ValueError`` naming the first offending row of probabilities ``p`` with row sums ``sums``.

    Catches NaN/inf entries (their row sum is not finite), negative entries, and sums outside
    the dtype's tolerance (module docstring).
    """
    lead = p.shape[:-1]
    sums = sums.reshape(lead)
    bad = ~torch.isfinite(sums)
    if bool(bad.any()):
        raise ValueError(f"{what} has NaN or infinite entries in {_first_bad(bad, lead)}")
    negative = p.amin(-1) < 0
    if bool(negative.any()):
        raise ValueError(f"{what} has negative probabilities in {_first_bad(negative, lead)}")
    tol = ROW_SUM_TOLERANCE.get(p.dtype, 1e-4)
    off = (sums - 1).abs() > tol
    if bool(off.any()):
        where = _first_bad(off, lead)
        flat = int(torch.nonzero(off.reshape(-1))[0, 0])
        raise ValueError(
            f"{what} must sum to 1 along the last dimension (tolerance {tol:g} for {p.dtype}); "
            f"{where} sums to {float(sums.reshape(-1)[flat]):.6g}. "
            "Pass from_logits=True if these are logits."
        )


def check_logit_rows(logits: Tensor, lse: Tensor, what: str = "logits") -> None:
    """Raise ``ValueError`` for logit rows with NaN, +inf, or no finite entry (``lse`` their log-normalisers).

    ``-inf`` logits (masked tokens) are allowed as long as one entry per row is finite.
    """
    lead = logits.shape[:-1]
    lse = lse.reshape(lead)
    # the log-normaliser is NaN with any NaN, +inf with any +inf, -inf when every entry is -inf.
    for test, problem in ((torch.isnan, "NaN entries"), (torch.isposinf, "+inf entries"),
                          (torch.isneginf, "every entry -inf")):
        bad = test(lse)
        if bool(bad.any()):
            raise ValueError(f"{what} has {problem} in {_first_bad(bad, lead)}")


def check_tree_widths(widths: Any) -> list[int]:
    """One width or an iterable of them, as a list (``certificates`` accepts both spellings)."""
    if isinstance(widths, bool):
        raise ValueError(f"tree_widths must be an integer or a list of integers, got {widths!r}")
    if isinstance(widths, int):
        return [widths]
    if isinstance(widths, (str, bytes)):
        raise ValueError(f"tree_widths must be an integer or a list of integers, got {widths!r}")
    try:
        return list(widths)
    except TypeError:
        raise ValueError(f"tree_widths must be an integer or a list of integers, got {widths!r}") from None


def check_divergences(divergences: Any) -> list[str]:
    """One divergence name or an iterable of them, checked (a bare string is one name, not its letters)."""
    if isinstance(divergences, str):
        return [check_divergence(divergences)]
    try:
        items = list(divergences)
    except TypeError:
        raise ValueError(f"divergences must be one of {DIVERGENCES} or a list of them, got {divergences!r}") from None
    return [check_divergence(d) for d in items]


def check_positive_int(name: str, value: Any) -> int:
    """An integer >= 1 (bool and float refused: 1.5 or True is a mistake, not a count)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_tree_width(m: int, vocab: int) -> int:
    """``m`` if it is an integer tree width with ``1 <= m < vocab``, else a ValueError."""
    if isinstance(m, bool) or not isinstance(m, int):
        raise ValueError(f"tree width m must be an integer, got {m!r}")
    if m < 1:
        raise ValueError(f"tree width m must be >= 1, got {m}")
    if m >= vocab:
        raise ValueError(f"tree width m={m} must be smaller than the vocabulary size V={vocab}")
    return m


def check_token(token: Tensor | int, lead_shape: torch.Size, vocab: int, device: torch.device) -> Tensor:
    """Broadcast a token id (or a tensor of ids over the leading dims) and range-check it."""
    tok = torch.as_tensor(token, device=device)
    if tok.is_floating_point() or tok.dtype == torch.bool:
        raise ValueError(f"token ids must be integers, got dtype {tok.dtype}")
    tok = tok.to(torch.long)
    try:
        tok = tok.expand(lead_shape)
    except RuntimeError as err:
        raise ValueError(
            f"token ids of shape {tuple(tok.shape)} do not match the batch shape {tuple(lead_shape)}"
        ) from err
    out = (tok < 0) | (tok >= vocab)
    if bool(out.any()):
        raise ValueError(f"token id out of range [0, {vocab}) in {_first_bad(out, lead_shape)}")
    return tok


def finite_positive(name: str, value: float, *, allow_zero: bool = False, upper: float | None = None) -> float:
    """Check a scalar parameter; return it as float."""
    try:
        x = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number, got {value!r}") from err
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if x < 0 or (x == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    if upper is not None and x > upper:
        raise ValueError(f"{name} must be <= {upper}, got {value!r}")
    return x
