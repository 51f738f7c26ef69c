"""PipeDream's planner (Narayanan et al., SOSP'19, §3.1; msr-fiddle/pipedream ``optimizer/``).

The DAG is linearised into PipeDream's antichain states (:mod:`.linearize`): after PipeDream's own
pre-processing — ``Input`` sources (and, for graphs without op names, zero-cost sources) are set
aside and placed with their first consumer, zero-cost ``__getitem__``-style sinks are set aside and
placed with their producer — the states are the downsets reached from the first source.  When
there are more than ``max_states`` of them the prefixes of one topological order are used instead
(logged warning).  Then the min-max DP over state ranges and replica counts (:mod:`.pipedream_dp`)
gives a chain of stages, each replicated (data-parallel degree = replicas), run with 1F1B.

Two modes:

``mode="shared"`` (default)
    Stage times are the shared cost model's, for each candidate micro-batch size ``b`` (powers of
    two dividing ``B``): ``TPS = (C(b/d) + comm) / b + A / B`` with replicas ``d | b``; ``comm``
    charges the stage's own transfers (:meth:`.Linearization.range_transfers`): every producer
    before the stage feeding it (exact) and every producer in it feeding a later node, once
    (exact unless that producer feeds two later stages: then a lower bound).  The states are
    every downset from a virtual source (not PipeDream's first-source start, which on graphs with
    several sources, e.g. mmt, jumped over whole branches), or the topological-order prefixes
    beyond ``max_states``.  On a flat network the DP value is therefore the exact TPS of its
    plan, or a lower bound when a producer fans out to two later stages.  Hierarchical as in the paper: with ``devices_per_node`` and several nodes, level
    1 partitions a state range over the devices of one node (intra-node bandwidth), level 2 over
    whole nodes; a level-2 stage on ``n'`` nodes is its level-1 pipeline replicated ``n'`` times,
    so each of its stages gets ``r`` devices in each of those nodes (inter-node bandwidth).
    Memory is checked in the DP with an upper bound on in-flight samples (1F1B: a stage holds
    ``min(n, stages after + 1) * b`` samples, and stages after <= devices after), so every plan
    the DP returns fits; the final plan is priced by ``build_plan`` (exact transfers, simulated
    iteration time) and the micro-batch size with the smallest simulated iteration time wins.
    Status ``feasible``: the DP is exact for its bottleneck objective only under the transfer
    approximation and the memory bound, and ``b`` is chosen by simulation; ``time-limit`` when
    ``time_limit`` stopped the search (the DP checks the clock at every step; stopped before any
    micro-batch size finished: :class:`TimeLimitError`).  Devices beyond what a chain can use
    (``core nodes * max b``) are not considered (``search.extra["devices_considered"]``), so a
    10^6-device cluster costs what the usable ones do.
    The stages are cut as a chain, but ``build_plan`` derives the stage edges from the graph's
    edges, so two consecutive stages with no edge between them (e.g. two branches) become
    parallel in the plan (PipeDream's runtime would forward the first one's input through it):
    this can only shorten PipeDream's simulated iteration.  Levels: the DP charges a level-1
    range's boundary transfers at the level-1 bandwidth (PipeDream does the same), so with
    several nodes transfers that cross a node are under-priced and the DP value is an estimate
    (the plan is priced exactly by ``build_plan``).
``mode="pipedream-costs"``
    PipeDream's own formulas and hierarchical optimizer (:mod:`.pipedream_costs`, which states
    them), no memory constraint, all machines used; the plan carries PipeDream's bottleneck
    figure in ``search.extra["pipedream_bottleneck"]``.
"""

from __future__ import annotations

import logging
import math
import time as _time
from dataclasses import replace
from typing import Any

import numpy as np

from gpp_solver.cost.model import comm_time, memory_per_device, node_compute, time_per_sample
from gpp_solver.cost.network import node_bandwidth
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InfeasibleError, TimeLimitError
from gpp_solver.plan.build import build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import parse_options
from gpp_solver.planners.sequential.common import (
    attach_detached,
    candidate_micro_batches,
    pipedream_core,
    usable_cluster,
)
from gpp_solver.planners.sequential.linearize import Linearization, linearize
from gpp_solver.planners.sequential.options import PipeDreamOptions
from gpp_solver.planners.sequential.pipedream_costs import plan_pipedream_costs
from gpp_solver.planners.sequential.pipedream_dp import INF, DeadlineReached, DPTable, minmax_dp
from gpp_solver.planners.sequential.seq_eval import SequentialPricer, select_by_simulation
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)


