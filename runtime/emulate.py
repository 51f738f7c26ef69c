"""Emulated devices: a model built from a ``gpp-graph/1`` whose operators *sleep* their profiled time.

    GPP_EMULATE_GRAPH=graph.json GPP_EMULATE_CLUSTER=cluster.json torchrun --standalone \\
        --nproc-per-node 8 -m gpp_runtime.train --plan plan.json --model gpp_runtime.emulate:workload \\
        --steps 5 --cpu --threads 1

**What is emulated and what is real.** Compute and collectives are emulated: every operator
sleeps its profiled time, and (with ``GPP_EMULATE_CLUSTER``) the data-parallel gradient
all-reduce takes the cost model's time ``A(S)`` on that cluster. Point-to-point transfers
between stages (real tensors over gloo) and the schedule (the runtime's own action order,
posting and waits) are real. So a measured iteration checks the runtime's schedule and its
transfers against the simulator, not the machine's arithmetic or its memory bandwidth.

:func:`build_model` returns an ``nn.Module`` that ``torch.fx`` traces into exactly the graph's
nodes (one ``call_module`` per node, named by the node id, so a plan made from the graph addresses
it) and edges. On forward, node ``v`` called with ``x`` rows sleeps ``f_v(x)``; on backward it
sleeps ``g_v(x)`` (a custom ``autograd.Function``); ``x`` is the micro-batch (or the data-parallel
share of it) the runtime gives it, and the times are interpolated by the cost model's own
:func:`gpp_solver.cost.model.interp_time`. Sleeping instead of computing lets 8 ranks on 2 cores
realise a simulated schedule without competing for the cores, so a measured iteration checks the
*runtime's* schedule against the simulator, not the machine's arithmetic.

What is real and what is scaled (see :func:`realised_graph`, which returns the graph as emulated
so that predictions are made for exactly what runs):

- node outputs are real float32 tensors of ``output_bytes / 4`` values per sample, at most
  ``max_output_bytes`` (default 256 KiB) per sample; edges' ``bytes`` overrides are not realised
  (each transfer carries the producer's output, as the runtime does);
- every node owns one real float32 parameter of ``weight_bytes / 4`` values, at most
  ``max_weight_bytes`` (default 4 MiB), at least one value (a weight-free node gets one float so
  that it has a backward to run); gradients are never produced, so SGD leaves them unchanged;
- the data-parallel gradient all-reduce: with a cluster (``GPP_EMULATE_CLUSTER``, or
  ``make_workload(..., cluster=)``) the workload carries ``emulate_allreduce``, which
  ``gpp_runtime.train`` hands to :class:`gpp_runtime.GraphPipeline`: each replica all-reduces one number
  (the latest replica's end of its last backward, so the replicas still synchronise over the
  real group) and then sleeps until ``A(S)`` (:func:`gpp_solver.cost.stage_costs` on the
  realised graph) has passed since then, as the simulator starts ``A(S)`` right after the
  stage's last backward. Without a cluster it is a real all-reduce of the capped weights'
  zero-filled gradients (8 ranks' memcpy on 2 cores then runs several times slower than the
  cost model's bandwidth, which is what emulation is meant to avoid);
- activation memory is not emulated (nothing is saved for backward beyond shapes);
- per-operator dispatch overhead is absorbed: operators sleep to a virtual deadline (the start
  of the action's operator sequence plus the cumulative profiled time, :class:`Sleeper`), not
  a fixed duration, so an action takes its profiled sum as long as the dispatch of each
  operator (fx, autograd: 50-130 us on a loaded CPU) is shorter than its profiled time; a gap
  of more than 1 ms between operators starts a new sequence (idle time is never credited).
  Dispatch between two actions that follow each other within 1 ms is absorbed too (the
  simulator charges none). Operators profiled shorter than their dispatch still run late.

The model returns one tensor, so :func:`build_model` refuses a graph with several sinks;
:func:`realised_graph` gives such a graph one more node, ``emulated_sink`` (zero time, no
weights), fed by every sink, so that it can be emulated and planned as emulated. Weight
gradients are not produced by the emulated backward (they stay ``None``); the real all-reduce
(no cluster given) zero-fills them first, inside the time it records for the all-reduce.
``workload()`` reads the graph path from ``GPP_EMULATE_GRAPH`` (and optional
``GPP_EMULATE_MAX_OUTPUT_BYTES`` / ``GPP_EMULATE_MAX_WEIGHT_BYTES``): the ``MODULE:FUNCTION`` that
``gpp_runtime.train`` takes.
"""

