"""The MILP for one micro-batch size ``b`` (a pure function: build, inspect, then solve elsewhere).

Data: nodes ``v`` (graph order), stage slots ``s = 0..K-1``, device options ``D_b`` (``b % d == 0``),
``n = B / b`` micro-batches, ``J = min(n, K)`` in-flight levels.

Variables
* ``x[v,s]`` binary: node ``v`` is in slot ``s``.
* devices: on a network where placement cannot matter, ``y[s,d]`` binary (slot ``s`` has ``d``
  devices); otherwise ``z[p]`` binary, one per *layout* ``p`` = tuple of per-slot device counts
  (``milp_space.layouts``), which fixes every stage's device range and so every bandwidth.
* ``r[u,s,t]``, ``rb[u,s,t]`` (``s < t``) in [0,1] / [0, max bytes]: the transfer of producer ``u``
  in slot ``s`` into slot ``t`` exists / its bytes per sample (the max over ``u``'s consumers in ``t``),
  in units of the largest edge's bytes so that no coefficient is tiny (HiGHS drops matrix entries
  below 1e-9, which would silently change optima).
* ``e[s,t]`` in [0,1]: stage edge ``s -> t``; ``g[s,j]`` in [0,1] (``j = 1..J``): slot ``s`` holds at
  least ``j`` micro-batches in flight (1F1B: ``min(depth + 1, n)``).
* ``tau``: the bottleneck time-per-sample (scaled), minimised.

Why slot order captures exactly the convex partitions with an acyclic stage graph: if every edge
``u -> v`` has ``slot(u) <= slot(v)``, stage edges go from lower to higher slots, so the stage graph
is acyclic, and a path leaving a stage and re-entering it would need its slot numbers to rise and
come back — impossible — so every stage is convex.  Conversely, for a partition with an acyclic
stage graph, numbering its stages in a topological order satisfies every edge constraint.  So the
feasible ``x`` are exactly (partition, topological order of its stage graph); the order is the
placement order of the device ranges (``milp_space``).

Every continuous auxiliary (``r``, ``rb``, ``e``, ``g``) is only bounded from below by the binaries
and only ever makes constraints tighter or the objective larger, so at an optimum it takes its exact
value; the model is exact under the cost model (up to the solver's tolerances).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpp_solver._backend import load_order as _load_order  # noqa: F401  (OR-Tools before PuLP, see that module)
import pulp

from gpp_solver.cost.model import TimeTerms, node_compute
from gpp_solver.types import Cluster, Graph
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.planners.milp.space import MEMORY_REL_TOL, contiguous_ranges, device_options, layouts


@dataclass
class MilpModel:
    """A built model and what is needed to read a solution back."""

    problem: pulp.LpProblem
    b: int
    scale: float                     # objective * scale = seconds per sample (or bytes for "memory")
    ids: tuple[str, ...]
    slots: int
    x: dict[tuple[int, int], pulp.LpVariable]
    y: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    z: dict[tuple[int, ...], pulp.LpVariable] = field(default_factory=dict)

    def extract(self) -> tuple[tuple[tuple[str, ...], ...], tuple[int, ...]]:
        """(stage node lists in slot order, devices per stage) of the solver's solution."""
        slot = {i: max(range(self.slots), key=lambda s: self.x[i, s].value() or 0.0) for i in range(len(self.ids))}
        if self.z:
            counts = max(self.z, key=lambda p: self.z[p].value() or 0.0)
        else:
            counts = tuple(d for s in range(self.slots) for (s2, d), var in self.y.items()
                           if s2 == s and (var.value() or 0.0) > 0.5)
        stages = tuple(tuple(self.ids[i] for i in range(len(self.ids)) if slot[i] == s) for s in range(len(counts)))
        return stages, tuple(counts)


