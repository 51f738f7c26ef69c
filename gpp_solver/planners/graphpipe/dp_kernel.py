"""Numeric kernel of GraphPipe's stage DP (Algorithm 1, lines 23-48) for one micro-batch size.

Everything here is arrays; :mod:`gpp_solver.planners.graphpipe.dp` does the orchestration (which micro-batch size,
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

**Shared sinks** (:func:`add_shared_sinks`, GraphPipe's shared terminals): at a series node whose
child ``p`` is a parallel node, a stage may join the tail of one branch (its last series children),
or a group of whole consecutive branches (the parallel split's group that keeps the shared sink),
with the series children ``p+1..q``; the other branches (consecutive groups on either side of that
branch or group) and the branch's head then have that stage as their successor
(:func:`attach_values`, mirrored prefix DPs :func:`prefix_series` / :func:`prefix_parallel`).  Such a stage is two leaf
ranges (``seg_lo2``/``seg_hi2``); its transfers are counted from its node set like any segment's.

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
``devices_per_node``: device ranges are then aligned, see :func:`gpp_solver.planners.graphpipe.dp.assign_devices`).
Memory: ``osf * W + min(depth, n) * b / d * A`` (the plan's 1F1B order never holds more than ``n``
micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from gpp_solver.sp_tree import Leaf, Series, SPNode

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
    #: second leaf range of a segment (empty ``0:0`` for the tree's own segments; a shared-sink
    #: stage is a branch's tail plus the series children after its parallel block)
    seg_lo2: np.ndarray | None = None
    seg_hi2: np.ndarray | None = None
    #: shared-sink sites: series node -> its :class:`AttachSite` list (empty without ``shared_sinks``)
    sites: dict[int, list["AttachSite"]] = field(default_factory=dict)
    n_tree_segments: int = 0

    def ranges(self, g: int) -> list[tuple[int, int]]:
        """Leaf ranges of segment ``g`` (one, or two for a shared-sink stage)."""
        out = [(int(self.seg_lo[g]), int(self.seg_hi[g]))]
        if self.seg_lo2 is not None and self.seg_hi2[g] > self.seg_lo2[g]:
            out.append((int(self.seg_lo2[g]), int(self.seg_hi2[g])))
        return out

    def leaves(self, g: int) -> tuple:
        return tuple(v for lo, hi in self.ranges(g) for v in self.leaf_order[lo:hi])


@dataclass(frozen=True)
class AttachSite:
    """Where GraphPipe's shared sink applies: child ``p`` of series node ``series`` is the parallel
    node ``par``; ``tails[i]`` lists, for branch ``i`` of ``par``, ``(u, ((q, segment), ...))``:
    the branch's children ``u..`` (``u = 0`` for a one-operator branch) joined with the series
    children ``p+1..q`` into one stage, whose segment id is ``segment``."""

    series: int
    p: int
    par: int
    tails: tuple[tuple[tuple[int, tuple[tuple[int, int], ...]], ...], ...]
    #: ``(a, c, ((q, segment), ...))``: branches ``a..c`` (``c > a``) whole, joined with the series
    #: children ``p+1..q`` into one stage (the parallel split's group that keeps the shared sink)
    groups: tuple[tuple[int, int, tuple[tuple[int, int], ...]], ...] = ()


def index_tree(tree: SPNode, shared_sinks: bool = False) -> TreeIndex:
    """Flatten ``tree``; with ``shared_sinks`` also list the shared-sink stages (see
    :func:`add_shared_sinks`)."""
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
    lo, hi = np.concatenate(lo_list), np.concatenate(hi_list)
    idx = TreeIndex(tuple(leaf_order), nodes, child_range, seg, lo, hi, root, height,
                    np.zeros_like(lo), np.zeros_like(hi), {}, len(lo))
    if shared_sinks:
        add_shared_sinks(idx)
    return idx


def add_shared_sinks(idx: TreeIndex) -> None:
    """GraphPipe's decompositions share terminals: the branches of a parallel block end in the
    block's sink, the node after it, so the stage holding that node may also hold the last
    operators of one branch (§7.5: "one stage necessarily contains the concatenation operator").
    For every series child ``p`` that is a parallel node with series children after it, every
    branch ``i`` and every tail of that branch (its last series children ``u..``, or the whole
    branch when it is one operator or not a series), and every extent ``q > p``, append the
    segment *tail + children p+1..q* (two leaf ranges) and record the site.  Likewise for every
    range ``a..c`` (``c > a``) of whole branches: a parallel split's group of branches shares the
    block's sink too, and the stage holding it may hold the whole group."""
    lo2, hi2 = [], []
    lo_new, hi_new = [], []
    nxt = len(idx.seg_lo)
    for t, (kind, kids) in enumerate(idx.nodes):
        if kind != "S":
            continue
        sites = []
        for p, (h, c) in enumerate(kids[:-1]):
            if h != "node" or idx.nodes[c][0] != "P":
                continue
            tails = []
            for i, (hb, cb) in enumerate(idx.nodes[c][1]):
                b_lo, b_hi = idx.child_range[c][i]
                if hb == "node" and idx.nodes[cb][0] == "S":
                    starts = [(u, idx.child_range[cb][u][0]) for u in range(len(idx.nodes[cb][1]))]
                else:
                    starts = [(0, b_lo)]
                opts = []
                for u, t_lo in starts:
                    qs = []
                    for q in range(p + 1, len(kids)):
                        lo_new.append(t_lo)
                        hi_new.append(b_hi)
                        lo2.append(idx.child_range[t][p + 1][0])
                        hi2.append(idx.child_range[t][q][1])
                        qs.append((q, nxt))
                        nxt += 1
                    opts.append((u, tuple(qs)))
                tails.append(tuple(opts))
            groups = []
            nb = len(idx.nodes[c][1])
            for a in range(nb):
                for z in range(a + 1, nb):
                    qs = []
                    for q in range(p + 1, len(kids)):
                        lo_new.append(idx.child_range[c][a][0])
                        hi_new.append(idx.child_range[c][z][1])
                        lo2.append(idx.child_range[t][p + 1][0])
                        hi2.append(idx.child_range[t][q][1])
                        qs.append((q, nxt))
                        nxt += 1
                    groups.append((a, z, tuple(qs)))
            sites.append(AttachSite(t, p, c, tuple(tails), tuple(groups)))
        if sites:
            idx.sites[t] = sites
    if lo_new:
        idx.seg_lo = np.concatenate([idx.seg_lo, np.asarray(lo_new, dtype=np.int64)])
        idx.seg_hi = np.concatenate([idx.seg_hi, np.asarray(hi_new, dtype=np.int64)])
        idx.seg_lo2 = np.concatenate([idx.seg_lo2, np.asarray(lo2, dtype=np.int64)])
        idx.seg_hi2 = np.concatenate([idx.seg_hi2, np.asarray(hi2, dtype=np.int64)])


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
    for g in range(idx.n_tree_segments, len(idx.seg_lo)):     # shared-sink stages: from the set
        inside = {w for lo, hi in idx.ranges(g) for w in range(lo, hi)}
        ins: dict[int, float] = {}
        out_cnt, out_sum = 0, 0.0
        for w in inside:
            for pu, nb in pred[w]:
                if pu not in inside:
                    ins[pu] = max(ins.get(pu, 0.0), nb)
            for pv, nb in succ[w]:
                if pv not in inside:
                    out_cnt += 1
                    out_sum += nb
        count[g] = len(ins) + out_cnt
        nbytes[g] = sum(ins.values()) + out_sum
    return SegmentComm(count, nbytes)


