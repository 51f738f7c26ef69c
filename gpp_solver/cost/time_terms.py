"""The calibrated terms of the time model beside the profiled node times (``docs/time-terms.md``):
each node's ``op_overhead``, the optimizer step per weight byte, the step's own work per sample of
the mini-batch, the gradient accumulation of every micro-batch after a step's first, and the ring
all-reduce at its own bandwidth and per-step latency;
:func:`allreduce_time` is the all-reduce's formula, :func:`allgather_time` the all-gather's (a stage
whose replicas shard the optimizer state)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpp_solver.types import Cluster, Graph


def allreduce_time(weight_bytes, d, bandwidth, latency=0.0):
    """Ring all-reduce of ``weight_bytes`` among ``d`` replicas (element-wise when ``d`` is an array):
    ``2 (d-1)`` steps (reduce-scatter, all-gather) of ``latency`` each, ``2 (d-1)/d * W`` bytes sent
    by each replica at ``bandwidth``."""
    if isinstance(d, (int, float)) or np.ndim(d) == 0:  # the scalar form first: pricers call it per stage
        if d <= 1:
            return 0.0
        t = 2.0 * (d - 1) / d * weight_bytes / bandwidth
        return t + 2.0 * (d - 1) * latency if latency else t
    t = 2.0 * (d - 1) / d * weight_bytes / bandwidth
    if np.any(latency):
        t = t + 2.0 * (d - 1) * latency
    return np.where(d > 1, t, 0.0)


def allgather_time(weight_bytes, d, bandwidth, latency=0.0):
    """Ring all-gather of ``weight_bytes`` from ``d`` parts of ``weight_bytes / d``: ``d - 1`` steps
    of ``latency`` each, ``(d-1)/d * W`` bytes received by each replica at ``bandwidth``."""
    if d <= 1:
        return 0.0
    t = (d - 1) / d * weight_bytes / bandwidth
    return t + (d - 1) * latency if latency else t


@dataclass(frozen=True)
class TimeTerms:
    """The calibrated terms of the time model beside the profiled node times: each node's
    ``op_overhead`` per forward and per backward, the optimizer step per weight byte (graph), and
    the all-reduce's own bandwidth and per-step latency (cluster). Every pricer takes them from
    here; absent fields give zeros and the point-to-point bandwidth, i.e. the plain model."""

    op_fw: float = 0.0
    op_bw: float = 0.0
    optimizer_per_byte: float = 0.0
    allreduce_bandwidth: float | None = None
    allreduce_latency: float = 0.0
    #: seconds every stage spends each step beside its actions: the graph's ``step_time_fixed``
    #: plus its ``step_time_per_sample`` times the mini-batch (0 without the mini-batch)
    per_step: float = 0.0
    #: the graph's ``grad_accumulation_time_per_byte`` (0 when absent or without a mini-batch)
    accumulate_per_byte: float = 0.0
    #: the mini-batch ``B`` that prices the accumulation (0: unknown)
    mini_batch: int = 0

    @classmethod
    def of(
        cls, graph: Graph | None = None, cluster: Cluster | None = None, mini_batch_size: int | None = None
    ) -> TimeTerms:
        """The terms of ``graph`` and ``cluster``; ``mini_batch_size`` prices the graph's
        ``step_time_per_sample`` and comes with ``step_time_fixed`` (without it, both are left out:
        a bound that holds for any mini-batch)."""
        fw, bw = graph.op_overhead if graph is not None else (0.0, 0.0)
        per_sample = graph.step_time_per_sample if graph is not None else 0.0
        fixed = graph.step_time_fixed if graph is not None else 0.0
        accumulate = graph.grad_accumulation_time_per_byte if graph is not None and mini_batch_size else 0.0
        return cls(
            fw,
            bw,
            graph.optimizer_time_per_byte if graph is not None else 0.0,
            cluster.allreduce_bandwidth if cluster is not None else None,
            cluster.allreduce_latency if cluster is not None else 0.0,
            fixed + per_sample * mini_batch_size if mini_batch_size else 0.0,
            accumulate,
            int(mini_batch_size or 0) if accumulate else 0,
        )

    @property
    def node_overhead(self) -> float:
        """What one node adds to a micro-batch's forward plus backward."""
        return self.op_fw + self.op_bw

    def allreduce(self, weight_bytes, d, bandwidth):
        """``A(S)`` (:func:`allreduce_time`) at the all-reduce's bandwidth: the cluster's
        ``allreduce_bandwidth`` when it has one, else ``bandwidth`` (the caller's point-to-point figure)."""
        bw = bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
        return allreduce_time(weight_bytes, d, bw, self.allreduce_latency)

    def allgather(self, weight_bytes, d, bandwidth):
        """The all-gather of a stage whose replicas shard the optimizer state (:func:`allgather_time`),
        at the all-reduce's bandwidth and latency (:meth:`allreduce`)."""
        bw = bandwidth if self.allreduce_bandwidth is None else self.allreduce_bandwidth
        return allgather_time(weight_bytes, d, bw, self.allreduce_latency)

    def accumulation(self, weight_bytes, micro_batch_size):
        """What a replica holding ``weight_bytes`` spends in a step summing each micro-batch's weight
        gradients into those of the step's earlier ones: ``(B/b - 1)`` accumulations (the first
        micro-batch's gradients become ``.grad`` as they are) of ``grad_accumulation_time_per_byte``
        per byte (elementwise on arrays; 0 without the term)."""
        if not self.accumulate_per_byte:
            return 0.0
        return self.accumulate_per_byte * weight_bytes * (self.mini_batch / micro_batch_size - 1.0)

    def optimizer(self, weight_bytes, micro_batch_size, shards=1):
        """``O(S)``: the optimizer step of a replica holding ``weight_bytes``, the step's own work
        beside the actions (``per_step``, the same on every stage) and the gradient accumulation of
        its micro-batches of ``micro_batch_size`` (:meth:`accumulation`); with the optimizer state
        cut into ``shards`` parts, the replica steps ``weight_bytes / shards``."""
        o = self.optimizer_per_byte * weight_bytes / shards + self.per_step
        return o + self.accumulation(weight_bytes, micro_batch_size) if self.accumulate_per_byte else o

    def tail(self, weight_bytes, d, bandwidth, micro_batch_size):
        """``A(S) + O(S)``: what a stage of micro-batch ``micro_batch_size`` runs after its last
        backward (elementwise on arrays)."""
        a = self.allreduce(weight_bytes, d, bandwidth)
        if self.optimizer_per_byte:
            a = a + self.optimizer_per_byte * weight_bytes
        if self.accumulate_per_byte:
            a = a + self.accumulation(weight_bytes, micro_batch_size)
        return a + self.per_step if self.per_step else a
