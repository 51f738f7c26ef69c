"""Per-segment tables of the stage DP for one micro-batch size: boundary transfers, sums by prefix
differences, the estimated TPS of every segment at every data-parallel degree, the deepest in-flight
count memory allows, and the fewest devices that meet a target TPS (see
:mod:`gpp_solver.planners.graphpipe.dp_kernel`'s docstring for the stage estimate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.cost import TimeTerms, comm_time, time_per_sample
from gpp_solver.planners.graphpipe.dp_tree import BIG_DEPTH, INF, TreeIndex


@dataclass
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
    ``tests/test_segment_comm.py``), term for term and in its order (so equal to it bit for bit): per leaf, its incoming edges (an outside producer's first edge adds its bytes,
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


def segment_sums(idx: TreeIndex, per_leaf: np.ndarray) -> np.ndarray:
    """``sum`` of a per-leaf quantity over every segment (prefix-sum differences)."""
    pre = np.concatenate([[0.0], np.cumsum(per_leaf)])
    out = pre[idx.seg_hi] - pre[idx.seg_lo]
    if idx.seg_lo2 is not None and len(idx.seg_lo) > idx.n_tree_segments:
        out = out + (pre[idx.seg_hi2] - pre[idx.seg_lo2])
    return out


def stage_tps(
    idx: TreeIndex,
    compute: Sequence[np.ndarray],
    W: np.ndarray,
    comm: SegmentComm,
    b: int,
    degrees: Sequence[int],
    *,
    mini_batch_size: int,
    latency: float,
    comm_bandwidth: float,
    allreduce_bandwidth: Sequence[float],
    terms: TimeTerms | None = None,
) -> np.ndarray:
    """Estimated TPS ``(segments, len(degrees))``; ``compute[j]`` holds ``f_v + g_v`` at
    ``b / degrees[j]`` samples per leaf (leaf order), ``W`` the segments' weight bytes.

    A pricer of its own (not :func:`gpp_solver.cost.model.stage_costs`) because it prices every SP-tree
    segment at every degree at once, before any stage or device exists, with the DP's *upper-bound*
    transfers (one per edge leaving the segment, at a bound of the bandwidth); its formulas are the
    cost model's pricing core (``comm_time``, ``TimeTerms.tail``: all-reduce and optimizer step,
    ``time_per_sample``)."""
    terms = terms or TimeTerms()
    tps = np.empty((len(idx.seg_lo), len(degrees)))
    for j, d in enumerate(degrees):
        C = segment_sums(idx, compute[j])
        comm_half = comm_time(comm.nbytes, b / d, comm_bandwidth, latency, comm.count)
        ar = terms.tail(W, d, allreduce_bandwidth[j])
        tps[:, j] = time_per_sample(C + 2.0 * comm_half, b, ar, mini_batch_size)
    return tps


def max_depths(
    W: np.ndarray, A: np.ndarray, b: int, degrees: Sequence[int], *, mini_batch_size: int, memory: float, osf: float
) -> np.ndarray:
    """Deepest position (1 = sink) each segment may take at each degree under the memory limit:
    ``osf * W + min(depth, n) * b / d * A <= memory``; 0 = not even as a sink, ``BIG_DEPTH`` = never
    binds."""
    num_micro_batches = mini_batch_size // b
    static = memory - osf * W
    out = np.empty((len(W), len(degrees)), dtype=np.int64)
    for j, d in enumerate(degrees):
        with np.errstate(divide="ignore", invalid="ignore"):
            md = np.floor(static * d / (b * A))
        md = np.where(A > 0, md, BIG_DEPTH)
        md = np.where(static < 0, 0, md)
        md = np.where(md >= num_micro_batches, BIG_DEPTH, md)
        out[:, j] = np.clip(md, 0, BIG_DEPTH).astype(np.int64)
    return out


def devices_by_depth(
    tps: np.ndarray, maxdepth: np.ndarray, degrees: Sequence[int], targets: np.ndarray, E: int
) -> np.ndarray:
    """``dev[i, g, depth]`` for target ``targets[i]`` and depth ``0..E+1``: the smallest degree that
    meets the target and memory at that depth (``INF`` when none; depths 0 and ``E+1`` are ``INF``)."""
    targets = np.atleast_1d(np.asarray(targets, dtype=float))
    depths = np.arange(E + 2)
    dev = np.full((len(targets), tps.shape[0], E + 2), INF, dtype=np.int64)
    for j in range(len(degrees) - 1, -1, -1):
        mem_ok = maxdepth[:, j][:, None] >= depths[None, :]  # (g, depth)
        ok = (tps[:, j][None, :] <= targets[:, None])[:, :, None] & mem_ok[None]
        dev = np.where(ok, degrees[j], dev)
    dev[:, :, 0] = INF
    dev[:, :, E + 1] = INF
    return dev


def degree_thresholds(tps: np.ndarray, maxdepth: np.ndarray, E: int) -> np.ndarray:
    """``thr[g, depth, j]``: the least TPS segment ``g`` reaches at ``depth`` with one of the first
    ``j+1`` degrees (``nan`` where none is allowed — memory, or depth 0 / ``E+1`` — so that it
    fails even the target ``inf``).

    Non-increasing in ``j``, so the smallest degree meeting a target ``t`` is ``degrees[count of
    entries not <= t]`` — :func:`devices_from_thresholds`, the same answer as :func:`devices_by_depth`
    with one comparison per entry instead of a pass per degree.  Stored degree-major (each
    ``thr[:, :, j]`` contiguous) for that lookup.
    """
    depths = np.arange(E + 2)
    thr = np.empty((tps.shape[1], tps.shape[0], E + 2))  # (j, g, depth)
    for j in range(tps.shape[1]):
        np.copyto(thr[j], np.where(maxdepth[:, j, None] >= depths[None, :], tps[:, j, None], np.nan))
    thr[:, :, 0] = np.nan
    thr[:, :, E + 1] = np.nan
    for j in range(1, len(thr)):  # fmin.accumulate along axis 0, without its slow path
        np.fmin(thr[j - 1], thr[j], out=thr[j])
    return np.moveaxis(thr, 0, 2)


def devices_from_thresholds(
    thr: np.ndarray, degrees: Sequence[int], targets, out: np.ndarray | None = None
) -> np.ndarray:
    """``dev[i, g, depth]`` as :func:`devices_by_depth` returns it, from :func:`degree_thresholds`:
    the largest degree first, each smaller one overwriting where it already meets the target.
    ``degrees`` may be any values standing for the degrees (the DP passes them encoded); ``out``
    (shape ``(targets, g, depth)``) is filled in place instead of a new array."""
    t = np.atleast_1d(np.asarray(targets, dtype=float))[:, None, None]
    shape = (t.shape[0],) + thr.shape[:2]
    if out is None:
        out = np.empty(shape, dtype=np.int64)
    assert out.shape == shape, (out.shape, shape)
    out.fill(INF)
    ok = np.empty(shape, dtype=bool)  # one mask buffer for every degree
    for j in range(thr.shape[2] - 1, -1, -1):
        np.less_equal(thr[:, :, j], t, out=ok)
        np.copyto(out, degrees[j], where=ok)
    return out


def best_at_sink(tps: np.ndarray, maxdepth: np.ndarray) -> np.ndarray:
    """Per segment the least TPS over the degrees whose memory allows it as a sink (depth 1; a
    deeper position only needs more memory): a target below it leaves the segment ``INF`` at every
    depth (``inf`` when no degree fits at all)."""
    return np.where(maxdepth >= 1, tps, np.inf).min(axis=1)


def segment_fits(maxdepth: np.ndarray, E: int) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`devices_for_segments` needs of ``maxdepth`` at depth bound ``E``, for every
    segment (a caller may keep it for every pass): whether the segment's ``maxdepth`` is
    non-decreasing along the degrees (and their count at most :data:`LUT_DEGREES`), and
    :func:`_first_fitting` (zeros where not)."""
    J = maxdepth.shape[1]
    fast = (np.diff(maxdepth, axis=1) >= 0).all(axis=1) if J <= LUT_DEGREES else np.zeros(len(maxdepth), dtype=bool)
    first = np.zeros((len(maxdepth), E + 2), dtype=np.int8)
    first[fast] = _first_fitting(maxdepth[fast], E)
    return fast, first


