"""Step 6 of the TPS lower bound's proof (:mod:`.tps_bound`, which states steps 6, 6b and 6c):
the class MILP over stage slots for plans of at least two stages, solved by HiGHS, whose proven
dual bound — never its best solution — bounds their bottleneck TPS."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import networkx as nx

from gpp_solver._backend import load_order as _load_order  # noqa: F401  (OR-Tools before PuLP, see that module)

# isort: split
import pulp

from gpp_solver._backend.highs_worker import highs_available, solve_highs
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import SolverError
from gpp_solver.oracles.node_classes import node_classes, watched_nodes
from gpp_solver.oracles.stage_degrees import MEMORY_REL_TOL, allreduce_bandwidth_ub, degrees, transfer_bandwidth_ub
from gpp_solver.types import Cluster, Graph

SAFETY = 1e-6
"""Relative margin taken off the solver's dual bound for its feasibility tolerances."""
MIP_REL_GAP = 1e-3
"""HiGHS stops once its dual bound is within this of its best solution (``optimal``); the value is
always the dual bound, so this trades only tightness (at most 1e-3 relative) for time."""


@dataclass(frozen=True)
class MultiStageResult:
    """What step 6 proved for the plans of at least two stages."""

    value: float  # lower bound for >= 2 stages (inf: infeasible), or nan: nothing proven
    status: str  # optimal | dual-bound | none | infeasible
    detail: str
    gap: float = math.nan  # (primal - dual) / primal


def _solver_options(time_limit: float | None) -> dict:
    if not highs_available():  # pragma: no cover - highspy is a dependency of the environment
        raise SolverError("tps_bound needs HiGHS (the highspy package)")
    return dict(
        msg=False, timeLimit=time_limit, gapRel=MIP_REL_GAP, gapAbs=1e-12, threads=1, mip_feasibility_tolerance=1e-9
    )


def multi_stage_bound(
    graph: Graph, cluster: Cluster, b: int, mini_batch_size: int, scale: float, *, time_limit: float | None = None
) -> MultiStageResult:
    """Step 6 of the proof: the class MILP for plans of at least two stages."""
    B = mini_batch_size  # the paper's B
    if min(cluster.devices, len(graph.nodes)) < 2:
        return MultiStageResult(math.inf, "infeasible", "fewer than 2 nodes or devices: no 2-stage plan")
    m = _ClassMilp(graph, cluster, b, B, scale)
    m.link_constraints()
    m.prob += m.t
    m.count_constraints()
    for k in range(m.K):
        m.slot_constraints(k)
    m.order_and_average()
    try:
        out = solve_highs(m.prob, **_solver_options(time_limit))
    except SolverError as exc:
        raise SolverError(f"tps_bound: the solver failed on b={b}: {exc}") from exc
    size = f"{m.K} slots x {len(m.classes)} classes x {len(m.ds)} degrees, {len(m.watched)} watched nodes"
    if out.model_status == "kInfeasible":
        return MultiStageResult(math.inf, "infeasible", f"S>=2 MILP ({size}) infeasible (memory)")
    dual, primal = out.dual_bound, out.objective
    gap = (primal - dual) / primal if math.isfinite(dual) and math.isfinite(primal) and primal > 0 else math.nan
    if out.model_status == "kOptimal" and math.isfinite(dual):
        return MultiStageResult(dual * scale * (1 - SAFETY), "optimal", f"S>=2 MILP ({size}) optimal", gap)
    if math.isfinite(dual) and dual > 0:
        return MultiStageResult(
            dual * scale * (1 - SAFETY),
            "dual-bound",
            f"S>=2 MILP ({size}) stopped ({out.model_status_text}): dual bound, gap {gap:.2e} to its best solution",
            gap,
        )
    return MultiStageResult(
        math.nan, "none", f"S>=2 MILP ({size}) stopped ({out.model_status_text}) without a dual bound"
    )


