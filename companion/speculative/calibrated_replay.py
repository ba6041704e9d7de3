"""The calibrated cost rule replayed on many recordings at once: every replay a row, all advanced round by round together.

:func:`companion.speculative.replay` drives a ``companion.speculative.policies.Calibrated`` object
call by call: per drafted token a survival lookup and a value-function evaluation, and every 8
verified steps a new calibration and plan (``companion.speculative.calibrated_plan``). The
comparison replays each calibrated rule, for each cost model, on every evaluated recording from the
same warmed state: hundreds of independent replays of the same few operations.
:func:`replay_warmed` runs them as rows of arrays: one step replays one round of every unfinished
row (the round's draft decisions for all rows together, draft by draft; the rows whose plan is due
refreshed together), with the policy's own float64 operations in its order, so each row makes the
rounds the policy object makes. ``tests/test_calibrated_replay.py`` checks that against the
reference replay on random and recorded chains, for every calibrated spec of the comparison.

What it replays: ``Calibrated`` itself (not a subclass), freshly made (no verified steps yet),
with ``window = 0``; anything else, and a recording on which the reference replay raises, makes
:func:`replay_warmed` return ``None`` (the caller then replays call by call, and raises there).
"""
from __future__ import annotations

import gc
import math
from collections.abc import Sequence

import numpy as np
import torch

from companion.speculative.batched_numpy import interp_unit_grid, row_sums
from companion.speculative.calibrated_plan import (
    G,
    bin_laws,
    bin_tables,
    count_below,
    expectation_ops,
    lookup_bins,
    optimal_rates,
    survival_laws,
)
from companion.speculative.decoder import SpeculativeResult, Timings
from companion.speculative.policies import Calibrated
from companion.speculative.recording import _GREEDY, RecordedChains
from companion.speculative.replay_fast import chain_arrays


class _Refused(Exception):
    """A replay the rows do not reproduce (the reference raises there): the caller replays call by call."""


def replayable(policy: object) -> bool:
    """Whether :func:`replay_warmed` replays ``policy``: a fresh ``Calibrated`` of ``window = 0``."""
    return (type(policy) is Calibrated and policy.window == 0 and policy.REFRESH == 8 and not policy.scores
            and not policy.kls and policy._plan is None and policy._table is None and policy._last_rate is None
            and policy.idle == 0 and policy.fresh_steps == 0)


class _Recordings:
    """The recordings, their per-position arrays stacked (position ``g = offset[rec] + s``)."""

    def __init__(self, recs: Sequence[RecordedChains], variants: Sequence[tuple[str, str]]) -> None:
        self.recs = list(recs)
        arrays = [chain_arrays(r) for r in self.recs]
        self.n_text = np.array([fa.n for fa in arrays])
        self.max_new = np.array([r.max_new_tokens for r in self.recs])
        self.offset = np.concatenate([[0], np.cumsum(self.n_text)[:-1]]).astype(np.intp)
        self.length = np.concatenate([np.asarray(fa.length, dtype=np.intp) for fa in arrays])
        self.matched = np.concatenate([np.asarray(fa.matched, dtype=np.intp) for fa in arrays])
        self.eos_stop = np.concatenate([np.asarray(fa.eos_stop, dtype=np.int64) for fa in arrays])
        self.next_eos = np.concatenate([np.asarray(fa.next_eos, dtype=np.intp) for fa in arrays])
        self.kl = np.concatenate([np.asarray(r.kl, dtype=float) for r in self.recs])
        self.drafts = [fa.drafts for fa in arrays]
        width = max([fa.q1.shape[1] for fa in arrays] + [1])
        self.scores = np.full((len(variants), len(self.kl), width), np.nan)
        for v, (kind, cal) in enumerate(variants):
            for fa, rec, off in zip(arrays, self.recs, self.offset):
                block = fa.scores(rec, kind, cal)
                self.scores[v, off:off + fa.n, :block.shape[1]] = block


