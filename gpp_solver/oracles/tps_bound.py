"""A communication-aware lower bound on the bottleneck time-per-sample (TPS) of every plan.

Scope: plans of ``docs/cost-model.md`` with one micro-batch size ``b`` for every stage, data
parallelism only (no TMPC, ``tensor_parallel = 1``), any partition of the nodes into stages (convex
or not), ``d_s | b`` devices per stage, ``sum_s d_s <= D``, every stage holding at least one
micro-batch (``b`` samples) in flight.  :func:`relaxed_tps_bound` returns a value ``T`` with
``TPS(P) >= T`` for every such plan ``P`` with micro-batch size ``b`` that fits in memory.

Notation: ``c_v(d) = f_v(b/d) + g_v(b/d)``; ``W_v``, ``a_v`` weight and activation bytes; ``L``
latency; ``bw*`` = max(intra, inter) bandwidth; ``beta`` = the least bytes of any graph edge;
``kappa`` = the number of weakly connected components of the graph; ``M = memory * (1 + 1e-9)``
(the validator's tolerance).  The cost model gives, for a stage ``s`` of node set ``X_s`` and
degree ``d = d_s`` with transfer set ``T_s``:

    TPS_s = sum_{v in X_s} c_v(d)/b + sum_{tau in T_s} 2 (L/b + bytes_tau / (d bw_tau))
            + 2 (d-1)/d W_{X_s} / (bw_s B),                       TPS(P) = max_s TPS_s.

Proof of validity (each step only lowers the right-hand side):

1. Bandwidths.  ``bw_s`` (all-reduce) is at most ``bw_ar(d) = bw*`` when ``d <= devices_per_node``
   and else the inter-node one (``d`` devices cannot sit in one node; a flat network is always
   inter-node).  A transfer's bandwidth is at most ``bw_x(d) = bw*`` when ``d < devices_per_node``,
   else the inter-node one: the union with the peer's ``>= 1`` devices exceeds one node.  So
   ``TPS_s >= sum_v u_v(d) + |T_s| tau(d)`` with ``u_v(d) = c_v(d)/b + 2(d-1)/d W_v/(bw_ar(d) B)``
   and ``tau(d) = 2 (L/b + beta/(d bw_x(d)))`` (a transfer carries the max bytes of its edges,
   ``>= beta``).  The all-reduce is additive over nodes, so it is charged node by node.
2. Transfers.  A transfer is one (producer node, consumer stage) pair; both stages *take part* in
   it (``cost.stage_transfers``).  The stage graph is a quotient of the node graph, so it has at
   most ``kappa`` weakly connected components and hence at least ``S - kappa`` edges, each carried
   by at least one transfer: ``sum_s |T_s| >= 2 (S - kappa)``.  With ``kappa = 1`` and ``S >= 2``
   every stage has a neighbour, so ``|T_s| >= 1``.
3. Devices.  ``D TPS(P) >= sum_s d_s TPS_s`` since ``sum_s d_s <= D`` and ``TPS_s <= TPS(P)``.
4. Memory.  Stage ``s`` holds ``>= b`` samples (its order runs ``F0`` before ``B0``), so
   ``sum_{v in X_s} (osf W_v + (b/d) a_v) <= M``.
5. Single stage (``S = 1``) is priced exactly: ``min_d sum_v c_v(d)/b + A(W_V, d)/B`` over ``d | b``,
   ``d <= D`` that fit in memory (no transfers), with the best bandwidth a placement of ``d``
   devices can get.
6. ``S >= 2``: the MILP below minimises ``t`` over (i) at most ``K = min(D, n)`` stage *slots*, each
   with one degree (binary ``y[k,d]``), (ii) integer counts ``x[k,c,d]`` of the nodes of each
   *class* ``c`` (nodes with identical times, weights and activations — interchangeable in every
   constraint) per slot, (iii) integer transfer participations ``r[k,d]`` subject to step 2,
   with ``t >= sum_{c,d} x u_c(d) + sum_d r tau(d)`` per slot (step 1),
   ``D t >= sum_{k,c,d} d x u_c(d) + sum_{k,d} d r tau(d)`` (step 3), memory per slot (step 4),
   ``sum d y <= D``, ``sum y >= 2``.  Any plan maps to a feasible point with ``t = TPS(P)`` (slot
   ``k`` = stage ``k`` in order of non-increasing degree, unused slots last; ``r = |T_s|``), so
   the MILP's optimum — or any proven dual bound of it — is ``<= TPS(P)``.  (The step-3 row is
   implied by the others for integer points; it tightens the LP relaxation.)
6b. Watched nodes: a node ``v`` alone in its class (so ``x[k,c_v,d]`` in {0, 1} says whether ``v``
   is in slot ``k``).  Let ``U_{v,c}`` be ``v``'s in-neighbours of class ``c`` not already listed
   for an earlier watched node (the sets are disjoint), ``m = |U_{v,c}|``.  If ``v`` is in stage
   ``s``, each ``u`` of ``U_{v,c}`` outside ``s`` gives the transfer ``(u, s)`` — distinct ``u``,
   distinct transfers — of bytes ``>= bytes(u, v)``; at most ``x[k,c,d]`` of ``U_{v,c}`` are
   inside ``s``, so ``s`` takes part in ``>= m x[k,c_v,d] - x[k,c,d]`` of them.  If ``v`` has
   ``m'`` out-neighbours in class ``c`` and ``m' x[k,c_v,d] > x[k,c,d]``, one is outside ``s`` and
   ``s`` takes part in a transfer ``(v, .)`` of bytes ``>=`` ``v``'s least out-edge bytes (binary
   ``o``).  Producers differ (outside ``s`` / the distinct watched ``v`` in ``s``), so these are
   distinct transfers of ``s``: ``r[k,d] >=`` their number, and each costs ``2 (bytes - beta) /
   (d bw_x(d))`` more than the ``beta`` that ``r`` charges (added to the slot's rows of steps 1, 3).
6c. Inter-node transfers (``devices_per_node`` set, intra faster than inter, ``D >`` a node).  Call a
   stage edge *intra* when both stages' devices sit in one node.  A connected group of stages
   joined by intra edges lies in one node, so it has ``<= devices_per_node`` devices, or is one
   stage: the number of groups is ``>= sum_s min(d_s, dpn) / dpn``.  The groups are joined by
   ``>= groups - kappa`` stage edges, each with a transfer at the inter-node bandwidth that both
   its stages take part in: integer ``q[k,d] <= r[k,d]``, ``sum q >= 2 (sum min(d,dpn)/dpn y -
   kappa)``, each costing ``2 beta (1/inter - 1/bw_x(d)) / d`` more than ``tau(d)``.
7. ``TPS(P) >= perfect balance`` (total cheapest device-time per sample / ``D``) holds for every
   plan, so the returned value is ``max(perfect balance, min(single stage, S >= 2 bound))``.

The value is always HiGHS's proven dual bound (``mip_dual_bound``) of the MILP, lowered by a
relative ``1e-6`` for the solver's tolerances — never its best solution.  Statuses: ``optimal``
(HiGHS closed the gap to :data:`MIP_REL_GAP`: the value is the relaxation's optimum up to that,
``proven``), ``dual-bound`` (time limit: the dual bound so far, ``relaxation_gap`` says how far from
the best relaxed solution found), ``perfect-balance`` (no usable dual bound: the value is only the
perfect-balance bound), ``infeasible`` (no plan with this ``b`` fits in memory: the value is ``inf``).
A dual bound reached under a time limit depends on the machine's speed (how far HiGHS got); it is
valid either way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import networkx as nx

from gpp_solver._backend import load_order as _load_order  # noqa: F401  (OR-Tools before PuLP, see that module)

# isort: split
import pulp

from gpp_solver._backend.highs_worker import highs_available, solve_highs
from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.network import best_bandwidth
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InvalidInputError, SolverError
from gpp_solver.oracles.node_classes import node_classes, watched_nodes
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)

MEMORY_REL_TOL = 1e-9
"""The validator's memory tolerance: a stage fits when ``M(S) <= memory * (1 + 1e-9)``."""
SAFETY = 1e-6
"""Relative margin taken off the solver's dual bound for its feasibility tolerances."""
MIP_REL_GAP = 1e-3
"""HiGHS stops once its dual bound is within this of its best solution (``optimal``); the value is
always the dual bound, so this trades only tightness (at most 1e-3 relative) for time."""


