"""One error model for the certificate engine: how far a computed number may be from the exact one.

A certificate is a promise about the *exact* distribution of the input as given (the logits or
probabilities, normalised in exact arithmetic). The engine computes in float64, except for one
pass over the vocabulary that runs in the rows' own precision (float32 for float32, bfloat16
and float16 rows): the normaliser's tail beyond the top ``K`` and, for typical acceptance, the
entropy. This module states the rounding bounds of that pass; :mod:`companion.certify.summary`
carries them per row and :mod:`companion.certify.certificates` turns them into certificates that
are never above the exact value. ``u`` is the unit roundoff of the working precision
(``2^-24`` for float32, ``2^-53`` for float64).

**Sums, in any order.** A sum of ``s`` floating-point terms, added in any order (any kernel,
any number of threads), is off by at most ``gamma_{s-1} sum |x_i|`` with
``gamma_k = k u / (1 - k u)`` (the classical bound of recursive summation holds for every
binary summation tree, since no term passes through more than ``s - 1`` additions). For
``V = 151,936`` float32 terms that is ``9e-3`` of the sum: useless. The bound counts additions
per term, so the engine bounds the count instead of trusting the kernel: it adds the row in
float32 in ``V / 4`` partial sums of :data:`CHUNK` ``= 4`` terms each (``gamma_3 = 1.8e-7``,
in any order), and the partial sums in float64 (``gamma_{V/4} < 4.3e-12``). A bound that holds
for every kernel and thread count, at about 2.5 times the cost of a plain float32 sum over a row
tile (measured, one thread: chunks of 16, 8 and 4 cost 1.3, 1.7 and 2.5 sums; chunks of 16,
``gamma_15 = 8.9e-7``, left certificates of LM-like logits up to 1.4e-6 below the exact value,
chunks of 4 leave 0.9e-6); a pairwise tree of depth 4 (``gamma_4 = 2.4e-7``) cost 2.7 times, and
summing every term in float64 more.

**Terms.** From logits ``l`` the pass computes ``x_i = exp(d_i)``, ``d_i = l_i - l(1) <= 0``, in
float32. The subtraction rounds ``d`` to within ``u |d_i|``, and ``exp`` is within
:data:`EXP_ULPS` units in the last place (two ulps: CUDA's ``expf`` bound; glibc and SLEEF,
torch's CPU kernels, are within one); an ulp is at most ``2u`` of the value. So each term is
within ``(2 EXP_ULPS + |d_i|) u x_i`` of ``exp(l_i - l(1))``; clamping at the ``K``-th value
rounded to float32 adds ``u`` for the terms at that value. Summed over the tail, the weights
``x_i |d_i| = x_i log(1 / x_i)`` need a bound in terms of the tail's sum ``T`` alone:
``-x log x`` is concave, so by Jensen, over ``n`` terms in ``[0, 1]`` with sum ``T``
(:func:`xlog_bound`, :func:`xlog2_bound`)::

    sum_i x_i log(1 / x_i)   <=  T log(n / T)
    sum_i x_i log(1 / x_i)^2 <=  n h(T / n),  h(y) = y log(y)^2 for y <= e^-2, 4 e^-2 above

``h`` being the least concave majorant of ``y log(y)^2`` on ``[0, 1]``. From probabilities the
terms are the data themselves: only the clamp and the summation round.

**Below the normal range.** The relative bound on ``exp`` holds only for results in the normal
range. ``exp(d_i)`` falls below it about 87 nats below the top in float32 (``2^-126``; 708 in
float64) and into 0 about 104 nats below (``2^-149``); there the result is a multiple of the
smallest subnormal spacing ``s`` (``2^-149``; ``2^-1074`` in float64) and its error is absolute:
at most :data:`EXP_ULPS` spacings (half of one measured, correctly rounded, on torch's CPU kernels),
and below ``s / 2`` the term is 0 with an error below ``s``. The clamp's ``K``-th value rounded to
float32 adds ``s / 2``. :func:`underflow_error` is that per-term bound, ``(EXP_ULPS + 1) s``, and the
passes add it once per term of the vocabulary as a block (``V (EXP_ULPS + 1) s``, ``2e-40`` of
the top term at ``V = 151,936``: no count of the terms concerned is needed, and the price on a row
whose tail is not itself within a few orders of ``1e-40`` is nil). A product ``x_i d_i`` of such
a term (the entropy's) is off by at most that times ``|d_i| <= log(1 / s) + 2``
(:func:`underflow_xd_error`; for ``d_i`` beyond it ``|x_i d_i| = |d_i| e^{d_i}`` is smaller
still). Sums of subnormals are exact (gradual underflow), so the summation bound is unchanged. A
device that flushes subnormals to zero (``torch.set_flush_denormal(True)``; a kernel built with
``-ftz``) loses each term below ``2^-126`` whole: :func:`underflow_error` asks the device (one
scalar ``exp``) and returns ``(EXP_ULPS + 1) 2^-126`` there.

**Kernel paths.** A model computes the same logits along several kernel paths (a one-token
decode step, a ``k+1``-token verification forward, one forward over a whole prefix). In
bfloat16 and float16 they differ by an ulp or two of the logits, and a greedy token whose top-2
gap is within that may differ between paths: :func:`tie_band` is the gap under which two logits
count as tied (:data:`TIE_ULPS` ulps of the larger; :mod:`companion.harvest.ties` gives the argument,
:mod:`companion.harvest.kernel_paths` the measurement on the default pair's four kernel paths). It is
an allowance measured on the book's models, not a theorem.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

#: Unit roundoff of float32 and float64 (round to nearest).
U32 = 2.0**-24
U64 = 2.0**-53
#: Terms of each float32 partial sum before the partial sums go to float64.
CHUNK = 4
#: The same for the entropy's sums (``sum x log x``, ``sum x d``): the entropy moves a typical
#: threshold, not the certificate itself, so a looser bound there costs little and the pass less.
ENTROPY_CHUNK = 16
#: Bound on the error of ``exp`` and ``log`` in float32, in units in the last place.
EXP_ULPS = 2
#: Explicit significand bits of the dtypes a model computes in.
SIGNIFICAND_BITS: dict[str, int] = {"bfloat16": 7, "float16": 10, "float32": 23, "float64": 52}
#: The kernel-path band, in units in the last place of the larger logit.
TIE_ULPS = 4


_FLUSHES: dict[str, bool] = {}


def _flushes_subnormals(device: torch.device) -> bool:
    """Whether float32 ``exp`` on ``device`` flushes results below the normal range to 0 (asked of
    the CPU every time, since ``torch.set_flush_denormal`` may change; of other devices once)."""
    key = str(device)
    if device.type != "cpu" and key in _FLUSHES:
        return _FLUSHES[key]
    probe = torch.exp(torch.full((1,), -100.0, dtype=torch.float32, device=device))  # 3.7e-44, subnormal
    flushes = bool(probe[0] == 0)
    _FLUSHES[key] = flushes
    return flushes


def underflow_error(dtype: torch.dtype, device: torch.device | str = "cpu") -> float:
    """Absolute bound, per term, on the error of ``exp(d)`` computed in the working precision of
    ``dtype`` rows beyond the relative bound (module docstring, *Below the normal range*):
    ``(EXP_ULPS + 1) s`` with ``s`` the smallest subnormal (``2^-149`` float32, ``2^-1074``
    float64), or ``(EXP_ULPS + 1) 2^-126`` on a device that flushes float32 subnormals to zero."""
    device = torch.device(device)
    if dtype == torch.float64:
        return (EXP_ULPS + 1) * 2.0**-1074
    if _flushes_subnormals(device):
        return (EXP_ULPS + 1) * 2.0**-126
    return (EXP_ULPS + 1) * 2.0**-149


def underflow_xd_error(dtype: torch.dtype, device: torch.device | str = "cpu") -> float:
    """The same for a product ``x d`` (``x = exp(d)``): :func:`underflow_error` times the largest
    ``|d|`` at which ``x`` is not 0 (``log(1 / s) + 2``), plus ``s`` for the product's own rounding."""
    spacing = 2.0**-1074 if dtype == torch.float64 else 2.0**-149
    return underflow_error(dtype, device) * (-math.log(spacing) + 2) + spacing


