"""The boundary transfers of every segment of the stage DP's SP tree (:func:`segment_comm`): per
segment the transfers in and out and their bytes per sample, the figures
:func:`gpp_solver.planners.graphpipe.dp.stage_tables.stage_tps` prices."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpp_solver.planners.graphpipe.dp.tree import TreeIndex


@dataclass(frozen=True)
class SegmentComm:
    """Per segment: boundary transfer count and bytes per sample (the upper-bound estimate)."""

    count: np.ndarray
    nbytes: np.ndarray


def segment_comm(idx: TreeIndex, edges: dict[tuple, float]) -> SegmentComm:
    """Boundary transfers of every segment: per segment, one incoming transfer per producer
    outside it (at its largest edge into the segment) and one outgoing per edge leaving it.

    Each segment is read off a *run*: a scan of the leaves from its first leaf on (a shared-sink
    stage: its first range, then its second from its start) kept as running sums, so that all
    segments sharing a run's start are lookups at their ends.  A tree segment's sums are the
    running sums of a child-by-child loop (``reference_segment_comm`` in
    ``tests/planners/graphpipe/test_segment_comm.py``), term for term and in its order (so equal to it bit for bit): per leaf, its incoming edges (an outside producer's first edge adds its bytes,
    a later larger one the difference; an inside producer's edge cancels an outgoing one), then
    its outgoing edges.  A shared-sink stage is summed the same way (a sum over its leaf set
    adds the same values in hash order, so there the two agree to rounding).  Runs of similar lengths are scanned together, one row
    each of a padded table (row-wise cumulative sums add in scan order)."""
    seq = _edge_sequence(idx, edges)
    ptr = seq.ptr
    S, T = len(idx.seg_lo), idx.n_tree_segments
    runs_a, seg_run_a, seg_at_a = _runs(idx, ptr)
    pp = np.r_[ptr, 0]  # ptr[n + 1] = 0: the empty second range
    p1, q1 = pp[runs_a[:, 0]], pp[runs_a[:, 1]]
    p2, q2 = pp[runs_a[:, 2]], pp[runs_a[:, 3]]
    length = (q1 - p1) + (q2 - p2)
    by_len, lens, bounds = _chunks(length)
    run_chunk = np.empty(len(lens), dtype=np.int64)
    run_row = np.empty(len(lens), dtype=np.int64)
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        run_chunk[by_len[a:b]] = c
        run_row[by_len[a:b]] = np.arange(b - a)
    seg_chunk = run_chunk[seg_run_a]
    n_out = np.zeros(S, dtype=np.int64)
    n_in = np.zeros(S, dtype=np.int64)
    s_in = np.zeros(S, dtype=float)
    s_out = np.zeros(S, dtype=float)
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        chunk = by_len[a:b]
        c_out_n, c_in_n, c_in, c_out = seq.scan(runs_a[chunk], p1[chunk], q1[chunk], p2[chunk], q2[chunk], lens[b - 1])
        segs = np.flatnonzero(seg_chunk == c) if len(bounds) > 2 else np.arange(S)
        rows, at = run_row[seg_run_a[segs]], seg_at_a[segs]
        n_out[segs] = c_out_n[rows, at]
        n_in[segs] = c_in_n[rows, at]
        s_in[segs] = c_in[rows, at]
        s_out[segs] = c_out[rows, at]
    # a tree segment's outgoing sum clamped at zero, as the reference loop clamps it; a shared-sink stage's (a plain
    # sum there) is exactly 0 without outgoing edges, not a residue of cancelled terms
    s_out = np.r_[np.maximum(s_out[:T], 0.0), np.where(n_out[T:] > 0, s_out[T:], 0.0)]
    count = (n_in + n_out).astype(float)
    nbytes = s_in + s_out
    return SegmentComm(count, nbytes)


def _runs(idx: TreeIndex, ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs scanned, ``(a1, b1, a2, b2, c1)`` per row: leaf ranges (``a2 = b2 = n + 1``: none)
    and the producers inside, ``[a1, c1)`` and from ``a2`` on (a tree run: from ``a1`` on, as the
    reference loop has it); per segment its run and its end's offset in the run's scan."""
    n = len(idx.leaf_order)
    S = len(idx.seg_lo)
    T = idx.n_tree_segments
    lo, hi = idx.seg_lo[:T], idx.seg_hi[:T]
    present = np.zeros(n + 1, dtype=bool)
    present[lo] = True
    first = np.flatnonzero(present)
    run_of = (np.cumsum(present) - 1)[lo]
    far = np.zeros(len(first), dtype=np.int64)
    np.maximum.at(far, run_of, hi)
    none = np.full_like(first, n + 1)
    runs = [np.stack([first, far, none, none, none], axis=1)]
    seg_run = [run_of]
    seg_at = [ptr[hi] - ptr[lo]]
    if S > T:
        l1, h1, l2, h2 = idx.seg_lo[T:], idx.seg_hi[T:], idx.seg_lo2[T:], idx.seg_hi2[T:]
        assert (h1 <= l2).all()
        keys, pick, run_of = np.unique((l1 * (n + 1) + h1) * (n + 1) + l2, return_index=True, return_inverse=True)
        run_of = run_of.reshape(-1)
        far = np.zeros(len(keys), dtype=np.int64)
        np.maximum.at(far, run_of, h2)
        runs.append(np.stack([l1[pick], h1[pick], l2[pick], far, h1[pick]], axis=1))
        seg_run.append(run_of + len(first))
        seg_at.append((ptr[h1] - ptr[l1]) + (ptr[h2] - ptr[l2]))
    return np.concatenate(runs), np.concatenate(seg_run), np.concatenate(seg_at)


def _chunks(length: np.ndarray) -> tuple[np.ndarray, list[int], list[int]]:
    """Runs of similar scan lengths in chunks of at most ~2M table cells: the runs by length, their
    lengths in that order, and the chunks' bounds in it."""
    by_len = np.argsort(length, kind="stable")
    lens = length[by_len].tolist()
    bounds = [0]
    while bounds[-1] < len(lens):
        a = bounds[-1]
        b = a + 1
        while b < len(lens) and lens[b] <= 2 * lens[a] + 16 and (b + 1 - a) * (lens[b] + 1) <= 1 << 21:
            b += 1
        bounds.append(b)
    return by_len, lens, bounds


class _EdgeSequence:
    """Every edge twice, in leaf order: at its consumer (``kind`` 0, ``other`` = the producer)
    and at its producer (``kind`` 1, ``other`` = the consumer); per leaf the incoming edges
    first, each list in the edge dict's order.  ``ptr[w]``: the first entry of leaf ``w``."""

    def __init__(self, kind, other, val, ptr) -> None:
        self.kind, self.other, self.val, self.ptr = kind, other, val, ptr
        self.uniq, rank = np.unique(val, return_inverse=True)
        self.rank = rank.reshape(-1)

    def scan(self, runs, p1, q1, p2, q2, width):
        """Per run (row) and scan offset ``e`` (column, ``0..width``), over the entries scanned
        before ``e``: the outgoing transfers, the outside producers, the incoming bytes and the
        outgoing bytes (cumulative tables, column 0 empty)."""
        l1 = q1 - p1
        c = np.arange(width)
        valid = c < (l1 + (q2 - p2))[:, None]  # a row's scan, then padding
        ent = p1[:, None] + c
        if (q2 > p2).any():
            ent += np.where(c >= l1[:, None], (p2 - q1)[:, None], 0)
        ent[~valid] = 0
        kind, other, val = self.kind[ent], self.other[ent], self.val[ent]
        outgoing = (kind == 1) & valid
        incoming = (kind == 0) & valid
        inside = (other >= runs[:, 0:1]) & (other < runs[:, 4:5]) | (other >= runs[:, 2:3])
        cancel = incoming & inside
        # outgoing: every edge out of a leaf adds; an edge into a leaf from inside cancels one
        cnt_tab = np.zeros((len(runs), width + 1), dtype=np.int64)
        prod_tab = np.zeros((len(runs), width + 1), dtype=np.int64)
        out_tab = np.zeros((len(runs), width + 1))
        in_tab = np.zeros((len(runs), width + 1))
        cnt = cnt_tab[:, 1:]
        np.subtract(outgoing, cancel, out=cnt, dtype=np.int64)
        np.copyto(out_tab[:, 1:], val, where=outgoing)
        np.negative(val, out=out_tab[:, 1:], where=cancel)
        # incoming from outside producers: the first edge of a producer adds its bytes, a later
        # larger one the difference (running max per producer and run: ranks, groups apart)
        ext = np.flatnonzero(incoming & ~inside)  # row-major: by run, then scan order
        prod = other.reshape(-1)[ext] + (ext // width) * (len(self.ptr) + 1)
        o = np.argsort(prod, kind="stable")
        eo = ext[o]
        po = prod[o]
        new = np.ones(len(po), dtype=bool)
        new[1:] = po[1:] != po[:-1]
        grp = np.cumsum(new) - 1
        span = len(self.uniq) + 1
        rk = self.rank[ent.reshape(-1)[eo]]
        prev = np.zeros(len(po), dtype=np.int64)  # the producer's largest so far (rank)
        prev[1:] = np.maximum.accumulate(grp * span + rk + 1)[:-1]
        prev -= grp * span + 1
        vo = val.reshape(-1)[eo]
        pos = eo + eo // width + 1  # in the tables (leading column)
        in_tab.reshape(-1)[pos] = np.where(new, vo, np.where(rk > prev, vo - self.uniq[np.maximum(prev, 0)], 0.0))
        prod_tab.reshape(-1)[pos] = new
        return [np.cumsum(t, axis=1, out=t) for t in (cnt_tab, prod_tab, in_tab, out_tab)]


def _edge_sequence(idx: TreeIndex, edges: dict[tuple, float]) -> _EdgeSequence:
    pos = {v: i for i, v in enumerate(idx.leaf_order)}
    m = len(edges)
    u = np.fromiter((pos[e[0]] for e in edges), dtype=np.int64, count=m)
    v = np.fromiter((pos[e[1]] for e in edges), dtype=np.int64, count=m)
    nb = np.fromiter(edges.values(), dtype=float, count=m)
    leaf = np.r_[v, u]
    kind = np.r_[np.zeros(m, dtype=np.int64), np.ones(m, dtype=np.int64)]
    order = np.argsort(2 * leaf + kind, kind="stable")
    ptr = np.searchsorted(leaf[order], np.arange(len(pos) + 1))
    return _EdgeSequence(kind[order], np.r_[u, v][order], np.r_[nb, nb][order], ptr)