class _Rows:
    """The state of every replayed policy, one row each: its knobs, counters, verified steps, table and plan."""

    def __init__(self, policies: Sequence[Calibrated], variants: list[tuple[str, str]]) -> None:
        self.n = len(policies)
        self.variant = np.array([variants.index((p.kind, p.cal)) for p in policies])
        self.kl_mode = np.array([p.cal == "kl" for p in policies])
        self.kmax = np.array([p.kmax for p in policies])
        top = int(self.kmax.max())
        self.n0 = np.array([p.n0 for p in policies])
        self.n0p = np.array([p.n0 * p.prior for p in policies])       # the policy's n0 * prior, one rounding
        self.prior = np.array([p.prior for p in policies])
        self.bins = np.array([p.bins for p in policies])
        self.explore = np.array([p.explore for p in policies])
        # c + V(i + 1) - V(i) per draft, and V(k) + c n per (k submitted, n drafted): the policy's expressions
        self.steps = np.zeros((self.n, top))
        self.price = np.zeros((self.n, top + 1, top + 1))
        for r, p in enumerate(policies):
            self.steps[r, :p.kmax] = [p.c + p.verify_cost(i + 1) - p.verify_cost(i) for i in range(p.kmax)]
            for n in range(p.kmax + 1):
                self.price[r, :n + 1, n] = [p.verify_cost(k) + p.c * n for k in range(n + 1)]
        self.idle = np.zeros(self.n, dtype=np.int64)
        self.explore_after = np.array([p.explore_after for p in policies], dtype=np.int64)
        self.fresh_steps = np.zeros(self.n, dtype=np.int64)
        self.last_rate = np.full(self.n, np.nan)
        self.slope = np.full(self.n, np.nan)
        self.plan_valid = np.zeros(self.n, dtype=bool)
        self.table_valid = np.zeros(self.n, dtype=bool)
        self.nd = np.zeros(self.n, dtype=np.intp)
        self.score = np.zeros((self.n, 64))
        self.acc = np.zeros((self.n, 64))
        self.first = np.zeros((self.n, 64), dtype=bool)
        self.nk = np.zeros(self.n, dtype=np.intp)
        self.kls = np.zeros((self.n, 64))
        # KLs of a shared warm state (cal=kl), searched once for all its copies: the rows' first nk0 KLs,
        # sorted in `base` (complex keys warm row + 1j * KL, and each warm row's start), warm row base_of
        self.nk0 = np.zeros(self.n, dtype=np.intp)
        self.base: tuple[np.ndarray, np.ndarray] | None = None
        self.base_of = np.full(self.n, -1, dtype=np.intp)
        e = max(int(self.bins.max()) - 1, 1)
        self.edges = np.full((self.n, e), np.inf)
        self.rates = np.zeros((self.n, e + 1))
        self.counts = np.zeros((self.n, 2, e + 1), dtype=np.intp)   # steps per bin, first drafts and others
        self.lam = np.zeros(self.n)
        self.tables = np.zeros((self.n, top + 1, G))
        self.law_k = np.zeros((self.n, 2, G), dtype=np.intp)
        self.law_w = np.zeros((self.n, 2, G))
        self.law_n = np.zeros((self.n, 2), dtype=np.intp)

    def take(self, rows: np.ndarray) -> _Rows:
        """A copy of rows ``rows`` (repeats allowed): the same states, to be replayed on separately."""
        for name, count in (("score", self.nd), ("acc", self.nd), ("first", self.nd), ("kls", self.nk)):
            setattr(self, name, getattr(self, name)[:, :max(int(count.max(initial=0)), 1)])   # the used part only
        out = object.__new__(_Rows)
        for name, value in vars(self).items():
            setattr(out, name, value[rows] if isinstance(value, np.ndarray) else value)
        out.n = len(rows)
        return out

    def room(self, more: int) -> None:
        """Widen the verified-step and KL stores so that every row can add ``more`` entries."""
        for name, count in (("score", self.nd), ("acc", self.nd), ("first", self.nd), ("kls", self.nk)):
            store = getattr(self, name)
            need = int(count.max(initial=0)) + more
            if need > store.shape[1]:
                grown = np.zeros((self.n, max(need, 2 * store.shape[1])), dtype=store.dtype)
                grown[:, :store.shape[1]] = store
                setattr(self, name, grown)


def _refresh_tables(st: _Rows, rows: np.ndarray) -> None:
    """``_bin_table`` of ``rows`` (``cal=bins``) from their verified steps so far."""
    if rows.size == 0:
        return
    width = int(st.nd[rows].max(initial=0)) or 1
    edges, rates, counts = bin_tables(st.score[rows, :width], st.acc[rows, :width], st.first[rows, :width],
                                      st.nd[rows], st.bins[rows], st.n0[rows], st.n0p[rows])
    st.edges[rows] = np.inf
    st.edges[rows, :edges.shape[1]] = edges
    st.rates[rows] = 0.0
    st.rates[rows, :rates.shape[1]] = rates
    st.counts[rows] = 0
    st.counts[rows, :, :counts.shape[2]] = counts
    st.table_valid[rows] = True