def unit_roundoff(dtype: torch.dtype) -> float:
    """``u`` of the precision a row of ``dtype`` is worked in: float64 for float64, float32 otherwise."""
    return U64 if dtype == torch.float64 else U32


def gamma(k: float, u: float) -> float:
    """``gamma_k = k u / (1 - k u)``: the relative bound of a sum of ``k + 1`` terms in any order."""
    return k * u / (1.0 - k * u)


def chunked_sum(x: Tensor, chunk: int = CHUNK) -> Tensor:
    """``sum_i x_i`` over the last axis of a 2-D tensor, float64 ``[N]``.

    float64 rows are summed as they are. Other rows (worked in float32): the first
    ``m * chunk`` terms are viewed as ``chunk`` blocks of ``m`` and the blocks added onto each
    other in float32 (one reduction over the block axis: each of the ``m`` partial sums adds
    ``chunk`` terms, in whatever order the kernel takes), then the partial sums and the last
    ``< chunk`` terms are added in float64. ``chunk``: :data:`CHUNK` by default (tail sums),
    :data:`ENTROPY_CHUNK` for the entropy's sums. :func:`chunked_sum_error` bounds the result's error.
    One read of the row and a write of ``1/CHUNK`` of it: measured at about 2.5 float32 sums, where
    a pairwise tree of depth 4 (a larger bound) cost 2.7.
    """
    if x.dtype == torch.float64:
        return x.sum(-1)
    if x.dtype != torch.float32:
        x = x.float()
    n = x.shape[-1]
    m = n // chunk
    rest = x[:, m * chunk:].sum(-1, dtype=torch.float64) if m * chunk < n else None
    if m == 0:
        return rest if rest is not None else torch.zeros(x.shape[0], dtype=torch.float64, device=x.device)
    partial = x[:, : m * chunk].reshape(x.shape[0], chunk, m).sum(1)
    total = partial.sum(-1, dtype=torch.float64)
    return total + rest if rest is not None else total


