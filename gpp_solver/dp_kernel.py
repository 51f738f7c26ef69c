"""Numeric kernel of GraphPipe's stage DP (Algorithm 1, lines 23-48) for one micro-batch size.

Everything here is arrays; :mod:`gpp_solver.dp` does the orchestration (which micro-batch size,
which target, building stages).  The search space is the SP tree's (:mod:`gpp_solver.sp_tree`):

* a **segment** is a contiguous range ``[i..j]`` of the children of one internal tree node; its
  operators are a contiguous range of the tree's leaf order (a topological order), so compute,
  weights and activations are prefix-sum differences;
* a stage is a segment; a tree node is either one stage (the *base case*) or split: a ``Series``
  node into consecutive segments (each a multi-child stage or one child solved recursively), a
  ``Parallel`` node into consecutive groups of branches likewise (Algorithm 1's series and parallel
  decompositions, generalised from binary splits to every split point);
* with one micro-batch size ``b`` and 1F1B (``k = 1``), Table 2 gives ``i_x = max_y i_y + b``, so a
  stage's in-flight samples are ``depth * b`` where ``depth`` is 1 + the longest path to a sink.

**DP value.**  For a target TPS ``t`` and a tree node ``T``: ``R_T[s, e]`` = the fewest devices
with which ``T``'s operators can be staged so that every stage has ``TPS <= t``, fits in memory,
the stages after ``T`` have depth ``s`` (``0`` = none) and ``T``'s source stages have depth
``<= e``.  This is the paper's DP with its value and its device argument swapped (the paper fixes
``d`` and minimises the source's in-flight count; here the in-flight bound ``e`` is fixed and the
devices minimised) — the same Pareto set of (devices, in-flight), without a factor ``|V_D|`` in the
state.  Series: ``Suf[p][s, e] = min_{q, m} Seg[p..q][m, e] + Suf[q+1][s, m]``;
Parallel: ``Par[p][s, e] = min_q Grp[p..q][s, e] + Par[q+1][s, e]`` (both branch groups see the
same successor, the larger in-flight count wins through the common bound ``e``).

**Stage estimate** (an upper bound of the cost model's exact figure, which ``plan_build`` computes
once the plan exists): compute ``sum f_v(b/d) + g_v(b/d)``; incoming transfers exact (one per
outside producer, its largest edge); outgoing transfers one per *edge* leaving the segment (the
cost model counts one per (producer, consumer stage) ≤ that); transfer bandwidth the intra-node
one only when the whole cluster is one node, else ``min(intra, inter)``; the all-reduce uses the
intra-node bandwidth only when the replicas are guaranteed one node (power-of-two ``d`` dividing
``devices_per_node``: device ranges are then aligned, see :func:`gpp_solver.dp.assign_devices`).
Memory: ``osf * W + min(depth, n) * b / d * A`` (the plan's 1F1B order never holds more than ``n``
micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .sp_tree import Leaf, Parallel, Series, SPNode

INF = 1 << 40          # "impossible" device count; sums of two stay far from int64 overflow
BIG_DEPTH = 1 << 30    # memory never binds


@dataclass
class TreeIndex:
    """The SP tree flattened for array work.

    ``nodes[t] = (kind, children)`` for internal nodes in post-order (children before parents);
    a child is ``("leaf", position)`` or ``("node", t)``; ``child_range[t][i]`` its leaf range.
    ``seg[t]`` is a ``k x k`` array of segment ids (``-1`` below the diagonal); segment ``g``
    covers leaf positions ``seg_lo[g]:seg_hi[g]``.
    """

    leaf_order: tuple
    nodes: list[tuple[str, list[tuple[str, int]]]]
    child_range: list[list[tuple[int, int]]]
    seg: list[np.ndarray]
    seg_lo: np.ndarray
    seg_hi: np.ndarray
    root: tuple[str, int]
    height: int            # longest chain of operators in the (SP-ized) order


def index_tree(tree: SPNode) -> TreeIndex:
    leaf_order: list = []
    nodes: list = []
    child_range: list = []
    seg: list = []
    lo_list: list[int] = []
    hi_list: list[int] = []

    def walk(t: SPNode) -> tuple[tuple[str, int], int, int, int]:
        """Returns (handle, lo, hi, height)."""
        if isinstance(t, Leaf):
            leaf_order.append(t.node)
            p = len(leaf_order) - 1
            return ("leaf", p), p, p + 1, 1
        kids = [walk(c) for c in t.children]
        kind = "S" if isinstance(t, Series) else "P"
        height = sum(k[3] for k in kids) if kind == "S" else max(k[3] for k in kids)
        k = len(kids)
        ids = np.full((k, k), -1, dtype=np.int64)
        iu, ju = np.triu_indices(k)
        base = sum(len(x) for x in lo_list)
        ids[iu, ju] = np.arange(base, base + len(iu))
        los = np.asarray([c[1] for c in kids], dtype=np.int64)
        his = np.asarray([c[2] for c in kids], dtype=np.int64)
        lo_list.append(los[iu])
        hi_list.append(his[ju])
        nodes.append((kind, [h for h, *_ in kids]))
        child_range.append([(lo, hi) for _, lo, hi, _ in kids])
        seg.append(ids)
        return ("node", len(nodes) - 1), kids[0][1], kids[-1][2], height

    if isinstance(tree, Leaf):
        # a one-operator graph: one internal "series" of a single leaf keeps the code uniform
        tree = Series((tree,))
    root, _, _, height = walk(tree)
    return TreeIndex(tuple(leaf_order), nodes, child_range, seg, np.concatenate(lo_list),
                     np.concatenate(hi_list), root, height)


@dataclass
class SegmentComm:
    """Per segment: boundary transfer count and bytes per sample (the upper-bound estimate)."""

    count: np.ndarray
    nbytes: np.ndarray


def segment_comm(idx: TreeIndex, edges: dict[tuple, float]) -> SegmentComm:
    """Boundary transfers of every segment, grown child by child (leaf order is topological)."""
    pos = {v: i for i, v in enumerate(idx.leaf_order)}
    n = len(pos)
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    pred: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (u, v), nb in edges.items():
        pu, pv = pos[u], pos[v]
        succ[pu].append((pv, nb))
        pred[pv].append((pu, nb))
    count = np.zeros(len(idx.seg_lo), dtype=float)
    nbytes = np.zeros(len(idx.seg_lo), dtype=float)
    for t, ranges in enumerate(idx.child_range):
        k = len(ranges)
        for i in range(k):
            lo = ranges[i][0]
            in_max: dict[int, float] = {}
            in_sum = 0.0
            out_cnt = 0
            out_sum = 0.0
            for j in range(i, k):
                a, hi = ranges[j]
                for w in range(a, hi):
                    for pu, nb in pred[w]:
                        if pu < lo:
                            old = in_max.get(pu)
                            if old is None:
                                in_max[pu] = nb
                                in_sum += nb
                            elif nb > old:
                                in_max[pu] = nb
                                in_sum += nb - old
                        else:           # was an outgoing edge of the shorter segment
                            out_cnt -= 1
                            out_sum -= nb
                    for _, nb in succ[w]:
                        out_cnt += 1
                        out_sum += nb
                g = idx.seg[t][i, j]
                count[g] = len(in_max) + out_cnt
                nbytes[g] = in_sum + max(out_sum, 0.0)
    return SegmentComm(count, nbytes)


def segment_sums(idx: TreeIndex, per_leaf: np.ndarray) -> np.ndarray:
    """``sum`` of a per-leaf quantity over every segment (prefix-sum differences)."""
    pre = np.concatenate([[0.0], np.cumsum(per_leaf)])
    return pre[idx.seg_hi] - pre[idx.seg_lo]


def stage_tps(idx: TreeIndex, compute: Sequence[np.ndarray], W: np.ndarray, comm: SegmentComm, b: int,
              degrees: Sequence[int], *, mini_batch: int, latency: float, comm_bandwidth: float,
              allreduce_bandwidth: Sequence[float]) -> np.ndarray:
    """Estimated TPS ``(segments, len(degrees))``; ``compute[j]`` holds ``f_v + g_v`` at
    ``b / degrees[j]`` samples per leaf (leaf order), ``W`` the segments' weight bytes."""
    tps = np.empty((len(idx.seg_lo), len(degrees)))
    for j, d in enumerate(degrees):
        C = segment_sums(idx, compute[j])
        comm_half = comm.count * latency + comm.nbytes * (b / d) / comm_bandwidth
        ar = 0.0 if d == 1 else 2.0 * (d - 1) / d * W / allreduce_bandwidth[j]
        tps[:, j] = (C + 2.0 * comm_half) / b + ar / mini_batch
    return tps


