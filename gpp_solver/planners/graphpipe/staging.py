"""What GraphPipe's two planners (one micro-batch size, :mod:`gpp_solver.planners.graphpipe.uniform`; one per
stage, :mod:`gpp_solver.planners.graphpipe.per_stage`) share: DP stages -> device ranges -> stage specs, the
fast pricing of a staging and the leftover-device pass."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from gpp_solver.cost.model import (CostTables, allreduce_time, comm_time, iteration_time_estimate, stage_costs,
                                   stage_transfers, time_per_sample)
from gpp_solver.planners.graphpipe.dp_stage import DPStage, assign_devices
from gpp_solver.plan.build import StageSpec, stage_graph_edges
from gpp_solver.types import Cluster, Graph

PLANNER = "graphpipe"
#: the kFkB ``k`` a stage may take with ``search_k`` (GraphPipe A.1)
K_OPTIONS = (1, 2, 4, 8)


def stage_specs(stages: Sequence[DPStage], b: int, devices_per_node: int | None, k: int | None = 1) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [StageSpec(nodes=s.nodes, devices=d, micro_batch_size=b, k=k) for s, d in zip(stages, devs)]


def estimate_iteration(graph: Graph, cluster: Cluster, specs: Sequence[StageSpec], B: int) -> float:
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    costs = stage_costs(graph, cluster, specs, B)
    return iteration_time_estimate(costs, stage_graph_edges(graph, stage_of), B)


def price_staging(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int, tables: CostTables
           ) -> tuple[float, float]:
    """``(TPS, iteration estimate)`` of DP stages at ``b`` on their :func:`assign_devices` ranges:
    the figures of :func:`gpp_solver.cost.model.stage_costs` and :func:`~gpp_solver.cost.model.iteration_time_estimate`
    (same formulas, same transfers), with each stage's compute summed from ``tables`` at once
    instead of node by node — this runs for every candidate staging and every leftover-device step.
    It must exist beside ``stage_costs`` because it prices DP stages (no ``StageSpec`` built) with the
    compute vectorised over nodes; every formula is the cost model's pricing core."""
    devs = assign_devices(stages, cluster.devices_per_node)
    stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
    transfers = stage_transfers(graph, stage_of)
    per_mb, allreduce, tps = [], [], 0.0
    for i, (st, dv) in enumerate(zip(stages, devs)):
        d = len(dv)
        ix = [graph.index[v] for v in st.nodes]
        comm_half = sum(comm_time(nb, b / d, cluster.bandwidth(dv + devs[peer]), cluster.latency)
                        for peer, nb in transfers.get(i, []))
        a = allreduce_time(float(tables.weight[ix].sum()), d, cluster.bandwidth(dv))
        m = float(tables.compute_at(b / d)[ix].sum()) + 2 * comm_half
        per_mb.append(m)
        allreduce.append(a)
        tps = max(tps, time_per_sample(m, b, a, B))
    preds: dict[int, list[int]] = {i: [] for i in range(len(stages))}
    for u, v in stage_graph_edges(graph, stage_of):
        preds[v].append(u)
    longest: dict[int, float] = {}

    def path(i: int) -> float:         # longest path of per-micro-batch times ending at stage i
        if i not in longest:
            longest[i] = per_mb[i] + max((path(u) for u in preds[i]), default=0.0)
        return longest[i]

    L = max(path(i) for i in range(len(stages)))
    return tps, L + (B // b - 1) * max(per_mb) + max(allreduce)


def spend_leftover_devices(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int,
                           degree_options: Sequence[int], tables: CostTables | None = None,
                           deadline: float | None = None) -> tuple[DPStage, ...]:
    """Give devices the DP left unused to stages, greedily, while the iteration estimate improves.

    The DP stops at the fewest devices that reach the optimal bottleneck; the rest would idle.  A
    step raises one stage's degree to the next allowed one (``b % d == 0``) when enough devices are
    free, and keeps the step that lowers the cost model's iteration estimate most, provided the
    plan's exact bottleneck TPS does not rise.  A larger degree only lowers a stage's activation
    memory (the stage graph, hence the in-flight counts, are unchanged), so memory stays within
    the limit; the plan's TPS stays at most the DP's target.  Past ``deadline`` (``time.perf_counter()``)
    it stops with the steps taken so far (a valid staging).
    """
    tables = tables or CostTables(graph)
    opts = sorted(d for d in degree_options if b % d == 0)
    return raise_degrees(tuple(stages), cluster.devices, lambda st: opts,
                         lambda trial: price_staging(graph, cluster, trial, b, B, tables), deadline)


def raise_degrees(stages: tuple, devices: int, allowed: Callable[[Any], Sequence[int]],
                  price: Callable[[tuple], tuple[float, float]], deadline: float | None = None) -> tuple:
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
            trial = cur[:i] + (replace(st, degree=bigger[0]),) + cur[i + 1:]
            tps, est = price(trial)
            if est < best * (1 - 1e-12) and tps <= tps0 * (1 + 1e-12) and (step is None or est < step[0]):
                step = (est, trial, bigger[0] - st.degree)
        if step is None:
            break
        best, cur, used = step
        free -= used
    return cur
