"""Turn a partition (stage node sets, devices, micro-batch sizes) into a complete :class:`Plan`.

Every planner ends here, so all plans get their stage edges, Algorithm 2 in-flight counts, kFkB
orders and predicted figures the same way — from ``cost.py`` and ``simulate.py`` — and the
validator recomputes exactly these numbers.

``predicted.iteration_time`` is the simulated makespan of the plan's own orders (exact under the
cost model); ``predicted.throughput = mini_batch_size / iteration_time``; the cheaper estimate of
the cost model is kept as ``search.iteration_time_estimate``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import networkx as nx

from gpp_solver.action import Action, Kind, as_order, has_weight_actions
from gpp_solver.cost.memory import order_memory
from gpp_solver.cost.model import (
    StageCost,
    in_flight_from_order,
    iteration_time_estimate,
    order_time_per_sample,
    stage_costs,
)
from gpp_solver.errors import DeadlockError, InvalidInputError, InvalidPlanError
from gpp_solver.plan.schedule import kfkb_order, schedule_stage_graph, warmup_micro_batches
from gpp_solver.plan.simulate import simulate_orders, sums_in_backwards
from gpp_solver.plan.zero_bubble import (
    ZB_KIND,
    Durations,
    apply_schedule,
    check_schedule,
    memory_caps,
    memory_fits,
)
from gpp_solver.types import Cluster, Graph, Plan, PlanPrediction, Schedule, SearchInfo, Stage, StagePrediction

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageSpec:
    """What a planner decides for one stage; ``build_plan`` derives the rest."""

    nodes: tuple[str, ...]
    devices: tuple[int, ...]
    micro_batch_size: int
    k: int | None = 1
    tensor_parallel: int = 1
    tmpc: Mapping[str, int] | None = field(default=None, compare=False, hash=False)
    order: tuple[Action, ...] | None = None  # an explicit order overrides kFkB (("F", j) pairs are converted)
    recompute: bool = False  # the stage recomputes its activations (docs/cost-model.md, *Recomputation*)
    zero: int = 0  # 1: its replicas shard the optimizer state (docs/cost-model.md, *Sharded optimizer state*)


def spec_of(stage: Stage, **changes) -> StageSpec:
    """The ``StageSpec`` that builds ``stage`` again as it is (its order kept), with ``changes``."""
    spec = StageSpec(
        stage.nodes,
        stage.devices,
        stage.micro_batch_size,
        k=stage.schedule.k,
        tensor_parallel=stage.tensor_parallel,
        tmpc=stage.tmpc,
        order=stage.schedule.order,
        recompute=stage.recompute,
        zero=stage.zero,
    )
    return replace(spec, **changes) if changes else spec


def stage_graph_edges(graph: Graph, stage_of: Mapping[str, int]) -> list[tuple[int, int]]:
    """Stage pairs ``[from, to]`` implied by graph edges across stages (C2), sorted."""
    return sorted({(stage_of[e.src], stage_of[e.dst]) for e in graph.edges if stage_of[e.src] != stage_of[e.dst]})


def _topological_renumbering(graph: Graph, specs: Sequence[StageSpec]) -> list[int]:
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(specs)))
    g.add_edges_from(stage_graph_edges(graph, stage_of))
    if not nx.is_directed_acyclic_graph(g):
        cyc = nx.find_cycle(g)
        raise InvalidPlanError(
            "stage graph has a cycle: "
            + " -> ".join(str(a) for a, _ in cyc)
            + " (a stage is not convex or stages depend on each other both ways)"
        )
    first = [min(graph.index[v] for v in s.nodes) for s in specs]
    return list(nx.lexicographical_topological_sort(g, key=lambda i: first[i]))


def _numbered_specs(graph: Graph, specs: Sequence[StageSpec], mini_batch_size: int) -> list[StageSpec]:
    """``specs`` checked (every node in exactly one stage, ``B % b == 0``) and numbered in
    topological order of the stage graph, each stage's nodes in graph order."""
    seen: dict[str, int] = {}
    for i, s in enumerate(specs):
        if not s.nodes:
            raise InvalidPlanError(f"stage spec #{i} has no nodes")
        for v in s.nodes:
            if v in seen:
                raise InvalidPlanError(f"node '{v}' is in two stages (#{seen[v]} and #{i})")
            seen[v] = i
    missing = [v for v in graph.ids if v not in seen]
    if missing:
        raise InvalidPlanError(f"node '{missing[0]}' is in no stage")
    perm = _topological_renumbering(graph, specs)
    specs = [specs[i] for i in perm]
    for s in specs:
        if mini_batch_size % s.micro_batch_size:
            raise InvalidPlanError(f"`B % b == 0` must hold, but got (B={mini_batch_size}, b={s.micro_batch_size})")
    # keep each stage's nodes in graph order so plans are deterministic
    return [replace(s, nodes=tuple(sorted(s.nodes, key=graph.index.__getitem__))) for s in specs]


