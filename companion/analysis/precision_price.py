"""What computing certificates from low-precision logits costs, on rows shaped like a model's.

The library lifts the top of a row to float64 and sums the rest in the row's own precision with a
bounded error ``eta`` on the log-normaliser, then lowers every certificate by that bound.
:func:`precision_price` measures, per dtype, on the same logits:

* the normaliser's error ``|log Z_computed - log Z_float64|`` against its stated bound ``eta``
  (asserted ``<=``), and the largest ratio error / bound;
* the relative price ``max (rho_float64 - rho_computed) / rho_float64`` over the criteria and both
  divergences, where ``rho_float64`` is the certificate of the same logits upcast to float64
  (asserted ``rho_computed <= rho_float64`` everywhere).

Chapter 2 runs it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from companion.checks import check_le
from companion.certify.certificates import certificates
from companion.certify.summary import summarize


@dataclass(frozen=True)
class PrecisionPrice:
    """One dtype's numbers: largest normaliser error and bound, their largest ratio, and the
    largest relative price per (criterion, divergence)."""

    dtype: str
    error: float
    bound: float
    use: float
    prices: dict[tuple[str, str], float]

    @property
    def price(self) -> float:
        """The largest relative price over every criterion and divergence."""
        return max(self.prices.values(), default=0.0)

    def largest(self, keep=lambda criterion: True) -> tuple[float, str, str]:
        """(price, criterion, divergence) of the dearest key whose criterion ``keep`` accepts."""
        kept = [(v, c, d) for (c, d), v in self.prices.items() if keep(c)]
        return max(kept, default=(0.0, "", ""))


def lm_shaped_logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """float64 logits ``2.5 N(0, 1)`` with three leading tokens lifted, from nearly flat (row 0)
    to peaked (last row)."""
    gen = torch.Generator().manual_seed(seed)
    z = 2.5 * torch.randn(rows, vocab, generator=gen, dtype=torch.float64)
    lift = torch.linspace(2.0, 16.0, rows, dtype=torch.float64).unsqueeze(1)
    z[:, :3] += lift * torch.tensor([1.0, 0.8, 0.7], dtype=torch.float64)
    return z


def precision_price(z: torch.Tensor, specs: list[str], dtype: torch.dtype) -> PrecisionPrice:
    """Certificates of ``z`` rounded to ``dtype`` against those of the same logits in float64."""
    name = str(dtype).removeprefix("torch.")
    x = z.to(dtype)
    s_x = summarize(x, from_logits=True)
    # the oracle: the same logits upcast to float64, where the float64 path is exact to ~1e-15
    norm_err = (s_x.norm - torch.logsumexp(x.double(), -1)).abs()
    check_le(norm_err, s_x.log_err, f"{name}: the normaliser's error within its stated bound")
    divs = ("forward", "reverse")
    low = certificates(x, list(specs), divs, from_logits=True, logits_dtype="exact")
    ref = certificates(x.double(), list(specs), divs, from_logits=True)
    prices = {}
    for key, val in low.items():
        finite = torch.isfinite(ref[key]) & (ref[key] > 0)
        check_le(val[finite], ref[key][finite], f"{name} {key}: computed certificate <= float64 one",
                 rtol=0.0)
        rel = ((ref[key] - val) / ref[key])[finite]
        prices[key] = float(rel.max()) if rel.numel() else 0.0
    return PrecisionPrice(name, float(norm_err.max()), float(s_x.log_err.max()),
                          float((norm_err / s_x.log_err).max()), prices)