class _ClassMilp:
    """The class MILP of :func:`multi_stage_bound`: its coefficients, variables and blocks of
    constraints (added in the order of the methods' calls)."""

    def __init__(self, graph: Graph, cluster: Cluster, b: int, B: int, scale: float) -> None:
        n, D = len(graph.nodes), cluster.devices
        self.cluster, self.D, self.K, self.scale = cluster, D, min(D, n), scale
        tab = CostTables(graph)
        self.classes = classes = node_classes(graph)
        self.ds = ds = degrees(b, D)
        self.kappa = nx.number_weakly_connected_components(graph.to_networkx())
        self.beta = beta = min(graph.edge_bytes_map.values(), default=0.0)
        self.n_edges = max(1, len(graph.edge_bytes_map))
        osf, limit = cluster.optimizer_state_factor, cluster.memory_bytes * (1 + MEMORY_REL_TOL)
        comp = {d: tab.compute_at(b / d) for d in ds}
        # per node: the all-reduce's per-stage latency and the step's own work (step_time_per_sample)
        # are not a node's share (left out: still a lower bound)
        per_node = replace(TimeTerms.of(graph, cluster), allreduce_latency=0.0)
        self.u = {
            (c, d): (
                float(comp[d][m[0]]) / b
                + per_node.tail(float(tab.weight[m[0]]), d, allreduce_bandwidth_ub(cluster, d), b) / B
            )
            / scale
            for c, m in enumerate(classes)
            for d in ds
        }
        self.tau = {d: 2 * (cluster.latency / b + beta / (d * transfer_bandwidth_ub(cluster, d))) / scale for d in ds}
        # step 6c: participations forced onto the inter-node bandwidth, and their extra cost over tau
        self.dpn, inter = cluster.devices_per_node, cluster.inter_node_bandwidth
        islands = self.dpn is not None and transfer_bandwidth_ub(cluster, 1) > inter and D > self.dpn
        self.tau_up = {
            d: 2 * beta * (1 / (d * inter) - 1 / (d * transfer_bandwidth_ub(cluster, d))) / scale for d in ds
        }
        self.mem = {
            (c, d): (osf * float(tab.weight[m[0]]) + b / d * float(tab.activation[m[0]])) / limit
            for c, m in enumerate(classes)
            for d in ds
        }
        K, n_edges = self.K, self.n_edges
        self.prob = prob = pulp.LpProblem("tps_bound", pulp.LpMinimize)
        self.t = prob.add_variable("t", 0)
        self.y = {(k, d): prob.add_variable(f"y_{k}_{d}", cat=pulp.LpBinary) for k in range(K) for d in ds}
        self.x = {
            (k, c, d): prob.add_variable(f"x_{k}_{c}_{d}", 0, len(m), cat=pulp.LpInteger)
            for k in range(K)
            for c, m in enumerate(classes)
            for d in ds
        }
        self.r = {
            (k, d): prob.add_variable(f"r_{k}_{d}", 0, 2 * n_edges, cat=pulp.LpInteger) for k in range(K) for d in ds
        }
        self.up = {
            (k, d): prob.add_variable(f"inter_{k}_{d}", 0, 2 * n_edges, cat=pulp.LpInteger)
            for k in range(K)
            for d in ds
            if islands
        }  # all degrees count towards the sum
        self.watched = watched_nodes(graph, classes)
        self.extra: dict[tuple[int, int], pulp.LpAffineExpression] = {}

    def link_constraints(self) -> None:
        """Inter-node participations: each at most its slot's, and at least those the islands force."""
        prob, y, ds, K, dpn = self.prob, self.y, self.ds, self.K, self.dpn
        for (k, d), v in self.up.items():
            prob += v <= self.r[k, d]
        if self.up:
            prob += (
                pulp.lpSum(self.up.values())
                >= 2 * pulp.lpSum(min(d, dpn) / dpn * y[k, d] for k in range(K) for d in ds) - 2 * self.kappa
            )

    def count_constraints(self) -> None:
        """At least two stages, the devices, the participations of a connected stage graph, every class placed."""
        prob, y, x, ds, K = self.prob, self.y, self.x, self.ds, self.K
        S = pulp.lpSum(y.values())
        prob += S >= 2
        prob += pulp.lpSum(d * y[k, d] for k in range(K) for d in ds) <= self.D
        prob += pulp.lpSum(self.r.values()) >= 2 * S - 2 * self.kappa
        for c, m in enumerate(self.classes):
            prob += pulp.lpSum(x[k, c, d] for k in range(K) for d in ds) == len(m)

    def slot_constraints(self, k: int) -> None:
        """Slot ``k``: one degree, its classes, participations, memory, and ``t`` at least its TPS."""
        prob, y, x, r, ds, classes = self.prob, self.y, self.x, self.r, self.ds, self.classes
        prob += pulp.lpSum(y[k, d] for d in ds) <= 1
        for d in ds:
            xs = [x[k, c, d] for c in range(len(classes))]
            for c, m in enumerate(classes):
                prob += x[k, c, d] <= len(m) * y[k, d]
            prob += pulp.lpSum(xs) >= y[k, d]
            prob += r[k, d] <= 2 * self.n_edges * y[k, d]
            if self.kappa == 1:
                prob += r[k, d] >= y[k, d]
            prob += pulp.lpSum(self.mem[c, d] * x[k, c, d] for c in range(len(classes))) <= y[k, d]
            self.extra[k, d] = self._watched_cost(k, d)
        prob += self.t >= (
            pulp.lpSum(self.u[c, d] * x[k, c, d] for c in range(len(classes)) for d in ds)
            + pulp.lpSum(self.tau[d] * r[k, d] for d in ds)
            + pulp.lpSum(self.extra[k, d] for d in ds)
        )

    def _watched_cost(self, k: int, d: int) -> pulp.LpAffineExpression:
        """Step 6b: transfers a watched node's stage must take part in, at their edges' bytes."""
        prob, x, beta = self.prob, self.x, self.beta
        per_byte = 2 / (d * transfer_bandwidth_ub(self.cluster, d)) / self.scale
        known, cost = [], []
        for j, w in enumerate(self.watched):
            for c, m, bytes_in in w.ins:
                miss = prob.add_variable(f"miss_{k}_{d}_{j}_{c}", 0, m)
                prob += miss >= m * x[k, w.cls, d] - x[k, c, d]
                known.append(miss)
                cost.append((bytes_in - beta) * per_byte * miss)
            if w.outs:
                o = prob.add_variable(f"out_{k}_{d}_{j}", cat=pulp.LpBinary)
                for c, m in w.outs:
                    prob += m * o >= m * x[k, w.cls, d] - x[k, c, d]
                known.append(o)
                cost.append((w.out_bytes - beta) * per_byte * o)
        if known:
            prob += self.r[k, d] >= pulp.lpSum(known)
        if (k, d) in self.up:
            cost.append(self.tau_up[d] * self.up[k, d])
        return pulp.lpSum(cost)

    def order_and_average(self) -> None:
        """Symmetry (used slots first, degrees non-increasing) and ``D t`` at least the total work."""
        prob, y, x, r, ds, K, D = self.prob, self.y, self.x, self.r, self.ds, self.K, self.D
        for k in range(K - 1):
            prob += pulp.lpSum(y[k, d] for d in ds) >= pulp.lpSum(y[k + 1, d] for d in ds)
            prob += pulp.lpSum(d * y[k, d] for d in ds) >= pulp.lpSum(d * y[k + 1, d] for d in ds)
        prob += D * self.t >= (
            pulp.lpSum(d * self.u[c, d] * x[k, c, d] for k in range(K) for c in range(len(self.classes)) for d in ds)
            + pulp.lpSum(d * self.tau[d] * r[k, d] for k in range(K) for d in ds)
            + pulp.lpSum(d * e for (k, d), e in self.extra.items())
        )
