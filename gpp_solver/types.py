"""Frozen dataclasses for everything that crosses module boundaries.

The JSON contracts (``gpp-graph/1``, ``gpp-cluster/1``, ``gpp-plan/1``) are read into these types by
``graph.py``, ``cluster.py`` and ``plan_io.py``; every planner returns a :class:`Plan`.
Units: seconds, bytes, samples.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import networkx as nx

from gpp_solver.action import Action, as_order, order_text

GRAPH_FORMAT = "gpp-graph/1"
CLUSTER_FORMAT = "gpp-cluster/1"
PLAN_FORMAT = "gpp-plan/1"
#: bytes of weights + gradients + optimizer state per byte of weights when a cluster does not say
#: (fp32 Adam: weights, gradients, m, v)
DEFAULT_OPTIMIZER_STATE_FACTOR = 4.0


@dataclass(frozen=True)
class Tmpc:
    """One alternative configuration of a node (Piper's TMPC): tensor-parallel degree, recomputation."""

    t: int
    recompute: bool
    fw_time: tuple[float, ...]
    bw_time: tuple[float, ...]
    weight_bytes: float
    activation_bytes: float
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: the part of ``bw_time`` spent on weight gradients (``None``: the cost model's estimate)
    bw_weight_time: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Node:
    """An operator (or layer): profiled times per micro-batch size and its bytes."""

    id: str
    fw_time: tuple[float, ...]
    bw_time: tuple[float, ...]
    weight_bytes: float
    activation_bytes: float
    output_bytes: float
    tmpc: tuple[Tmpc, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: the part of ``bw_time`` spent on weight gradients, per micro-batch size (``None``: the cost
    #: model's estimate, ``docs/zero-bubble.md``)
    bw_weight_time: tuple[float, ...] | None = None
    #: bytes per sample the operator allocates for the moment of its call beyond what it keeps (its
    #: workspace; in its backward, with the gradients it produces): one figure for every size, or
    #: one per micro-batch size (``cost.memory.workspace_at`` reads either); ``None``: not measured
    workspace_bytes: float | tuple[float, ...] | None = None
    #: bytes, per micro-batch (not per sample), of the low-precision copies of the node's weights
    #: that autocast makes in its forward and autograd saves for its backward (0: none, as in
    #: float32 or a bf16 model)
    weight_copy_bytes: float = 0.0
    #: its backward hands its inputs' gradients as views of its output's gradient (a concatenation:
    #: ``torch.cat``'s backward narrows it), so that gradient's storage stays whole until the last of
    #: them is consumed (``docs/cost-model.md``, the memory rule's ``views_k``)
    grad_views: bool = False


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    bytes: float | None = None


@dataclass(frozen=True)
class Graph:
    """A validated operator DAG (build it with ``graph.graph_from_dict``)."""

    name: str
    micro_batch_sizes: tuple[int, ...]
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: seconds every node adds to each forward and each backward of a micro-batch (dispatch on CPU,
    #: kernel launch on GPU), on top of its interpolated times; ``(0, 0)`` when the graph has none
    op_overhead: tuple[float, float] = (0.0, 0.0)
    #: seconds of the optimizer step per weight byte (the optimizer profiled); 0 when absent
    optimizer_time_per_byte: float = 0.0
    #: seconds per sample of the mini-batch that every rank spends each step beside its stage's
    #: actions (``gpp_runtime.train`` samples the whole mini-batch on every rank); 0 when absent
    step_time_per_sample: float = 0.0
    #: seconds every rank spends each step beside its stage's actions whatever the mini-batch and
    #: the weights (the training loop, ``zero_grad``, the calls around the optimizer); 0 when absent
    step_time_fixed: float = 0.0
    #: seconds per weight byte that a replica's backward of a micro-batch adds when its weights'
    #: gradients already hold an earlier micro-batch's (every micro-batch of the step after the
    #: first is summed into ``.grad``); 0 when absent
    grad_accumulation_time_per_byte: float = 0.0
    #: what a split backward (an order with ``W`` actions) adds beside the nodes' times:
    #: ``(call, node, walk)`` seconds, per weight-gradient engine call, per node such a call walks,
    #: per node ``B`` walks to find the weight nodes (``docs/zero-bubble.md``); zeros when absent
    split_backward_overhead: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @cached_property
    def ids(self) -> tuple[str, ...]:
        return tuple(n.id for n in self.nodes)

    @cached_property
    def index(self) -> dict[str, int]:
        return {n.id: i for i, n in enumerate(self.nodes)}

    def node(self, node_id: str) -> Node:
        return self.nodes[self.index[node_id]]

    @cached_property
    def _adjacency(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        succ: dict[str, list[str]] = {i: [] for i in self.ids}
        pred: dict[str, list[str]] = {i: [] for i in self.ids}
        for e in self.edges:
            if e.dst not in succ[e.src]:
                succ[e.src].append(e.dst)
                pred[e.dst].append(e.src)
        return ({k: tuple(v) for k, v in succ.items()}, {k: tuple(v) for k, v in pred.items()})

    def succs(self, node_id: str) -> tuple[str, ...]:
        return self._adjacency[0][node_id]

    def preds(self, node_id: str) -> tuple[str, ...]:
        return self._adjacency[1][node_id]

    @cached_property
    def edge_bytes_map(self) -> dict[tuple[str, str], float]:
        """Bytes per sample carried by each edge (its own ``bytes`` or the producer's output)."""
        out: dict[tuple[str, str], float] = {}
        for e in self.edges:
            b = e.bytes if e.bytes is not None else self.node(e.src).output_bytes
            key = (e.src, e.dst)
            out[key] = max(out.get(key, 0.0), b)
        return out

    def edge_bytes(self, src: str, dst: str) -> float:
        return self.edge_bytes_map[(src, dst)]

    @cached_property
    def topo_index(self) -> dict[str, int]:
        """Each node's position in :attr:`topo_order`."""
        return {v: i for i, v in enumerate(self.topo_order)}

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """A deterministic topological order (ties broken by file order)."""
        g = self.to_networkx()
        return tuple(nx.lexicographical_topological_sort(g, key=lambda n: self.index[n]))

    def to_networkx(self) -> nx.DiGraph:
        g = nx.DiGraph(name=self.name)
        for n in self.nodes:
            g.add_node(
                n.id,
                fw_time=n.fw_time,
                bw_time=n.bw_time,
                weight_bytes=n.weight_bytes,
                activation_bytes=n.activation_bytes,
                output_bytes=n.output_bytes,
            )
        for e in self.edges:
            if e.bytes is None:
                g.add_edge(e.src, e.dst)
            else:
                g.add_edge(e.src, e.dst, bytes=e.bytes)
        return g


@dataclass(frozen=True)
class Cluster:
    """Devices, memory per device and the affine network model (``latency + bytes / bandwidth``)."""

    devices: int
    memory_bytes: float
    inter_node_bandwidth: float
    intra_node_bandwidth: float | None = None
    devices_per_node: int | None = None
    latency: float = 0.0
    optimizer_state_factor: float = DEFAULT_OPTIMIZER_STATE_FACTOR
    #: the ring all-reduce's measured bandwidth and per-step latency (``gpp_runtime.probe``); absent: the
    #: point-to-point bandwidth of the group (``bandwidth``) and no latency
    allreduce_bandwidth: float | None = None
    allreduce_latency: float = 0.0
    #: price the runtime's memory beyond weights, state and saved activations (cost model:
    #: received buffers, the data-parallel all-reduce's gradient buckets, the step's temporaries);
    #: None (not stated): on for a graph the runtime profiled, off for another
    #: (``cost.memory.overheads_priced``)
    memory_overheads: bool | None = None
    #: bytes each device's runtime holds beside any stage's (the libraries' workspaces: cuBLAS's,
    #: per thread that multiplies, on CUDA; ``gpp_runtime.probe``); priced with ``memory_overheads``
    runtime_memory_bytes: float = 0.0

    def node_of(self, device: int) -> int:
        return 0 if self.devices_per_node is None else device // self.devices_per_node

    def same_node(self, devices: Iterable[int]) -> bool:
        """True when every device sits in one node (never true on a flat network)."""
        dpn = self.devices_per_node
        if dpn is None:
            return False
        if not isinstance(devices, (range, list, tuple)):
            devices = list(devices)
        if len(devices) <= 1:
            return True
        if isinstance(devices, range):  # node_of is monotonic: the two ends decide, O(1)
            return devices[0] // dpn == devices[-1] // dpn
        return min(devices) // dpn == max(devices) // dpn

    def bandwidth(self, devices: Iterable[int]) -> float:
        """Intra-node bandwidth when all ``devices`` share a node, else the inter-node one."""
        if self.same_node(devices) and self.intra_node_bandwidth is not None:
            return self.intra_node_bandwidth
        return self.inter_node_bandwidth

    def collective_bandwidth(self, bandwidth: float) -> float:
        """The bandwidth an all-reduce is priced at: the measured ``allreduce_bandwidth`` when the
        cluster has one, else ``bandwidth`` (the point-to-point figure the caller chose)."""
        return bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth

    def with_(self, **changes: Any) -> Cluster:
        from dataclasses import replace

        return replace(self, **changes)


@dataclass(frozen=True)
class Schedule:
    """A stage's micro-batch order: :class:`~gpp_solver.action.Action` records (``F j`` / ``B j``)
    in the order it runs them; pairs such as ``("F", 0)`` are converted."""

    kind: str
    k: int
    order: tuple[Action, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", as_order(self.order))

    def text(self) -> str:
        """Compact form, e.g. ``F0 F1 B0 F2 B1 B2`` (:func:`gpp_solver.action.parse_order` reads it)."""
        return order_text(self.order)


@dataclass(frozen=True)
class StagePrediction:
    time_per_sample: float
    memory_bytes: float


@dataclass(frozen=True)
class Stage:
    id: int
    nodes: tuple[str, ...]
    devices: tuple[int, ...]
    micro_batch_size: int
    schedule: Schedule
    in_flight_samples: int
    predicted: StagePrediction
    tensor_parallel: int = 1
    tmpc: Mapping[str, int] | None = field(default=None, compare=False, hash=False)
    #: activation recomputation: each micro-batch's forward keeps only the stage's received values,
    #: and its backward runs the forward again first (``docs/cost-model.md``, *Recomputation*)
    recompute: bool = False
    #: ZeRO stage of the replicas: 0 (each holds everything) or 1 (the optimizer state is sharded
    #: over the ``data_parallel`` replicas; ``docs/cost-model.md``, *Sharded optimizer state*)
    zero: int = 0

    @property
    def data_parallel(self) -> int:
        return len(self.devices) // self.tensor_parallel


@dataclass(frozen=True)
class PlanPrediction:
    time_per_sample: float
    iteration_time: float
    throughput: float
    peak_memory_bytes: float


class Status(StrEnum):
    """What a plan's search proved (``search.status``); each value is the plan JSON's string.

    An ``optimal-*`` status names the objective it was proven for: a plan optimal for the bottleneck
    time-per-sample (TPS) may have a far longer iteration time than the best plan (docs/planners.md, "Plan
    statuses").
    """

    #: least bottleneck TPS of the cost model proven over ``milp``'s space (convex stages, any acyclic
    #: stage graph, one micro-batch size, 1F1B); says nothing about the iteration time
    OPTIMAL_TIME_PER_SAMPLE = "optimal-time-per-sample"
    #: least simulated iteration time proven over ``exact``'s space (convex stages, one micro-batch size, 1F1B)
    OPTIMAL_ITERATION_TIME = "optimal-iteration-time"
    #: the best plan of the planner's own restricted space for the objective named in ``search.objective``
    OPTIMAL_WITHIN_SEARCH_SPACE = "optimal-within-search-space"
    #: within ``search.epsilon`` (relative) of the optimum of ``search.objective`` (read; no
    #: built-in planner reports it)
    OPTIMAL_WITHIN_EPSILON = "optimal-within-epsilon"
    FEASIBLE = "feasible"  # a valid plan, nothing proven about its quality
    TIME_LIMIT = "time-limit"  # the time limit stopped the search; the best plan found so far
    INFEASIBLE = "infeasible"  # no plan fits (comparison rows; a planner raises InfeasibleError)
    SEARCH_SPACE_TOO_LARGE = "search-space-too-large"  # comparison rows: the planner refused the instance
    UNKNOWN = "unknown"  # a plan file whose ``search`` has no status
    #: written before statuses named their objective (read only; it meant ``optimal-time-per-sample``)
    OPTIMAL = "optimal"


#: keys of a plan's ``search`` object that are typed fields of :class:`SearchInfo` (the rest is ``extra``)
SEARCH_FIELDS = ("objective", "iteration_time_estimate", "micro_batch_size", "cp_tighten")


@dataclass(frozen=True)
class SearchInfo:
    """How the plan was found: the plan JSON's ``search`` object.

    ``status`` is a :class:`Status` (a plain string is converted; an unknown one raises
    ``ValueError``).  The keys several planners or readers share are typed fields
    (:data:`SEARCH_FIELDS`); planner-specific records stay in ``extra``.  In JSON all of them are
    keys of ``search`` as before.  A typed field's key given in ``extra`` moves into the field (so
    ``replace(search, extra={**search.extra, "cp_tighten": info})`` sets ``cp_tighten``); ``extra``
    never holds one.
    """

    seconds: float
    status: Status
    epsilon: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    #: what the search optimised, in words (every ``optimal-within-search-space`` plan says it)
    objective: str | None = None
    #: the cost model's critical-path estimate of the iteration time (``plan.build.build_plan`` sets it)
    iteration_time_estimate: float | None = None
    #: the one micro-batch size the search chose for every stage (``None``: stages differ, or not said)
    micro_batch_size: int | None = None
    #: what CP-SAT's tightening of the orders did (``cp_schedule.tighten_plan_if_fits``), when it ran
    cp_tighten: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)

    def __post_init__(self) -> None:
        if type(self.status) is not Status:
            object.__setattr__(self, "status", Status(self.status))
        if any(k in self.extra for k in SEARCH_FIELDS):
            for k in SEARCH_FIELDS:
                if k in self.extra:
                    object.__setattr__(self, k, self.extra[k])
            object.__setattr__(self, "extra", {k: v for k, v in self.extra.items() if k not in SEARCH_FIELDS})


@dataclass(frozen=True)
class Plan:
    planner: str
    graph: str
    mini_batch_size: int
    stages: tuple[Stage, ...]
    edges: tuple[tuple[int, int], ...]
    predicted: PlanPrediction
    search: SearchInfo
    #: the cluster's ``optimizer_state_factor`` the plan's memory figures were computed with; None
    #: when the document does not record it (the cluster the plan runs on then supplies it)
    optimizer_state_factor: float | None = None

    def stage(self, stage_id: int) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    @property
    def devices_used(self) -> int:
        return sum(len(s.devices) for s in self.stages)

    @property
    def depth(self) -> int:
        """Number of stages on the longest path of the stage graph."""
        g = nx.DiGraph()
        g.add_nodes_from(s.id for s in self.stages)
        g.add_edges_from(self.edges)
        return nx.dag_longest_path_length(g) + 1 if g.number_of_nodes() else 0


@dataclass(frozen=True)
class SolveOptions:
    """Options of :func:`gpp_solver.solve` as one value (keyword arguments override its fields)."""

    mini_batch_size: int | None = None
    planner: str | None = None
    time_limit: float | None = None
    tighten: bool | None = None
    progress: bool = False
    planner_options: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