def max_depths(W: np.ndarray, A: np.ndarray, b: int, degrees: Sequence[int], *, mini_batch: int,
               memory: float, osf: float) -> np.ndarray:
    """Deepest position (1 = sink) each segment may take at each degree under the memory limit:
    ``osf * W + min(depth, n) * b / d * A <= memory``; 0 = not even as a sink, ``BIG_DEPTH`` = never
    binds."""
    n_micro = mini_batch // b
    static = memory - osf * W
    out = np.empty((len(W), len(degrees)), dtype=np.int64)
    for j, d in enumerate(degrees):
        with np.errstate(divide="ignore", invalid="ignore"):
            md = np.floor(static * d / (b * A))
        md = np.where(A > 0, md, BIG_DEPTH)
        md = np.where(static < 0, 0, md)
        md = np.where(md >= n_micro, BIG_DEPTH, md)
        out[:, j] = np.clip(md, 0, BIG_DEPTH).astype(np.int64)
    return out


def devices_by_depth(tps: np.ndarray, maxdepth: np.ndarray, degrees: Sequence[int], targets: np.ndarray,
                     E: int) -> np.ndarray:
    """``dev[i, g, depth]`` for target ``targets[i]`` and depth ``0..E+1``: the smallest degree that
    meets the target and memory at that depth (``INF`` when none; depths 0 and ``E+1`` are ``INF``)."""
    targets = np.atleast_1d(np.asarray(targets, dtype=float))
    depths = np.arange(E + 2)
    dev = np.full((len(targets), tps.shape[0], E + 2), INF, dtype=np.int64)
    for j in range(len(degrees) - 1, -1, -1):
        mem_ok = maxdepth[:, j][:, None] >= depths[None, :]                    # (g, depth)
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
    thr = np.empty((tps.shape[1], tps.shape[0], E + 2))                         # (j, g, depth)
    for j in range(tps.shape[1]):
        np.copyto(thr[j], np.where(maxdepth[:, j, None] >= depths[None, :], tps[:, j, None], np.nan))
    thr[:, :, 0] = np.nan
    thr[:, :, E + 1] = np.nan
    for j in range(1, len(thr)):            # fmin.accumulate along axis 0, without its slow path
        np.fmin(thr[j - 1], thr[j], out=thr[j])
    return np.moveaxis(thr, 0, 2)