from __future__ import annotations

import copy
import os
import time
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from gpp_solver.cost.model import interp_time, node_weight_grad_time, stage_costs
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.cluster import as_cluster
from gpp_solver.formats.graph import as_graph, graph_to_dict
from gpp_solver.types import Graph, Node, Plan, Stage

from .engine.split_backward import phase

ENV_GRAPH = "GPP_EMULATE_GRAPH"
ENV_CLUSTER = "GPP_EMULATE_CLUSTER"
SINK_ID = "emulated_sink"
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024
DEFAULT_MAX_WEIGHT_BYTES = 4 * 2**20


class Sleeper:
    """Sleeps each operator to a virtual deadline: the start of its sequence of operators plus the
    profiled times of the sequence so far, so that the dispatch between operators (fx, autograd,
    the Python around them: 50-130 us per operator on a loaded CPU) is absorbed by the next sleep
    instead of adding to it, as long as it is shorter than the profiled time.

    A sequence is the operators one action runs back to back; it starts anew when more than
    ``reset_gap`` seconds passed since the previous operator returned (a wait for a message, idle
    time: never credited to the next operator). Oversleep at the end of a sequence (the scheduler's
    late wake-up) is taken off the next sequence (error feedback), so sleeps are exact on average.
    """

    def __init__(self, reset_gap: float = 1e-3) -> None:
        self.reset_gap = reset_gap
        self.deadline = 0.0  # when the sequence's operators so far should have ended
        self.last = -float("inf")  # when the previous operator returned
        self.debt = 0.0  # oversleep of the previous sequence's last operator
        self.requested = 0.0

    def sleep(self, seconds: float) -> None:
        self.requested += seconds
        now = time.perf_counter()
        if now - self.last > self.reset_gap:
            self.deadline = now - self.debt
        self.deadline += seconds
        want = self.deadline - now
        if want > 0:
            time.sleep(want)
        self.last = time.perf_counter()
        self.debt = max(0.0, self.last - self.deadline) if want > 0 else 0.0


SLEEPER = Sleeper()


class _Sleep(torch.autograd.Function):
    """Forward sleeps ``fw(rows)`` and returns zeros of the op's width; backward sleeps ``bw(rows)``."""

    @staticmethod
    def forward(ctx, op: EmulatedOp, weight: torch.Tensor, *xs: torch.Tensor) -> torch.Tensor:
        rows = xs[0].shape[0]
        SLEEPER.sleep(op.fw(rows))
        ctx.op, ctx.rows = op, rows
        ctx.in_meta = [(x.shape, x.dtype) for x in xs]
        # a zero-stride view of one zero: no allocation inside a stage; a send materialises it
        return torch.zeros((), dtype=torch.float32, device=weight.device).expand(rows, op.width)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # a split backward (plans with W actions): the input-gradient share in B, the weight share
        # in W; an op B did not reach (no input gradient needed through it) sleeps both in W
        part, bw = phase(), ctx.op.bw(ctx.rows)
        if part == "input":
            ctx.input_done = True
            SLEEPER.sleep(bw - ctx.op.wgt(ctx.rows))
        elif part == "weight":
            SLEEPER.sleep(ctx.op.wgt(ctx.rows) if getattr(ctx, "input_done", False) else bw)
        else:
            SLEEPER.sleep(bw)
        grads = [
            torch.zeros((), dtype=dtype, device=grad.device).expand(shape) if need else None
            for (shape, dtype), need in zip(ctx.in_meta, ctx.needs_input_grad[2:])
        ]
        return (None, None, *grads)


