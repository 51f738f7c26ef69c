"""PipeDream's own cost model and optimizer (``mode="pipedream-costs"`` of :func:`.pipedream.plan_pipedream`;
msr-fiddle/pipedream ``optimizer/optimizer_graph_hierarchical.py``).

The linearisation is PipeDream's own: antichain states reached from the first source
(:mod:`.linearize`), after the pre-processing of :func:`.common.pipedream_core`; the min-max DP is
:mod:`.pipedream_dp`'s.

PipeDream's own formulas: stage time
``(C + 4 (m-1) W / (bw m)) / m`` for ``m`` replicas (``C`` = profiled fw+bw time of the
stage for the profiled mini-batch, ``W`` its parameter bytes), flat network at ``bandwidth``
(default 1e9 B/s, or per level ``bandwidths``), no memory constraint, all machines used.  Like
the original, activation transfers enter only with ``activation_compression_ratio`` (then as
``2 a / (bw m ratio)`` terms of the max, ``a`` here the bytes leaving the state per producer
rather than PipeDream's augmented-antichain sum).  :func:`pipedream_optimizer` returns the
bottleneck figure PipeDream prints ("Time per stage in pipeline", seconds per mini-batch); the
plan built from its partition carries it in ``search.extra["pipedream_bottleneck"]``.
At a second level the original's quirks are kept: its single-stage initialisation divides the
sync time by the machines of the level below; ranges are formed only between nested states.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpp_solver.cost.network import node_bandwidth
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.plan.build import build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core
from gpp_solver.planners.sequential.linearize import DEFAULT_MAX_STATES, linearize
from gpp_solver.planners.sequential.options import PipeDreamOptions
from gpp_solver.planners.sequential.pipedream_dp import DPTable, minmax_dp
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status


@dataclass(frozen=True)
class PipeDreamSolution:
    """PipeDream's answer in its own model: bottleneck (s per mini-batch) and the stages."""

    bottleneck: float
    stages: tuple[tuple[tuple[str, ...], int], ...]  # (node ids, replicas), in pipeline order
    n_states: int
    linearization: str
    seconds: float


def pipedream_optimizer(
    graph: Graph,
    machines: Sequence[int],
    bandwidths: Sequence[float] | float = 1e9,
    *,
    activation_compression_ratio: float | None = None,
    use_fewer_machines: bool = False,
    max_states: int | None = DEFAULT_MAX_STATES,
) -> PipeDreamSolution:
    """Run PipeDream's hierarchical optimizer on ``graph`` (times at its first profiled size).

    ``machines[l]`` machines at level ``l`` (level 0 innermost), ``bandwidths[l]`` bytes/s.
    """
    t0 = _time.perf_counter()
    machines = list(machines)
    if isinstance(bandwidths, (int, float)):
        bandwidths = [float(bandwidths)] * len(machines)
    if len(bandwidths) != len(machines) or not machines or min(machines) < 1:
        raise InvalidInputError(
            f"machines and bandwidths must be non-empty lists of equal length, "
            f"got machines={machines}, bandwidths={list(bandwidths)}"
        )
    core, _, _ = pipedream_core(graph)
    lin = linearize(graph, nodes=core, first_source=True, max_states=max_states)
    order_nodes = [graph.node(v) for v in lin.order]
    mb = graph.micro_batch_sizes[0]
    C = lin.state_sums([n.fw_time[0] + n.bw_time[0] for n in order_nodes])
    W = lin.state_sums([n.weight_bytes for n in order_nodes])
    cut, _ = lin.cut_bytes(graph)
    cut = cut * mb
    S = lin.n_states
    last = S - 1
    sub = lin.subset
    comp = C[None, :] - C[:, None]
    wts = W[None, :] - W[:, None]
    tables: list[DPTable] = []
    below = 1
    for level, (K, bw) in enumerate(zip(machines, bandwidths)):
        final = level == len(machines) - 1
        if level > 0:
            comp = tables[-1].value[:, :, machines[level - 1]]  # best range time one level down

        def T(m: int, r: int, comp=comp, bw=bw, below=below) -> np.ndarray:
            t = (comp + 4.0 * (r - 1) * wts / (bw * r)) / r
            if below > 1 and r == m:  # the original's single-stage initialisation
                t = t.copy()
                t[0] = (comp[0] + 4.0 * (r - 1) * wts[0] / (bw * r) / below) / r
            if activation_compression_ratio is not None:
                xfer_in = 2.0 * cut / (bw * r) / activation_compression_ratio
                xfer_in[0] = 0.0
                xfer_out = 2.0 * cut / (bw * r) / activation_compression_ratio
                xfer_out[last] = 0.0
                t = np.maximum(t, np.maximum(xfer_in[:, None], xfer_out[None, :]))
            return t

        starts = (0,) if final else tuple(range(S))
        tables.append(minmax_dp(sub, T, K, starts=starts, allow_fewer=use_fewer_machines))
        below = K
    bottleneck = float(tables[-1].value[0, last, machines[-1]])
    stages: list[tuple[tuple[str, ...], int]] = []

    def unfold(level: int, k: int, j: int, outer: int) -> None:
        for a, c, r in tables[level].stages(k, j, machines[level]):
            if level == 0:
                stages.append((tuple(lin.stage_nodes(a, c)), r * outer))
            else:
                unfold(level - 1, a, c, r * outer)

    if math.isfinite(bottleneck):
        unfold(len(tables) - 1, 0, last, 1)
    return PipeDreamSolution(bottleneck, tuple(stages), S, lin.kind, _time.perf_counter() - t0)


