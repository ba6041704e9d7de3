"""One pass over a batch of target distributions: what every criterion and certificate needs.

Every criterion's threshold depends on the target only through a few order statistics
(``p(1)``, ``p(k)``) and, for typical acceptance, the entropy ``H(p)``; every certificate
depends only on the tokens at or above the boundary of the rejection region. So instead of
sorting 151,936 probabilities we take the top ``K`` of each row once (``torch.topk``), lift
those few values to float64, and reuse them for all criteria. Rows whose boundary lies
beyond ``K`` are rare and are handled separately (see ``certificates``).

The normaliser matters more than it seems: the reverse certificate of a peaked row is
``-log((1 - P_A) + |A| G_A)`` and ``1 - P_A`` is the tail mass, say 1e-5. A float32 sum of the
row carries an absolute error ~1e-7 and would spoil it, a float64 sum costs more than a
softmax. So the tail is summed on its own scale: ``sum_i min(p_i, p(K)) - K p(K)`` keeps the
float32 partial sums as small as the tail itself, and the top ``K`` are added in float64.
The same tail sum, normalised, is kept in the summary (:attr:`TopSummary.tail`): the mass
outside a pool of top tokens is the values left out plus this tail, never ``1 - sum(values)``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from companion.certify.precision import (ENTROPY_CHUNK, EXP_ULPS, U64, chunked_sum, chunked_sum_error, gamma,
                                        logits_dtype_name, tie_band_tensor, underflow_error, underflow_xd_error,
                                        unit_roundoff, xlog2_bound, xlog_bound)
from companion.certify.validation import check_distribution_tensor, check_logit_rows, check_probability_rows

DEFAULT_TOP = 64
# Row tiles for memory-bound passes on the CPU: a full-size temporary (a [256, 151936] clamp or
# log) costs more in fresh-page faults than the arithmetic, while a ~2 MiB tile stays in cache.
_TILE_BYTES = 2 * 2**20
# Block size of the two-stage top-k on the CPU (row_topk): a max over 64 contiguous values
# vectorises well, and k blocks of 64 leave few candidates for the second stage.
_TOPK_BLOCK = 64


@dataclass(frozen=True)
class TopSummary:
    """Normalised float64 top-``K`` probabilities of a batch of rows, flattened to ``[N, K]``.

    ``values[n]`` is sorted in decreasing order, ``indices[n]`` are the token ids, ``vocab`` is
    ``V``; ``norm`` is the float64 row sum (probabilities) or log-sum-exp (logits) the values
    were normalised by; ``entropy`` (nats, float64) is present when requested. ``lead_shape``
    restores the caller's leading dimensions.

    ``tail`` (float64 ``[N]``): the normalised mass of the ``V - K`` tokens beyond ``values``,
    summed on its own scale (0 when ``K = V``). ``logs`` (float64 ``[N, K]``): ``log(values)``,
    taken from the logits as ``l - lse`` when the summary was made from logits, so that it stays
    finite where ``values`` underflows to 0. :func:`summarize` always fills both; a summary built
    by hand may leave them ``None``, and then :meth:`tail_mass` and :meth:`log_values` fall back to
    ``max(0, 1 - sum(values))`` (which loses the digits of a tail far below 1e-16) and ``log(values)``.

    ``top_logits`` (float64 ``[N, K]``): the raw logits of the top ``K`` as given (exact float64
    upcasts, in the order of ``values``), present only when the summary was made from logits
    (``None`` from probabilities or by hand). Criteria that read the logits themselves, not only
    ``p`` (:class:`~companion.certify.criteria.Mars`: ``z(2) / z(1)`` changes when a constant is added to
    the logits), need them.
    """

    values: Tensor
    indices: Tensor
    vocab: int
    lead_shape: torch.Size
    norm: Tensor
    entropy: Tensor | None = None
    tail: Tensor | None = None
    logs: Tensor | None = None
    top_logits: Tensor | None = None
    log_err: Tensor | None = None  # [N]: a bound on |log lambda|, each value's relative rounding
    tail_err: Tensor | None = None
    entropy_err: Tensor | None = None
    band: Tensor | None = None
    working_dtype: torch.dtype | None = None

    @property
    def k(self) -> int:
        """How many top values each row keeps, ``values.shape[-1]``."""
        return self.values.shape[-1]

    def tail_mass(self) -> Tensor:
        """``tail``, or ``max(0, 1 - sum(values))`` for a summary built without one."""
        if self.tail is not None:
            return self.tail
        if self.k >= self.vocab:
            return torch.zeros_like(self.values[:, 0])
        return (1 - self.values.sum(1)).clamp(min=0)

    def guarded(self) -> bool:
        """Whether certificates read from this summary apply its error bounds (rows worked in float32)."""
        return self.log_err is not None and self.working_dtype not in (None, torch.float64)

    def log_values(self) -> Tensor:
        """``logs``, or ``log(values)`` for a summary built without them."""
        return self.logs if self.logs is not None else torch.log(self.values)


def row_topk(flat: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest values of each row of ``flat`` ``[N, V]``, sorted descending, and their indices.

    ``torch.topk``'s values; on the CPU, for ``V >= 4 k B`` (``B = 64``), in two stages. The row is
    cut into blocks of ``B`` contiguous values; the row's top ``k`` lie in the ``k`` blocks with the
    largest maxima (plus the last ``V mod B`` values, always candidates): a value ``x`` in a block
    left out has ``k`` block maxima ``>= x`` above it, one per chosen block, so if ``x`` exceeds the
    ``k``-th value ``v(k)`` there would be ``k + 1`` values above ``v(k)``; and each chosen block
    whose maximum is ``v(k)`` holds a value ``v(k)``, enough to fill the top ``k`` at a tie. So
    ``topk`` over those ``k B`` candidates returns the row's top-``k`` values. The first stage is one
    read of the row (a max per block), the second a ``topk`` over ``k B`` values: about half the
    time of ``torch.topk`` over ``V = 151,936`` float32 values with ``k = 64`` (one thread). Among
    values tied at the ``k``-th, which indices come back is unspecified, as with ``torch.topk``
    (whose CPU kernel does not return the lowest index first either). NaN counts as the largest
    value, as in ``torch.topk``.
    """
    n, vocab = flat.shape
    b = _TOPK_BLOCK
    if flat.device.type != "cpu" or 4 * k * b > vocab or flat.stride(-1) != 1:
        return torch.topk(flat, k, dim=-1, largest=True, sorted=True)
    nb = vocab // b
    body = flat[:, : nb * b].view(n, nb, b)
    blocks = torch.topk(body.amax(-1), k, dim=-1).indices  # [N, k]
    cand = torch.gather(body, 1, blocks.unsqueeze(-1).expand(n, k, b)).view(n, k * b)
    if nb * b < vocab:
        cand = torch.cat([cand, flat[:, nb * b:]], 1)
    values, pos = torch.topk(cand, k, dim=-1, largest=True, sorted=True)
    in_blocks = pos < k * b
    block = torch.gather(blocks, 1, torch.where(in_blocks, pos // b, 0))
    idx = torch.where(in_blocks, block * b + pos % b, nb * b + (pos - k * b))
    return values, idx


def row_tiles(n_rows: int, vocab: int, itemsize: int, device: torch.device) -> Iterator[slice]:
    """Slices of rows to process together: ~2 MiB tiles on the CPU, every row at once elsewhere.

    Not a loop over rows: each tile is one vectorised operation over several rows; only the
    size of the temporaries changes.
    """
    per = n_rows if device.type != "cpu" else max(1, _TILE_BYTES // max(1, vocab * itemsize))
    for start in range(0, n_rows, per):
        yield slice(start, min(n_rows, start + per))


def map_rows(fn: Callable[..., Tensor], flat: Tensor, *row_args: Tensor, idx: Tensor | None = None) -> Tensor:
    """``fn(flat[idx], *(a[idx] for a in row_args))`` for a per-row ``fn`` (rows ``[n, V]`` to ``[n, ...]``),
    evaluated tile by tile (see :func:`row_tiles`) so that no full-size temporary is made.
    ``idx`` selects rows (all when ``None``); ``row_args`` are per-row tensors of the full batch."""
    if idx is not None and idx.numel() == flat.shape[0]:
        idx = None  # every row, in order (idx comes from nonzero): slice instead of gathering
    n = flat.shape[0] if idx is None else idx.numel()
    outs = []
    for tile in row_tiles(n, flat.shape[-1], flat.element_size(), flat.device):
        if idx is None:
            outs.append(fn(flat[tile], *(a[tile] for a in row_args)))
        else:
            sel = idx[tile]
            outs.append(fn(flat.index_select(0, sel), *(a.index_select(0, sel) for a in row_args)))
    if not outs:
        return torch.empty(0, dtype=torch.float64, device=flat.device)
    return torch.cat(outs)


def _tail_sum(x: Tensor, kth: Tensor, k: int, out: Tensor | None = None) -> Tensor:
    """``sum_i x_i`` over all but the ``k`` largest, as ``sum_i min(x_i, x(k)) - k x(k)`` (float64).

    Entries tied with ``x(k)`` beyond the top ``k`` contribute ``x(k)`` either way, so this is
    exact in real arithmetic; in float32 the partial sums stay at the scale of the tail, and
    :func:`~companion.certify.precision.chunked_sum` bounds their error in any summation order.
    NaN entries propagate into the result. ``out``: a work buffer of ``x``'s shape and dtype.
    """
    clamped = torch.clamp(x, max=kth.unsqueeze(-1).to(x.dtype), out=out)
    return chunked_sum(clamped) - k * kth.to(torch.float64)


def summarize(
    p: Tensor,
    *,
    from_logits: bool = False,
    k: int = DEFAULT_TOP,
    with_entropy: bool = False,
    norm: Tensor | None = None,
    log_err: Tensor | None = None,
    what: str = "p",
    logits_dtype: str | None = None,
) -> TopSummary:
    """See :func:`summarize_partial`: the summary alone (the entropy of every row when ``with_entropy``)."""
    return summarize_partial(p, from_logits=from_logits, k=k, with_entropy=with_entropy, norm=norm, log_err=log_err,
                             what=what, logits_dtype=logits_dtype)[0]


def _split_error(u: float, chunk: float, from_logits: bool, clamped: Tensor, tail: Tensor, kth: Tensor,
                 log_kth: Tensor, split: int, vocab: int, under: float = 0.0) -> Tensor:
    """Bound on the error of one tail sum ``sum_i min(x_i, x(s)) - s x(s)`` as the pass computes it
    (raw units: ``x = p``, or ``x = exp(l - l(1))``), :mod:`companion.certify.precision`:

    * logits: each term within ``(2 EXP_ULPS + 1 + |d_i|) u x_i``; the ``s`` clamped top terms within
      ``(2 EXP_ULPS + 1 + |d(s)|) u x(s)``, the tail's ``sum x_i |d_i|`` at most ``T log(n / T)``;
    * probabilities: the clamp at ``x(s)`` rounded to the rows' precision, ``u`` of each clamped term;
    * the chunked sum: ``chunk`` of ``sum |min(x_i, x(s))|``; the float64 subtraction ``2 U64 s x(s)``;
    * logits: ``under`` (:func:`~companion.certify.precision.underflow_error`) for each of the ``V``
      terms, those below the normal range.

    ``clamped``: the computed ``sum_i min(x_i, x(s))`` (>= 0), ``tail``: the computed tail.
    """
    mag = clamped.abs()
    err = chunk * mag + 2 * U64 * split * kth.abs()
    if from_logits:
        slack = tail.clamp(min=0) * (1 + 1e-3) + 1e-300  # the bound's T, above the computed one
        terms = (2 * EXP_ULPS + 1) * mag + split * kth * (-log_kth).clamp(min=0) + xlog_bound(slack, vocab - split)
        err = err + u * terms + vocab * under
    else:
        err = err + u * mag
    return err * (1 + 1e-6)


def summarize_partial(
    p: Tensor,
    *,
    from_logits: bool = False,
    k: int = DEFAULT_TOP,
    with_entropy: bool = False,
    norm: Tensor | None = None,
    log_err: Tensor | None = None,
    what: str = "p",
    entropy_rows: Callable[[Tensor], Tensor] | None = None,
    logits_dtype: str | None = None,
) -> tuple[TopSummary, Tensor | None]:
    """Validate ``p`` (probabilities, or logits with ``from_logits=True``) and summarise it.

    Probabilities: ``values = topk(p) / S`` with ``S = sum(topk(p)) + tail`` in float64.
    Logits ``l``: ``values = exp(topk(l) - lse)`` with ``lse = l(1) + log(sum_i exp(l_i - l(1)))``,
    the sum split the same way into the top ``K`` (float64) and the tail; near-ties keep the
    precision of the logits rather than that of a float32 softmax. ``logs = topk(l) - lse``;
    ``top_logits = topk(l)`` itself (float64; only from logits).
    ``tail``: the mass beyond the top ``k``, ``sum_i min(x_i, x(k)) - k x(k)`` over the row
    (``x = p``, or ``exp(l - l(1))``), divided by the normaliser; for ``k`` below the normaliser's
    split ``K_norm`` it is that split's tail plus the values in between (a sum of positive terms).
    Entropy (``with_entropy``): ``H = -sum_i p_i log p_i``, computed in the pass that sums the tail
    (no pass of its own). From logits, with ``x_i = exp(l_i - l(1))``, ``d_i = l_i - l(1)`` and
    ``S = sum_i x_i = exp(lse - l(1))``: ``H = log S - (sum_i x_i d_i) / S``, both terms >= 0; the
    top ``K_norm`` terms of ``sum x d`` in float64, the rest as ``sum_i min(x_i, x(K)) d_i -
    x(K) sum_{top K} d_i`` (the clamp the tail sum makes anyway, so the float32 part stays at the
    scale of the tail). From probabilities: ``H = (-sum_i x_i log x_i) / S + log S`` (``x = p``).
    Every row gets the error bounds of :class:`TopSummary` (``log_err``, ``tail_err``,
    ``entropy_err``), from :mod:`companion.certify.precision`.
    ``norm`` reuses a normaliser computed earlier for the same rows (so that summaries of
    different ``K`` agree bit for bit), with its bound ``log_err``; the tail is then summed in a
    pass of its own.
    ``logits_dtype`` (logits only): the dtype the logits were computed in, for the kernel-path
    band (:func:`~companion.certify.precision.logits_dtype_name`: by default bfloat16 and float16
    tensors get their dtype's band, float32 and float64 tensors none; ``"bfloat16"`` declares a
    float32 copy of bfloat16 logits, ``"exact"`` asks for none).

    ``entropy_rows`` (probabilities only; ignored with ``with_entropy`` or logits, where every row
    gets its entropy in the summary at the cost of one product per token): called with the raw top
    values (float64 ``[N, K']``, before normalisation) once ``topk`` has run, it returns the rows
    (bool ``[N]``) whose entropy to compute *in the same pass* as the tail sums, while each tile of
    rows is in cache; those entropies come back as the second element (NaN on the other rows),
    equal to what ``with_entropy`` gives, with their bounds in the summary's ``entropy_err``.
    """
    check_distribution_tensor(p, "logits" if from_logits and what == "p" else what)
    band_dtype = logits_dtype_name(p.dtype, logits_dtype) if from_logits else None
    vocab = p.shape[-1]
    k = max(1, min(int(k), vocab))
    flat = p.reshape(-1, vocab)
    u = unit_roundoff(flat.dtype)
    chunk = chunked_sum_error(vocab, flat.dtype)
    chunk_h = chunked_sum_error(vocab, flat.dtype, ENTROPY_CHUNK)  # the entropy's sums
    # The normaliser always splits at the same K_norm, whatever k is asked for, so every
    # function of the library normalises a row to the same float64 numbers.
    k_norm = min(DEFAULT_TOP, vocab)
    top, idx = row_topk(flat, max(k, k_norm))
    # Tail sums needed in the pass over the rows: at K_norm for a new normaliser, and at
    # max(k, K_norm) for the summary's tail (below K_norm the tail is that split's plus the values
    # in between: splitting at a small k would cancel k x(k) against a much smaller tail).
    splits: list[int] = []
    if (norm is None or (with_entropy and from_logits)) and k_norm < vocab:
        splits.append(k_norm)
    if max(k, k_norm) < vocab and max(k, k_norm) not in splits:
        splits.append(max(k, k_norm))
    top64 = top.to(torch.float64)
    errs: dict[int, Tensor] = {}
    entropy_err = None
    if from_logits:
        name = "logits" if what == "p" else what
        m = top64[:, 0]
        # NaN sorts first in topk; keep it so the check reports it, and avoid inf - inf.
        safe_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        # -inf logits: x = 0 and a finite d (as in the pass), so that x d = 0, not 0 * -inf
        d64 = (top64 - safe_m.unsqueeze(1)).clamp(min=-torch.finfo(torch.float32).max)
        scaled = torch.exp(d64)  # exp(l - l(1)), top max(k, K_norm)
        kths = [scaled[:, s - 1] for s in splits]
        wanted = torch.ones_like(m, dtype=torch.bool) if with_entropy else None
        sums = _row_tail_sums(flat, splits, kths, safe_m, wanted)
        # exp below the normal range: an absolute error per term (precision module docstring)
        under = underflow_error(flat.dtype, flat.device)
        for s_, kth in zip(splits, kths):
            errs[s_] = _split_error(u, chunk, True, sums[s_] + s_ * kth, sums[s_], kth, d64[:, s_ - 1], s_, vocab,
                                    under)
        head = scaled[:, :k_norm].contiguous().sum(1)
        # float64 head: each exp within (2 + |d|) U64 (and 3 * 2^-1074 below float64's normal range),
        # the sum gamma_K
        head_err = ((gamma(k_norm, U64) + 4 * U64) * head - U64 * (scaled[:, :k_norm] * d64[:, :k_norm]).sum(1)
                    + k_norm * underflow_error(torch.float64))
        # the normaliser's sum and bound exist only where this pass summed the K_norm split
        split_known = k_norm in sums or k_norm >= vocab
        norm_sum = (head + sums[k_norm] if k_norm < vocab else head) if split_known else None
        norm_err = (head_err + errs[k_norm] if k_norm < vocab else head_err) if split_known else None
        if norm is None:
            norm = torch.where(torch.isfinite(m), safe_m + torch.log(head + (sums[k_norm] if k_norm < vocab else 0)), m)
            check_logit_rows(p, norm, what=name)
            log_err = (norm_err / (norm_sum - norm_err).clamp(min=1e-300) + 4 * U64 * norm.abs()).nan_to_num(0.0)
        scale = torch.exp(safe_m - norm)  # exp(l(1) - lse): turns exp(l - l(1)) into probabilities
        if with_entropy and norm_err is None:
            norm_err = torch.full_like(m, torch.nan)  # unreachable: entropy from logits sums the K_norm split
        if with_entropy:
            # H = log S - sum x d / S, S = 1 + rest: log S = log1p(rest) keeps its digits on peaked
            # rows (S - 1 ~ 1e-13). sum x d: the top K_norm in float64, the tail from the clamp.
            rest = scaled[:, 1:k_norm].contiguous().sum(1)
            xd_head = (scaled[:, :k_norm] * d64[:, :k_norm]).sum(1)
            xd = xd_head
            xd_err = gamma(k_norm + 2, U64) * xd_head.abs()
            if k_norm < vocab:
                rest = rest + sums[k_norm]
                kth = kths[0]
                kth32 = kth.to(flat.dtype if flat.dtype == torch.float64 else torch.float32).to(torch.float64)
                d_top = d64[:, :k_norm].sum(1)
                xd_clamped = sums.pop("xd")
                xd = xd_head + (xd_clamped - kth32 * d_top)
                tail = sums[k_norm].clamp(min=0) * (1 + 1e-3) + 1e-300
                dk = (-d64[:, k_norm - 1]).clamp(min=0)
                n_t = vocab - k_norm
                xd_err = xd_err + (u * ((2 * EXP_ULPS + 3) * xlog_bound(tail, n_t) + xlog2_bound(tail, n_t)
                                        + torch.where(kth > 0, k_norm * kth * dk * (2 * EXP_ULPS + 4 + dk), 0.0))
                                   + chunk_h * xd_clamped.abs() + gamma(k_norm + 2, U64) * (kth32 * d_top).abs()
                                   + vocab * underflow_xd_error(flat.dtype, flat.device)
                                   + k_norm * under * d_top.abs())
            one = 1 + rest
            sums["entropy"] = torch.log1p(rest) - xd / one
            entropy_err = ((norm_err + xd_err) / one + xd.abs() * norm_err / one**2
                           + 8 * U64 * (sums["entropy"].abs() + 1)) * (1 + 1e-6)
    else:
        kths = [top64[:, s - 1] for s in splits]
        if with_entropy:
            wanted = torch.ones_like(top64[:, 0], dtype=torch.bool)
        else:
            wanted = entropy_rows(top64) if entropy_rows is not None else None
        sums = _row_tail_sums(flat, splits, kths, None, wanted)
        zeros = torch.zeros_like(top64[:, 0])
        for s_, kth in zip(splits, kths):
            errs[s_] = _split_error(u, chunk, False, sums[s_] + s_ * kth, sums[s_], kth, zeros, s_, vocab)
        head = top64[:, :k_norm].contiguous().sum(1)
        if norm is None:
            norm_sum = head + sums[k_norm] if k_norm < vocab else head
            norm_err = gamma(k_norm, U64) * head + (errs[k_norm] if k_norm < vocab else 0)
            norm = norm_sum
            check_probability_rows(p, norm, what=what)
            log_err = norm_err / (norm_sum - norm_err).clamp(min=1e-300) + 2 * U64
        scaled = top64
        scale = 1.0 / norm
    if k >= vocab:
        tail_raw = torch.zeros_like(norm)
        tail_raw_err = torch.zeros_like(norm)
    elif k in sums:
        tail_raw = sums[k]
        tail_raw_err = errs[k]
    else:  # k < K_norm, the K_norm tail at hand (0 when K_norm = V): add the values in between
        tail_raw = scaled[:, k:k_norm].sum(1)
        tail_raw_err = gamma(k_norm, U64) * 4 * tail_raw
        if k_norm < vocab:
            tail_raw = sums[k_norm] + tail_raw
            tail_raw_err = tail_raw_err + errs[k_norm]
    tail = (tail_raw * scale).clamp(min=0)
    tail_err = None
    if log_err is not None:
        tail_err = tail_raw_err * scale + tail * (torch.expm1(log_err) + 2 * U64)
    top, idx = top[:, :k], idx[:, :k]
    if from_logits:
        logs = top.to(torch.float64) - norm.unsqueeze(1)
        values = torch.exp(logs)
    else:
        values = top.to(torch.float64) / norm.unsqueeze(1)
        logs = torch.log(values)
    partial = None
    if "entropy" in sums:
        partial = sums["entropy"]
        if not from_logits:  # -sum x log x of the raw rows, as entropy_of_rows normalises it
            j = partial
            partial = j / norm + torch.log(norm)
            # each x log x within (2 EXP_ULPS + 1) u, the chunked sum; the normaliser's error twice
            j_err = ((2 * EXP_ULPS + 1) * u + chunk_h) * j.abs() * (1 + 1e-6) + vocab * 1e-36
            s_err = norm.abs() * torch.expm1(log_err) if log_err is not None else torch.zeros_like(norm)
            entropy_err = (j_err / norm + j.abs() * s_err / norm**2 + s_err / norm
                           + 8 * U64 * (partial.abs() + 1)) * (1 + 1e-6)
    entropy = partial if with_entropy else None
    band = None
    if band_dtype is not None:
        band = tie_band_tensor(top64[:, 0], band_dtype)
    summary = TopSummary(values=values, indices=idx, vocab=vocab, lead_shape=p.shape[:-1], norm=norm, entropy=entropy,
                         tail=tail, logs=logs, top_logits=top.to(torch.float64) if from_logits else None,
                         log_err=log_err, tail_err=tail_err,
                         entropy_err=entropy_err if (entropy is not None or partial is not None) else None, band=band,
                         working_dtype=flat.dtype)
    return summary, partial


def _row_tail_sums(flat: Tensor, splits: list[int], kths: list[Tensor], shift: Tensor | None,
                   entropy_rows: Tensor | None = None) -> dict[int | str, Tensor]:
    """``{s: sum of x over all but the s largest}`` for each split ``s``, in one pass over the rows.

    ``x = flat`` (probabilities, ``shift`` None) or ``x = exp(flat - shift)`` (logits);
    ``kths[i]`` is ``x(s_i)`` in float64. See :func:`_tail_sum`. With ``entropy_rows`` (bool
    ``[N]``), also, on each tile while it is in cache: probabilities, ``"entropy"``: ``-sum x log x``
    of those rows (NaN elsewhere); logits, ``"xd"``: ``sum min(x, x(s_0)) d`` with
    ``d = flat - shift <= 0`` of every row, ``s_0`` the first split (a product per token of the
    clamp the tail sum makes anyway; ``-inf`` logits give 0).
    """
    with_ent = entropy_rows is not None and bool(entropy_rows.any())
    if not splits and not with_ent:
        return {}
    # Work buffers reused by every tile (a fresh tile-sized temporary per tile would be new pages
    # from the OS each time): the entropy's log (probabilities); d, x and the tail clamp (logits).
    buf: list[Tensor] = []

    def scratch(i: int, like: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """Buffer ``i``, of ``like``'s shape and dtype (or ``dtype``), reused across tiles."""
        dtype = like.dtype if dtype is None else dtype
        while len(buf) <= i:
            buf.append(torch.empty(0))
        if buf[i].shape[0] < like.shape[0] or buf[i].shape[1:] != like.shape[1:] or buf[i].dtype != dtype:
            buf[i] = torch.empty(like.shape, dtype=dtype, device=like.device)
        return buf[i][: like.shape[0]]

    def tile(rows: Tensor, *args: Tensor, finite_d: bool = False) -> Tensor:
        if with_ent:
            want, args = args[-1], args[:-1]
        if shift is None:
            x = rows
            ks = args
            cols = [_tail_sum(x, kth.to(x.dtype), s, out=scratch(1, x)) for s, kth in zip(splits, ks)]
        else:
            work = rows if rows.dtype in (torch.float32, torch.float64) else rows.float()
            d = torch.sub(work, args[0].unsqueeze(1).to(work.dtype), out=scratch(0, work))
            if finite_d:  # -inf logits: x = 0 and a finite d, so that x d = 0 (not 0 * -inf)
                d.clamp_(min=-torch.finfo(d.dtype).max)
            x = torch.exp(d, out=scratch(1, work))
            ks = args[1:]
            cols = []
            for i, (s, kth) in enumerate(zip(splits, ks)):
                clamped = scratch(2, work)
                cols.append(_tail_sum(x, kth.to(x.dtype), s, out=clamped))
                if with_ent and i == 0:  # the clamp at the first split, times d: the tail's sum x d
                    xd_col = chunked_sum(torch.mul(clamped, d, out=clamped), ENTROPY_CHUNK)
            if with_ent:
                cols.append(xd_col if splits else chunked_sum(torch.mul(x, d, out=d), ENTROPY_CHUNK))
                # x d is NaN only where a logit is -inf (0 * -inf) or NaN: only then is the tile
                # redone with d clamped to a finite value (a pass the common tile does without)
                if not finite_d and bool(cols[-1].isnan().any()):
                    return tile(rows, *args, want, finite_d=True)
            return torch.stack(cols, dim=1) if cols else torch.empty(rows.shape[0], 0, dtype=torch.float64)
        if with_ent:
            ent = torch.full_like(want, torch.nan, dtype=torch.float64)
            sel = torch.nonzero(want).squeeze(1)
            if sel.numel() == rows.shape[0] and rows.dtype in (torch.float32, torch.float64):
                ent = _neg_xlogx_sum(rows, out=scratch(0, rows))
            elif sel.numel():
                ent = ent.index_copy(0, sel, _neg_xlogx_sum(rows.index_select(0, sel)))
            cols.append(ent)
        return torch.stack(cols, dim=1)

    row_args = ([shift] if shift is not None else []) + kths + ([entropy_rows] if with_ent else [])
    out = map_rows(tile, flat, *row_args)
    # _tail_sum subtracts s * x(s) in float64 from the float64 kth given (exactly as before)
    sums: dict[int | str, Tensor] = {s: out[:, i] for i, s in enumerate(splits)}
    if with_ent:
        if shift is None:
            sums["entropy"] = out[:, len(splits)]
        else:
            sums["xd"] = out[:, len(splits)]
    return sums


def _neg_xlogx_sum(rows: Tensor, out: Tensor | None = None) -> Tensor:
    """``-sum_i x_i log x_i`` of each row of probabilities (unnormalised), float64: see :func:`entropy_of_rows`.
    ``out``: a work buffer of the rows' shape and dtype (float32/float64 rows) to compute in."""
    work = rows if rows.dtype in (torch.float32, torch.float64) else rows.float()
    # sum x log x as log(max(x, tiny)) * x: x = 0 gives 0 * finite = 0 exactly, a subnormal x an
    # error below 1e-36; half the cost of special.entr. Each term within (2 EXP_ULPS + 1) u of its
    # value, the chunked sum within chunked_sum_error (summarize_partial's entropy_err).
    tiny = torch.finfo(work.dtype).tiny
    clamped = work.clamp(min=tiny) if out is None else torch.clamp(work, min=tiny, out=out)
    return -chunked_sum(clamped.log_().mul_(work), ENTROPY_CHUNK)


def entropy_of_rows(flat: Tensor, norm: Tensor, from_logits: bool) -> Tensor:
    """``H = -sum p log p`` (nats, float64) of rows ``[N, V]``, in one pass over them.

    See :func:`entropy_with_error`, which also returns a bound on its error."""
    return entropy_with_error(flat, norm, from_logits)[0]


def entropy_with_error(flat: Tensor, norm: Tensor, from_logits: bool,
                       log_err: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(H, bound on |H - exact H|)`` (nats, float64) of rows ``[N, V]``, in one pass over them.

    Probabilities (row sums ``S = norm``, within a factor ``exp(log_err)`` of the exact sums):
    ``H = (-sum_i x_i log x_i) / S + log S``.
    Logits (``norm``, the log-sum-exp, is not needed): with ``d_i = l_i - l(1) <= 0``,
    ``x_i = exp(d_i)`` and ``S = 1 + r``, ``r`` the sum of ``x`` over every token but the first
    maximiser, ``H = log1p(r) - (sum_i x_i d_i) / S`` (masked ``-inf`` logits contribute 0).
    ``r`` is summed on its own (the maximiser's ``x = 1`` set to 0), so that ``log S`` keeps its
    digits on peaked rows (``S - 1 ~ 1e-13``). The bound is that of
    :mod:`companion.certify.precision` over all ``V - 1`` terms (looser than the fused pass of
    :func:`summarize_partial`, which splits off the top ``K``).
    """
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    vocab = flat.shape[-1]
    u = unit_roundoff(flat.dtype)
    chunk = chunked_sum_error(vocab, flat.dtype)
    if from_logits:
        top, where = work.max(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        d = (work - top).clamp_(min=-torch.finfo(work.dtype).max)
        x = torch.exp(d)
        xd = chunked_sum(x * d)
        rest = chunked_sum(x.scatter_(-1, where, 0.0))
        one = 1 + rest
        h = torch.log1p(rest) - xd / one
        slack = rest.clamp(min=0) * (1 + 1e-3) + 1e-300
        under = vocab * underflow_error(flat.dtype, flat.device)  # terms below the normal range
        rest_err = ((2 * EXP_ULPS + 1) * u * rest + u * xlog_bound(slack, vocab - 1) + chunk * rest + under) * (1 + 1e-6)
        xd_err = (u * ((2 * EXP_ULPS + 3) * xlog_bound(slack, vocab - 1) + xlog2_bound(slack, vocab - 1))
                  + chunk * xd.abs() + vocab * underflow_xd_error(flat.dtype, flat.device)) * (1 + 1e-6)
        err = (rest_err + xd_err) / one + xd.abs() * rest_err / one**2 + 8 * U64 * (h.abs() + 1)
        return h, err * (1 + 1e-6)
    # H of p/S equals H(p)/S + log S for an unnormalised row with sum S.
    j = _neg_xlogx_sum(work)
    h = j / norm + torch.log(norm)
    j_err = ((2 * EXP_ULPS + 1) * u + chunked_sum_error(vocab, flat.dtype, ENTROPY_CHUNK)) * j.abs() * (1 + 1e-6)
    j_err = j_err + vocab * 1e-36
    s_err = norm.abs() * torch.expm1(log_err) if log_err is not None else torch.zeros_like(norm)
    err = j_err / norm + j.abs() * s_err / norm**2 + s_err / norm + 8 * U64 * (h.abs() + 1)
    return h, err * (1 + 1e-6)


def sorted_rows(p: Tensor, *, from_logits: bool = False, with_entropy: bool = False, what: str = "p") -> TopSummary:
    """The complete summary (``K = V``): every row fully sorted. For witnesses and references."""
    return summarize(p, from_logits=from_logits, k=p.shape[-1], with_entropy=with_entropy, what=what)


def normalized_probabilities(p: Tensor, *, from_logits: bool = False, what: str = "p") -> Tensor:
    """Validated float64 probabilities ``p / sum(p)`` (or ``softmax(logits)``), same shape.

    Float64 over the whole vocabulary: for the decisions that need every token in float64 (a
    rejection mask, its ties at the threshold) and for references in tests; the certificates'
    path reads only a summary's top values in float64 (a caller wanting a few tokens gathers
    them first and normalises them by ``summarize(p).norm``, as :meth:`Criterion.accepts` does)."""
    return normalized_with_error(p, from_logits=from_logits, what=what)[0]


def normalized_with_error(p: Tensor, *, from_logits: bool = False, what: str = "p") -> tuple[Tensor, Tensor]:
    """:func:`normalized_probabilities` and, per row (shape ``p.shape[:-1]``), the bound ``eta`` of
    :attr:`TopSummary.log_err`: every value is within a factor ``exp(eta)`` of the exact
    probability (plus its own float64 rounding), whatever the dtype."""
    s = summarize(p, from_logits=from_logits, k=1, what=what)
    norm = s.norm.reshape(p.shape[:-1] + (1,))
    probs = torch.exp(p.to(torch.float64) - norm) if from_logits else p.to(torch.float64) / norm
    return probs, s.log_err.reshape(p.shape[:-1])