class EmulatedOp(nn.Module):
    """One graph node: sleeps its profiled times, outputs ``width`` floats per sample."""

    def __init__(
        self, node_id: str, fw_time, bw_time, sizes, width: int, weight_values: int, weight_grad: Node | None = None
    ) -> None:
        super().__init__()
        self.node_id = node_id
        self.fw_time, self.bw_time, self.sizes = tuple(fw_time), tuple(bw_time), tuple(sizes)
        self.weight_grad = weight_grad  # the node whose weight-gradient time W sleeps
        self.width = width
        self.weight = nn.Parameter(torch.zeros(weight_values))

    def fw(self, rows: int) -> float:
        return interp_time(self.fw_time, self.sizes, rows)

    def bw(self, rows: int) -> float:
        return interp_time(self.bw_time, self.sizes, rows)

    def wgt(self, rows: int) -> float:
        """The weight-gradient part of :meth:`bw` (the cost model's ``w_v``)."""
        return (
            0.0
            if self.weight_grad is None
            else min(self.bw(rows), node_weight_grad_time(self.weight_grad, self.sizes, rows))
        )

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return _Sleep.apply(self, self.weight, *xs)


# torch.fx's default tracer keeps modules of torch.nn as leaves (one call_module node each) and
# traces through all others; the emulated op must be one node, so it declares itself one of them.
EmulatedOp.__module__ = "torch.nn.modules.gpp_emulated"


