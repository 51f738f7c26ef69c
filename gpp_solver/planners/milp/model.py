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

# isort: split
import pulp

from gpp_solver.cost.model import node_compute
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.planners.milp.space import MEMORY_REL_TOL, contiguous_ranges, device_options, layouts
from gpp_solver.types import Cluster, Graph


@dataclass
class MilpModel:
    """A built model and what is needed to read a solution back."""

    problem: pulp.LpProblem
    b: int
    scale: float  # objective * scale = seconds per sample (or bytes for "memory")
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
            counts = tuple(
                d
                for s in range(self.slots)
                for (s2, d), var in self.y.items()
                if s2 == s and (var.value() or 0.0) > 0.5
            )
        stages = tuple(tuple(self.ids[i] for i in range(len(self.ids)) if slot[i] == s) for s in range(len(counts)))
        return stages, tuple(counts)


def build_model(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    b: int,
    slots: int,
    *,
    objective: str = "tps",
    cutoff: float | None = None,
) -> MilpModel:
    """The MILP for micro-batch size ``b``; ``objective`` is ``"tps"`` (bottleneck time-per-sample,
    memory constrained; only plans with TPS <= ``cutoff`` seconds if given) or ``"memory"``
    (smallest peak memory per device, no memory limit).  The blocks of constraints are added in
    the order of :class:`_Builder`'s methods (the module docstring names the variables)."""
    B = mini_batch_size  # the paper's B
    mb = _Builder(graph, cluster, B, b, slots)
    mb.assignment()
    used, ycnt = mb.devices()
    mb.nonempty(used)
    r, rb, e = mb.transfers()
    g = mb.in_flight(used, e)
    peak = mb.problem.add_variable("peak", 0) if objective == "memory" else None
    mb.memory(ycnt, g, peak)
    if peak is not None:
        mb.problem += peak
        mb.model.scale = cluster.memory_bytes
        return mb.model
    mb.time_per_sample(r, rb, cutoff)
    return mb.model


