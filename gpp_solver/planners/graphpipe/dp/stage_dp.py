"""GraphPipe's stage DP (Algorithm 1, lines 13-48) over the SP tree: the one class, :class:`StageDP`.

:class:`StageDP` prepares, once per graph and cluster, the SP tree's segments and their boundary
transfers; per micro-batch size ``b`` it prices every segment at every data-parallel degree
(:func:`gpp_solver.planners.graphpipe.dp.stage_tables.stage_tps`,
:func:`~gpp_solver.planners.graphpipe.dp.stage_tables.max_depths`); per target TPS ``t`` it runs
batched passes of the numeric kernel (:func:`gpp_solver.planners.graphpipe.dp.kernel.run_dp`) over
``(b, t)`` pairs, grouped by micro-batch size or halved to bound their tables, bounded in depth or
saturated at each pair's depth cap, over the stage-value tables of the segments the targets can
use; and reads the answers off them: "how few devices reach ``t``" per depth bound or, with
:meth:`StageDP.stages`, the stages themselves (the traceback,
:mod:`gpp_solver.planners.graphpipe.dp.traceback`).

With ``optimistic_transfers=True`` every boundary transfer is priced at the faster of the two
bandwidths instead: the figures are then no longer upper bounds (a transfer between nodes costs
more), so the planner only uses such a DP to *propose* stages and prices them exactly.

Search space (the paper's defaults): one micro-batch size ``b`` for every stage, 1F1B (``k = 1``),
data-parallel degrees from ``degree_options`` (default: powers of two up to the cluster's devices)
with ``b % d == 0``; stages are SP-tree segments (see :mod:`gpp_solver.planners.graphpipe.dp.kernel`).
Every figure the DP uses is an upper bound of the cost model's exact one, so the plan built from its
stages has ``TPS <= t`` and fits in memory (``plan_build`` recomputes the exact figures).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from gpp_solver.cost.network import link_bandwidths, node_bandwidth, one_node, slowest_bandwidth
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InvalidInputError
from gpp_solver.planners.graphpipe.dp.kernel import check_deadline, run_dp
from gpp_solver.planners.graphpipe.dp.segment_comm import SegmentComm, segment_comm
from gpp_solver.planners.graphpipe.dp.stage import DPProbe, DPStage, SizeTables, decode, encode, power_of_two_degrees
from gpp_solver.planners.graphpipe.dp.stage_tables import (
    best_at_sink,
    devices_for_segments,
    max_depths,
    segment_fits,
    segment_sums,
    stage_tps,
)
from gpp_solver.planners.graphpipe.dp.traceback import trace_stages
from gpp_solver.planners.graphpipe.dp.tree import BIG_DEPTH, INF, SegDev, TreeIndex, index_tree, tree_segments
from gpp_solver.sp_tree import SPDecomposition, decompose
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)


class StageDP:
    """The DP for one graph, cluster and mini-batch size (uniform ``b``, 1F1B): its setup and
    per-size tables, then its passes per target TPS, which keep two caches per size:
    :meth:`depth_cap`'s steps and the stage-value tables' :func:`segment_fits`."""

    #: segments above which long series are coarsened into blocks (``max_segments``; 0: never)
    MAX_SEGMENTS = 150_000
    #: the children a coarsened series keeps (about 74,000 segments)
    COARSE_CHILDREN = 384
    #: the largest stage-graph depth a coarsened space holds (unless memory needs more, see ``E``)
    COARSE_DEPTH = 32
    #: largest (segments x depths) table a traceback under a depth cap may rebuild without the cap
    RETRACE_BYTES = 256 << 20
    #: a pass's work per target, segments x (depth bound + 2)^2, from which :meth:`large` holds
    LARGE_TABLE = 1 << 20
    #: entries of one pass's stage-value table above which :meth:`probe` halves its targets
    PASS_ENTRIES = 1 << 24

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        *,
        decomposition: SPDecomposition | None = None,
        degree_options: Sequence[int] | None = None,
        max_devices: int | None = None,
        optimistic_transfers: bool = False,
        shared_sinks: bool = True,
        lower_bound_pricing: bool = False,
        max_segments: int | None = None,
    ) -> None:
        self.graph = graph
        self.cluster = cluster
        self.B = mini_batch_size
        self.D = cluster.devices if max_devices is None else max_devices
        self.decomposition = decomposition or decompose(graph)
        #: GraphPipe's shared terminals: a parallel block's sink side may join one branch's last stage
        self.shared_sinks = bool(shared_sinks)
        limit = self.MAX_SEGMENTS if max_segments is None else max_segments
        tree = self.decomposition.tree
        #: series coarsened into blocks of operators (``tree.index_tree``) when the tree lists
        #: more than ``MAX_SEGMENTS`` segments: the answers are then stagings, not proven optima
        coarse = self.COARSE_CHILDREN if limit and tree_segments(tree) > limit else None
        if coarse is not None:  # nor shared-sink stages: their tables cost a pass's time again per site
            self.shared_sinks = False
        self.idx: TreeIndex = index_tree(tree, self.shared_sinks, coarse)
        self.coarsened = bool(self.idx.blocks)
        self.comm = segment_comm(self.idx, graph.edge_bytes_map)
        opts = power_of_two_degrees(self.D) if degree_options is None else tuple(sorted(set(degree_options)))
        if not opts or opts[0] < 1:
            raise InvalidInputError(f"degree_options must be positive integers, got {degree_options!r}")
        self.degree_options = opts
        self._pow2 = all(d & (d - 1) == 0 for d in opts)
        self.E = max(1, min(self.D, self.idx.height))
        perm = np.asarray([graph.index[v] for v in self.idx.leaf_order], dtype=np.int64)
        self._perm = perm
        self._costs = CostTables(graph)
        #: ``E`` bounds the depth below the deepest staging the tree holds (a coarsened space is
        #: bounded in depth too, its passes' tables grow as ``E^2``: ``COARSE_DEPTH``, or twice the
        #: fewest stages a chain needs to hold the weights, if more); depths then never saturate
        chain = int(np.ceil(cluster.optimizer_state_factor * float(self._costs.weight.sum()) / cluster.memory_bytes))
        self.depth_limited = self.coarsened and self.E > max(self.COARSE_DEPTH, 2 * chain)
        if self.depth_limited:
            self.E = max(self.COARSE_DEPTH, 2 * chain)
        self.W = segment_sums(self.idx, self._costs.weight[perm])
        self.A = segment_sums(self.idx, self._costs.activation[perm])
        self.memory = cluster.memory_bytes
        slow, fast = link_bandwidths(cluster)
        self.comm_bandwidth = slowest_bandwidth(cluster, self.D)
        #: with ``optimistic_transfers`` every transfer is priced at the faster bandwidth: no longer an
        #: upper bound, so such a DP only *proposes* stages, which the planner prices exactly
        self.optimistic_transfers = bool(optimistic_transfers)
        if self.optimistic_transfers:
            self.comm_bandwidth = fast
        #: True when some transfer may be priced at a bandwidth the plan will not get (the
        #: conservative estimate differs from the optimistic one)
        self.placement_sensitive = slow != fast and not one_node(cluster, self.D)
        self._intra, self._low = node_bandwidth(cluster), slow
        #: with ``lower_bound_pricing`` a stage's figure is a *lower* bound of the cost model's exact
        #: TPS instead: no transfers, the all-reduce at the faster bandwidth (memory as always).  If
        #: such a DP finds no staging meeting ``t``, every staging the DP space holds (at any of its
        #: degrees) has a stage whose exact TPS exceeds ``t`` — a bound the depth sweep prunes with
        self.lower_bound_pricing = bool(lower_bound_pricing)
        self._fast = fast
        self._cache: dict[int, SizeTables] = {}
        self._caps: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._fits: dict[int, tuple] = {}  # b -> (E, stage_tables.segment_fits at E)

    # ---- per micro-batch size -------------------------------------------------------------
    def degrees(self, b: int) -> tuple[int, ...]:
        return tuple(d for d in self.degree_options if b % d == 0 and d <= self.D)

    def _allreduce_bandwidth(self, d: int) -> float:
        if self.lower_bound_pricing:
            return self._fast
        dpn = self.cluster.devices_per_node
        if dpn is not None and self._pow2 and dpn % d == 0:
            return self._intra
        return self._low

    def tables(self, b: int) -> SizeTables:
        tb = self._cache.get(b)
        if tb is None:
            degs = self.degrees(b)
            compute = [self._costs.compute_at(b / d)[self._perm] for d in degs]
            comm = (
                self.comm
                if not self.lower_bound_pricing
                else SegmentComm(np.zeros_like(self.comm.count), np.zeros_like(self.comm.nbytes))
            )
            tps = stage_tps(
                self.idx,
                compute,
                self.W,
                comm,
                b,
                degs,
                mini_batch_size=self.B,
                latency=self.cluster.latency,
                comm_bandwidth=self.comm_bandwidth,
                allreduce_bandwidth=[self._allreduce_bandwidth(d) for d in degs],
                terms=TimeTerms.of(self.graph, self.cluster, self.B),
            )
            md = self._max_depths(b, degs, self.memory)
            tb = SizeTables(degs, tps, md, best_at_sink(tps, md))
            self._cache[b] = tb
        return tb

    def _tables_in_time(self, b: int, deadline: float | None) -> SizeTables:
        """:meth:`tables`, checking ``deadline`` first when they are still to be built (about a
        second a size on 5,000 operators: the one step of a pass that did not check it)."""
        if b not in self._cache:
            check_deadline(deadline)
        return self.tables(b)

    def _max_depths(self, b: int, degs: Sequence[int], memory: float) -> np.ndarray:
        return max_depths(
            self.W, self.A, b, degs, mini_batch_size=self.B, memory=memory, osf=self.cluster.optimizer_state_factor
        )

    def candidates(self, b: int) -> np.ndarray:
        """Sorted distinct stage TPS values the DP can produce at ``b`` (the optimum is one)."""
        tb = self.tables(b)
        return np.unique(tb.tps[tb.maxdepth >= 1])

    def lower_bound(self, b: int) -> float:
        """A TPS no plan at ``b`` beats: the slowest operator at its best degree, and the total
        device-time spread over every device."""
        degs = self.degrees(b)
        per = np.stack([self._costs.compute_at(b / d) for d in degs])  # (deg, nodes)
        one = per.min(axis=0).max() / b
        work = (per * np.asarray(degs)[:, None]).min(axis=0).sum() / (b * self.D)
        return float(max(one, work))

    # ---- per target TPS: the passes and the answers read off them -------------------------
    def depth_cap(self, b: int, floor: int = 1, t: float | None = None) -> int:
        """A depth ``C <= E`` at which the DP at ``b`` may saturate its depths (count every stage
        deeper than ``C`` as depth ``C``) and still find the fewest devices at any depth, exactly:
        depth enters a stage's figures only through memory, ``osf * W + min(depth, n) * b / d * A``,
        so segment ``g`` at degree ``d`` fits at depth ``m`` iff ``m <= maxdepth[g, d]``, and
        every finite ``maxdepth`` is below ``n = B / b`` (``max_depths``): beyond the largest
        finite one, ``M``, no stage's devices change with its depth.  ``C = max(M + 1, floor)``
        (at most ``E``; ``floor`` keeps the depths a caller still asks about exact).

        With a target ``t`` only the (segment, degree) pairs meeting it count (the others never
        serve a stage at ``t``), and only their ``maxdepth`` below ``E`` (one of ``E`` or more
        fits at every depth a staging on ``D`` devices reaches): exact for that target, and
        where memory never binds at ``t`` the cap is ``floor``."""
        if self.depth_limited:  # saturating would admit the stagings deeper than E
            return self.E
        if t is not None:
            keys, reach = self._cap_steps(b)
            k = int(np.searchsorted(keys, t, side="right"))
            return min(self.E, max(int(reach[k - 1]) + 1 if k else 1, int(floor)))
        md = self.tables(b).maxdepth
        fin = md[md < BIG_DEPTH]
        return min(self.E, max(int(fin.max()) + 1 if fin.size else 1, int(floor)))

    def _cap_steps(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The (segment, degree) pairs at ``b`` whose memory binds below depth ``E``: their TPS
        sorted, and the running maximum of their ``maxdepth`` in that order (:meth:`depth_cap`)."""
        got = self._caps.get(b)
        if got is None:
            tb = self.tables(b)
            sel = tb.maxdepth < self.E
            order = np.argsort(tb.tps[sel], kind="stable")
            got = (tb.tps[sel][order], np.maximum.accumulate(tb.maxdepth[sel][order]) if order.size else order)
            self._caps[b] = got
        return got

    def _dev(
        self, pairs: Sequence[tuple[int, float]], E: int, sat: bool = False, deadline: float | None = None
    ) -> SegDev:
        """The DP's encoded stage values ``encode(dev[i, g, depth])`` for ``pairs[i] = (b, t)``,
        stored only for the segments some pair's target can use (the others are ``INF`` at every
        depth and every degree, so leaving them out changes no DP value): a target near the
        optimum leaves most long segments out, which keeps the table small on long series."""
        by_b, use, _ = self._usable(pairs, deadline)
        nseg = len(self.idx.seg_lo)
        used = np.nonzero(use)[0]
        gmap = np.full(nseg + 1, len(used), dtype=np.int64)
        gmap[used] = np.arange(len(used))
        arr = np.empty((len(pairs), len(used) + 1, E + 2), dtype=np.int64)
        arr[:, -1] = INF
        for b, rows in by_b.items():
            check_deadline(deadline)
            tb = self.tables(b)
            enc = encode(np.asarray(tb.degrees, dtype=np.int64))
            ts = [pairs[i][1] for i in rows]
            if self._fits.get(b, (None,))[0] != E and len(tb.maxdepth) * (E + 2) <= 1 << 22:
                self._fits[b] = (E, segment_fits(tb.maxdepth, E))  # one bound per size, 4 MB at most
            fits = self._fits[b][1] if self._fits.get(b, (None,))[0] == E else None
            if rows[-1] - rows[0] == len(rows) - 1:  # consecutive rows: fill the slice in place
                devices_for_segments(
                    tb.tps, tb.maxdepth, enc, ts, used, E, out=arr[rows[0] : rows[-1] + 1, :-1], fits=fits
                )
            else:
                arr[rows, :-1] = devices_for_segments(tb.tps, tb.maxdepth, enc, ts, used, E, fits=fits)
        if sat:  # depth E + 1 counts as depth E
            arr[:, :-1, E + 1] = arr[:, :-1, E]
        return SegDev(arr, gmap)

    def batch_size(self) -> int:
        """How many targets one DP pass should test: enough to amortise the Python overhead of
        the recursion on small tables, few enough that array work stays modest on large ones."""
        size = self.E + 1
        work = sum(len(kids) ** 2 for _, kids in self.idx.nodes) * size * size
        return int(max(1, min(32, 4e5 // max(work, 1))))

    def min_devices_by_depth(self, pairs: Sequence[tuple[int, float]]) -> np.ndarray:
        """``out[i, e]``: fewest devices for ``pairs[i] = (b, t)`` with the stage graph's depth at
        most ``e`` (``e = 0..E``; column ``E`` is :meth:`min_devices`), one batched DP pass."""
        return self.probe(pairs, keep=False).devices

    def probe(
        self,
        pairs: Sequence[tuple[int, float]],
        keep: bool = True,
        E: int | None = None,
        saturate: int | None = None,
        deadline: float | None = None,
    ) -> DPProbe:
        """One batched DP pass over ``(b, t)`` pairs; with ``keep`` it also holds the tables that
        :meth:`traceback` needs, so a search need not run the pass again for its answer.  With
        ``E`` below the DP's own bound the pass only considers stage graphs of depth ``<= E``: the
        answers for those depths are the same (a stage's depth never exceeds its source's), and
        the tables are much smaller.  ``deadline``: :class:`TimeLimitError` when it passes during the pass."""
        E = self.E if E is None or E >= self.E else max(1, int(E))
        if saturate is not None and E == self.E:
            caps: dict[int, list[int]] = {}
            for i, (b, t) in enumerate(pairs):
                self._tables_in_time(b, deadline)
                caps.setdefault(self.depth_cap(b, saturate, t), []).append(i)
            if any(C < E for C in caps):
                return self._probe_saturated(pairs, keep, caps, deadline)
        groups = self._split(pairs, E, deadline)
        if len(groups) > 1:  # one pass per micro-batch size, or per half of the targets (_split)
            subs = [(self.probe([pairs[i] for i in rows], keep, E, deadline=deadline), rows) for rows in groups]
            devices = np.empty((len(pairs), E + 1), dtype=np.int64)
            where = {}
            for sub, rows in subs:
                devices[rows] = sub.devices
                where.update({i: (sub, r) for r, i in enumerate(rows)})
            return DPProbe(tuple(pairs), devices, ("split", where) if keep else None, E)
        dev = self._dev(pairs, E, deadline=deadline)
        Rroot, tables, R = run_dp(self.idx, dev, E, keep=keep, deadline=deadline)
        return DPProbe(tuple(pairs), decode(Rroot[:, 0, :]), (dev, Rroot, tables, R) if keep else None, E)

    def _usable(
        self, pairs: Sequence[tuple[int, float]], deadline: float | None = None
    ) -> tuple[dict[int, list[int]], np.ndarray, int]:
        """``pairs``' rows by micro-batch size, the segments some pair's target can use (a target
        below a segment's ``best`` leaves it ``INF`` everywhere), and the sum over rows of the
        segments each row's own size and target could use (by size, at its largest target);
        :class:`TimeLimitError` past ``deadline`` before a size's tables are built."""
        by_b: dict[int, list[int]] = {}
        for i, (b, _) in enumerate(pairs):
            by_b.setdefault(b, []).append(i)
        use = np.zeros(len(self.idx.seg_lo), dtype=bool)
        own = 0
        for b, rows in by_b.items():
            u = self._tables_in_time(b, deadline).best <= max(pairs[i][1] for i in rows)
            own += len(rows) * int(u.sum())
            use |= u
        return by_b, use, own

    def _probe_saturated(
        self, pairs: Sequence[tuple[int, float]], keep: bool, caps: dict[int, list[int]], deadline: float | None = None
    ) -> DPProbe:
        """:meth:`probe` with each pair's depths saturated at its :meth:`depth_cap` (at its size and target) (one
        pass per cap).  Column ``E`` of ``devices`` (any depth) is exact, as are the columns below
        each cap; the columns from a cap to ``E - 1`` repeat the any-depth answer."""
        devices = np.empty((len(pairs), self.E + 1), dtype=np.int64)
        where = {}
        for C, rows in caps.items():
            sub = [pairs[i] for i in rows]
            if C >= self.E:
                pr = self.probe(sub, keep, deadline=deadline)
            else:
                dev = self._dev(sub, C, sat=True, deadline=deadline)
                Rroot, tables, R = run_dp(self.idx, dev, C, keep=keep, sat=True, deadline=deadline)
                pr = DPProbe(tuple(sub), decode(Rroot[:, 0, :]), (dev, Rroot, tables, R) if keep else None, C, True)
            devices[rows, : pr.devices.shape[1]] = pr.devices
            devices[rows, pr.devices.shape[1] :] = pr.devices[:, -1:]
            where.update({i: (pr, r) for r, i in enumerate(rows)})
        return DPProbe(tuple(pairs), devices, ("split", where) if keep else None, None)

    def _split(self, pairs: Sequence[tuple[int, float]], E: int, deadline: float | None = None) -> list[list[int]]:
        """The rows of ``pairs`` by micro-batch size when passes of their own store much less than
        one batched pass (whose table holds, for every target, the union of the segments the
        sizes' targets can use: a small ``b`` with its large targets would widen every row);
        else one group, or its halves when that one pass's stage-value table would hold more than
        ``PASS_ENTRIES`` entries.  The answers do not depend on the grouping."""
        by_b, use, own = self._usable(pairs, deadline)
        whole = len(pairs) * int(use.sum())
        if len(by_b) > 1 and whole * (E + 2) >= (1 << 20) and own * 2 <= whole:
            return list(by_b.values())
        if len(pairs) > 1 and len(pairs) * (int(use.sum()) + 1) * (E + 2) > self.PASS_ENTRIES:
            half = len(pairs) // 2  # bound the pass's tables: halves of the targets
            return [list(range(half)), list(range(half, len(pairs)))]
        return [list(range(len(pairs)))]

    def large(self) -> bool:
        """Whether a pass is large per target: segments x (depth bound + 2)^2 (its kernel's tables
        per segment are depth^2) of at least :data:`LARGE_TABLE`.  Only then do the searches gallop,
        cap depths and prune sizes by a seed staging (:mod:`gpp_solver.binary_search`); below it the
        extra passes cost more Python overhead than they save."""
        return len(self.idx.seg_lo) * (self.E + 2) ** 2 >= self.LARGE_TABLE

    def keep_tables(self) -> bool:
        """Whether a search may hold every probe's tables for its tracebacks (a few MB at most)."""
        size = self.E + 1
        per_target = sum(len(kids) + 1 for _, kids in self.idx.nodes) * size * size * 8
        return per_target * self.batch_size() <= 4 << 20

    def traceback(self, probe: DPProbe, i: int, prefer_shared: bool = True) -> list[DPStage]:
        """The stages of ``probe``'s ``i``-th pair (it must be feasible).  Where a shared-sink stage
        and separate stages reach the same value, ``prefer_shared`` picks the former."""
        assert probe.kept is not None, "probe ran without keep=True"
        if isinstance(probe.kept[0], str):  # a probe split by micro-batch size
            sub, r = probe.kept[1][i]
            return self.traceback(sub, r, prefer_shared)
        dev, Rroot, tables, R = probe.kept
        b, t = probe.pairs[i]
        tb = self.tables(b)
        E = self.E if probe.E is None else probe.E
        st = trace_stages(
            self.idx,
            tb.degrees,
            tb.tps,
            self.D,
            b,
            t,
            dev[i],
            Rroot[i],
            [x[i] for x in tables],
            [x[i] for x in R],
            prefer_shared,
            E,
            probe.sat,
        )
        if probe.sat and max(s.depth for s in st) >= E:
            # the staging reaches the cap: trace it from a pass without saturation, so that ties
            # break as they always did (same stages), unless that pass's table is too large; the
            # saturated traceback is a staging of the same value (devices, stages) at target t
            if int((tb.best <= t).sum()) * (self.E + 2) * 8 <= self.RETRACE_BYTES:
                return self.traceback(self.probe([(b, t)]), 0, prefer_shared)
            logger.info("b=%d: staging traced under the depth cap %d (a table without it is too large)", b, E)
        return st

    def min_devices_any_tps(self, b: int) -> int | None:
        """Fewest devices for a plan at ``b`` that fits in memory, ignoring TPS (None: never fits)."""
        r = self.min_devices(b, float("inf"))
        return None if r >= INF else r

    def min_devices(self, b: int, t: float) -> int:
        """Fewest devices with which every stage meets TPS ``t`` and memory (``INF`` if none)."""
        R, _, _ = run_dp(self.idx, self._dev([(b, float(t))], self.E), self.E)
        return int(decode(R[0, 0, self.E]))

    def feasible(self, b: int, t: float) -> bool:
        return self.min_devices(b, t) <= self.D

    def stages(self, b: int, t: float) -> list[DPStage]:
        """The stages of a plan meeting ``t`` with at most ``D`` devices (traceback of the DP)."""
        return self.stages_many([(b, t)])[0]

    def stages_many(
        self,
        pairs: Sequence[tuple[int, float]],
        prefer_shared: bool = True,
        E: int | None = None,
        saturate: int | None = None,
    ) -> list[list[DPStage]]:
        """Tracebacks for several ``(b, t)`` pairs from one batched DP pass (bounded to depth
        ``E``, or saturated, see :meth:`probe`)."""
        pr = self.probe(pairs, E=E, saturate=saturate)
        return [self.traceback(pr, i, prefer_shared) for i in range(len(pairs))]
