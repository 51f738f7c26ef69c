"""Between ``plan_gpp``'s local-search states and plans: a seed plan's partition as start states, a
state as a full priced plan, a seed plan re-issued under the name ``gpp``."""

from __future__ import annotations

import logging
from dataclasses import replace

from gpp_solver.cost.model import stage_costs
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo

logger = logging.getLogger(__name__)


def uniform_micro_batch(plan: Plan) -> int | None:
    bs = {s.micro_batch_size for s in plan.stages}
    if len(bs) != 1 or any(s.tensor_parallel != 1 or s.tmpc for s in plan.stages):
        return None
    return bs.pop()


def states_from_plan(P: Problem, plan: Plan) -> list[State]:
    """The seed plan's partition at ``P.b``: its own degrees when valid there, and re-split ones."""
    idx = P.graph.index
    a = [0] * P.N
    for i, s in enumerate(plan.stages):
        for v in s.nodes:
            a[idx[v]] = i
    k = len(plan.stages)
    out = []
    devs = tuple(len(s.devices) // max(1, s.tensor_parallel) for s in plan.stages)
    if all(d in P.degrees for d in devs) and sum(devs) <= P.D:
        out.append(State(tuple(a), devs))
    rb = P.rebalance(a, k)
    if rb is not None:
        out.append(State(tuple(a), rb))
    return out


def _stage_specs(P: Problem, state: State, ev: Eval) -> list[StageSpec]:
    k = len(state.devs)
    members: list[list[int]] = [[] for _ in range(k)]
    for u, s in enumerate(state.assign):
        members[s].append(u)
    ids = P.graph.ids
    return [
        StageSpec(
            nodes=tuple(ids[u] for u in members[s]),
            devices=tuple(range(ev.offsets[s], ev.offsets[s] + state.devs[s])),
            micro_batch_size=P.b,
            k=1,
        )
        for s in range(k)
    ]


def iteration_time_lower_bound(P: Problem, state: State, ev: Eval, split: bool = False) -> float:
    """A lower bound on the simulated iteration time of :func:`build_from_state`'s plan, under any
    orders (``docs/cost-model.md``, *Iteration time*; one micro-batch size, ``n = B / b``).

    Stage ``s`` starts no forward before ``head(s)``, the longest chain of predecessors' forwards,
    and runs its ``n`` forwards and ``n`` backwards one after another, then its all-reduce:
    ``head(s) + n (F_s + B_s) + A_s``.  And its last backward waits for the backward of micro-batch
    ``n - 1`` of every successor, which waits for that successor's own forward of it after
    ``s``'s last forward, and so on down: ``head(s) + n F_s + down(s) + B_s + A_s`` with
    ``down(s)`` the longest chain of ``F_t + B_t`` over descendants.  After that last backward
    the stage runs its all-reduce, and every predecessor ``p`` still runs its own last backward
    (it waits for ``s``'s) and then its all-reduce, and so on up: ``+ max(A_s, up(s))`` with
    ``up(s) = max_p B_p + max(A_p, up(p))``.  The durations are the simulator's
    (``stage_costs``); the caller allows for float rounding.  ``split``: a bound for orders with
    ``W`` actions too (:func:`_split_lower_bound`)."""
    k = len(state.devs)
    costs = stage_costs(P.graph, P.cluster, _stage_specs(P, state, ev), P.B)
    succ: list[set[int]] = [set() for _ in range(k)]
    for u in range(P.N):
        for v, _ in P.succ[u]:
            if state.assign[u] != state.assign[v]:
                succ[state.assign[u]].add(state.assign[v])
    fw = [c.forward for c in costs]
    bw = [c.backward for c in costs]
    head = [0.0] * k
    for s in ev.order:
        for t in succ[s]:
            head[t] = max(head[t], head[s] + fw[s])
    ar = [c.tail for c in costs]
    up = [0.0] * k
    for s in ev.order:
        for t in succ[s]:
            up[t] = max(up[t], bw[s] + max(ar[s], up[s]))
    down = [0.0] * k
    for s in reversed(ev.order):
        down[s] = max((fw[t] + bw[t] + down[t] for t in succ[s]), default=0.0)
    n = P.num_micro_batches
    if split:
        return _split_lower_bound(costs, succ, ev.order, n, head)
    return max(head[s] + max(n * (fw[s] + bw[s]), n * fw[s] + down[s] + bw[s]) + max(ar[s], up[s]) for s in range(k))


def _split_lower_bound(costs: list, succ: list[set[int]], order: list[int], n: int, head: list[float]) -> float:
    """The bound of :func:`iteration_time_lower_bound` for orders with ``W`` actions: a predecessor
    waits only for the input gradient ``B_in`` of its successors, so the chains down and up use
    ``B_in``; a stage's own last ``B`` is still followed by its ``W`` (``B_in + W = B``)."""
    k = len(costs)
    fw = [c.forward for c in costs]
    bw = [c.backward for c in costs]
    b_in = [c.backward_input for c in costs]
    w = [c.backward_weight for c in costs]
    ar = [c.tail for c in costs]
    up = [0.0] * k  # after stage s's last B_in: the longest tail through its predecessors
    for s in order:
        for t in succ[s]:
            up[t] = max(up[t], bw[s] + ar[s], b_in[s] + up[s])
    down = [0.0] * k
    for s in reversed(order):
        down[s] = max((fw[t] + b_in[t] + down[t] for t in succ[s]), default=0.0)
    return max(
        max(head[s] + n * (fw[s] + bw[s]) + ar[s], head[s] + n * fw[s] + down[s] + b_in[s] + max(w[s] + ar[s], up[s]))
        for s in range(k)
    )


def build_from_state(P: Problem, state: State, ev: Eval, search_info: SearchInfo, schedule: str = "1f1b") -> Plan:
    """A full, priced plan of a state (stage devices as placed by the evaluator)."""
    specs = _stage_specs(P, state, ev)
    plan = build_plan(P.graph, P.cluster, specs, P.B, planner="gpp", search=search_info, schedule=schedule)
    split_priced = any(P.graph.split_backward_overhead) and any(
        a.kind == "W" for s in plan.stages for a in s.schedule.order
    )  # the evaluator prices kFkB stages: a split order adds its own cost (docs/zero-bubble.md)
    if not split_priced and abs(plan.predicted.time_per_sample - ev.max_tps) > 1e-6 * ev.max_tps:
        logger.warning(
            "evaluator TPS %.9g differs from the cost model's %.9g", ev.max_tps, plan.predicted.time_per_sample
        )
    return plan


def reschedule(plan: Plan, graph: Graph, cluster: Cluster, schedule: str) -> Plan:
    """A seed plan with its orders made again under ``schedule`` (same planner name, partition and
    search record); the plan itself when that breaks the memory limit or, under ``auto``, is slower,
    and for ``1f1b``."""
    if schedule == "1f1b":
        return plan
    specs = [
        StageSpec(
            s.nodes, s.devices, s.micro_batch_size, k=s.schedule.k, tensor_parallel=s.tensor_parallel, tmpc=s.tmpc
        )
        for s in plan.stages
    ]
    out = build_plan(
        graph, cluster, specs, plan.mini_batch_size, planner=plan.planner, search=plan.search, schedule=schedule
    )
    slower = out.predicted.iteration_time > plan.predicted.iteration_time * (1 + 1e-12)
    if (slower and schedule != "zb") or any(
        st.predicted.memory_bytes > cluster.memory_bytes * (1 + 1e-9) for st in out.stages
    ):
        return plan
    return out


def rebuild_as_gpp(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    search_info: SearchInfo,
    schedule: str = "1f1b",
    *,
    orders: str = "remake",
) -> Plan:
    """A seed plan re-issued under the name ``gpp`` with the same partition.  ``orders``:
    ``"remake"`` its orders made again under ``schedule`` when that fits and is faster (or
    ``schedule`` is ``"zb"``: the split the user asked for, though its own costs may make it slower),
    else its own; ``"built"`` the plan *is* such a build (:func:`reschedule`'s, under the same ``schedule``),
    renamed; ``"own"`` its own orders (what ``"remake"`` falls back to)."""

    def specs(keep_orders: bool) -> list[StageSpec]:
        return [
            StageSpec(
                s.nodes,
                s.devices,
                s.micro_batch_size,
                k=s.schedule.k,
                tensor_parallel=s.tensor_parallel,
                tmpc=s.tmpc,
                order=s.schedule.order if keep_orders else None,
            )
            for s in plan.stages
        ]

    if orders not in ("remake", "built", "own"):
        raise ValueError(f"rebuild_as_gpp: orders must be 'remake', 'built' or 'own', got {orders!r}")
    if orders == "built":
        extra = dict(search_info.extra or {})
        if "schedule" in (plan.search.extra or {}):
            extra["schedule"] = plan.search.extra["schedule"]
        info = replace(search_info, iteration_time_estimate=plan.search.iteration_time_estimate, extra=extra)
        return replace(plan, planner="gpp", search=info)
    if orders == "remake":
        out = build_plan(
            graph, cluster, specs(False), plan.mini_batch_size, planner="gpp", search=search_info, schedule=schedule
        )
        faster = out.predicted.iteration_time <= plan.predicted.iteration_time * (1 + 1e-12)
        if (faster or schedule == "zb") and all(
            st.predicted.memory_bytes <= cluster.memory_bytes * (1 + 1e-9) for st in out.stages
        ):
            return out
    return build_plan(graph, cluster, specs(True), plan.mini_batch_size, planner="gpp", search=search_info)