@dataclass(frozen=True)
class TpsBound:
    """A lower bound on the bottleneck TPS of every plan with micro-batch size ``micro_batch_size``."""

    value: float  # the bound (inf: no plan with this b fits in memory)
    proven: bool  # the relaxation was solved to optimality (value is its optimum)
    perfect_balance: float
    single_stage: float  # exact best one-stage TPS (inf when none fits)
    multi_stage: float  # lower bound for plans of >= 2 stages (inf: none exists)
    status: str  # optimal | dual-bound | perfect-balance | infeasible
    relaxation_gap: float  # (best relaxed solution - dual bound) / best, of the >= 2-stage MILP (nan: none)
    micro_batch_size: int
    seconds: float
    detail: str


def degrees(b: int, devices: int) -> list[int]:
    """Data-parallel degrees a stage may take: ``1 <= d <= devices`` with ``b % d == 0``."""
    return [d for d in range(1, min(devices, b) + 1) if b % d == 0]


def perfect_balance_tps(graph: Graph, b: int, devices: int) -> float:
    """Every node at its cheapest device-time per sample ``min_d d c_v(d) / b``, summed, over ``D``."""
    t = CostTables(graph)
    per = [d * t.compute_at(b / d) for d in degrees(b, devices)]
    return float(sum(min(x[i] for x in per) for i in range(len(graph.nodes)))) / b / devices