def build_model(graph: Graph, cluster: Cluster, B: int, b: int, slots: int, *, objective: str = "tps",
                cutoff: float | None = None) -> MilpModel:
    """The MILP for micro-batch size ``b``; ``objective`` is ``"tps"`` (bottleneck time-per-sample,
    memory constrained; only plans with TPS <= ``cutoff`` seconds if given) or ``"memory"``
    (smallest peak memory per device, no memory limit)."""
    ids = graph.ids
    V, K, N = range(len(ids)), slots, cluster.devices
    D = device_options(b, N)
    n_micro = B // b
    J = min(n_micro, K)
    edges = [(graph.index[u], graph.index[v], nb) for (u, v), nb in graph.edge_bytes_map.items()]
    out_edges: dict[int, list[tuple[int, float]]] = {}
    for u, v, nb in edges:
        out_edges.setdefault(u, []).append((v, nb))
    nodes = graph.nodes
    W = [nd.weight_bytes for nd in nodes]
    A = [nd.activation_bytes for nd in nodes]
    gs = graph.micro_batch_sizes

    overhead = TimeTerms.of(graph).node_overhead

    def c(i: int, x: float) -> float:
        return node_compute(nodes[i].fw_time, nodes[i].bw_time, gs, x, overhead)

    prob = pulp.LpProblem(f"gpp_milp_b{b}", pulp.LpMinimize)
    x = {(i, s): prob.add_variable(f"x_{i}_{s}", cat=pulp.LpBinary) for i in V for s in range(K)}
    m = MilpModel(prob, b, 1.0, ids, K, x)

    # each node in one slot; edges never go to an earlier slot (cumulative form, tighter LP)
    for i in V:
        prob += pulp.lpSum(x[i, s] for s in range(K)) == 1, f"one_slot_{i}"
    for u, v, _ in edges:
        for s in range(K - 1):
            prob += (pulp.lpSum(x[v, q] for q in range(s + 1)) <= pulp.lpSum(x[u, q] for q in range(s + 1)),
                     f"order_{u}_{v}_{s}")

    # devices: y[s,d] (placement cannot matter) or one layout z[p]; used slots form a prefix
    const_bw = constant_bandwidth(cluster)
    ycnt: dict[tuple[int, int], Any] = {}
    if const_bw is not None:
        m.y = {(s, d): prob.add_variable(f"y_{s}_{d}", cat=pulp.LpBinary) for s in range(K) for d in D}
        ycnt = dict(m.y)
        used = [pulp.lpSum(m.y[s, d] for d in D) for s in range(K)]
        for s in range(K):
            prob += used[s] <= 1, f"one_count_{s}"
            if s:
                prob += used[s] <= used[s - 1], f"prefix_{s}"
        prob += pulp.lpSum(d * m.y[s, d] for s in range(K) for d in D) <= N, "devices"
    else:
        lay = list(layouts(b, N, K))
        m.z = {p: prob.add_variable("z_" + "_".join(map(str, p)), cat=pulp.LpBinary) for p in lay}
        prob += pulp.lpSum(m.z.values()) == 1, "one_layout"
        used = [pulp.lpSum(z for p, z in m.z.items() if len(p) > s) for s in range(K)]
        ycnt = {(s, d): pulp.lpSum(z for p, z in m.z.items() if len(p) > s and p[s] == d)
                for s in range(K) for d in D}
    for s in range(K):
        prob += pulp.lpSum(x[i, s] for i in V) >= used[s], f"nonempty_{s}"
        for i in V:
            prob += x[i, s] <= used[s], f"in_used_{i}_{s}"

    # transfers (producer u in slot s, consumer slot t > s) and stage edges
    r: dict[tuple[int, int, int], pulp.LpVariable] = {}
    rb: dict[tuple[int, int, int], pulp.LpVariable] = {}
    e = {(s, t): prob.add_variable(f"e_{s}_{t}", 0, 1) for s in range(K) for t in range(s + 1, K)}
    byte_unit = max((nb for _, _, nb in edges), default=0.0) or 1.0   # rb is in these units (numerics)
    for u, outs in out_edges.items():
        top = max(nb for _, nb in outs) / byte_unit
        for s in range(K):
            for t in range(s + 1, K):
                r[u, s, t] = prob.add_variable(f"r_{u}_{s}_{t}", 0, 1)
                rb[u, s, t] = prob.add_variable(f"rb_{u}_{s}_{t}", 0, top)
                for v, nb in outs:
                    both = x[u, s] + x[v, t] - 1
                    prob += r[u, s, t] >= both, f"r_{u}_{v}_{s}_{t}"
                    prob += rb[u, s, t] >= (nb / byte_unit) * both, f"rb_{u}_{v}_{s}_{t}"
                    prob += e[s, t] >= both, f"e_{u}_{v}_{s}_{t}"

    # in-flight levels: g[s,1] for a used slot; g[s,j+1] >= g[t,j] along a stage edge s -> t
    g = {(s, j): prob.add_variable(f"g_{s}_{j}", 0, 1) for s in range(K) for j in range(1, J + 1)}
    for s in range(K):
        prob += g[s, 1] >= used[s], f"g1_{s}"
        for t in range(s + 1, K):
            for j in range(1, J):
                prob += g[s, j + 1] >= g[t, j] + e[s, t] - 1, f"g_{s}_{t}_{j}"

    # memory per device (scaled by memory_bytes): osf W_S + j b/d Act_S, active when y[s,d] = g[s,j] = 1
    mem, osf = cluster.memory_bytes, cluster.optimizer_state_factor
    peak = prob.add_variable("peak", 0) if objective == "memory" else None
    for s in range(K):
        for d in D:
            for j in range(1, J + 1):
                coef = [(osf * W[i] + j * b / d * A[i]) / mem for i in V]
                lhs = pulp.lpSum(coef[i] * x[i, s] for i in V)
                big = sum(coef)
                if peak is None:
                    slack = max(0.0, big - 1 - MEMORY_REL_TOL)
                    if slack > 0:
                        prob += (lhs <= 1 + MEMORY_REL_TOL + slack * (2 - ycnt[s, d] - g[s, j]),
                                 f"mem_{s}_{d}_{j}")
                else:
                    prob += peak >= lhs - big * (2 - ycnt[s, d] - g[s, j]), f"mem_{s}_{d}_{j}"
    if peak is not None:
        prob += peak
        m.scale = mem
        return m

    # time per sample (scaled by tau0): one constraint per slot and per device situation ("key")
    tau0 = sum(c(i, b) for i in V) / b or 1.0
    m.scale = tau0
    lat = cluster.latency
    if const_bw is not None:
        keys = {(s, (d, const_bw, None)): m.y[s, d] for s in range(K) for d in D}
    else:
        grouped: dict[tuple[int, tuple[Any, ...]], list[pulp.LpVariable]] = {}
        for p, z in m.z.items():
            ranges = contiguous_ranges(p)
            for s in range(len(p)):
                pair = tuple(cluster.bandwidth(ranges[min(s, t)] + ranges[max(s, t)]) if t != s else 0.0
                             for t in range(len(p)))
                grouped.setdefault((s, (p[s], cluster.bandwidth(ranges[s]), pair)), []).append(z)
        keys = {k: pulp.lpSum(zs) for k, zs in grouped.items()}
    tau = prob.add_variable("tau", 0, None if cutoff is None else cutoff / tau0)
    for kidx, ((s, (d, bw_self, pair)), active) in enumerate(keys.items()):
        x_ = b / d
        terms = [c(i, x_) * x[i, s] for i in V]
        for t in range(K):
            if t == s or (pair is not None and t >= len(pair)):
                continue
            bw = const_bw if pair is None else pair[t]
            lo, hi = min(s, t), max(s, t)
            for u in out_edges:
                terms += [2 * lat * r[u, lo, hi], 2 * x_ * byte_unit / bw * rb[u, lo, hi]]
        expr = pulp.lpSum(terms) / (b * tau0)
        if d > 1:   # A(S) (TimeTerms.allreduce): the cluster's all-reduce bandwidth and latency when given
            expr += (2 * (d - 1) / d / cluster.collective_bandwidth(bw_self) / B / tau0) * pulp.lpSum(
                W[i] * x[i, s] for i in V)
            if cluster.allreduce_latency:
                expr += 2 * (d - 1) * cluster.allreduce_latency / B / tau0
        if graph.optimizer_time_per_byte:   # O(S)
            expr += (graph.optimizer_time_per_byte / B / tau0) * pulp.lpSum(W[i] * x[i, s] for i in V)
        big = sum(coef * var.upBound for var, coef in expr.items())   # every coefficient is >= 0
        prob += tau >= expr - big * (1 - active), f"tps_{s}_{kidx}"
    prob += tau
    return m