def devices_for_segments(
    tps: np.ndarray,
    maxdepth: np.ndarray,
    degrees: Sequence[int],
    targets,
    used: np.ndarray,
    E: int,
    out: np.ndarray | None = None,
    fits: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`devices_by_depth` for the segments ``used`` only: ``out[i, u, depth]`` for segment
    ``used[u]`` (``degrees`` may be any values standing for the degrees; ``out`` filled in place;
    ``fits``: :func:`segment_fits` of every segment at ``E``, else computed for ``used``)."""
    t = np.atleast_1d(np.asarray(targets, dtype=float))[:, None]
    shape = (t.shape[0], len(used), E + 2)
    if out is None:
        out = np.empty(shape, dtype=np.int64)
    assert out.shape == shape, (out.shape, shape)
    # dev[depth] is a step function: the smallest degree j meeting the target whose memory allows
    # the depth, i.e. the first j with reach[j] >= depth, reach = running max over j of the
    # meeting degrees' deepest depths.  Written as steps (a difference array along the depths,
    # then one cumulative sum) instead of one pass over the table per degree.
    tp, md = tps[used], maxdepth[used]
    J = len(degrees)
    vals = np.append(np.asarray(degrees, dtype=np.int64), INF)
    # where memory per device never grows with the degree (maxdepth non-decreasing along j, as
    # the cost model has it), the degrees fitting at a depth are a suffix j >= first[depth], so
    # dev[depth] is the first degree of that suffix meeting the target: one lookup by the bit
    # mask of the degrees meeting it
    fast, first_all = segment_fits(md, E) if fits is None else (fits[0][used], fits[1])
    rest = np.nonzero(~fast)[0]
    if len(rest) < len(used):
        rows = np.nonzero(fast)[0] if len(rest) else slice(None)
        first = first_all[rows] if fits is None else first_all[used[rows]]  # (F, E+2)
        mask = (tp[rows][None] <= t[:, :, None]).astype(np.int64) @ (np.int64(1) << np.arange(J, dtype=np.int64))
        lut = vals[_first_bit_at_or_after(J)].ravel()  # (2^J (J+1),)
        idx = mask[:, :, None] * (J + 1)
        idx = idx + first[None]
        if len(rest):
            out[:, rows] = lut[idx]
        else:
            np.take(lut, idx, out=out)
    if len(rest):
        out[:, rest] = _binding_devices(tp[rest], md[rest], vals, t, E)
    out[:, :, 0] = INF
    out[:, :, E + 1] = INF
    return out


#: the most degrees for which :func:`devices_for_segments` looks its values up by bit mask
LUT_DEGREES = 12


def _first_fitting(md: np.ndarray, E: int) -> np.ndarray:
    """``first[u, m]``: how many degrees of row ``u`` fit in memory at no depth ``>= m``
    (``maxdepth < m``), ``m = 0..E+1``; with ``maxdepth`` non-decreasing along the degrees, the
    first degree fitting at depth ``m``."""
    U, J = md.shape
    hist = np.zeros((U, E + 3), dtype=np.int8)  # at most LUT_DEGREES: one byte each
    at = np.arange(U)
    for j in range(J):  # degree j stops fitting from depth maxdepth + 1 on
        hist[at, np.clip(md[:, j], 0, E + 1) + 1] += 1
    return np.cumsum(hist[:, : E + 2], axis=1, dtype=np.int8)


_FIRST_BIT: dict[int, np.ndarray] = {}


def _first_bit_at_or_after(J: int) -> np.ndarray:
    """``tab[mask, s]``: the lowest set bit of ``mask`` at position ``>= s`` (``J`` when none)."""
    tab = _FIRST_BIT.get(J)
    if tab is None:
        masks = np.arange(1 << J, dtype=np.int64)
        tab = np.full((1 << J, J + 1), J, dtype=np.int64)
        for s in range(J - 1, -1, -1):
            tab[:, s] = np.where((masks >> s) & 1, s, tab[:, s + 1])
        _FIRST_BIT[J] = tab
    return tab


def _binding_devices(tp: np.ndarray, md: np.ndarray, vals: np.ndarray, t: np.ndarray, E: int) -> np.ndarray:
    """:func:`devices_for_segments`' values for segments given by their TPS and ``maxdepth`` rows."""
    J = len(vals) - 1
    reach = np.where(tp[None] <= t[:, :, None], np.minimum(md, E + 1)[None], 0)  # (T, U, J)
    np.maximum.accumulate(reach, axis=2, out=reach)
    step = np.zeros((t.shape[0], tp.shape[0], E + 3), dtype=np.int64)
    rows = step.reshape(-1, E + 3)
    first = np.arange(rows.shape[0])
    rows[:, 0] = vals[0]
    for j in range(J):  # from depth reach[j] + 1 on, degree j no longer serves
        pos = reach[..., j].reshape(-1) + 1
        rows[first, pos] += vals[j + 1] - vals[j]  # one entry per row: no repeated index
    return np.cumsum(step[..., : E + 2], axis=2)
