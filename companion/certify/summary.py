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

from companion.certify.validation import check_distribution_tensor, check_logit_rows, check_probability_rows

DEFAULT_TOP = 64
# Row tiles for memory-bound passes on the CPU: a full-size temporary (a [256, 151936] clamp or
# log) costs more in fresh-page faults than the arithmetic, while a ~2 MiB tile stays in cache.
_TILE_BYTES = 2 * 2**20


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

    @property
    def k(self) -> int:
        return self.values.shape[-1]

    def tail_mass(self) -> Tensor:
        """``tail``, or ``max(0, 1 - sum(values))`` for a summary built without one."""
        if self.tail is not None:
            return self.tail
        if self.k >= self.vocab:
            return torch.zeros_like(self.values[:, 0])
        return (1 - self.values.sum(1)).clamp(min=0)

    def log_values(self) -> Tensor:
        """``logs``, or ``log(values)`` for a summary built without them."""
        return self.logs if self.logs is not None else torch.log(self.values)


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
    exact in real arithmetic; in float32 the partial sums stay at the scale of the tail.
    NaN entries propagate into the result. ``out``: a work buffer of ``x``'s shape and dtype.
    """
    clamped = torch.clamp(x, max=kth.unsqueeze(-1).to(x.dtype), out=out)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    return clamped.sum(-1, dtype=acc).to(torch.float64) - k * kth.to(torch.float64)


def summarize(
    p: Tensor,
    *,
    from_logits: bool = False,
    k: int = DEFAULT_TOP,
    with_entropy: bool = False,
    norm: Tensor | None = None,
    what: str = "p",
) -> TopSummary:
    """See :func:`summarize_partial`: the summary alone (the entropy of every row when ``with_entropy``)."""
    return summarize_partial(p, from_logits=from_logits, k=k, with_entropy=with_entropy, norm=norm, what=what)[0]


def summarize_partial(
    p: Tensor,
    *,
    from_logits: bool = False,
    k: int = DEFAULT_TOP,
    with_entropy: bool = False,
    norm: Tensor | None = None,
    what: str = "p",
    entropy_rows: Callable[[Tensor], Tensor] | None = None,
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
    (no pass of its own). From logits, with ``x_i = exp(l_i - l(1))`` (which that pass computes
    anyway) and ``S = sum_i x_i = exp(lse - l(1))``: ``H = log S - (sum_i x_i (l_i - l(1))) / S``, one
    product per token and no logarithm; both terms are >= 0, so nothing cancels. From
    probabilities: ``H = (-sum_i x_i log x_i) / S + log S`` (``x = p``, ``S`` the row sum). The
    per-token sums accumulate in the rows' precision (float32 for float32, bfloat16 and float16
    rows: relative error ~1e-7), the rest is float64.
    ``norm`` reuses a normaliser computed earlier for the same rows (so that summaries of
    different ``K`` agree bit for bit); the tail is then summed in a pass of its own.

    ``entropy_rows`` (probabilities only; ignored with ``with_entropy`` or logits, where every row
    gets its entropy in the summary at the cost of one product per token): called with the raw top
    values (float64 ``[N, K']``, before normalisation) once ``topk`` has run, it returns the rows
    (bool ``[N]``) whose entropy to compute *in the same pass* as the tail sums, while each tile of
    rows is in cache; those entropies come back as the second element (NaN on the other rows),
    equal to what ``with_entropy`` gives. For callers that need the entropy only on some rows
    (typical acceptance where the top ``K`` do not settle the threshold): on probabilities the
    entropy costs a logarithm per token, so it is taken only on those rows.
    """
    check_distribution_tensor(p, "logits" if from_logits and what == "p" else what)
    vocab = p.shape[-1]
    k = max(1, min(int(k), vocab))
    flat = p.reshape(-1, vocab)
    # The normaliser always splits at the same K_norm, whatever k is asked for, so every
    # function of the library normalises a row to the same float64 numbers.
    k_norm = min(DEFAULT_TOP, vocab)
    top, idx = torch.topk(flat, max(k, k_norm), dim=-1, largest=True, sorted=True)
    # Tail sums needed in the pass over the rows: at K_norm for a new normaliser, and at
    # max(k, K_norm) for the summary's tail (below K_norm the tail is that split's plus the values
    # in between: splitting at a small k would cancel k x(k) against a much smaller tail).
    splits: list[int] = []
    if (norm is None or (with_entropy and from_logits)) and k_norm < vocab:
        splits.append(k_norm)
    if max(k, k_norm) < vocab and max(k, k_norm) not in splits:
        splits.append(max(k, k_norm))
    if from_logits:
        name = "logits" if what == "p" else what
        m = top[:, 0].to(torch.float64)
        # NaN sorts first in topk; keep it so the check reports it, and avoid inf - inf.
        safe_m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        scaled = torch.exp(top.to(torch.float64) - safe_m.unsqueeze(1))  # exp(l - l(1)), top max(k, K_norm)
        kths = [scaled[:, s - 1] for s in splits]
        wanted = torch.ones_like(m, dtype=torch.bool) if with_entropy else None
        sums = _row_tail_sums(flat, splits, kths, safe_m, wanted)
        if norm is None:
            head = scaled[:, :k_norm].contiguous().sum(1)
            if k_norm < vocab:
                head = head + sums[k_norm]
            norm = torch.where(torch.isfinite(m), safe_m + torch.log(head), m)
            check_logit_rows(p, norm, what=name)
        scale = torch.exp(safe_m - norm)  # exp(l(1) - lse): turns exp(l - l(1)) into probabilities
        if with_entropy:
            # H = log S - sum x (l - l(1)) / S, S = sum x = exp(lse - l(1)): both terms >= 0. x(1) = 1,
            # so log S = log1p(the rest), which keeps its digits on peaked rows (S - 1 ~ 1e-13).
            rest = scaled[:, 1:k_norm].contiguous().sum(1)
            if k_norm < vocab:
                rest = rest + sums[k_norm]
            sums["entropy"] = torch.log1p(rest) - sums.pop("xd", torch.zeros_like(rest)) / (1 + rest)
    else:
        top64 = top.to(torch.float64)
        kths = [top64[:, s - 1] for s in splits]
        if with_entropy:
            wanted = torch.ones_like(top64[:, 0], dtype=torch.bool)
        else:
            wanted = entropy_rows(top64) if entropy_rows is not None else None
        sums = _row_tail_sums(flat, splits, kths, None, wanted)
        if norm is None:
            norm = top64[:, :k_norm].contiguous().sum(1)
            if k_norm < vocab:
                norm = norm + sums[k_norm]
            check_probability_rows(p, norm, what=what)
        scaled = top64
        scale = 1.0 / norm
    if k >= vocab:
        tail_raw = torch.zeros_like(norm)
    elif k in sums:
        tail_raw = sums[k]
    else:  # k < K_norm, the K_norm tail at hand (0 when K_norm = V): add the values in between
        tail_raw = scaled[:, k:k_norm].sum(1)
        if k_norm < vocab:
            tail_raw = sums[k_norm] + tail_raw
    tail = (tail_raw * scale).clamp(min=0)
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
            partial = partial / norm + torch.log(norm)
    entropy = partial if with_entropy else None
    summary = TopSummary(values=values, indices=idx, vocab=vocab, lead_shape=p.shape[:-1], norm=norm, entropy=entropy,
                         tail=tail, logs=logs, top_logits=top.to(torch.float64) if from_logits else None)
    return summary, partial