class _Builder:
    """One MILP under construction: its data (nodes, slots, device options, edges) and the blocks
    of constraints, each a method."""

    def __init__(self, graph: Graph, cluster: Cluster, B: int, b: int, slots: int) -> None:
        self.graph, self.cluster, self.B, self.b = graph, cluster, B, b
        ids = graph.ids
        self.V, self.K, N = range(len(ids)), slots, cluster.devices
        self.N = N
        self.D = device_options(b, N)
        num_micro_batches = B // b
        self.J = min(num_micro_batches, slots)  # in-flight levels
        self.edges = [(graph.index[u], graph.index[v], nb) for (u, v), nb in graph.edge_bytes_map.items()]
        self.out_edges: dict[int, list[tuple[int, float]]] = {}
        for u, v, nb in self.edges:
            self.out_edges.setdefault(u, []).append((v, nb))
        self.nodes = graph.nodes
        self.W = [nd.weight_bytes for nd in self.nodes]
        self.A = [nd.activation_bytes for nd in self.nodes]
        self.const_bw = constant_bandwidth(cluster)
        self.overhead = TimeTerms.of(graph).node_overhead
        self.problem = pulp.LpProblem(f"gpp_milp_b{b}", pulp.LpMinimize)
        self.x = {
            (i, s): self.problem.add_variable(f"x_{i}_{s}", cat=pulp.LpBinary) for i in self.V for s in range(slots)
        }
        self.model = MilpModel(self.problem, b, 1.0, ids, slots, self.x)
        self.byte_unit = max((nb for _, _, nb in self.edges), default=0.0) or 1.0  # rb is in these units (numerics)

    def c(self, i: int, x: float) -> float:
        nd = self.nodes[i]
        return node_compute(nd.fw_time, nd.bw_time, self.graph.micro_batch_sizes, x, self.overhead)

    def assignment(self) -> None:
        """Each node in one slot; edges never go to an earlier slot (cumulative form, tighter LP)."""
        prob, x, K = self.problem, self.x, self.K
        for i in self.V:
            prob += pulp.lpSum(x[i, s] for s in range(K)) == 1, f"one_slot_{i}"
        for u, v, _ in self.edges:
            for s in range(K - 1):
                prob += (
                    pulp.lpSum(x[v, q] for q in range(s + 1)) <= pulp.lpSum(x[u, q] for q in range(s + 1)),
                    f"order_{u}_{v}_{s}",
                )

    def devices(self) -> tuple[list[Any], dict[tuple[int, int], Any]]:
        """Devices: ``y[s,d]`` (placement cannot matter) or one layout ``z[p]``; the used slots form a
        prefix.  Returns each slot's "used" expression and the count indicators ``(s, d)``."""
        prob, m, K, D, N = self.problem, self.model, self.K, self.D, self.N
        if self.const_bw is not None:
            m.y = {(s, d): prob.add_variable(f"y_{s}_{d}", cat=pulp.LpBinary) for s in range(K) for d in D}
            used = [pulp.lpSum(m.y[s, d] for d in D) for s in range(K)]
            for s in range(K):
                prob += used[s] <= 1, f"one_count_{s}"
                if s:
                    prob += used[s] <= used[s - 1], f"prefix_{s}"
            prob += pulp.lpSum(d * m.y[s, d] for s in range(K) for d in D) <= N, "devices"
            return used, dict(m.y)
        lay = list(layouts(self.b, N, K))
        m.z = {p: prob.add_variable("z_" + "_".join(map(str, p)), cat=pulp.LpBinary) for p in lay}
        prob += pulp.lpSum(m.z.values()) == 1, "one_layout"
        used = [pulp.lpSum(z for p, z in m.z.items() if len(p) > s) for s in range(K)]
        ycnt = {(s, d): pulp.lpSum(z for p, z in m.z.items() if len(p) > s and p[s] == d) for s in range(K) for d in D}
        return used, ycnt

    def nonempty(self, used: list[Any]) -> None:
        """A used slot holds a node; a node sits in a used slot."""
        for s in range(self.K):
            self.problem += pulp.lpSum(self.x[i, s] for i in self.V) >= used[s], f"nonempty_{s}"
            for i in self.V:
                self.problem += self.x[i, s] <= used[s], f"in_used_{i}_{s}"

    def transfers(self) -> tuple[dict, dict, dict]:
        """Transfers (producer ``u`` in slot ``s``, consumer slot ``t > s``) and stage edges."""
        prob, x, K, byte_unit = self.problem, self.x, self.K, self.byte_unit
        r: dict[tuple[int, int, int], pulp.LpVariable] = {}
        rb: dict[tuple[int, int, int], pulp.LpVariable] = {}
        e = {(s, t): prob.add_variable(f"e_{s}_{t}", 0, 1) for s in range(K) for t in range(s + 1, K)}
        for u, outs in self.out_edges.items():
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
        return r, rb, e

    def in_flight(self, used: list[Any], e: dict) -> dict:
        """In-flight levels: ``g[s,1]`` for a used slot; ``g[s,j+1] >= g[t,j]`` along a stage edge ``s -> t``."""
        prob, K, J = self.problem, self.K, self.J
        g = {(s, j): prob.add_variable(f"g_{s}_{j}", 0, 1) for s in range(K) for j in range(1, J + 1)}
        for s in range(K):
            prob += g[s, 1] >= used[s], f"g1_{s}"
            for t in range(s + 1, K):
                for j in range(1, J):
                    prob += g[s, j + 1] >= g[t, j] + e[s, t] - 1, f"g_{s}_{t}_{j}"
        return g

    def memory(self, ycnt: dict, g: dict, peak: Any) -> None:
        """Memory per device (scaled by ``memory_bytes``): ``osf W_S + j b/d Act_S``, active when
        ``y[s,d] = g[s,j] = 1``; at most the memory, or at most ``peak`` (the "memory" objective)."""
        prob, x, V, b = self.problem, self.x, self.V, self.b
        mem, osf = self.cluster.memory_bytes, self.cluster.optimizer_state_factor
        for s in range(self.K):
            for d in self.D:
                for j in range(1, self.J + 1):
                    coef = [(osf * self.W[i] + j * b / d * self.A[i]) / mem for i in V]
                    lhs = pulp.lpSum(coef[i] * x[i, s] for i in V)
                    big = sum(coef)
                    if peak is None:
                        slack = max(0.0, big - 1 - MEMORY_REL_TOL)
                        if slack > 0:
                            prob += (lhs <= 1 + MEMORY_REL_TOL + slack * (2 - ycnt[s, d] - g[s, j]), f"mem_{s}_{d}_{j}")
                    else:
                        prob += peak >= lhs - big * (2 - ycnt[s, d] - g[s, j]), f"mem_{s}_{d}_{j}"

    def _situations(self) -> dict[tuple[int, tuple[Any, ...]], Any]:
        """Per slot and device situation ``(d, bandwidth within, bandwidths to the other slots)``: the
        indicator that the slot is in it (``pair`` is ``None`` on a constant-bandwidth network)."""
        cluster, K, D = self.cluster, self.K, self.D
        if self.const_bw is not None:
            return {(s, (d, self.const_bw, None)): self.model.y[s, d] for s in range(K) for d in D}
        grouped: dict[tuple[int, tuple[Any, ...]], list[pulp.LpVariable]] = {}
        for p, z in self.model.z.items():
            ranges = contiguous_ranges(p)
            for s in range(len(p)):
                pair = tuple(
                    cluster.bandwidth(ranges[min(s, t)] + ranges[max(s, t)]) if t != s else 0.0 for t in range(len(p))
                )
                grouped.setdefault((s, (p[s], cluster.bandwidth(ranges[s]), pair)), []).append(z)
        return {k: pulp.lpSum(zs) for k, zs in grouped.items()}

    def time_per_sample(self, r: dict, rb: dict, cutoff: float | None) -> None:
        """Time per sample (scaled by ``tau0``): one constraint per slot and device situation; ``tau``
        minimised."""
        prob, x, V, K, b, B = self.problem, self.x, self.V, self.K, self.b, self.B
        tau0 = sum(self.c(i, b) for i in V) / b or 1.0
        self.model.scale = tau0
        lat, byte_unit = self.cluster.latency, self.byte_unit
        keys = self._situations()
        tau = prob.add_variable("tau", 0, None if cutoff is None else cutoff / tau0)
        for kidx, ((s, (d, bw_self, pair)), active) in enumerate(keys.items()):
            x_ = b / d
            terms = [self.c(i, x_) * x[i, s] for i in V]
            for t in range(K):
                if t == s or (pair is not None and t >= len(pair)):
                    continue
                bw = self.const_bw if pair is None else pair[t]
                lo, hi = min(s, t), max(s, t)
                for u in self.out_edges:
                    terms += [2 * lat * r[u, lo, hi], 2 * x_ * byte_unit / bw * rb[u, lo, hi]]
            expr = pulp.lpSum(terms) / (b * tau0)
            weight = pulp.lpSum(self.W[i] * x[i, s] for i in V)
            if d > 1:  # A(S) (TimeTerms.allreduce): the cluster's all-reduce bandwidth and latency when given
                expr += (2 * (d - 1) / d / self.cluster.collective_bandwidth(bw_self) / B / tau0) * weight
                expr += 2 * (d - 1) * self.cluster.allreduce_latency / B / tau0
            if self.graph.optimizer_time_per_byte:  # O(S)
                expr += (self.graph.optimizer_time_per_byte / B / tau0) * weight
            if self.graph.step_time_per_sample:  # the step's own work, B * per sample, on every stage
                expr += self.graph.step_time_per_sample / tau0
            if self.graph.step_time_fixed:  # and its fixed part, per step
                expr += self.graph.step_time_fixed / B / tau0
            if self.graph.grad_accumulation_time_per_byte:  # O(S): the micro-batches after the first
                expr += (self.graph.grad_accumulation_time_per_byte * (B / b - 1) / B / tau0) * weight
            # every coefficient is >= 0; the constant (all-reduce latency) is relaxed with the rest
            big = sum(coef * var.upBound for var, coef in expr.items()) + expr.constant
            prob += tau >= expr - big * (1 - active), f"tps_{s}_{kidx}"
        prob += tau
