"""GraphPipe's stage DP (Algorithm 1, lines 13-48) over the SP tree: orchestration.

:class:`StageDP` prepares, once per graph and cluster, the SP tree's segments and their boundary
transfers; per micro-batch size ``b`` it prices every segment at every data-parallel degree
(:func:`gpp_solver.planners.graphpipe.dp_stage_tables.stage_tps`, :func:`~gpp_solver.planners.graphpipe.dp_stage_tables.max_depths`); per target TPS ``t`` it runs the numeric kernel
(:func:`gpp_solver.planners.graphpipe.dp_kernel.run_dp`) and answers "how few devices reach ``t``" or, with
:meth:`StageDP.stages`, the stages themselves (the traceback): the methods of
:class:`gpp_solver.planners.graphpipe.dp_passes.DPPasses`.

With ``optimistic_transfers=True`` every boundary transfer is priced at the faster of the two
bandwidths instead: the figures are then no longer upper bounds (a transfer between nodes costs
more), so the planner only uses such a DP to *propose* stages and prices them exactly.

Search space (the paper's defaults): one micro-batch size ``b`` for every stage, 1F1B (``k = 1``),
data-parallel degrees from ``degree_options`` (default: powers of two up to the cluster's devices)
with ``b % d == 0``; stages are SP-tree segments (see :mod:`gpp_solver.planners.graphpipe.dp_kernel`).  Every figure
the DP uses is an upper bound of the cost model's exact one, so the plan built from its stages has
``TPS <= t`` and fits in memory (``plan_build`` recomputes the exact figures).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpp_solver.cost.network import link_bandwidths, node_bandwidth, one_node, slowest_bandwidth
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InvalidInputError
from gpp_solver.planners.graphpipe.dp_passes import DPPasses
from gpp_solver.planners.graphpipe.dp_segment_comm import SegmentComm, segment_comm
from gpp_solver.planners.graphpipe.dp_stage import SizeTables, power_of_two_degrees
from gpp_solver.planners.graphpipe.dp_stage_tables import best_at_sink, max_depths, segment_sums, stage_tps
from gpp_solver.planners.graphpipe.dp_tree import TreeIndex, index_tree, tree_segments
from gpp_solver.sp_tree import SPDecomposition, decompose
from gpp_solver.types import Cluster, Graph


class StageDP(DPPasses):
    """The DP for one graph, cluster and mini-batch size (uniform ``b``, 1F1B): its setup and
    per-size tables here, its passes per target inherited (:class:`DPPasses`)."""

    #: segments above which long series are coarsened into blocks (``max_segments``; 0: never)
    MAX_SEGMENTS = 150_000
    #: the children a coarsened series keeps (about 74,000 segments)
    COARSE_CHILDREN = 384
    #: the largest stage-graph depth a coarsened space holds (unless memory needs more, see ``E``)
    COARSE_DEPTH = 32

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
        #: series coarsened into blocks of operators (``dp_tree.index_tree``) when the tree lists
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
        self._fits: dict[int, tuple] = {}  # b -> (E, dp_stage_tables.segment_fits at E)

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