class RangeCosts:
    """Stage-time arrays ``T[k, j]`` under the shared cost model for one micro-batch size.

    A pricer of its own because PipeDream's DP needs the TPS of every state range ``[k, j)`` of the
    linearisation at once (a dense array per replica count), before stages or devices exist; its
    formulas are the cost model's pricing core (``comm_time``, ``TimeTerms.tail``, ``time_per_sample``,
    ``memory_per_device``) and its compute the one interpolation (``node_compute``)."""

    def __init__(self, graph: Graph, cluster: Cluster, lin: Linearization, B: int, b: int) -> None:
        self.graph, self.cluster, self.lin, self.B, self.b = graph, cluster, lin, B, b
        self.num_micro_batches = B // b
        self.terms = TimeTerms.of(graph, cluster, B)
        nodes = [graph.node(v) for v in lin.order]
        W = lin.state_sums([n.weight_bytes for n in nodes])
        act = lin.state_sums([n.activation_bytes for n in nodes])
        self.W = W[None, :] - W[:, None]
        self.act = act[None, :] - act[:, None]
        self.in_b, self.in_c, self.out_b, self.out_c = lin.range_transfers(graph)
        self._comp: dict[float, np.ndarray] = {}
        self._nodes = nodes

    def compute(self, x: float) -> np.ndarray:
        c = self._comp.get(x)
        if c is None:
            sizes = self.graph.micro_batch_sizes
            oh = self.terms.node_overhead
            per = [node_compute(n.fw_time, n.bw_time, sizes, x, oh) for n in self._nodes]
            s = self.lin.state_sums(per)
            c = self._comp[x] = s[None, :] - s[:, None]
        return c

    def stage_time(self, d: int, bw: float, in_flight_stages: int) -> np.ndarray:
        """TPS of every range with ``d`` replicas, transfers and all-reduce at ``bw``; ``inf`` when
        the stage does not fit with ``in_flight_stages`` micro-batches in flight or ``b % d``."""
        b = self.b
        if b % d:
            return np.full(self.W.shape, INF)
        x = b / d
        comm = 2.0 * comm_time(self.in_b + self.out_b, x, bw, self.cluster.latency, self.in_c + self.out_c)
        tps = time_per_sample(self.compute(x) + comm, b, self.terms.tail(self.W, d, bw, b), self.B)
        f = min(self.num_micro_batches, max(1, in_flight_stages)) * b
        mem = memory_per_device(self.cluster.optimizer_state_factor, self.W, f, d, self.act)
        return np.where(mem <= self.cluster.memory_bytes, tps, INF)


def _shared_specs(
    graph: Graph,
    cluster: Cluster,
    lin: Linearization,
    B: int,
    b: int,
    deadline: float | None = None,
) -> tuple[float, list[tuple[list[str], tuple[int, ...]]]] | None:
    """Run the DP for micro-batch ``b``; ``(bottleneck, [(nodes, devices), ...])`` or ``None``.
    Raises :class:`DeadlineReached` past ``deadline``."""
    K = cluster.devices
    costs = RangeCosts(graph, cluster, lin, B, b)
    last = lin.n_states - 1
    dpn = cluster.devices_per_node
    if dpn is None or dpn >= K or K % dpn or lin.n_states > HIERARCHICAL_MAX_STATES:
        bw = cluster.bandwidth(range(K))
        tab = minmax_dp(
            lin.subset,
            lambda m, r: costs.stage_time(r, bw, K - m + 1),
            K,
            allow_fewer=True,
            replicas=[r for r in range(1, min(K, b) + 1) if b % r == 0],
            deadline=deadline,
        )  # others: `b % d` fails
        if not math.isfinite(tab.value[0, last, K]):
            return None
        out, dev = [], 0
        for k, j, r in tab.stages(0, last, K):
            out.append((lin.stage_nodes(k, j), tuple(range(dev, dev + r))))
            dev += r
        return float(tab.value[0, last, K]), out
    N = K // dpn
    inner: dict[int, DPTable] = {}
    for rho in (x for x in range(1, min(N, b) + 1) if b % x == 0):  # r * rho | b needs rho | b
        bw = node_bandwidth(cluster) if rho == 1 else cluster.inter_node_bandwidth
        inner[rho] = minmax_dp(
            lin.subset,
            lambda m, r, rho=rho, bw=bw: costs.stage_time(r * rho, bw, K - rho * m + 1),
            dpn,
            starts=tuple(range(lin.n_states)),
            allow_fewer=True,
            replicas=[r for r in range(1, dpn + 1) if b % (r * rho) == 0],
            deadline=deadline,
        )
    outer = minmax_dp(
        lin.subset,
        lambda m, r: inner[r].value[:, :, dpn],
        N,
        allow_fewer=True,
        replicas=sorted(inner),
        deadline=deadline,
    )
    if not math.isfinite(outer.value[0, last, N]):
        return None
    out, node0 = [], 0
    for k, j, n_nodes in outer.stages(0, last, N):
        offset = 0
        for a, c, r in inner[n_nodes].stages(k, j, dpn):
            devs = tuple(sorted((node0 + t) * dpn + offset + q for t in range(n_nodes) for q in range(r)))
            out.append((lin.stage_nodes(a, c), devs))
            offset += r
        node0 += n_nodes
    return float(outer.value[0, last, N]), out


HIERARCHICAL_MAX_STATES = 400