def allreduce_bandwidth_ub(cluster: Cluster, d: int) -> float:
    """The largest bandwidth an all-reduce among ``d`` devices can get (step 1 of the proof)."""
    return best_bandwidth(cluster, d)


def transfer_bandwidth_ub(cluster: Cluster, d: int) -> float:
    """The largest bandwidth a transfer of a stage of ``d`` devices can get (step 1 of the proof):
    it joins them with at least one device of the peer stage."""
    return best_bandwidth(cluster, d + 1)


def single_stage_tps(graph: Graph, cluster: Cluster, b: int, mini_batch_size: int) -> float:
    """Exact least TPS of a one-stage plan with micro-batch ``b`` that fits in memory (inf if none)."""
    B = mini_batch_size  # the paper's B
    t = CostTables(graph)
    W, A = float(t.weight.sum()), float(t.activation.sum())
    limit = cluster.memory_bytes * (1 + MEMORY_REL_TOL)
    best = math.inf
    for d in degrees(b, cluster.devices):
        if cluster.optimizer_state_factor * W + b / d * A > limit:
            continue
        tps = (
            float(t.compute_at(b / d).sum()) / b
            + TimeTerms.of(graph, cluster).tail(W, d, allreduce_bandwidth_ub(cluster, d)) / B
        )
        best = min(best, tps)
    return best