def segment_sums(idx: TreeIndex, per_leaf: np.ndarray) -> np.ndarray:
    """``sum`` of a per-leaf quantity over every segment (prefix-sum differences)."""
    pre = np.concatenate([[0.0], np.cumsum(per_leaf)])
    out = pre[idx.seg_hi] - pre[idx.seg_lo]
    if idx.seg_lo2 is not None and len(idx.seg_lo) > idx.n_tree_segments:
        out = out + (pre[idx.seg_hi2] - pre[idx.seg_lo2])
    return out


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
    site_pars = {st.par for sts in idx.sites.values() for st in sts}
    par_suf: dict[int, np.ndarray] = {}
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
            if kind == "S" and idx.sites:
                for j, t in enumerate(group):
                    for site in idx.sites.get(t, ()):
                        if site.p == p:
                            sv = [0] if t == idx.root[1] else range(size)
                            A = attach_values(idx, site, dev, suf[:, j], R, par_suf[site.par], E, sv)
                            np.minimum(suf[:, j, p], A, out=suf[:, j, p])
        Rg = np.minimum(suf[:, :, 0], INF)
        for j, t in enumerate(group):
            R[t] = Rg[:, j]
            if t in site_pars:
                par_suf[t] = suf[:, j]
            if keep:
                tables[t] = suf[:, j]
    return R[idx.root[1]], (tables if keep else []), R


# ---------------------------------------------------------------- shared sinks (GraphPipe §5, §7.5)
def _head_base(T: int, size: int) -> np.ndarray:
    """Nothing before: the successor (depth ``m``) is itself a source stage, so ``m <= e``."""
    m_idx, e_idx = np.arange(size)[:, None], np.arange(size)[None, :]
    return np.broadcast_to(np.where(m_idx <= e_idx, 0, INF).astype(np.int64), (T, size, size)).copy()