def chunked_sum_error(n: int, dtype: torch.dtype, chunk: int = CHUNK) -> float:
    """Relative bound (of ``sum |x_i|``) on the error of :func:`chunked_sum` over ``n`` terms of ``dtype``.

    float64: ``gamma_{n-1}`` (any order). Otherwise each term passes through at most ``chunk - 1``
    float32 additions (``gamma_{chunk-1}``, any order) and the float64 sum of at most
    ``n / chunk + chunk`` numbers (``gamma`` of that count in float64)."""
    if dtype == torch.float64:
        return gamma(max(n - 1, 0), U64)
    parts = n // chunk + chunk
    return gamma(chunk - 1, U32) * (1 + gamma(parts, U64)) + gamma(parts, U64)


def xlog_bound(total: Tensor, n: Tensor | int) -> Tensor:
    """``T log(n / T)``: the largest ``sum x_i log(1/x_i)`` of ``n`` terms in ``[0, 1]`` with sum ``T``
    (``T log(n/T)`` rises with ``T`` up to ``n / e``; past it the bound is ``n / e``). 0 at ``T = 0``."""
    n = torch.as_tensor(n, dtype=torch.float64, device=total.device)
    t = torch.minimum(total.clamp(min=0), n / math.e)
    return torch.where(t > 0, t * torch.log(n / t.clamp(min=1e-300)), torch.zeros_like(t))


def xlog2_bound(total: Tensor, n: Tensor | int) -> Tensor:
    """``n h(T / n)``: the largest ``sum x_i log(x_i)^2`` of ``n`` terms in ``[0, 1]`` with sum ``T``
    (``h`` the concave majorant in the module docstring). 0 at ``T = 0``."""
    n = torch.as_tensor(n, dtype=torch.float64, device=total.device)
    y = (total.clamp(min=0) / n).clamp(max=math.exp(-2))
    return torch.where(y > 0, n * y * torch.log(y.clamp(min=1e-300)) ** 2, torch.zeros_like(y))


def ulp(z: np.ndarray | float, dtype: str) -> np.ndarray:
    """The spacing of ``dtype``'s numbers at ``|z|``: ``2^(floor(log2 |z|) - b)`` (at ``z = 0``: that of 1)."""
    if dtype not in SIGNIFICAND_BITS:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(SIGNIFICAND_BITS)}")
    a = np.abs(np.asarray(z, dtype=np.float64))
    exponent = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    return np.ldexp(1.0, (exponent - SIGNIFICAND_BITS[dtype]).astype(np.int64))


def tie_band(z1: np.ndarray | float, dtype: str, ulps: float = TIE_ULPS) -> np.ndarray:
    """The largest top-2 logit gap that counts as a near tie at top logit ``z1``: ``ulps * ulp(z1)``."""
    return ulps * ulp(z1, dtype)