@dataclass(frozen=True)
class _MultiResult:
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
) -> _MultiResult:
    """Step 6 of the proof: the class MILP for plans of at least two stages."""
    B = mini_batch_size  # the paper's B
    if min(cluster.devices, len(graph.nodes)) < 2:
        return _MultiResult(math.inf, "infeasible", "fewer than 2 nodes or devices: no 2-stage plan")
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
        return _MultiResult(math.inf, "infeasible", f"S>=2 MILP ({size}) infeasible (memory)")
    dual, primal = out.dual_bound, out.objective
    gap = (primal - dual) / primal if math.isfinite(dual) and math.isfinite(primal) and primal > 0 else math.nan
    if out.model_status == "kOptimal" and math.isfinite(dual):
        return _MultiResult(dual * scale * (1 - SAFETY), "optimal", f"S>=2 MILP ({size}) optimal", gap)
    if math.isfinite(dual) and dual > 0:
        return _MultiResult(
            dual * scale * (1 - SAFETY),
            "dual-bound",
            f"S>=2 MILP ({size}) stopped ({out.model_status_text}): dual bound, gap {gap:.2e} to its best solution",
            gap,
        )
    return _MultiResult(math.nan, "none", f"S>=2 MILP ({size}) stopped ({out.model_status_text}) without a dual bound")


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
        # per node: the all-reduce's per-stage latency is not a node's share (left out: still a lower bound)
        per_node = replace(TimeTerms.of(graph, cluster), allreduce_latency=0.0)
        self.u = {
            (c, d): (
                float(comp[d][m[0]]) / b
                + per_node.tail(float(tab.weight[m[0]]), d, allreduce_bandwidth_ub(cluster, d)) / B
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


def relaxed_tps_bound(
    graph: Graph, cluster: Cluster, b: int, mini_batch_size: int, *, time_limit: float | None = None
) -> TpsBound:
    """A lower bound on the bottleneck TPS of every plan with micro-batch size ``b`` (module docstring).

    ``time_limit`` (seconds) caps the MILP; when it stops the solver the value is HiGHS's proven
    dual bound (``status="dual-bound"``, ``proven=False``), or the perfect-balance bound when none.
    """
    B = mini_batch_size  # the paper's B
    t0 = time.perf_counter()
    check_micro_batch_sizes(B, [b])
    if time_limit is not None and not time_limit > 0:
        raise InvalidInputError(f"tps_bound: time_limit must be positive, got {time_limit!r}")
    pb = perfect_balance_tps(graph, b, cluster.devices)
    one = single_stage_tps(graph, cluster, b, B)
    scale = pb if pb > 0 else 1e-6
    multi = multi_stage_bound(graph, cluster, b, B, scale, time_limit=time_limit)
    scope = "uniform b, data parallelism only" + (
        " (graph has TMPCs: plans using them are NOT covered)" if any(nd.tmpc for nd in graph.nodes) else ""
    )
    if multi.status == "none":
        value, status, proven = pb, "perfect-balance", False
    else:
        best = min(one, multi.value)
        if math.isinf(best):
            value, status, proven = math.inf, "infeasible", multi.status == "infeasible"
        else:
            value = max(pb, best)
            # a dual bound above the exact single-stage value cannot change min(single, relaxation)
            proven = multi.status in ("optimal", "infeasible") or one <= multi.value
            status = "optimal" if proven else "dual-bound"
    detail = (
        f"b={b}: perfect balance {pb:.6g}, single stage {one:.6g}, >=2 stages {multi.value:.6g} "
        f"[{multi.detail}]; {scope}"
    )
    logger.debug("tps_bound %s", detail)
    return TpsBound(
        value=value,
        proven=proven,
        perfect_balance=pb,
        single_stage=one,
        multi_stage=multi.value,
        status=status,
        relaxation_gap=multi.gap,
        micro_batch_size=b,
        seconds=time.perf_counter() - t0,
        detail=detail,
    )


def relaxed_tps_bounds(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    micro_batch_sizes: Sequence[int] | None = None,
    time_limit: float | None = None,
) -> dict[int, TpsBound]:
    """:func:`relaxed_tps_bound` for every candidate ``b`` (default: powers of two dividing ``B``);
    ``min(v.value for v in result.values())`` bounds every uniform-``b`` plan among them."""
    B = mini_batch_size  # the paper's B
    return {
        b: relaxed_tps_bound(graph, cluster, b, B, time_limit=time_limit)
        for b in check_micro_batch_sizes(B, micro_batch_sizes)
    }
