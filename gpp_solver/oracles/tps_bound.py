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
6. ``S >= 2``: the class MILP (:mod:`.class_milp`) minimises ``t`` over (i) at most
   ``K = min(D, n)`` stage *slots*, each with one degree (binary ``y[k,d]``), (ii) integer counts ``x[k,c,d]`` of the nodes of each
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

The value is always HiGHS's proven dual bound (``mip_dual_bound``) of the MILP (:mod:`.class_milp`),
lowered by a relative ``1e-6`` for the solver's tolerances — never its best solution.  Statuses:
``optimal`` (HiGHS closed the gap to :data:`.class_milp.MIP_REL_GAP`: the value is the
relaxation's optimum up to that, ``proven``), ``dual-bound`` (time limit: the dual bound so far,
``relaxation_gap`` says how far from the best relaxed solution found), ``perfect-balance`` (no
usable dual bound: the value is only the perfect-balance bound), ``infeasible`` (no plan with this
``b`` fits in memory: the value is ``inf``).
A dual bound reached under a time limit depends on the machine's speed (how far HiGHS got); it is
valid either way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import InvalidInputError
from gpp_solver.oracles.class_milp import multi_stage_bound
from gpp_solver.oracles.stage_degrees import MEMORY_REL_TOL, allreduce_bandwidth_ub, degrees
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)


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


def perfect_balance_tps(graph: Graph, b: int, devices: int) -> float:
    """Every node at its cheapest device-time per sample ``min_d d c_v(d) / b``, summed, over ``D``."""
    t = CostTables(graph)
    per = [d * t.compute_at(b / d) for d in degrees(b, devices)]
    return float(sum(min(x[i] for x in per) for i in range(len(graph.nodes)))) / b / devices


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
            + TimeTerms.of(graph, cluster, B).tail(W, d, allreduce_bandwidth_ub(cluster, d), b) / B
        )
        best = min(best, tps)
    return best


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