def _kls_below(st: _Rows, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per row, how many of its verified KLs are below each of ``x`` ``[rows, m]`` (``searchsorted`` on the
    sorted KLs, side ``left``): those of its warm state, searched in the warm rows' sorted KLs, plus its own."""
    own = st.nk[rows] - st.nk0[rows]
    width = int(own.max(initial=0))
    below = np.zeros(x.shape, dtype=np.intp)
    if width:
        take = st.nk0[rows][:, None] + np.arange(width)
        mine = np.take_along_axis(st.kls[rows], np.minimum(take, st.kls.shape[1] - 1), axis=1)
        mine = np.sort(np.where(np.arange(width)[None, :] < own[:, None], mine, np.inf), axis=1)
        below += count_below(mine, x)
    if st.base is not None:
        keys, start = st.base
        query = np.empty(x.shape, dtype=complex)
        query.real = st.base_of[rows][:, None]
        query.imag = x
        below += np.searchsorted(keys, query, side="left") - start[st.base_of[rows]][:, None]
    return below


def _survival(st: _Rows, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``Calibrated.survival`` of scores ``x`` ``[rows, m]``: the bin rate, or (``cal=kl``) ``F(x)`` of the KLs so far."""
    out = np.empty(x.shape)
    bins = ~st.kl_mode[rows]
    if bins.any():
        b = rows[bins]
        out[bins] = lookup_bins(st.edges[b], st.rates[b], x[bins])
    if not bins.all():
        k = rows[~bins]
        below = _kls_below(st, k, x[~bins])
        out[~bins] = (below + st.n0p[k][:, None]) / (st.nk[k] + st.n0[k])[:, None]
    return out


def _refresh_plans(st: _Rows, rows: np.ndarray) -> None:
    """``Calibrated.plan`` of ``rows``: survival laws over their verified steps, the rate and the value tables."""
    if rows.size == 0:
        return
    kk = np.zeros((rows.size, 2, G), dtype=np.intp)
    w = np.zeros((rows.size, 2, G))
    n = np.zeros((rows.size, 2), dtype=np.intp)
    kl = st.kl_mode[rows]
    for part in (np.flatnonzero(~kl), np.flatnonzero(kl)):
        if part.size == 0:
            continue
        r = rows[part]
        if kl[part[0]]:                 # F(u) of every verified step against the KLs so far
            width = int(st.nd[r].max(initial=0)) or 1
            looked = _survival(st, r, st.score[r, :width])
            laws = survival_laws(looked, st.first[r, :width], st.nd[r], st.prior[r], st.n0[r])
        else:                           # a step's survival is its bin's rate: count the bins
            laws = bin_laws(st.rates[r], st.counts[r], st.prior[r], st.n0[r])
        width = laws[0].shape[2]
        kk[part, :, :width], w[part, :, :width], n[part] = laws
    width = int(n.max())
    kk, w = kk[:, :, :width], w[:, :, :width]
    a, m = expectation_ops(kk, w, n)
    for kmax in np.unique(st.kmax[rows]):
        pick = np.flatnonzero(st.kmax[rows] == kmax)
        r = rows[pick]
        lam, tables, slope = optimal_rates(a[pick], m[pick], st.steps[r, :kmax], st.last_rate[r], st.slope[r])
        st.lam[r] = lam
        st.last_rate[r] = lam
        st.slope[r] = slope
        st.tables[r, :kmax + 1] = tables
    st.law_k[rows] = 0
    st.law_w[rows] = 0.0
    st.law_k[rows, :, :kk.shape[2]] = kk
    st.law_w[rows, :, :w.shape[2]] = w
    st.law_n[rows] = n
    st.plan_valid[rows] = True


def _continuation(st: _Rows, rows: np.ndarray, i: np.ndarray, surv: np.ndarray) -> np.ndarray:
    """``Calibrated.continuation(i, surv)`` per pair ``(rows[p], i[p])``:
    ``E_s[S s + W_{i+1}(S s)] - lam (c + V(i+1) - V(i))`` at ``S = surv[p]``."""
    c = np.minimum(i, 1)                # a round's first draft has its own law
    n = st.law_n[rows, c]
    wide = n > 16
    if wide.any() and not wide.all():   # the wide laws (cal=kl's) apart: the others' sums stay narrow
        out = np.empty(rows.size)
        for part in (wide, ~wide):
            out[part] = _continuation(st, rows[part], i[part], surv[part])
        return out
    width = int(n.max())
    vals = st.law_k[rows, c, :width] / (G - 1)
    s_next = surv[:, None] * vals
    terms = (s_next + interp_unit_grid(s_next, st.tables[rows, i + 1])) * st.law_w[rows, c, :width]
    return row_sums(terms, n) - st.lam[rows] * st.steps[rows, i]


class _Log:
    """Every round of every row, in order: enough to rebuild each replay's result."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []

    def add(self, *columns: np.ndarray) -> None:
        self.parts.append(columns)

    def by_row(self, n_rows: int) -> list[tuple[np.ndarray, ...]]:
        if not self.parts:
            return [tuple(np.zeros(0, dtype=np.int64) for _ in range(5))] * n_rows
        cols = [np.concatenate(c) for c in zip(*self.parts)]
        order = np.argsort(cols[0], kind="stable")
        cols = [c[order] for c in cols]
        cuts = np.searchsorted(cols[0], np.arange(n_rows + 1))
        return [tuple(c[cuts[r]:cuts[r + 1]] for c in cols[1:]) for r in range(n_rows)]


def _run(st: _Rows, recs: _Recordings, sequences: np.ndarray, log: _Log | None) -> tuple[np.ndarray, np.ndarray]:
    """Replay row ``r`` on the recordings ``sequences[r]`` in turn (``-1``: none), its state carried over,
    all rows a round at a time. Returns each row's last position and whether its last text ended."""
    rows_all = np.arange(st.n)
    at = np.zeros(st.n, dtype=np.intp)
    rec = sequences[:, 0].copy() if sequences.shape[1] else np.full(st.n, -1)
    s = np.zeros(st.n, dtype=np.intp)
    final = np.zeros(st.n, dtype=np.intp)
    ended_last = np.zeros(st.n, dtype=bool)
    top = int(st.kmax.max())
    while True:
        live = rows_all[rec >= 0]
        if live.size == 0:
            return final, ended_last
        r, pos = rec[live], s[live]
        if np.any(pos >= recs.n_text[r]):
            raise _Refused("the replay runs past the recorded text")
        g = recs.offset[r] + pos
        cap = recs.max_new[r] - pos - 1
        capk = np.minimum(cap, st.kmax[live])
        exploring = (st.explore[live] > 0) & (st.idle[live] >= st.explore_after[live])
        bins = ~st.kl_mode[live]
        _refresh_tables(st, live[bins & ~st.table_valid[live] & (~exploring | (cap > 0))])
        _refresh_plans(st, live[~exploring & ~st.plan_valid[live]])
        # every survival the round may read, and S_0 = 1, S_{i + 1} = S_i s_i: within a round they do not
        # depend on the decisions (drafts past the chain read 0; a row that would draft them is refused)
        width = min(top, recs.scores.shape[2])
        inside = np.arange(width)[None, :] < recs.length[g][:, None]
        x = np.where(inside, recs.scores[st.variant[live], g, :width], 0.0)
        surv = np.ones((live.size, top + 1))
        surv[:, 1:width + 1] = np.cumprod(np.where(inside, _survival(st, live, x), 0.0), axis=1)
        # drafts: up to the cap or a drafted end token, while the continuation pays; the decisions of a
        # few drafts at a time (past a row's first refusal they are not read)
        limit = np.minimum(capk, recs.eos_stop[g])
        refused = np.full(live.size, top + 1)
        todo = np.flatnonzero(~exploring & (limit > 0))
        first = 0
        while todo.size:
            # many rows: one draft each at a time; few rows: several drafts at once (fewer, larger steps)
            span = np.arange(first, min(first + int(np.clip(512 // todo.size, 1, 8)), top))
            pair = np.repeat(todo, span.size)
            i = np.tile(span, todo.size)
            ask = i < limit[pair]
            pays = np.ones(pair.size, dtype=bool)
            pays[ask] = _continuation(st, live[pair[ask]], i[ask], surv[pair[ask], i[ask]]) > 0.0
            pays = pays.reshape(todo.size, span.size)
            stop = ~pays.all(1)
            refused[todo[stop]] = first + np.argmin(pays[stop], axis=1)
            first += span.size
            todo = todo[~stop & (first < limit[todo])]
        drafted = np.where(exploring, np.minimum(cap, 1), np.minimum(limit, refused))
        if np.any(drafted > recs.length[g]):
            raise _Refused("a chain too short for the round")
        # submit: all drafts when exploring, else the k <= n maximising S_1 + .. + S_k - lam (V(k) + c n)
        submitted = drafted.copy()
        choose = np.flatnonzero(~exploring)
        if choose.size:
            rows = live[choose]
            n = drafted[choose]
            width = int(n.max()) + 1
            total = np.concatenate([np.zeros((choose.size, 1)), np.cumsum(surv[choose, 1:width], axis=1)], axis=1)
            values = total - st.lam[rows][:, None] * st.price[rows, :width, n]
            values[np.arange(width)[None, :] > n[:, None]] = -np.inf
            best = values.max(1, keepdims=True)
            submitted[choose] = width - 1 - np.argmax((values == best)[:, ::-1], axis=1)
        accepted = np.minimum(submitted, recs.matched[g])
        step = np.minimum(accepted + 1, recs.n_text[r] - pos)
        eos = recs.next_eos[g]
        ended = eos < pos + step
        step = np.where(ended, eos - pos + 1, step)
        verified = np.minimum(accepted + 1, submitted)
        # end_round: the counters, the verified steps (and their KLs), the refresh every 8 steps
        st.idle[live] = np.where(submitted > 0, 0, st.idle[live] + 1)
        st.explore_after[live] = np.where(exploring, st.explore_after[live] * 2,
                                          np.where(submitted > 0, st.explore[live], st.explore_after[live]))
        st.room(top + 1)
        each = np.repeat(np.arange(live.size), verified)
        j = np.arange(each.size) - np.repeat(np.cumsum(verified) - verified, verified)
        row_of = live[each]
        col = st.nd[row_of] + j
        st.score[row_of, col] = recs.scores[st.variant[row_of], g[each], j]
        st.acc[row_of, col] = j < accepted[each]
        st.first[row_of, col] = j == 0
        st.nd[live] += verified
        with_kl = st.kl_mode[live]
        if with_kl.any():
            kl_n = np.where(with_kl, np.minimum(verified, recs.n_text[r] - pos), 0)
            each = np.repeat(np.arange(live.size), kl_n)
            j = np.arange(each.size) - np.repeat(np.cumsum(kl_n) - kl_n, kl_n)
            row_of = live[each]
            st.kls[row_of, st.nk[row_of] + j] = recs.kl[g[each] + j]
            st.nk[live] += kl_n
        st.fresh_steps[live] += verified
        due = (st.fresh_steps[live] >= 8) | ~st.plan_valid[live]
        stale = live[due]
        st.fresh_steps[stale] = 0
        st.table_valid[stale] = False
        st.plan_valid[stale] = False
        if log is not None:
            log.add(live, pos, accepted, submitted, drafted)
        s[live] = pos + step
        finished = (s[live] >= recs.max_new[r]) | ended
        # a row that did not draft because not even a first draft pays makes the same empty round (its plan,
        # its S_0 = 1 and so that decision unchanged; no step verified) until its next forced draft, its
        # text's end token or its budget: those rounds at once
        idle = np.flatnonzero(~exploring & (capk > 0) & (drafted == 0) & ~finished & st.plan_valid[live])
        if idle.size:
            row, start = live[idle], s[live[idle]]
            gap = np.where(st.explore[row] > 0, st.explore_after[row] - st.idle[row], recs.max_new[r[idle]])
            to_end = recs.next_eos[recs.offset[r[idle]] + start] - start + 1
            count = np.maximum(np.minimum(np.minimum(gap, to_end), recs.max_new[r[idle]] - start), 0)
            if log is not None and count.any():
                each = np.repeat(np.arange(idle.size), count)
                at_pos = start[each] + np.arange(each.size) - np.repeat(np.cumsum(count) - count, count)
                zero = np.zeros(each.size, dtype=np.int64)
                log.add(row[each], at_pos, zero, zero, zero)
            st.idle[row] += count
            s[row] = start + count
            hit = (count > 0) & (count == to_end)
            ended[idle] |= hit
            finished[idle] |= hit | (s[row] >= recs.max_new[r[idle]])
        done = live[finished]
        final[done] = s[done]
        ended_last[done] = ended[finished]
        at[done] += 1
        nxt = np.where(at[done] < sequences.shape[1], sequences[done, np.minimum(at[done], sequences.shape[1] - 1)], -1)
        rec[done] = nxt
        s[done] = 0


def _warm_kls(st: _Rows) -> tuple[np.ndarray, np.ndarray]:
    """Every row's verified KLs, sorted, as complex keys ``row + 1j * KL`` in one array, and each row's start."""
    width = int(st.nk.max(initial=0))
    kls = np.sort(np.where(np.arange(width)[None, :] < st.nk[:, None], st.kls[:, :width], np.inf), axis=1)
    keys = np.empty(kls.shape, dtype=complex)
    keys.real = np.arange(st.n)[:, None]
    keys.imag = kls
    return keys.reshape(-1), np.arange(st.n) * width


def replay_warmed(policies: Sequence[Calibrated], warm_on: Sequence[Sequence[RecordedChains]],
                  evals: Sequence[RecordedChains]) -> list[list[SpeculativeResult]] | None:
    """Each policy warmed on its recordings ``warm_on[p]`` in turn, then replayed on every recording of
    ``evals`` from a copy of that warm state: ``out[p][e]`` is ``replay(evals[e], warm.fresh())`` after
    ``for ch in warm_on[p]: replay(ch, warm)``, the same rounds and result. The policies themselves are
    left as they were. ``None`` when a policy is not :func:`replayable` or a replay would raise."""
    if not policies or not all(replayable(p) for p in policies) or not evals:
        return None
    recs = list({id(r): r for r in [*evals, *(r for seq in warm_on for r in seq)]}.values())
    index = {id(r): i for i, r in enumerate(recs)}
    variants = sorted({(p.kind, p.cal) for p in policies})
    try:
        stacked = _Recordings(recs, variants)
        st = _Rows(policies, variants)
        longest = max((len(seq) for seq in warm_on), default=0)
        warm = np.full((len(policies), longest), -1, dtype=np.intp)
        for p, seq in enumerate(warm_on):
            warm[p, :len(seq)] = [index[id(r)] for r in seq]
        _run(st, stacked, warm, None)
        rows = np.repeat(np.arange(len(policies)), len(evals))
        base = _warm_kls(st)
        st = st.take(rows)
        st.base, st.base_of, st.nk0 = base, rows, st.nk.copy()
        seq = np.tile(np.array([index[id(r)] for r in evals], dtype=np.intp), len(policies))[:, None]
        log = _Log()
        final, ended = _run(st, stacked, seq, log)
    except _Refused:
        return None
    collecting = gc.isenabled()
    gc.disable()        # the results are ~10^5 small lists and no cycle: the collector would rescan the heap for them
    try:
        return _results(policies, evals, stacked, index, log.by_row(st.n), final, ended)
    finally:
        if collecting:
            gc.enable()


def _results(policies: Sequence[Calibrated], evals: Sequence[RecordedChains], stacked: _Recordings,
             index: dict[int, int], rounds: list[tuple[np.ndarray, ...]], final: np.ndarray, ended: np.ndarray
             ) -> list[list[SpeculativeResult]]:
    """Each row's rounds as the reference replay's result: ``out[policy][evaluated recording]``."""
    nan = math.nan
    names = [str(p) for p in policies]
    out: list[list[SpeculativeResult]] = [[] for _ in policies]
    for row, (pos, acc, sub, dra) in enumerate(rounds):
        p, e = divmod(row, len(evals))
        rec = evals[e]
        drafts = stacked.drafts[index[id(rec)]]
        sub_list = sub.tolist()
        out[p].append(SpeculativeResult(
            tokens=torch.tensor(rec.tokens[:int(final[row])], dtype=torch.long),
            target_forwards=len(sub_list),
            drafter_forwards=int(dra.sum()),
            accepted=acc.tolist(),
            submitted=sub_list,
            drafted=dra.tolist(),
            policy=names[p],
            criterion=str(_GREEDY),
            timings=Timings(wall_s=nan, target_s=nan, drafter_s=nan),
            draft_tokens=[list(drafts[q][:k]) for q, k in zip(pos.tolist(), sub_list)],
            ended_by_eos=bool(ended[row]),
            extra={"replayed": True},
        ))
    return out