def tie_band_tensor(z1: Tensor, dtype: str, ulps: float = TIE_ULPS) -> Tensor:
    """:func:`tie_band` for a float64 tensor of top logits, on its device (``-inf``/NaN rows: 0)."""
    if dtype not in SIGNIFICAND_BITS:
        raise ValueError(f"unknown logits dtype {dtype!r}: expected one of {', '.join(SIGNIFICAND_BITS)}")
    a = z1.abs()
    a = torch.where(torch.isfinite(a) & (a > 0), a, torch.ones_like(a))
    exponent = torch.floor(torch.log2(a))
    band = ulps * torch.exp2(exponent - SIGNIFICAND_BITS[dtype])
    return torch.where(torch.isfinite(z1), band, torch.zeros_like(band))


def logits_dtype_name(dtype: torch.dtype, declared: str | None) -> str | None:
    """The dtype whose kernel-path band applies to logits of tensor dtype ``dtype``: ``declared``
    when given (``"exact"``: none), else bfloat16 or float16 for tensors of those dtypes and none
    for float32 and float64 tensors (whose caller knows whether they are copies of lower-precision
    logits and says so)."""
    if declared is not None:
        if declared == "exact":
            return None
        if declared not in SIGNIFICAND_BITS:
            raise ValueError(f"logits_dtype must be one of {', '.join(SIGNIFICAND_BITS)} or 'exact', got {declared!r}")
        return None if declared == "float64" else declared
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype)


def lower_log_normaliser(cost: Tensor, log_err: Tensor, tail_err: Tensor, mismatch: Tensor) -> Tensor:
    """A certificate ``C = -log X`` computed from normalised values, lowered to at most the exact one.

    ``X`` is a tilted normaliser: the mass ``t`` beyond the top values plus the pool's complement
    plus ``|A|`` times a mean of the pool ``A``, so ``X >= t`` and ``X`` is homogeneous of degree 1
    in the top values ``v``. The computed ``v`` are the exact probabilities ``e`` times a common
    ``lambda``, ``|log lambda| <= log_err``, ``delta = e^log_err - 1``; the computed tail is within
    ``tail_err`` of the exact one, and ``v`` and the tail sum to 1 up to ``mismatch`` (as exact
    probabilities do). Two identities bound ``X(e)``; the lowered certificate is the larger of the two:

    * ``X(v) - X(e) = (lambda - 1)(X(e) - t) + (t_hat - t)``, so ``X(e) <= (X(v) + tail_err) / (1 - delta)``
      and ``C_exact >= C + log(1 - delta) - log(1 + tail_err e^C)`` (tight where the tail is known
      to within a small fraction of ``X``: peaked rows, probabilities with a short tail);
    * ``X(v) - X(e) = mismatch - (lambda - 1)(1 - X(e))``, so
      ``X(e) <= (X(v) + |mismatch| + delta) / (1 + delta)`` and
      ``C_exact >= C - log(1 + (|mismatch| + delta) e^C) + log(1 + delta)``: a loss of about
      ``|mismatch| + delta C``, relative in the normaliser's error (small certificates on flat rows).

    ``+inf`` stays ``+inf``; the result is never below 0.
    """
    delta = torch.expm1(log_err)
    by_tail = cost + torch.log1p(-delta.clamp(max=0.5)) - torch.logaddexp(
        torch.zeros_like(cost), torch.log(tail_err.clamp(min=1e-300)) + cost)
    slack = (mismatch.abs() + delta).clamp(min=1e-300)
    by_sum = cost - torch.logaddexp(torch.zeros_like(cost), torch.log(slack) + cost) + torch.log1p(delta)
    lowered = torch.maximum(by_tail, by_sum).clamp(min=0)
    return torch.where(torch.isposinf(cost), cost, lowered)


def normalisation_mismatch(values: Tensor, tail: Tensor) -> Tensor:
    """``|sum(values) + tail - 1|`` of normalised float64 top values ``[N, K]`` and their tail ``[N]``,
    plus the float64 rounding of that sum (``gamma_{K+1}`` of the magnitudes): a bound on the
    mismatch of :func:`lower_log_normaliser`."""
    total = values.sum(1) + tail
    return (total - 1).abs() + gamma(values.shape[1] + 2, U64) * (total.abs() + 1)
