"""Per-segment tables of the stage DP for one micro-batch size: sums by prefix differences, the
estimated TPS of every segment at every data-parallel degree (its boundary transfers from
:mod:`gpp_solver.planners.graphpipe.dp.segment_comm`), the deepest in-flight count memory allows,
and the fewest devices that meet a target TPS (see :mod:`gpp_solver.planners.graphpipe.dp.kernel`'s
docstring for the stage estimate)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpp_solver.cost import TimeTerms, comm_time, time_per_sample
from gpp_solver.planners.graphpipe.dp.segment_comm import SegmentComm
from gpp_solver.planners.graphpipe.dp.tree import BIG_DEPTH, INF, TreeIndex


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
        ar = terms.tail(W, d, allreduce_bandwidth[j], b)
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