def prefix_series(idx: TreeIndex, t: int, dev: np.ndarray, R: list, E: int, upto: int) -> np.ndarray:
    """``pre[:, u, m, e]`` for ``u = 0..upto``: fewest devices staging the first ``u`` children of
    series node ``t`` when the stage after them has depth ``m`` and every stage has depth ``<= e``
    (the mirror image of :func:`run_dp`'s series suffix)."""
    T, size = dev.shape[0], E + 1
    kids, segs = idx.nodes[t][1], idx.seg[t]
    pre = np.empty((T, upto + 1, size, size), dtype=np.int64)
    pre[:, 0] = _head_base(T, size)
    shifted = np.full((T, upto + 1, size, size), INF, dtype=np.int64)   # shifted[:, v, m] = pre[:, v, m+1]
    shifted[:, 0, :-1] = pre[:, 0, 1:]
    for u in range(1, upto + 1):
        internal = kids[u - 1][0] == "node"
        D = dev[:, segs[0:u, u - 1], 1:size + 1]                          # (T, v, m): stage at depth m+1
        if internal:
            D = D.copy()
            D[:, u - 1] = INF
        best = (D[:, :, :, None] + shifted[:, :u]).min(axis=1)
        if internal:
            Rc = R[kids[u - 1][1]]                                         # [m, m']
            np.minimum(best, (Rc[:, :, :, None] + pre[:, u - 1][:, None, :, :]).min(axis=2), out=best)
        pre[:, u] = np.minimum(best, INF)
        shifted[:, u, :-1] = pre[:, u, 1:]
    return pre


def prefix_leaf_series(idx: TreeIndex, ts: Sequence[int], dev: np.ndarray, E: int, upto: int) -> np.ndarray:
    """:func:`prefix_series` for several series nodes of operators only (no internal child) at
    once: ``pre[:, j, u, m, e]`` for node ``ts[j]``."""
    T, size = dev.shape[0], E + 1
    SEGS = np.stack([idx.seg[t][:upto, :upto] for t in ts])                        # (j, v, u)
    n = len(ts)
    pre = np.empty((T, n, upto + 1, size, size), dtype=np.int64)
    pre[:, :, 0] = _head_base(T, size)[:, None]
    shifted = np.full((T, n, upto + 1, size, size), INF, dtype=np.int64)
    shifted[:, :, 0, :-1] = pre[:, :, 0, 1:]
    for u in range(1, upto + 1):
        D = dev[:, SEGS[:, 0:u, u - 1], 1:size + 1]                                   # (T, j, v, m)
        pre[:, :, u] = np.minimum((D[..., None] + shifted[:, :, :u]).min(axis=2), INF)
        shifted[:, :, u, :-1] = pre[:, :, u, 1:]
    return pre


def prefix_parallel(idx: TreeIndex, t: int, dev: np.ndarray, R: list, E: int, upto: int) -> list[np.ndarray]:
    """``pre[i][., s, e]`` for ``i = 0..upto``: fewest devices staging the first ``i`` branches of
    parallel node ``t`` in consecutive groups (the mirror image of :func:`run_dp`'s parallel suffix)."""
    T, size = dev.shape[0], E + 1
    kids, segs = idx.nodes[t][1], idx.seg[t]
    s_idx, e_idx = np.arange(size)[:, None], np.arange(size)[None, :]
    lower = ~(e_idx >= s_idx + 1)
    pre = [np.zeros((T, size, size), dtype=np.int64)]
    for i in range(1, upto + 1):
        best = np.full((T, size, size), INF, dtype=np.int64)
        internal = kids[i - 1][0] == "node"
        for v in range(i):
            if v == i - 1 and internal:
                continue
            X = dev[:, segs[v, i - 1], 1:size + 1][:, :, None] + pre[v]
            X[:, lower] = INF
            np.minimum(best, X, out=best)
        if internal:
            np.minimum(best, R[kids[i - 1][1]] + pre[i - 1], out=best)
        pre.append(np.minimum(best, INF))
    return pre


@dataclass
class AttachParts:
    """The tables one site's choices combine (for the values and for the traceback)."""

    others: list[np.ndarray]              # others[i][., m, e]: every branch but i, successor depth m
    heads: list[np.ndarray]               # heads[i][., u, m, e]: branch i's children before u
    prepar: list[np.ndarray]


