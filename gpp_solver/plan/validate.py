"""``validate(plan, graph, cluster)``: C1–C4, the device partition, divisibility, memory, and that
the plan's predicted figures are the cost model's.  Raises :class:`InvalidPlanError` naming the
first violation; for a schedule, the stage's order is shown with the bad step marked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import networkx as nx

from gpp_solver.cost.memory import order_memory
from gpp_solver.cost.model import in_flight_from_order, order_time_per_sample, stage_costs
from gpp_solver.errors import InvalidPlanError, check_types
from gpp_solver.plan.build import stage_graph_edges
from gpp_solver.plan.simulate import SimResult, simulate
from gpp_solver.types import Cluster, Graph, Plan, Stage

E = InvalidPlanError
REL_TOL = 1e-6


def _marked(order: Sequence[tuple[str, int]], bad: int) -> str:
    items = [f"{a}{j}" for a, j in order]
    lo = max(0, bad - 12)
    hi = min(len(items), bad + 12)
    shown = items[lo:hi]
    shown[bad - lo] = f"[{shown[bad - lo]}]<-"
    return ("... " if lo else "") + " ".join(shown) + (" ..." if hi < len(items) else "")


def check_order(stage_id: int, order: Sequence[tuple[str, int]], n: int) -> None:
    """C4 for one stage: every F j and B j once, F j < F j+1, B j < B j+1, F j < B j; in an order
    with ``W`` actions also every W j once, W j < W j+1 and B j < W j."""
    seen_f = seen_b = seen_w = 0
    fw_done: set[int] = set()
    split = any(kind == "W" for kind, _ in order)
    for pos, (kind, j) in enumerate(order):
        where = f"stage {stage_id} schedule step {pos}"
        if j >= n:
            raise E(f"{where}: micro-batch {j} does not exist (n = {n}): {_marked(order, pos)}")
        if kind == "F":
            if j != seen_f:
                raise E(f"{where}: F{j} out of order, expected F{seen_f} (C4: F j before F j+1): {_marked(order, pos)}")
            seen_f += 1
            fw_done.add(j)
        elif kind == "W":
            if j != seen_w:
                raise E(f"{where}: W{j} out of order, expected W{seen_w} (C4: W j before W j+1): {_marked(order, pos)}")
            if j >= seen_b:
                raise E(
                    f"{where}: W{j} before B{j} (C4: the weight gradient follows the input gradient, "
                    f"B j before W j): {_marked(order, pos)}"
                )
            seen_w += 1
        else:
            if j != seen_b:
                raise E(f"{where}: B{j} out of order, expected B{seen_b} (C4: B j before B j+1): {_marked(order, pos)}")
            if j not in fw_done:
                raise E(f"{where}: B{j} before F{j} (C4: F j before B j): {_marked(order, pos)}")
            seen_b += 1
    if seen_f != n or seen_b != n:
        raise E(
            f"stage {stage_id} schedule has {seen_f} forwards and {seen_b} backwards, "
            f"expected {n} of each (mini_batch_size / micro_batch_size)"
        )
    if split and seen_w != n:
        raise E(
            f"stage {stage_id} schedule has {seen_w} weight gradients W but {n} micro-batches: an order with "
            f"W actions needs W j for every micro-batch j (after B j)"
        )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-12)


def _check_optimizer_state_factor(plan: Plan, cluster: Cluster) -> None:
    """A plan that records its optimizer state factor was priced for that factor only."""
    f = plan.optimizer_state_factor
    if f is not None and not _close(f, cluster.optimizer_state_factor):
        raise E(
            f"the plan was made for optimizer_state_factor {f:g} but the cluster's is "
            f"{cluster.optimizer_state_factor:g}"
        )


def validate(plan: Plan, graph: Graph, cluster: Cluster, *, check_predictions: bool = True) -> None:
    """Raise :class:`InvalidPlanError` at the first violation; return ``None`` for a valid plan.

    The checks, in order: stage ids, C1 (a partition of the nodes; convex stages), C2 (the stage
    edges; an acyclic stage graph), C3 (devices, ``b % d``, ``B % b``, TMPC choices), C4 (the
    orders and their in-flight counts), memory (Eq. 2), deadlock-free orders (simulated) and,
    with ``check_predictions``, the predicted figures against the cost model's."""
    check_types(plan=(plan, Plan), graph=(graph, Graph), cluster=(cluster, Cluster))
    ids = [s.id for s in plan.stages]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise E(f"stage id {dup} appears twice")
    stage_of = _check_partition(plan, graph)
    implied = set(stage_graph_edges(graph, stage_of))
    _check_convex(plan, graph, stage_of)
    _check_stage_edges(plan, graph, ids, stage_of, implied)
    owner: dict[int, int] = {}
    for s in plan.stages:  # C3: devices
        _check_devices(plan, graph, cluster, s, owner)
    for s in plan.stages:  # C4: orders
        check_order(s.id, s.schedule.order, plan.mini_batch_size // s.micro_batch_size)
        if s.recompute and any(a[0] == "W" for a in s.schedule.order):
            raise E(
                f"stage {s.id}: recompute with a split backward (W actions) is not supported; "
                "give it an order without W"
            )
        if s.zero and s.data_parallel < 2:
            raise E(
                f"stage {s.id}: zero {s.zero} shards the optimizer state over the stage's data-parallel "
                f"replicas, but it has {s.data_parallel}; give it more devices or zero 0"
            )
        peak = in_flight_from_order(s.schedule.order, s.micro_batch_size)
        if s.in_flight_samples != peak:
            raise E(f"stage {s.id}: in_flight_samples is {s.in_flight_samples} but its order holds up to {peak}")
    _check_optimizer_state_factor(plan, cluster)
    memory: dict[int, float] = {}  # each stage's, priced once: the simulation and the predictions reuse it
    for s in plan.stages:  # memory (Eq. 2)
        m = memory[s.id] = order_memory(graph, cluster, s, s.schedule.order, plan.stages)
        if m > cluster.memory_bytes * (1 + 1e-9):
            raise E(
                f"stage {s.id} needs {m:.6g} bytes per device but the cluster has {cluster.memory_bytes:.6g} "
                f"(memory limit, Eq. 2)"
            )
    sim = simulate(plan, graph, cluster, record=False, memory=memory)  # deadlock-free orders
    if check_predictions:
        _check_predictions(plan, graph, cluster, sim, memory)


def _check_partition(plan: Plan, graph: Graph) -> dict[str, int]:
    """C1: the stages partition the graph's nodes; each node's stage id."""
    stage_of: dict[str, int] = {}
    for s in plan.stages:
        if not s.nodes:
            raise E(f"stage {s.id} has no nodes")
        for v in s.nodes:
            if v not in graph.index:
                raise E(f"stage {s.id} names node '{v}' which is not in graph '{graph.name}'")
            if v in stage_of:
                raise E(f"node '{v}' is in stage {stage_of[v]} and in stage {s.id} (C1: stages must not overlap)")
            stage_of[v] = s.id
    for v in graph.ids:
        if v not in stage_of:
            raise E(f"node '{v}' is in no stage (C1: stages must cover the graph)")
    return stage_of


def _check_convex(plan: Plan, graph: Graph, stage_of: dict[str, int]) -> None:
    """C1: no path leaves a stage and re-enters it."""
    nxg = graph.to_networkx()
    for s in plan.stages:
        inside = set(s.nodes)
        frontier = [w for v in inside for w in nxg.successors(v) if w not in inside]
        outside_reach = set(frontier)
        while frontier:
            u = frontier.pop()
            for w in nxg.successors(u):
                if w in inside:
                    raise E(
                        f"stage {s.id} is not convex: a path leaves it and re-enters at node '{w}' "
                        f"through node '{u}' of stage {stage_of[u]} (C1)"
                    )
                if w not in outside_reach:
                    outside_reach.add(w)
                    frontier.append(w)


def _check_stage_edges(
    plan: Plan, graph: Graph, ids: list[int], stage_of: dict[str, int], implied: set[tuple[int, int]]
) -> None:
    """C2: the plan's stage edges are exactly those the graph's edges imply, and acyclic."""
    listed = set()
    for a, b in plan.edges:
        if a not in ids or b not in ids:
            raise E(f"plan edge [{a}, {b}] names a stage that does not exist")
        if a == b:
            raise E(f"plan edge [{a}, {b}] is a self-loop")
        listed.add((a, b))
    for a, b in sorted(implied):
        if (a, b) not in listed:
            u, v = next((e.src, e.dst) for e in graph.edges if stage_of[e.src] == a and stage_of[e.dst] == b)
            raise E(
                f"graph edge '{u}' -> '{v}' crosses from stage {a} to stage {b} but plan edge [{a}, {b}] "
                "is missing (C2)"
            )
    for a, b in sorted(listed - implied):
        raise E(f"plan edge [{a}, {b}] corresponds to no graph edge between those stages")
    sg = nx.DiGraph(list(listed))
    sg.add_nodes_from(ids)
    if not nx.is_directed_acyclic_graph(sg):
        cyc = nx.find_cycle(sg)
        raise E("stage graph has a cycle: " + " -> ".join(str(a) for a, _ in cyc))


def _check_devices(plan: Plan, graph: Graph, cluster: Cluster, s: Stage, owner: dict[int, int]) -> None:
    """C3 for stage ``s``: its devices exist and no other stage has them (``owner``: device -> stage
    so far), ``b % d == 0``, ``B % b == 0``, and its TMPC choices match its tensor parallelism."""
    if not s.devices:
        raise E(f"stage {s.id} has no devices (C3)")
    for d in s.devices:
        if d >= cluster.devices:
            raise E(f"stage {s.id} uses device {d} but the cluster has {cluster.devices} (0..{cluster.devices - 1})")
        if d in owner:
            raise E(f"device {d} is in stage {owner[d]} and in stage {s.id} (C3: device lists must be disjoint)")
        owner[d] = s.id
    t = s.tensor_parallel
    if len(s.devices) % t:
        raise E(
            f"stage {s.id}: `len(devices) % tensor_parallel == 0` must hold, but got (devices={len(s.devices)}, t={t})"
        )
    d = len(s.devices) // t
    if s.micro_batch_size % d:
        raise E(f"stage {s.id}: `b % d == 0` must hold, but got (b={s.micro_batch_size}, d={d})")
    if plan.mini_batch_size % s.micro_batch_size:
        raise E(f"stage {s.id}: `B % b == 0` must hold, but got (B={plan.mini_batch_size}, b={s.micro_batch_size})")
    if s.tmpc:
        for v, idx in s.tmpc.items():
            if v not in s.nodes:
                raise E(f"stage {s.id}: tmpc names node '{v}' which is not in the stage")
            node = graph.node(v)
            if not isinstance(idx, int) or not 0 <= idx < len(node.tmpc):
                raise E(f"stage {s.id}: tmpc index {idx!r} for node '{v}' is out of range ({len(node.tmpc)} TMPCs)")
            if node.tmpc[idx].t != t:
                raise E(
                    f"stage {s.id}: node '{v}' TMPC {idx} has t={node.tmpc[idx].t} but the stage's "
                    f"tensor_parallel is {t}"
                )
    elif t != 1:
        raise E(f"stage {s.id}: tensor_parallel={t} needs a tmpc choice for its nodes")


def _check_predictions(plan: Plan, graph: Graph, cluster: Cluster, sim: SimResult, memory: dict[int, float]) -> None:
    """Every predicted figure, per stage and of the plan, equals the cost model's (``REL_TOL``);
    ``memory``: each stage's ``order_memory`` by id."""
    costs = stage_costs(graph, cluster, plan.stages, plan.mini_batch_size)
    tps = [order_time_per_sample(c, s.schedule.order) for s, c in zip(plan.stages, costs)]
    for s, t in zip(plan.stages, tps):
        if not _close(s.predicted.time_per_sample, t):
            raise E(
                f"stage {s.id}: predicted time_per_sample {s.predicted.time_per_sample:.9g} differs from the "
                f"cost model's {t:.9g}"
            )
        m = memory[s.id]
        if not _close(s.predicted.memory_bytes, m):
            raise E(
                f"stage {s.id}: predicted memory_bytes {s.predicted.memory_bytes:.9g} differs from the cost "
                f"model's {m:.9g}"
            )
    p = plan.predicted
    checks = [
        ("time_per_sample", p.time_per_sample, max(tps)),
        ("iteration_time", p.iteration_time, sim.iteration_time),
        ("throughput", p.throughput, sim.throughput),
        ("peak_memory_bytes", p.peak_memory_bytes, sim.peak_memory_bytes),
    ]
    for name, got, want in checks:
        if not _close(got, want):
            raise E(f"plan predicted.{name} {got:.9g} differs from the cost model's {want:.9g}")


def unbounded_cluster(plan: Plan) -> Cluster:
    """A cluster with every device ``plan`` names and unlimited memory: to check a plan's structure
    (C1-C4, devices) when no cluster is given."""
    return Cluster(
        devices=max((d for s in plan.stages for d in s.devices), default=0) + 1,
        memory_bytes=math.inf,
        inter_node_bandwidth=1.0,
    )