def _solve_shared(
    graph: Graph, cluster: Cluster, B: int, o: PipeDreamOptions, deadline: float | None = None
) -> tuple[Plan | None, dict]:
    """The DP for every micro-batch size, then the one with the smallest simulated iteration time.

    Each DP's chain is priced with numpy (:mod:`.seq_eval`) for a lower bound on its simulated
    iteration time; chains are simulated in increasing bound order until the bound exceeds the
    best simulated time, so the choice is the one of simulating every chain."""
    core, inputs, sinks = pipedream_core(graph)
    lin = linearize(graph, nodes=core, first_source=False, method=o.linearization, max_states=o.max_states)
    info: dict[str, Any] = {"n_states": lin.n_states, "linearization": lin.kind, "tried": {}}
    info["complete"] = True
    sizes = candidate_micro_batches(B, o.micro_batch_sizes)
    dp_cluster, info["devices_considered"] = usable_cluster(cluster, len(core), max(sizes))
    pricer = SequentialPricer(graph, cluster, B, lin.order, inputs, sinks)
    pos = {v: i for i, v in enumerate(lin.order)}
    cands: list[tuple[int, float, list[tuple[list[str], tuple[int, ...]]]]] = []
    lower: list[float] = []
    for b in sizes:
        if deadline is not None and _time.perf_counter() > deadline:
            info["complete"] = False  # remaining micro-batch sizes not tried
            break
        try:
            res = _shared_specs(graph, dp_cluster, lin, B, b, deadline)
        except DeadlineReached:
            info["complete"] = False
            break
        if res is None:
            info["tried"][b] = None
            continue
        value, stages = res
        core_stage = np.empty(len(lin.order), dtype=np.int64)
        for s, (nodes, _) in enumerate(stages):
            core_stage[[pos[v] for v in nodes]] = s
        cands.append((b, value, stages))
        lower.append(pricer.price(core_stage, [devs for _, devs in stages], b).lower_bound)

    def build(i: int) -> Plan | None:
        b, value, stages = cands[i]
        specs = attach_detached(graph, [(nodes, devs, b) for nodes, devs in stages], inputs, sinks)
        plan = build_plan(
            graph,
            cluster,
            specs,
            B,
            planner="pipedream",
            search=SearchInfo(0.0, Status.FEASIBLE, extra={"dp_bottleneck_tps": value}),
        )
        info["tried"][b] = plan.predicted.iteration_time
        if plan.predicted.peak_memory_bytes > cluster.memory_bytes * (1 + 1e-9):
            return None  # cannot happen with the DP's bound; kept as a guard
        return plan

    built, complete = select_by_simulation(lower, build, deadline)
    info["complete"] &= complete
    info["pruned_lower_bounds"] = {cands[i][0]: lower[i] for i in range(len(cands)) if cands[i][0] not in info["tried"]}
    best: Plan | None = None
    for i in sorted(built):  # the exhaustive loop's rule, in micro-batch order
        plan = built[i]
        if best is None or plan.predicted.iteration_time < best.predicted.iteration_time - 1e-15:
            best = plan
    return best, info


def plan_pipedream(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """PipeDream's plan for ``graph`` on ``cluster`` (see the module docstring for the modes).

    Options: ``micro_batch_sizes`` (candidates; default powers of two dividing ``B``),
    ``linearization`` (``"antichain"`` or ``"topological"``), ``max_states``; for
    ``mode="pipedream-costs"`` also ``bandwidth`` (default 1e9) and ``activation_compression_ratio``
    (the fields of :class:`PipeDreamOptions`).
    """
    o = parse_options("pipedream", PipeDreamOptions, options)
    t0 = _time.perf_counter()
    if o.mode == "pipedream-costs":
        return plan_pipedream_costs(graph, cluster, mini_batch_size, t0, o)
    deadline = None if time_limit is None else t0 + time_limit
    best, info = _solve_shared(graph, cluster, mini_batch_size, o, deadline)
    if best is None and not info["complete"]:
        raise TimeLimitError(
            f"pipedream: the time limit ({time_limit} s) was reached before the DP finished "
            f"for any micro-batch size ({info['n_states']} states, "
            f"{info['devices_considered']} devices considered)"
        )
    if best is None:
        loose, linfo = _solve_shared(graph, cluster.with_(memory_bytes=float("inf")), mini_batch_size, o, deadline)
        if loose is None and not linfo["complete"]:
            raise TimeLimitError(
                f"pipedream: no plan fits {cluster.memory_bytes:.4g} bytes per device; the time "
                "limit stopped the search for the memory a plan would need"
            )
        need = loose.predicted.peak_memory_bytes if loose is not None else None
        raise InfeasibleError(
            f"pipedream: no plan of graph '{graph.name}' fits {cluster.memory_bytes:.4g} bytes per device on "
            f"{cluster.devices} devices (B={mini_batch_size}); the best plan without a memory limit needs "
            f"{need:.4g} bytes per device"
            if need is not None
            else f"pipedream: no plan of graph '{graph.name}' exists for B={mini_batch_size}",
            required_memory_bytes=need,
        )
    status = Status.FEASIBLE if info["complete"] else Status.TIME_LIMIT
    plan = replace(
        best,
        search=replace(
            best.search,
            seconds=_time.perf_counter() - t0,
            status=status,
            extra={**dict(best.search.extra), **info, "mode": "shared"},
        ),
    )
    validate(plan, graph, cluster)
    return plan
