"""What GraphPipe's two planners (one micro-batch size, :mod:`gpp_solver.planners.graphpipe.uniform`; one per
stage, :mod:`gpp_solver.planners.graphpipe.per_stage`) share: DP stages -> device ranges -> stage specs, the
fast pricing of a staging, the leftover-device pass and the priced plan of a staging."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from gpp_solver.cost.model import iteration_time_estimate, stage_costs, stage_transfers
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.plan.build import StageSpec, build_plan, stage_graph_edges
from gpp_solver.planners.graphpipe.dp.stage import DPStage, assign_devices
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

PLANNER = "graphpipe"
#: the kFkB ``k`` a stage may take with ``search_k`` (GraphPipe A.1)
K_OPTIONS = (1, 2, 4, 8)


def stage_specs(stages: Sequence[DPStage], b: int, devices_per_node: int | None, k: int | None = 1) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [StageSpec(nodes=s.nodes, devices=d, micro_batch_size=b, k=k) for s, d in zip(stages, devs)]


def estimate_iteration(graph: Graph, cluster: Cluster, specs: Sequence[StageSpec], mini_batch_size: int) -> float:
    B = mini_batch_size  # the paper's B
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    costs = stage_costs(graph, cluster, specs, B)
    return iteration_time_estimate(costs, stage_graph_edges(graph, stage_of), B)


def price_staging(
    graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, mini_batch_size: int, tables: CostTables
) -> tuple[float, float]:
    """``(TPS, iteration estimate)`` of DP stages at ``b`` on their :func:`assign_devices` ranges:
    the figures of :func:`gpp_solver.cost.model.stage_costs` and :func:`~gpp_solver.cost.model.iteration_time_estimate`
    (same formulas, same transfers), with each stage's compute summed from ``tables`` at once
    instead of node by node — this runs for every candidate staging and every leftover-device step.
    It must exist beside ``stage_costs`` because it prices DP stages (no ``StageSpec`` built) with the
    compute vectorised over nodes; every formula is the cost model's pricing core."""
    B = mini_batch_size  # the paper's B
    return StagingPricer(graph, cluster, stages, b, B, tables).price(stages)