def _kfkb_orders(
    specs: Sequence[StageSpec],
    edges: Sequence[tuple[int, int]],
    bsz: Mapping[int, int],
    mini_batch_size: int,
    k_options: Sequence[int],
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[Action, ...]]]:
    """Algorithm 2's ``{stage: (k, in_flight_samples)}`` (each stage's ``k``, or the best of
    ``k_options`` when no stage fixes one) and each stage's order: its explicit one, else kFkB."""
    succs: dict[int, list[int]] = {i: [] for i in range(len(specs))}
    for a, b in edges:
        succs[a].append(b)
    if all(s.k is None for s in specs):
        inflight = schedule_stage_graph(succs, bsz, None, k_options=k_options)
    else:
        inflight = schedule_stage_graph(succs, bsz, {i: (s.k or 1) for i, s in enumerate(specs)})
    orders: dict[int, tuple[Action, ...]] = {}
    for i, s in enumerate(specs):
        n = mini_batch_size // s.micro_batch_size
        orders[i] = (
            as_order(s.order)
            if s.order is not None
            else kfkb_order(n, warmup_micro_batches(inflight[i][1], s.micro_batch_size, n))
        )
    return inflight, orders


def _simulated(
    orders: dict[int, tuple[Action, ...]],
    sim_args: tuple,
    weight: Mapping[int, float],
    accumulate: Mapping[int, float] | None = None,
    split_input: Mapping[int, float] | None = None,
) -> tuple[dict[int, tuple[Action, ...]], float, str]:
    """``(orders, makespan, schedule kind)``: the kFkB ``orders`` and their simulated makespan, or,
    when they deadlock, all forwards then all backwards (GPipe) and theirs."""
    try:
        makespan, _ = simulate_orders(
            orders, *sim_args, record=False, weight=weight, accumulate=accumulate, split_input=split_input
        )
    except DeadlockError as exc:
        logger.warning("Algorithm 2 orders deadlock (%s); falling back to all-forward-then-backward", exc)
        orders = {
            i: tuple([Action(Kind.F, j) for j in range(len(o) // 2)] + [Action(Kind.B, j) for j in range(len(o) // 2)])
            for i, o in orders.items()
        }
        makespan, _ = simulate_orders(
            orders, *sim_args, record=False, weight=weight, accumulate=accumulate, split_input=split_input
        )
        return orders, makespan, "GPipe"
    return orders, makespan, "kFkB"


def _stages(
    graph: Graph,
    cluster: Cluster,
    specs: Sequence[StageSpec],
    costs: Sequence[StageCost],
    orders: Mapping[int, tuple[Action, ...]],
    inflight: Mapping[int, tuple[int, int]],
    kind: str,
) -> list[Stage]:
    """The plan's stages: each with its order (``kind`` for kFkB or GPipe ones), in-flight samples
    (the order's peak) and predicted time per sample and memory."""
    stages = []
    for i, (s, c) in enumerate(zip(specs, costs)):
        peak = in_flight_from_order(orders[i], s.micro_batch_size)
        stages.append(
            Stage(
                id=i,
                nodes=s.nodes,
                devices=tuple(s.devices),
                micro_batch_size=s.micro_batch_size,
                schedule=Schedule(
                    kind="custom" if s.order is not None else ZB_KIND if has_weight_actions(orders[i]) else kind,
                    k=inflight[i][0],
                    order=orders[i],
                ),
                in_flight_samples=peak,
                predicted=StagePrediction(
                    time_per_sample=order_time_per_sample(c, orders[i]),
                    memory_bytes=order_memory(graph, cluster, s, orders[i], specs),
                ),
                tensor_parallel=s.tensor_parallel,
                tmpc=dict(s.tmpc) if s.tmpc else None,
                recompute=s.recompute,
                zero=s.zero,
            )
        )
    return stages


def build_plan(
    graph: Graph,
    cluster: Cluster,
    specs: Sequence[StageSpec],
    mini_batch_size: int,
    *,
    planner: str,
    search: SearchInfo,
    k_options: Sequence[int] = (1,),
    schedule: str = "1f1b",
) -> Plan:
    """Assemble and price a plan.  Stages are numbered in topological order of the stage graph.

    ``schedule``: ``"1f1b"`` the kFkB orders; ``"zb"`` those orders with the weight gradients split
    off as ``W`` actions (:mod:`gpp_solver.plan.zero_bubble`, same memory; slower only when the graph prices the
    split's own cost, ``split_backward_overhead``); ``"auto"``
    the zb orders when they are faster, else the kFkB ones.  Explicit orders (``StageSpec.order``)
    are kept as given.  With ``"zb"``/``"auto"`` the plan's ``search.extra["schedule"]`` records
    the choice (:func:`gpp_solver.plan.zero_bubble.schedule_record`)."""
    check_schedule(schedule)
    if any(s.recompute for s in specs):
        if schedule == "zb":
            raise InvalidInputError("schedule 'zb' splits the backward, which a stage that recomputes does not support")
        schedule = "1f1b"  # "auto": the split is out of reach
    specs = _numbered_specs(graph, specs, mini_batch_size)
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    edges = stage_graph_edges(graph, stage_of)
    bsz = {i: s.micro_batch_size for i, s in enumerate(specs)}
    inflight, orders = _kfkb_orders(specs, edges, bsz, mini_batch_size, k_options)
    costs = stage_costs(graph, cluster, specs, mini_batch_size)
    tails, sums = sums_in_backwards(costs, mini_batch_size)  # as simulate() runs them
    sim_args = (
        bsz,
        {i: c.forward for i, c in enumerate(costs)},
        {i: c.backward for i, c in enumerate(costs)},
        dict(enumerate(tails)),
        edges,
        mini_batch_size,
    )
    weight = {i: c.backward_weight for i, c in enumerate(costs)}
    split_input = {i: c.backward_input for i, c in enumerate(costs)}
    accumulate = dict(enumerate(sums))
    orders, makespan, kind = _simulated(orders, sim_args, weight, accumulate, split_input)
    if schedule != "1f1b" and all(s.order is None for s in specs):
        orders, makespan, _, record = apply_schedule(
            schedule,
            orders,
            makespan,
            kind,
            Durations(
                bsz,
                sim_args[1],
                sim_args[2],
                weight,
                sim_args[3],
                tuple(edges),
                memory_caps(graph, cluster, specs, orders, mini_batch_size),
                memory_fits(graph, cluster, specs, orders),
                accumulate,
                split_input,
            ),
        )
        search = replace(search, extra={**dict(search.extra), "schedule": record})
    stages = _stages(graph, cluster, specs, costs, orders, inflight, kind)
    estimate = iteration_time_estimate(costs, edges, mini_batch_size)
    pred = PlanPrediction(
        time_per_sample=max(st.predicted.time_per_sample for st in stages),
        iteration_time=makespan,
        throughput=mini_batch_size / makespan if makespan > 0 else float("inf"),
        peak_memory_bytes=max(st.predicted.memory_bytes for st in stages),
    )
    search = replace(search, iteration_time_estimate=estimate)
    return Plan(
        planner=planner,
        graph=graph.name,
        mini_batch_size=mini_batch_size,
        stages=tuple(stages),
        edges=tuple(edges),
        predicted=pred,
        search=search,
        optimizer_state_factor=cluster.optimizer_state_factor,
    )