def attach_parts(idx: TreeIndex, site: AttachSite, dev: np.ndarray, R: list, par_suf: np.ndarray, E: int
                 ) -> AttachParts:
    T, size = dev.shape[0], E + 1
    kidsP = idx.nodes[site.par][1]
    prepar = prefix_parallel(idx, site.par, dev, R, E, len(kidsP) - 1)
    others, heads = [], []
    batch: dict[int, list[int]] = {}       # branches of operators only, by length: one batched prefix DP
    for i, opts in enumerate(site.tails):
        others.append(np.minimum(prepar[i] + par_suf[:, i + 1], INF))
        hb, cb = kidsP[i]
        if hb == "node" and idx.nodes[cb][0] == "S":
            if all(h == "leaf" for h, _ in idx.nodes[cb][1]):
                batch.setdefault(max(u for u, _ in opts), []).append(i)
                heads.append(None)
            else:
                heads.append(prefix_series(idx, cb, dev, R, E, max(u for u, _ in opts)))
        else:
            heads.append(_head_base(T, size)[:, None])
    for upto, members in batch.items():
        pre = prefix_leaf_series(idx, [kidsP[i][1] for i in members], dev, E, upto)
        for j, i in enumerate(members):
            heads[i] = pre[:, j]
    return AttachParts(others, heads, prepar)


def attach_values(idx: TreeIndex, site: AttachSite, dev: np.ndarray, suf: np.ndarray, R: list,
                  par_suf: np.ndarray, E: int, s_values: Sequence[int]) -> np.ndarray:
    """``out[i, s, e]`` (``s`` in ``s_values``, else ``INF``): the least devices over the site's
    shared-sink choices for the series suffix starting at the site's child ``p`` — the shared
    stage (branch tail + series children ``p+1..q``) at depth ``m``, the series rest after ``q``
    below it (``suf[:, q+1][s, m-1]``), the branch's head and every other branch before it
    (successor depth ``m``).  ``suf`` is the series node's suffix table (positions ``> p`` done)."""
    T, size = dev.shape[0], E + 1
    out = np.full((T, size, size), INF, dtype=np.int64)
    sv = np.asarray(list(s_values), dtype=np.int64)
    parts = attach_parts(idx, site, dev, R, par_suf, E)
    for i, opts in enumerate(site.tails):
        us = [u for u, _ in opts]
        qs = [q for q, _ in opts[0][1]]
        G = np.asarray([[g for _, g in qg] for _, qg in opts], dtype=np.int64)          # (u, q)
        rest = np.stack([suf[:, q + 1][:, sv, :size - 1] for q in qs], axis=1)         # (T, q, s, m-1)
        F = np.full((T, len(us), len(sv), size), INF, dtype=np.int64)                   # (T, u, s, m)
        F[..., 1:] = (dev[:, G, 1:size][:, :, :, None, :] + rest[:, None]).min(axis=2)
        HO = np.minimum(parts.heads[i][:, us] + parts.others[i][:, None], INF)          # (T, u, m, e)
        val = (F[:, :, :, :, None] + HO[:, :, None, :, :]).min(axis=(1, 3))           # (T, s, e)
        out[:, sv] = np.minimum(out[:, sv], val)
    if site.groups:
        F, O = group_parts(site, dev, suf, par_suf, parts.prepar, sv, size)
        step = max(1, (1 << 21) // max(1, T * len(sv) * size * size))       # bound the temporary
        for lo in range(0, len(site.groups), step):
            val = (F[:, lo:lo + step, :, :, None] + O[:, lo:lo + step, None]).min(axis=(1, 3))   # (T, s, e)
            out[:, sv] = np.minimum(out[:, sv], val)
    return np.minimum(out, INF)


def group_parts(site: AttachSite, dev: np.ndarray, suf: np.ndarray, par_suf: np.ndarray,
                prepar: list[np.ndarray], sv: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """For the site's whole-branch groups ``(a, c)``: ``F[., grp, s, m]``, the shared stage at depth
    ``m`` with the series rest after it (successor depth ``s``), and ``O[., grp, m, e]``, the
    branches before ``a`` and after ``c`` with that stage as successor (``m <= e``: nothing before)."""
    T = dev.shape[0]
    qs = [q for q, _ in site.groups[0][2]]
    rest = np.stack([suf[:, q + 1][:, sv, :size - 1] for q in qs], axis=1)             # (T, q, s, m-1)
    G = np.asarray([[g for _, g in qg] for _, _, qg in site.groups], dtype=np.int64)   # (grp, q)
    F = np.full((T, len(G), len(sv), size), INF, dtype=np.int64)
    F[..., 1:] = (dev[:, G, 1:size][:, :, :, None, :] + rest[:, None]).min(axis=2)
    a = np.asarray([x for x, _, _ in site.groups])
    c = np.asarray([z for _, z, _ in site.groups])
    PP = np.stack(prepar, axis=1)                                                        # (T, i, m, e)
    O = PP[:, a] + par_suf[:, c + 1] + _head_base(T, size)[:, None]
    return F, np.minimum(O, INF)