class StagingPricer:
    """:func:`price_staging` for one partition (the stages' node sets) at many degree vectors: the
    transfers, the stage graph and its topological order are built once, each stage's compute is
    summed once per degree, and a device range's node test is two integer divisions (ranges are
    contiguous, so :meth:`Cluster.bandwidth`'s ``min // dpn == max // dpn`` reads their ends).
    The leftover-device pass prices every stage's next degree at every step (thousands of
    pricings at 1,024 devices)."""

    def __init__(
        self, graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int, tables: CostTables
    ) -> None:
        self.cluster, self.b, self.B, self.tables = cluster, b, B, tables
        stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
        transfers = stage_transfers(graph, stage_of)
        n = len(stages)
        self.nodes = [s.nodes for s in stages]
        self.first = np.asarray([s.first for s in stages], dtype=np.int64)
        flat = [(i, peer, nb) for i in range(n) for peer, nb in transfers.get(i, [])]  # stage by stage
        self.t_stage = np.asarray([f[0] for f in flat], dtype=np.int64)
        self.t_peer = np.asarray([f[1] for f in flat], dtype=np.int64)
        self.t_bytes = np.asarray([f[2] for f in flat], dtype=np.float64)
        self.ix = [np.asarray([graph.index[v] for v in s.nodes], dtype=np.int64) for s in stages]
        self.weight = np.asarray([float(tables.weight[ix].sum()) for ix in self.ix])
        preds: list[list[int]] = [[] for _ in range(n)]
        for u, v in stage_graph_edges(graph, stage_of):
            preds[v].append(u)
        self.preds = preds
        order, seen = [], [False] * n  # a topological order of the stage graph (DFS post-order)
        for root in range(n):
            stack = [(root, 0)]
            while stack:
                i, k = stack.pop()
                if k == 0 and seen[i]:
                    continue
                seen[i] = True
                if k < len(preds[i]):
                    stack.append((i, k + 1))
                    if not seen[preds[i][k]]:
                        stack.append((preds[i][k], 0))
                else:
                    order.append(i)
        self.order = order
        self._comp: dict[int, np.ndarray] = {}
        self.terms = TimeTerms.of(graph, cluster, B)

    def _compute(self, d: int) -> np.ndarray:
        """Every stage's compute per micro-batch at degree ``d`` (``compute_at(b / d)`` summed)."""
        out = self._comp.get(d)
        if out is None:
            at = self.tables.compute_at(self.b / d)
            out = self._comp[d] = np.asarray([float(at[ix].sum()) for ix in self.ix])
        return out

    def price(self, stages: Sequence[DPStage]) -> tuple[float, float]:
        """``(TPS, iteration estimate)`` of ``stages`` (this partition's node sets, any degrees):
        :func:`assign_devices`' ranges and the cost model's formulas, evaluated for all stages
        and transfers at once (the same floating-point operations in the same order)."""
        assert len(stages) == len(self.nodes)
        c, b, B = self.cluster, self.b, self.B
        S = len(stages)
        deg = np.asarray([s.degree for s in stages], dtype=np.int64)
        order = np.lexsort((self.first, -deg))  # assign_devices: largest degree first, then leaf order
        start = np.empty(S, dtype=np.int64)
        start[order] = np.cumsum(deg[order]) - deg[order]
        end = start + deg - 1
        dpn, intra, inter = c.devices_per_node, c.intra_node_bandwidth, c.inter_node_bandwidth
        x = b / deg
        comm_half = np.zeros(S)
        if len(self.t_stage):
            lo = np.minimum(start[self.t_stage], start[self.t_peer])
            hi = np.maximum(end[self.t_stage], end[self.t_peer])
            bw = (
                np.full(len(lo), inter)
                if dpn is None or intra is None
                else np.where(lo // dpn == hi // dpn, intra, inter)
            )
            t = 1 * c.latency + self.t_bytes * x[self.t_stage] / bw  # comm_time, one message each
            comm_half = np.bincount(self.t_stage, weights=t, minlength=S)
        if dpn is None or intra is None:
            bw_st = np.full(S, inter)
        else:
            bw_st = np.where((deg <= 1) | (start // dpn == end // dpn), intra, inter)
        allreduce = self.terms.tail(self.weight, deg, bw_st, b)  # A(S) + O(S)
        comp = np.empty(S)
        for d in np.unique(deg).tolist():
            m = deg == d
            comp[m] = self._compute(d)[m]
        per_mb = comp + 2 * comm_half
        tps = float(np.max(per_mb / b + allreduce / B))
        pm = per_mb.tolist()
        longest = [0.0] * S  # longest path of per-micro-batch times ending at stage i
        for i in self.order:
            longest[i] = pm[i] + max((longest[u] for u in self.preds[i]), default=0.0)
        L = max(longest)
        return tps, L + (B // b - 1) * max(pm) + float(np.max(allreduce))


def spend_leftover_devices(
    graph: Graph,
    cluster: Cluster,
    stages: Sequence[DPStage],
    b: int,
    mini_batch_size: int,
    degree_options: Sequence[int],
    tables: CostTables | None = None,
    deadline: float | None = None,
) -> tuple[DPStage, ...]:
    """Give devices the DP left unused to stages, greedily, while the iteration estimate improves.

    The DP stops at the fewest devices that reach the optimal bottleneck; the rest would idle.  A
    step raises one stage's degree to the next allowed one (``b % d == 0``) when enough devices are
    free, and keeps the step that lowers the cost model's iteration estimate most, provided the
    plan's exact bottleneck TPS does not rise.  A larger degree only lowers a stage's activation
    memory (the stage graph, hence the in-flight counts, are unchanged), so memory stays within
    the limit; the plan's TPS stays at most the DP's target.  Past ``deadline`` (``time.perf_counter()``)
    it stops with the steps taken so far (a valid staging).
    """
    B = mini_batch_size  # the paper's B
    tables = tables or CostTables(graph)
    opts = sorted(d for d in degree_options if b % d == 0)
    pricer = StagingPricer(graph, cluster, stages, b, B, tables)
    return raise_degrees(tuple(stages), cluster.devices, lambda st: opts, pricer.price, deadline)


def raise_degrees(
    stages: tuple,
    devices: int,
    allowed: Callable[[Any], Sequence[int]],
    price: Callable[[tuple], tuple[float, float]],
    deadline: float | None = None,
) -> tuple:
    """The greedy loop of :func:`spend_leftover_devices`: ``price(stages) -> (exact TPS, estimate)``;
    ``allowed(stage)`` lists the degrees a stage may take (ascending)."""
    cur = stages
    free = devices - sum(s.degree for s in cur)
    tps0, best = price(cur)
    while free > 0:
        if deadline is not None and time.perf_counter() > deadline:
            break
        step = None
        for i, st in enumerate(cur):
            bigger = [d for d in allowed(st) if d > st.degree and d - st.degree <= free]
            if not bigger:
                continue
            trial = cur[:i] + (replace(st, degree=bigger[0]),) + cur[i + 1 :]
            tps, est = price(trial)
            if est < best * (1 - 1e-12) and tps <= tps0 * (1 + 1e-12) and (step is None or est < step[0]):
                step = (est, trial, bigger[0] - st.degree)
        if step is None:
            break
        best, cur, used = step
        free -= used
    return cur


def build_staging_plan(
    graph: Graph,
    cluster: Cluster,
    stages: Sequence[DPStage],
    b: int,
    B: int,
    dp: StageDP,
    search_k: bool,
    leftover: bool = True,
    deadline: float | None = None,
    schedule: str = "1f1b",
) -> Plan:
    """The priced plan of DP stages at ``b`` (devices by :func:`assign_devices`; with ``leftover``
    the unused devices first go through :func:`spend_leftover_devices`)."""
    if leftover and sum(s.degree for s in stages) < cluster.devices:
        stages = spend_leftover_devices(graph, cluster, stages, b, B, dp.degree_options, dp._costs, deadline)
    specs = stage_specs(stages, b, cluster.devices_per_node, None if search_k else 1)
    return build_plan(
        graph,
        cluster,
        specs,
        B,
        planner=PLANNER,
        search=SearchInfo(seconds=0.0, status=Status.TIME_LIMIT, epsilon=None, extra={}),
        k_options=K_OPTIONS if search_k else (1,),
        schedule=schedule,
    )