def _row_tail_sums(flat: Tensor, splits: list[int], kths: list[Tensor], shift: Tensor | None,
                   entropy_rows: Tensor | None = None) -> dict[int | str, Tensor]:
    """``{s: sum of x over all but the s largest}`` for each split ``s``, in one pass over the rows.

    ``x = flat`` (probabilities, ``shift`` None) or ``x = exp(flat - shift)`` (logits);
    ``kths[i]`` is ``x(s_i)`` in float64. See :func:`_tail_sum`. With ``entropy_rows`` (bool
    ``[N]``), also, on each tile while it is in cache: probabilities, ``"entropy"``: ``-sum x log x``
    of those rows (NaN elsewhere); logits, ``"xd"``: ``sum x d`` with ``d = flat - shift <= 0`` of
    every row (a product per token of the ``x`` this pass computes anyway; ``-inf`` logits give 0).
    """
    with_ent = entropy_rows is not None and bool(entropy_rows.any())
    if not splits and not with_ent:
        return {}
    # Work buffers reused by every tile (a fresh tile-sized temporary per tile would be new pages
    # from the OS each time): the entropy's log (probabilities); d, x and the tail clamp (logits).
    buf: list[Tensor] = []

    def scratch(i: int, like: Tensor) -> Tensor:
        while len(buf) <= i:
            buf.append(torch.empty(0))
        if buf[i].shape[0] < like.shape[0] or buf[i].shape[1:] != like.shape[1:] or buf[i].dtype != like.dtype:
            buf[i] = torch.empty_like(like)
        return buf[i][: like.shape[0]]

    def tile(rows: Tensor, *args: Tensor) -> Tensor:
        if with_ent:
            want, args = args[-1], args[:-1]
        if shift is None:
            x = rows
            ks = args
            cols = [_tail_sum(x, kth.to(x.dtype), s) for s, kth in zip(splits, ks)]
        else:
            work = rows if rows.dtype in (torch.float32, torch.float64) else rows.float()
            d = torch.sub(work, args[0].unsqueeze(1).to(work.dtype), out=scratch(0, work))
            if with_ent:  # -inf logits: x = 0 and a finite d, so that x d = 0 (not 0 * -inf)
                d.clamp_(min=-torch.finfo(d.dtype).max)
            x = torch.exp(d, out=scratch(1, work))
            ks = args[1:]
            cols = [_tail_sum(x, kth.to(x.dtype), s, out=scratch(2, work)) for s, kth in zip(splits, ks)]
            if with_ent:
                cols.append(torch.mul(x, d, out=d).sum(-1).to(torch.float64))
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
    # error below 1e-36; half the cost of special.entr. float32 accumulation: relative error
    # ~1e-7, a float64 sum costs a softmax more.
    tiny = torch.finfo(work.dtype).tiny
    clamped = work.clamp(min=tiny) if out is None else torch.clamp(work, min=tiny, out=out)
    return -clamped.log_().mul_(work).sum(-1).to(torch.float64)


