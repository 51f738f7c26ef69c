"""The cost model of ``docs/cost-model.md`` — and nothing else.

Every planner, the validator and the simulator take their figures from here, so that plans of
different planners are compared on one footing.

Notation (per stage ``S``): node set ``V_S``, micro-batch size ``b``, data-parallel degree ``d``
(``len(devices) / tensor_parallel``), mini-batch size ``B``, ``n = B / b`` micro-batches.

* compute per micro-batch on each replica: ``C(S) = sum_v f_v(b/d) + g_v(b/d)``;
* a *transfer* is one (producer node ``u``, consumer stage) pair across a stage boundary carrying
  ``max bytes(u, v)`` per sample; each stage taking part pays ``latency + bytes*(b/d)/bandwidth`` in
  the forward pass and again in the backward pass (``b``, ``d`` of the paying stage; the intra-node
  bandwidth when both stages' devices sit in one node, else the inter-node one);
* ring all-reduce once per iteration: ``A(S) = 2 (d-1) allreduce_latency + 2 (d-1)/d * W_S / bandwidth``
  (the cluster's ``allreduce_bandwidth`` when it has one, else the point-to-point bandwidth); a
  stage whose replicas shard the optimizer state (``zero`` 1) adds the all-gather of the updated
  weights, ``(d-1) allreduce_latency + (d-1)/d * W_S / bandwidth``, and its optimizer step's
  per-byte term is paid on ``W_S / d``;
* the optimizer step after it: ``O(S) = optimizer_time_per_byte * W_S + step_time_fixed +
  step_time_per_sample * B + grad_accumulation_time_per_byte * W_S * (n - 1)`` (the graph's terms,
  each 0 when absent: the step's own work, and the gradient accumulation of the micro-batches
  after the first);
* a graph's ``op_overhead`` adds ``|V_S| * op_overhead.fw`` to ``C(S)``'s forward and
  ``|V_S| * op_overhead.bw`` to its backward (:class:`TimeTerms` holds the three terms);
* ``TPS(S) = (C(S) + comm(S)) / b + (A(S) + O(S)) / B``; the plan's TPS is the max over stages;
* memory per device: ``M(S) = optimizer_state_factor * W_S + in_flight(S)/d * sum_v activation_bytes_v``
  (:func:`memory_per_device`; a stage's figure, with the runtime's overheads, is :mod:`gpp_solver.cost.memory`'s);
* iteration-time estimate: ``L + max_S (n_S - 1)(C(S) + comm(S)) + max_S (A(S) + O(S))``, ``L`` the longest
  path of per-micro-batch ``C + comm`` through the stage graph (with one micro-batch size this is
  the page's ``L + (n-1) max_S (C+comm) + max_S A``).

With TMPCs (Piper), ``stage.tmpc[node] = i`` replaces the node's times, weights and activation
bytes by those of its ``i``-th TMPC; the stage's tensor-parallel degree divides its devices.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import networkx as nx

from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.types import Cluster, Graph, Node

T = TypeVar("T")


def interpolate(at: Callable[[int], T], sizes: Sequence[float], x: float) -> T:
    """The graph format's one interpolation rule, for one node (``at(i)`` a float) or many at once
    (``at(i)`` a numpy column): the time for ``x`` samples from the times ``at(i)`` measured at
    ``sizes[i]``.

    Linear between measured sizes; above the largest, linear in samples (constant time per sample);
    below the smallest, the smallest's time.
    """
    if x <= sizes[0]:
        return at(0)
    if x >= sizes[-1]:
        return at(len(sizes) - 1) * x / sizes[-1]
    i = bisect.bisect_right(sizes, x)
    x0, x1 = sizes[i - 1], sizes[i]
    t0, t1 = at(i - 1), at(i)
    return t0 + (t1 - t0) * (x - x0) / (x1 - x0)


def interp_time(times: Sequence[float], sizes: Sequence[int], x: float) -> float:
    """Time for ``x`` samples from times measured at ``sizes`` (:func:`interpolate`)."""
    return float(interpolate(lambda i: float(times[i]), sizes, x))


def node_compute(
    fw_time: Sequence[float], bw_time: Sequence[float], sizes: Sequence[int], x: float, overhead: float = 0.0
) -> float:
    """``f_v(x) + g_v(x)``: one node's forward plus backward time at ``x`` samples, plus ``overhead``
    (:attr:`TimeTerms.node_overhead`: the graph's per-node dispatch of a forward and a backward)."""
    t = interp_time(fw_time, sizes, x) + interp_time(bw_time, sizes, x)
    return t + overhead if overhead else t


@dataclass(frozen=True)
class NodeConfig:
    """The figures of one node in one configuration (its own, or one of its TMPCs)."""

    fw_time: tuple[float, ...]
    bw_time: tuple[float, ...]
    weight_bytes: float
    activation_bytes: float
    bw_weight_time: tuple[float, ...] | None = None


def node_config(node: Node, tmpc_index: int | None = None) -> NodeConfig:
    if tmpc_index is None:
        return NodeConfig(node.fw_time, node.bw_time, node.weight_bytes, node.activation_bytes, node.bw_weight_time)
    t = node.tmpc[tmpc_index]
    return NodeConfig(t.fw_time, t.bw_time, t.weight_bytes, t.activation_bytes, t.bw_weight_time)


#: without a measured ``bw_weight_time``, this share of a node's ``bw_time`` is its weight gradient
#: when it has weights (a matrix product's backward is two products of one size: ``dX = dY W^T`` and
#: ``dW = X^T dY``), and none when it has no weights
WEIGHT_GRAD_SHARE = 0.5


def node_weight_grad_time(c: NodeConfig | Node, sizes: Sequence[int], x: float) -> float:
    """``w_v(x)``: the part of ``g_v(x)`` spent on weight gradients — ``bw_weight_time`` interpolated
    like ``bw_time`` when given, else :data:`WEIGHT_GRAD_SHARE` of ``g_v(x)`` for a node with weights."""
    if c.bw_weight_time is not None:
        return interp_time(c.bw_weight_time, sizes, x)
    if c.weight_bytes <= 0:
        return 0.0
    return WEIGHT_GRAD_SHARE * interp_time(c.bw_time, sizes, x)


class StageLike(Protocol):
    nodes: Sequence[str]
    devices: Sequence[int]
    micro_batch_size: int
    tensor_parallel: int
    tmpc: Mapping[str, int] | None


def data_parallel(stage: StageLike) -> int:
    return max(1, len(stage.devices) // max(1, stage.tensor_parallel))


def optimizer_shards(stage: StageLike) -> int:
    """The parts a stage's optimizer state is cut into: its ``d`` replicas when its ``zero`` is 1
    (each replica holds and steps one part), else 1 (the planners' own stage records have no
    ``zero``)."""
    return data_parallel(stage) if getattr(stage, "zero", 0) else 1


def recomputes(stage: StageLike) -> bool:
    """Whether ``stage`` recomputes its activations (a plan stage's ``recompute``; the planners'
    own stage records have none and recompute nothing)."""
    return bool(getattr(stage, "recompute", False))


def stage_configs(graph: Graph, stage: StageLike) -> list[NodeConfig | Node]:
    """Each node's figures (``fw_time``, ``bw_time``, ``weight_bytes``, ``activation_bytes``): the
    node itself when it runs in its own configuration (no copy), else its TMPC's."""
    tm = stage.tmpc
    if not tm:
        return [graph.node(v) for v in stage.nodes]
    return [node_config(graph.node(v), tm.get(v)) for v in stage.nodes]


def stage_compute_parts(graph: Graph, stage: StageLike) -> tuple[float, float]:
    """(forward, backward) compute time of one micro-batch on one replica (with ``op_overhead``);
    a stage that recomputes runs its forward again in each backward, so that counts in both."""
    x = stage.micro_batch_size / data_parallel(stage)
    sizes = graph.micro_batch_sizes
    fw = bw = 0.0
    for c in stage_configs(graph, stage):
        fw += interp_time(c.fw_time, sizes, x)
        bw += interp_time(c.bw_time, sizes, x)
    ofw, obw = graph.op_overhead
    if ofw or obw:
        n = len(stage.nodes)
        fw, bw = fw + n * ofw, bw + n * obw
    return fw, bw + fw if recomputes(stage) else bw


def stage_weight_grad_time(graph: Graph, stage: StageLike) -> float:
    """``W(S) = sum_v w_v(b/d)``: the weight-gradient part of one micro-batch's backward on one replica."""
    x = stage.micro_batch_size / data_parallel(stage)
    return sum(node_weight_grad_time(c, graph.micro_batch_sizes, x) for c in stage_configs(graph, stage))


def split_region(graph: Graph, nodes: Sequence[str]) -> set[str]:
    """The nodes a split backward's ``B`` runs through: those of ``nodes`` downstream (within the
    stage, inclusive) of a node with a predecessor outside it (``docs/zero-bubble.md``)."""
    mine = set(nodes)
    todo = [v for v in nodes if any(u not in mine for u in graph.preds(v))]
    seen = set(todo)
    while todo:
        for v in graph.succs(todo.pop()):
            if v in mine and v not in seen:
                seen.add(v)
                todo.append(v)
    return seen


def split_overhead(graph: Graph, stage: StageLike) -> tuple[float, float]:
    """``(ovh_B(S), ovh_W(S))``: what a split backward adds to one micro-batch's ``B`` and ``W``
    beside the nodes' times (the graph's ``split_backward_overhead``, ``docs/zero-bubble.md``):
    ``B`` walks the stage's ``N_S`` nodes to find its weight nodes, and ``W`` makes one engine call
    per weighted node of the region ``R`` (and one for the weighted nodes outside it), each walking
    the nodes below it in the stage.  ``(0, 0)`` without the term."""
    call, per_node, walk = graph.split_backward_overhead
    if not (call or per_node or walk):
        return 0.0, 0.0
    nodes = stage.nodes
    region = split_region(graph, nodes)
    weighted = [v for v, c in zip(nodes, stage_configs(graph, stage)) if c.weight_bytes > 0]
    if not weighted:
        return 0.0, 0.0
    if not region:
        return 0.0, call + per_node * len(nodes)
    mine = set(nodes)
    below: dict[str, int] = {}  # bit set of each node's ancestors within the stage, itself included
    for i, v in enumerate(sorted(nodes, key=graph.topo_index.__getitem__)):
        bits = 1 << i
        for u in graph.preds(v):
            if u in mine:
                bits |= below[u]
        below[v] = bits
    w = 0.0
    if any(v not in region for v in weighted):
        w += call + per_node * (len(nodes) - len(region))
    for v in weighted:
        if v in region:
            w += call + per_node * below[v].bit_count()
    return walk * len(nodes), w


def stage_compute(graph: Graph, nodes: Iterable[str], b: int, d: int) -> float:
    """``C(S)`` for a stage of ``nodes`` with micro-batch ``b`` over ``d`` replicas (no TMPC)."""
    sizes = graph.micro_batch_sizes
    x = b / d
    oh = TimeTerms.of(graph).node_overhead
    return sum(node_compute(n.fw_time, n.bw_time, sizes, x, oh) for n in (graph.node(v) for v in nodes))


def stage_weight_bytes(graph: Graph, stage: StageLike) -> float:
    return sum(c.weight_bytes for c in stage_configs(graph, stage))


def stage_activation_bytes(graph: Graph, stage: StageLike) -> float:
    return sum(c.activation_bytes for c in stage_configs(graph, stage))


def stage_weight_copy_bytes(graph: Graph, stage: StageLike) -> float:
    """``copies_S``: bytes per micro-batch of the low-precision weight copies autocast makes in the
    stage's forward and saves for its backward (the nodes' ``weight_copy_bytes``)."""
    return sum(graph.node(v).weight_copy_bytes for v in stage.nodes)


# The pricing core: every pricer (this module's stage_costs and the planners' vectorised fast
# pricers) computes its figures with these formulas; each takes floats or numpy arrays.


def comm_time(bytes_per_sample, samples, bandwidth, latency, messages=1):
    """``messages`` messages of the affine model carrying ``bytes_per_sample * samples`` bytes in all:
    ``messages * latency + bytes / bandwidth`` (one message: ``latency + bytes / bandwidth``)."""
    return messages * latency + bytes_per_sample * samples / bandwidth


def time_per_sample(per_micro_batch, b, allreduce, mini_batch_size):
    """``TPS(S) = (C(S) + comm(S)) / b + A(S) / B`` from ``C + comm`` per micro-batch and ``A``."""
    return per_micro_batch / b + allreduce / mini_batch_size


def memory_per_device(optimizer_state_factor, weight_bytes, in_flight_samples, d, activation_bytes):
    """``M(S) = osf * W + in_flight / d * act``: a full replica's weights and optimizer state, the
    in-flight samples' activations split over ``d`` replicas."""
    return optimizer_state_factor * weight_bytes + in_flight_samples / d * activation_bytes


def stage_transfers(graph: Graph, stage_of: Mapping[str, int]) -> dict[int, list[tuple[int, float]]]:
    """For each stage, the transfers it takes part in as ``(peer stage, bytes per sample)``.

    A transfer is one (producer node, consumer stage) pair across a boundary; several edges from
    the producer into the same consumer stage are one transfer of the largest bytes.
    """
    pairs: dict[tuple[str, int], float] = {}
    for (u, v), nbytes in graph.edge_bytes_map.items():
        su, sv = stage_of[u], stage_of[v]
        if su != sv:
            key = (u, sv)
            pairs[key] = max(pairs.get(key, 0.0), nbytes)
    out: dict[int, list[tuple[int, float]]] = {}
    for (u, sv), nbytes in sorted(pairs.items(), key=lambda kv: (graph.index[kv[0][0]], kv[0][1])):
        su = stage_of[u]
        out.setdefault(su, []).append((sv, nbytes))
        out.setdefault(sv, []).append((su, nbytes))
    return out


@dataclass(frozen=True)
class StageCost:
    """Every cost-model figure of one stage."""

    compute_fw: float  # sum f_v(b/d)
    compute_bw: float  # sum g_v(b/d)
    comm_fw: float  # forward halves of the stage's transfers
    comm_bw: float  # backward halves
    allreduce: float  # A(S)
    time_per_sample: float  # TPS(S)
    micro_batch_size: int
    data_parallel: int
    compute_bw_weight: float = 0.0  # W(S): the part of compute_bw spent on weight gradients
    optimizer: float = 0.0  # O(S), after the all-reduce
    accumulation: float = 0.0  # the part of O(S) that sums each later micro-batch's weight gradients
    split_input: float = 0.0  # ovh_B(S): what a split backward adds to each B
    split_weight: float = 0.0  # ovh_W(S): what a split backward adds to each W

    @property
    def tail(self) -> float:
        """``A(S) + O(S)``: what the stage runs after its last backward."""
        return self.allreduce + self.optimizer

    @property
    def compute(self) -> float:
        return self.compute_fw + self.compute_bw

    @property
    def comm(self) -> float:
        return self.comm_fw + self.comm_bw

    @property
    def forward(self) -> float:
        """Duration of one ``F(S, j)`` in the simulator."""
        return self.compute_fw + self.comm_fw

    @property
    def backward(self) -> float:
        """Duration of one ``B(S, j)`` in the simulator."""
        return self.compute_bw + self.comm_bw

    @property
    def backward_input(self) -> float:
        """Duration of one ``B(S, j)`` in an order with ``W`` actions: the input gradient, the
        backward halves of the transfers and the split's own ``ovh_B(S)``."""
        return self.backward - self.compute_bw_weight + self.split_input

    @property
    def backward_weight(self) -> float:
        """Duration of one ``W(S, j)``: the weight gradient and the split's own ``ovh_W(S)``."""
        return self.compute_bw_weight + self.split_weight

    @property
    def per_micro_batch(self) -> float:
        return self.compute + self.comm


def stage_costs(graph: Graph, cluster: Cluster, stages: Sequence[StageLike], mini_batch_size: int) -> list[StageCost]:
    """The cost of every stage of a partition (``stages[i]`` is stage ``i`` of the result)."""
    stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
    transfers = stage_transfers(graph, stage_of)
    terms = TimeTerms.of(graph, cluster, mini_batch_size)
    out = []
    for i, s in enumerate(stages):
        b, d = s.micro_batch_size, data_parallel(s)
        cf, cb = stage_compute_parts(graph, s)
        comm_half = 0.0
        for peer, nbytes in transfers.get(i, []):
            bw = cluster.bandwidth(list(s.devices) + list(stages[peer].devices))
            comm_half += comm_time(nbytes, b / d, bw, cluster.latency)
        w = stage_weight_bytes(graph, s)
        shards = optimizer_shards(s)
        a = terms.allreduce(w, d, cluster.bandwidth(s.devices))
        if shards > 1:  # each replica steps its part, then the parts are gathered
            a += terms.allgather(w, d, cluster.bandwidth(s.devices))
        o = terms.optimizer(w, b, shards)
        tps = time_per_sample(cf + cb + 2 * comm_half, b, a + o if o else a, mini_batch_size)
        split_in, split_w = split_overhead(graph, s)
        out.append(
            StageCost(
                cf,
                cb,
                comm_half,
                comm_half,
                a,
                tps,
                b,
                d,
                compute_bw_weight=min(cb, stage_weight_grad_time(graph, s)),
                optimizer=o,
                accumulation=terms.accumulation(w, b),
                split_input=split_in,
                split_weight=split_w,
            )
        )
    return out


def order_time_per_sample(cost: StageCost, order: Iterable[tuple[str, int]]) -> float:
    """``TPS(S)`` under ``order``: in an order with ``W`` actions each micro-batch also runs the
    split's own ``ovh_B(S) + ovh_W(S)`` (``docs/zero-bubble.md``)."""
    extra = cost.split_input + cost.split_weight
    if extra and any(a[0] == "W" for a in order):
        return cost.time_per_sample + extra / cost.micro_batch_size
    return cost.time_per_sample


def in_flight_from_order(order: Iterable[tuple[str, int]], b: int) -> int:
    """Peak samples a stage holds under ``order``: max of (forwards done - backwards done) * b; in an
    order with ``W`` actions a micro-batch's activations stay until its ``W`` (forwards done - weight
    gradients done)."""
    kinds = [a[0] for a in order]  # one pass in C, then plain comparisons (orders run to 10^5 actions)
    release = "W" if "W" in kinds else "B"
    live = peak = 0
    for kind in kinds:
        if kind == "F":
            live += 1
            if live > peak:
                peak = live
        elif kind == release:
            live -= 1
    return peak * b


def pending_weight_samples(order: Iterable[tuple[str, int]], b: int) -> int:
    """Peak samples whose weight gradient is pending under ``order``: max of (input gradients done
    - weight gradients done) * b; 0 in an order without ``W`` (its backward is whole)."""
    kinds = [a[0] for a in order]
    if "W" not in kinds:
        return 0
    live = peak = 0
    for kind in kinds:
        if kind == "B":
            live += 1
        elif kind == "W":
            if live > peak:
                peak = live
            live -= 1
    return peak * b


def iteration_time_estimate(
    costs: Sequence[StageCost], edges: Iterable[tuple[int, int]], mini_batch_size: int
) -> float:
    """``L + max_S (n_S - 1)(C+comm) + max_S (A + O)`` (Alpa's ``sum + (B-1) max`` on a DAG)."""
    g = nx.DiGraph()
    g.add_nodes_from(range(len(costs)))
    g.add_edges_from(edges)
    longest = {}
    for s in nx.topological_sort(g):
        longest[s] = costs[s].per_micro_batch + max((longest[p] for p in g.predecessors(s)), default=0.0)
    L = max(longest.values())
    steady = max((mini_batch_size // c.micro_batch_size - 1) * c.per_micro_batch for c in costs)
    return L + steady + max(c.tail for c in costs)
