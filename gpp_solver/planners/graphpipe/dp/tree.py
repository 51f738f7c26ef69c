"""The SP tree flattened for the stage DP's array work (:class:`TreeIndex`): internal nodes in
post-order, every segment (a contiguous range of one node's children, hence a contiguous range of
the leaf order) with an id, and with ``shared_sinks`` GraphPipe's shared-sink stages
(:func:`add_shared_sinks`).  See :mod:`gpp_solver.planners.graphpipe.dp.kernel` for the DP itself."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from gpp_solver._backend import trampoline
from gpp_solver.sp_tree import Leaf, Series, SPNode

INF = 1 << 40  # "impossible" device count; sums of two stay far from int64 overflow
BIG_DEPTH = 1 << 30  # memory never binds


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
    height: int  # longest chain of operators in the (SP-ized) order
    #: second leaf range of a segment (empty ``0:0`` for the tree's own segments; a shared-sink
    #: stage is a branch's tail plus the series children after its parallel block)
    seg_lo2: np.ndarray | None = None
    seg_hi2: np.ndarray | None = None
    #: shared-sink sites: series node -> its :class:`AttachSite` list (empty without ``shared_sinks``)
    sites: dict[int, list[AttachSite]] = field(default_factory=dict)
    n_tree_segments: int = 0
    #: sizes of the blocks of several operators a coarsened series holds (``index_tree``'s
    #: ``max_series_children``; empty: the full search space)
    blocks: tuple[int, ...] = ()

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


def tree_segments(tree: SPNode) -> int:
    """How many segments :func:`index_tree` would list for ``tree`` (without shared sinks):
    ``k (k + 1) / 2`` per internal node of ``k`` children."""
    return trampoline.run(_segments, tree)


def _segments(tree: SPNode) -> Generator[tuple, int, int]:
    if isinstance(tree, Leaf):
        return 1
    k = len(tree.children)
    total = k * (k + 1) // 2
    for c in tree.children:
        if not isinstance(c, Leaf):
            total += yield (c,)
    return total


def index_tree(tree: SPNode, shared_sinks: bool = False, max_series_children: int | None = None) -> TreeIndex:
    """Flatten ``tree``; with ``shared_sinks`` also list the shared-sink stages (see
    :func:`add_shared_sinks`).

    ``max_series_children`` coarsens long series: a series node with more children than that has
    each run of consecutive operator children cut into blocks of about equal length (as many as
    needed to bring the node down to that many children), and a block is one child — its operators
    always share a stage.  The DP's search space is then coarser (``TreeIndex.blocks`` counts the
    blocks of more than one operator): its answers are stagings, not the optimum over the full
    space.  NASNet-A large, SP-ized, is one series of 977 children (480,000 segments)."""
    if isinstance(tree, Leaf):
        # a one-operator graph: one internal "series" of a single leaf keeps the code uniform
        tree = Series((tree,))
    f = _Flattener(max_series_children)
    root, _, _, height = trampoline.run(f.walk, tree)
    lo, hi = np.concatenate(f.lo_list), np.concatenate(f.hi_list)
    idx = TreeIndex(
        tuple(f.leaf_order),
        f.nodes,
        f.child_range,
        f.seg,
        lo,
        hi,
        root,
        height,
        np.zeros_like(lo),
        np.zeros_like(hi),
        {},
        len(lo),
        tuple(f.blocks),
    )
    if shared_sinks:
        add_shared_sinks(idx)
    return idx


class _Flattener:
    """The lists :func:`index_tree` fills while it walks the tree: leaves in order, internal nodes,
    their children's leaf ranges, segment ids and bounds, and the blocks of coarsened series."""

    def __init__(self, max_series_children: int | None) -> None:
        self.max_series_children = max_series_children
        self.leaf_order: list = []
        self.nodes: list = []
        self.child_range: list = []
        self.seg: list = []
        self.lo_list: list[int] = []
        self.hi_list: list[int] = []
        self.blocks: list[int] = []

    def walk(self, t: SPNode) -> Generator[tuple, tuple, tuple[tuple[str, int], int, int, int]]:
        """Returns (handle, lo, hi, height); each child is a call run by
        :func:`gpp_solver._backend.trampoline.run` (no recursion limit on the tree's depth)."""
        if isinstance(t, Leaf):
            self.leaf_order.append(t.node)
            p = len(self.leaf_order) - 1
            return ("leaf", p), p, p + 1, 1
        kids = []
        for c in t.children:
            kids.append((yield (c,)))
        kind = "S" if isinstance(t, Series) else "P"
        if kind == "S" and self.max_series_children is not None and len(kids) > self.max_series_children:
            kids = self._blocks(kids, self.max_series_children)
        height = sum(k[3] for k in kids) if kind == "S" else max(k[3] for k in kids)
        k = len(kids)
        ids = np.full((k, k), -1, dtype=np.int64)
        iu, ju = np.triu_indices(k)
        base = sum(len(x) for x in self.lo_list)
        ids[iu, ju] = np.arange(base, base + len(iu))
        los = np.asarray([c[1] for c in kids], dtype=np.int64)
        his = np.asarray([c[2] for c in kids], dtype=np.int64)
        self.lo_list.append(los[iu])
        self.hi_list.append(his[ju])
        self.nodes.append((kind, [h for h, *_ in kids]))
        self.child_range.append([(lo, hi) for _, lo, hi, _ in kids])
        self.seg.append(ids)
        return ("node", len(self.nodes) - 1), kids[0][1], kids[-1][2], height

    def _blocks(self, kids: list, limit: int) -> list:
        """Runs of operator children cut into blocks: ``("leaf", first position)`` over the run's
        leaf range, height 1 (a block is one stage)."""
        internal = sum(1 for h, *_ in kids if h[0] == "node")
        runs, cur = [], []
        for c in kids:
            if c[0][0] == "leaf":
                cur.append(c)
            else:
                if cur:
                    runs.append(cur)
                    cur = []
                runs.append(c)
        if cur:
            runs.append(cur)
        leaves = len(kids) - internal
        size = max(1, -(-leaves // max(1, limit - internal)))  # operators per block
        out = []
        for r in runs:
            if not isinstance(r, list):
                out.append(r)
                continue
            n = -(-len(r) // size)
            for i in range(n):
                part = r[i * len(r) // n : (i + 1) * len(r) // n]
                out.append((("leaf", part[0][1]), part[0][1], part[-1][2], 1))
                if len(part) > 1:
                    self.blocks.append(len(part))
        return out


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


def node_groups(idx: TreeIndex) -> list[list[int]]:
    """Internal tree nodes in groups that :func:`gpp_solver.planners.graphpipe.dp.kernel.run_dp` solves
    together: same kind, same number of children, the same children internal, and the same level
    (1 + the deepest internal child's; so no member is an ancestor of another).  Groups come children-first.  The branches of a
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
    idx._groups = out  # type: ignore[attr-defined]
    return out


class SegDev:
    """The DP's stage values ``dev[i, g, depth]`` stored for the segments some target can use only:
    ``arr`` holds one row per used segment plus a last row of ``INF``, ``gmap[g]`` the row of
    segment ``g`` (the ``INF`` row for the others; ``gmap[-1]`` too, so the ``-1`` entries below
    the diagonal of ``TreeIndex.seg`` read ``INF``).  Indexing with segment ids reads as if the
    table were dense; ``seg_axis`` is the axis holding segments (1 with a leading target axis)."""

    def __init__(self, arr: np.ndarray, gmap: np.ndarray | None = None, seg_axis: int = 1) -> None:
        if gmap is None:  # a dense table: every segment its own row, then an INF row
            n = arr.shape[seg_axis]
            pad = list(arr.shape)
            pad[seg_axis] = 1
            arr = np.concatenate([arr, np.full(pad, INF, dtype=arr.dtype)], axis=seg_axis)
            gmap = np.arange(n + 1, dtype=np.int64)
        self.arr, self.gmap, self.seg_axis = arr, gmap, seg_axis

    @property
    def shape(self) -> tuple[int, ...]:
        return self.arr.shape

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if key[0] is None:
            return SegDev(self.arr[None], self.gmap, self.seg_axis + 1)
        if len(key) <= self.seg_axis:  # the targets' axis only
            return SegDev(self.arr[key], self.gmap, self.seg_axis - sum(not isinstance(k, slice) for k in key))
        key = list(key)
        key[self.seg_axis] = self.gmap[key[self.seg_axis]]
        return self.arr[tuple(key)]