def devices_from_thresholds(thr: np.ndarray, degrees: Sequence[int], targets) -> np.ndarray:
    """``dev[i, g, depth]`` as :func:`devices_by_depth` returns it, from :func:`degree_thresholds`:
    the largest degree first, each smaller one overwriting where it already meets the target."""
    t = np.atleast_1d(np.asarray(targets, dtype=float))[:, None, None]
    dev = np.full((t.shape[0],) + thr.shape[:2], INF, dtype=np.int64)
    for j in range(thr.shape[2] - 1, -1, -1):
        np.copyto(dev, degrees[j], where=thr[:, :, j] <= t)
    return dev


def node_groups(idx: TreeIndex) -> list[list[int]]:
    """Internal tree nodes in groups that :func:`run_dp` solves together: same kind, same number
    of children, the same children internal, and the same level (1 + the deepest internal child's;
    so no member is an ancestor of another).  Groups come children-first.  The branches of a
    multi-branch model (MMT's, CANDLE-Uno's) share one group, which turns their per-child Python
    steps into one."""
    cached = getattr(idx, "_groups", None)
    if cached is not None:
        return cached
    level: list[int] = []
    groups: dict[tuple, list[int]] = {}
    for t, (kind, kids) in enumerate(idx.nodes):
        level.append(1 + max((level[c] for h, c in kids if h == "node"), default=-1))
        groups.setdefault((level[t], kind, tuple(h == "node" for h, _ in kids)), []).append(t)
    out = [groups[key] for key in sorted(groups, key=lambda key: key[0])]
    idx._groups = out      # type: ignore[attr-defined]
    return out