class EmulatedModel(nn.Module):
    """The graph as a module: forward(x) runs every node in topological order, returns the sink."""

    def __init__(self, graph: Graph, max_output_bytes: float, max_weight_bytes: float) -> None:
        super().__init__()
        sinks = [v for v in graph.topo_order if not graph.succs(v)]
        if len(sinks) != 1:
            raise InvalidInputError(
                f"graph {graph.name!r} has {len(sinks)} sinks ({', '.join(sinks[:4])}); the emulated "
                "model returns one tensor and needs exactly one sink"
            )
        self.sink = sinks[0]
        self.order = list(graph.topo_order)
        self.preds = {v: list(graph.preds(v)) for v in self.order}
        self.ops: dict[str, EmulatedOp] = {}
        for n in graph.nodes:
            width = max(1, int(min(n.output_bytes, max_output_bytes) // 4))
            values = max(1, int(min(n.weight_bytes, max_weight_bytes) // 4))
            op = EmulatedOp(n.id, n.fw_time, n.bw_time, graph.micro_batch_sizes, width, values, n)
            self._place(n.id, op)
            self.ops[n.id] = op

    def _place(self, node_id: str, op: EmulatedOp) -> None:
        parts = node_id.split(".")
        if any(not p for p in parts):
            raise InvalidInputError(f"node id {node_id!r} cannot name a module (empty name part)")
        parent: nn.Module = self
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            child = parent._modules.get(p)
            if isinstance(parent, EmulatedOp) or (child is not None and (last or isinstance(child, EmulatedOp))):
                raise InvalidInputError(
                    f"node id {node_id!r} cannot name a module: another node's id is a prefix of it or equal to it"
                )
            if child is None:
                child = op if last else nn.Module()
                try:
                    parent.add_module(p, child)
                except (KeyError, TypeError) as exc:
                    raise InvalidInputError(f"node id {node_id!r} cannot name a module: {exc}") from None
            parent = child

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        env: dict[str, Any] = {}
        for v in self.order:
            ins = [env[u] for u in self.preds[v]] or [x]
            env[v] = self.ops[v](*ins)
        return env[self.sink]


def realised_graph(
    graph: Any, max_output_bytes: float = DEFAULT_MAX_OUTPUT_BYTES, max_weight_bytes: float = DEFAULT_MAX_WEIGHT_BYTES
) -> dict:
    """The graph as the emulated model realises it (gpp-graph/1 dict): bytes as actually sent; no
    ``op_overhead``, ``optimizer_time_per_byte`` or ``grad_accumulation_time_per_byte`` (an emulated
    operator sleeps its own times, to a deadline that absorbs the runtime's dispatch, and nothing
    emulates an optimizer step or the profiled weights' gradient sums)."""
    g = graph_to_dict(as_graph(graph))
    g = copy.deepcopy(g)
    g.pop("op_overhead", None)
    g.pop("optimizer_time_per_byte", None)
    g.pop("grad_accumulation_time_per_byte", None)
    for n in g["nodes"]:
        if n["weight_bytes"] <= 0 and "bw_weight_time" not in n:  # keep: no weight gradient to split off
            n["bw_weight_time"] = [0.0] * len(n["bw_time"])
        n["output_bytes"] = 4 * max(1, int(min(n["output_bytes"], max_output_bytes) // 4))
        n["weight_bytes"] = 4 * max(1, int(min(n["weight_bytes"], max_weight_bytes) // 4))
    for e in g["edges"]:
        e.pop("bytes", None)
    has_out = {e["src"] for e in g["edges"]}
    sinks = [n["id"] for n in g["nodes"] if n["id"] not in has_out]
    if len(sinks) > 1:
        if any(n["id"] == SINK_ID for n in g["nodes"]):
            raise InvalidInputError(f"graph has several sinks and already a node named {SINK_ID!r}")
        k = len(g["micro_batch_sizes"])
        g["nodes"].append(
            {
                "id": SINK_ID,
                "fw_time": [0.0] * k,
                "bw_time": [0.0] * k,
                "weight_bytes": 4.0,
                "activation_bytes": 0.0,
                "output_bytes": 4.0,
            }
        )
        g["edges"] += [{"src": v, "dst": SINK_ID} for v in sinks]
    return g


def build_model(
    graph: Any, max_output_bytes: float = DEFAULT_MAX_OUTPUT_BYTES, max_weight_bytes: float = DEFAULT_MAX_WEIGHT_BYTES
) -> EmulatedModel:
    """The emulated model of ``graph`` (a Graph, a gpp-graph/1 dict or a path)."""
    return EmulatedModel(as_graph(graph), max_output_bytes, max_weight_bytes)


def allreduce_emulator(graph: Any, cluster: Any):
    """``(plan, stage) -> seconds``: the cost model's ``A(S)`` of ``stage`` (the price
    :func:`gpp_solver.cost.stage_costs` gives it on ``cluster``) for ``graph`` as emulated."""
    g, c = as_graph(graph), as_cluster(cluster)

    def seconds(plan: Plan, stage: Stage) -> float:
        costs = stage_costs(g, c, plan.stages, plan.mini_batch_size)
        return costs[[s.id for s in plan.stages].index(stage.id)].allreduce

    return seconds


def make_workload(
    graph: Any,
    max_output_bytes: float = DEFAULT_MAX_OUTPUT_BYTES,
    max_weight_bytes: float = DEFAULT_MAX_WEIGHT_BYTES,
    cluster: Any = None,
) -> SimpleNamespace:
    """A ``gpp_runtime.train`` workload: the emulated model, one-column zero inputs, loss = sum of the
    output; with ``cluster`` also ``emulate_allreduce`` (:func:`allreduce_emulator`), which makes
    the data-parallel gradient all-reduce take the modelled time."""
    model = build_model(graph, max_output_bytes, max_weight_bytes)

    def sample(batch_size: int, step: int):
        return (torch.zeros(batch_size, 1),), torch.zeros(batch_size, 1)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.sum()

    wl = SimpleNamespace(model=model, sample=sample, loss=loss)
    if cluster is not None:
        wl.emulate_allreduce = allreduce_emulator(realised_graph(graph, max_output_bytes, max_weight_bytes), cluster)
    return wl


def workload() -> SimpleNamespace:
    """``gpp_runtime.emulate:workload``: the graph named by ``$GPP_EMULATE_GRAPH`` (the cluster of the
    emulated all-reduce by ``$GPP_EMULATE_CLUSTER`` when set)."""
    path = os.environ.get(ENV_GRAPH)
    if not path:
        raise InvalidInputError(f"gpp_runtime.emulate:workload needs the graph path in ${ENV_GRAPH}")
    try:
        out_cap = float(os.environ.get("GPP_EMULATE_MAX_OUTPUT_BYTES", DEFAULT_MAX_OUTPUT_BYTES))
        w_cap = float(os.environ.get("GPP_EMULATE_MAX_WEIGHT_BYTES", DEFAULT_MAX_WEIGHT_BYTES))
    except ValueError as exc:
        raise InvalidInputError(f"GPP_EMULATE_MAX_*_BYTES must be numbers: {exc}") from None
    return make_workload(path, out_cap, w_cap, os.environ.get(ENV_CLUSTER) or None)