def entropy_of_rows(flat: Tensor, norm: Tensor, from_logits: bool) -> Tensor:
    """``H = -sum p log p`` (nats, float64) of rows ``[N, V]``, in one pass over them.

    Probabilities (row sums ``S = norm``): ``H = (-sum_i x_i log x_i) / S + log S``.
    Logits (``norm``, the log-sum-exp, is not needed): with ``d_i = l_i - l(1) <= 0``,
    ``x_i = exp(d_i)`` and ``S = 1 + r``, ``r`` the sum of ``x`` over every token but the first
    maximiser, ``H = log1p(r) - (sum_i x_i d_i) / S``: the formula of the fused pass in
    :func:`summarize` (masked ``-inf`` logits contribute 0). ``r`` is summed on its own (the
    maximiser's ``x = 1`` set to 0), so that ``log S`` keeps its digits on peaked rows
    (``S - 1 ~ 1e-13``), which ``lse - l(1)`` from a rounded ``lse`` would not.
    """
    work = flat if flat.dtype in (torch.float32, torch.float64) else flat.float()
    if from_logits:
        top, where = work.max(-1, keepdim=True)
        top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
        d = (work - top).clamp_(min=-torch.finfo(work.dtype).max)
        x = torch.exp(d)
        xd = (x * d).sum(-1).to(torch.float64)
        rest = x.scatter_(-1, where, 0.0).sum(-1).to(torch.float64)
        return torch.log1p(rest) - xd / (1 + rest)
    # H of p/S equals H(p)/S + log S for an unnormalised row with sum S.
    return _neg_xlogx_sum(work) / norm + torch.log(norm)


def sorted_rows(p: Tensor, *, from_logits: bool = False, with_entropy: bool = False, what: str = "p") -> TopSummary:
    """The complete summary (``K = V``): every row fully sorted. For witnesses and references."""
    return summarize(p, from_logits=from_logits, k=p.shape[-1], with_entropy=with_entropy, what=what)


def normalized_probabilities(p: Tensor, *, from_logits: bool = False, what: str = "p") -> Tensor:
    """Validated float64 probabilities ``p / sum(p)`` (or ``softmax(logits)``), same shape.

    Float64 over the whole vocabulary: for the decisions that need every token in float64 (a
    rejection mask, its ties at the threshold) and for references in tests; the certificates'
    path reads only a summary's top values in float64 (a caller wanting a few tokens gathers
    them first and normalises them by ``summarize(p).norm``, as :meth:`Criterion.accepts` does)."""
    s = summarize(p, from_logits=from_logits, k=1, what=what)
    norm = s.norm.reshape(p.shape[:-1] + (1,))
    if from_logits:
        return torch.exp(p.to(torch.float64) - norm)
    return p.to(torch.float64) / norm