def run_dp(idx: TreeIndex, dev: np.ndarray, E: int, keep: bool = False):
    """The DP over the tree for a batch of targets (one per leading index of ``dev``).

    Returns ``(R_root, tables, R)``: ``R_root[i, s, e]`` as in the module docstring for target
    ``i`` (values ``>= INF`` mean impossible), with ``keep`` every node's suffix tables
    ``tables[t][i, p]`` for the traceback, and every internal node's ``R``.  Batching targets shares
    the Python overhead of the recursion, which dominates on small trees; so does solving each
    group of like tree nodes (:func:`node_groups`) at once.
    """
    T = dev.shape[0]
    size = E + 1
    s_idx = np.arange(size)[:, None]
    e_idx = np.arange(size)[None, :]
    empty_series = np.where(e_idx >= s_idx, 0, INF).astype(np.int64)
    lower = ~(e_idx >= s_idx + 1)       # a base stage at depth s+1 needs e >= s+1
    n = len(idx.nodes)
    R: list[np.ndarray] = [None] * n        # type: ignore[list-item]
    tables: list[np.ndarray] = [None] * n   # type: ignore[list-item]
    for group in node_groups(idx):
        kind, kids0 = idx.nodes[group[0]]
        k, g = len(kids0), len(group)
        segs = np.stack([idx.seg[t] for t in group])                          # (g, k, k)
        suf = np.empty((T, g, k + 1, size, size), dtype=np.int64)
        for p in range(k - 1, -1, -1):
            child_internal = kids0[p][0] == "node"
            q0 = p + 1 if child_internal else p
            out = suf[:, :, p]
            Rc = np.stack([R[idx.nodes[t][1][p][1]] for t in group], axis=1) if child_internal else None
            if kind == "S":
                if p == k - 1:
                    suf[:, :, k] = empty_series
                if q0 < k:
                    D = dev[:, segs[:, p, q0:k], 1:size + 1]                  # D[i, j, q, m] = dev at depth m+1
                    X = (D[:, :, :, None, :] + suf[:, :, q0 + 1:k + 1]).min(axis=2)   # X[i, j, s, m]
                    np.minimum.accumulate(X, axis=3, out=X)
                    out[..., 0] = INF
                    out[..., 1:] = X[..., :-1]                                 # m <= e-1
                if child_internal:
                    Y = (suf[:, :, p + 1][..., None] + Rc[:, :, None]).min(axis=3)
                    if q0 < k:
                        np.minimum(out, Y, out=out)
                    else:
                        out[...] = Y
            else:
                if p == k - 1:
                    suf[:, :, k] = 0
                if q0 < k:
                    D = dev[:, segs[:, p, q0:k], 1:size + 1]                  # D[i, j, q, s] = dev at depth s+1
                    X = (D[..., None] + suf[:, :, q0 + 1:k + 1]).min(axis=2)
                    X[:, :, lower] = INF
                    out[...] = X
                if child_internal:
                    Y = Rc + suf[:, :, p + 1]
                    if q0 < k:
                        np.minimum(out, Y, out=out)
                    else:
                        out[...] = Y
        Rg = np.minimum(suf[:, :, 0], INF)
        for j, t in enumerate(group):
            R[t] = Rg[:, j]
            if keep:
                tables[t] = suf[:, j]
    return R[idx.root[1]], (tables if keep else []), R