def plan_pipedream_costs(graph: Graph, cluster: Cluster, B: int, t0: float, o: PipeDreamOptions) -> Plan:
    """PipeDream's partition (:func:`pipedream_optimizer`, one level per network level of ``cluster``
    unless ``o.bandwidth`` flattens it), then the micro-batch size of least simulated iteration time;
    ``t0`` is the call's start, for ``search.seconds``."""
    dpn = cluster.devices_per_node
    if o.bandwidth is not None or dpn is None or dpn >= cluster.devices or cluster.devices % dpn:
        machines, bws = [cluster.devices], [float(1e9 if o.bandwidth is None else o.bandwidth)]
    else:
        machines = [dpn, cluster.devices // dpn]
        bws = [node_bandwidth(cluster), cluster.inter_node_bandwidth]
    sol = pipedream_optimizer(
        graph, machines, bws, max_states=o.max_states, activation_compression_ratio=o.activation_compression_ratio
    )
    if not sol.stages:
        raise InfeasibleError(f"pipedream-costs: no partition of '{graph.name}' on {machines} machines")
    _, inputs, sinks = pipedream_core(graph)
    lcm = math.lcm(*(r for _, r in sol.stages))
    best: Plan | None = None
    for b in candidate_micro_batches(B, o.micro_batch_sizes):
        if b % lcm:
            continue
        rows, dev = [], 0
        for nodes, r in sol.stages:
            rows.append((list(nodes), tuple(range(dev, dev + r)), b))
            dev += r
        plan = build_plan(
            graph,
            cluster,
            attach_detached(graph, rows, inputs, sinks),
            B,
            planner="pipedream",
            search=SearchInfo(0.0, Status.OPTIMAL_WITHIN_SEARCH_SPACE),
        )
        if best is None or plan.predicted.iteration_time < best.predicted.iteration_time:
            best = plan
    if best is None:
        raise InvalidInputError(
            f"pipedream-costs: the partition replicates stages {[r for _, r in sol.stages]} "
            f"times; `b % d == 0` needs a micro-batch size divisible by {lcm} that divides "
            f"B={B}"
        )
    if best.predicted.peak_memory_bytes > cluster.memory_bytes:
        raise InfeasibleError(
            f"pipedream-costs: PipeDream's partition (no memory constraint) needs "
            f"{best.predicted.peak_memory_bytes:.4g} bytes per device, the cluster has "
            f"{cluster.memory_bytes:.4g}",
            required_memory_bytes=best.predicted.peak_memory_bytes,
        )
    plan = replace(
        best,
        search=SearchInfo(
            _time.perf_counter() - t0,
            Status.OPTIMAL_WITHIN_SEARCH_SPACE,
            objective="least bottleneck stage time in PipeDream's own cost model over the chains of its "
            "linearisation; then the micro-batch size of least simulated iteration time",
            extra={
                "mode": "pipedream-costs",
                "pipedream_bottleneck": sol.bottleneck,
                "machines": machines,
                "bandwidths": bws,
                "n_states": sol.n_states,
                "linearization": sol.linearization,
                "note": "optimal for PipeDream's own cost model; predicted figures are the shared model's",
            },
        ),
    )
    validate(plan, graph, cluster)
    return plan
