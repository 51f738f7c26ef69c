"""Helpers shared by the sequential-pipeline baselines (PipeDream, PipeDream-2BW, Alpa).

- :func:`pipedream_core` — PipeDream's pre-processing: the nodes the partitioner sees, without
  ``Input`` sources and ``__getitem__`` sinks (for graphs whose nodes carry no ``op`` name:
  sources, then sinks, with zero time and zero weights);
- :func:`attach_detached` — put those nodes back: a source into the earliest stage of its
  consumers (PipeDream puts inputs in stage 0), a sink into the latest stage of its producers;
- :func:`candidate_micro_batches` — the micro-batch sizes a baseline tries;
- :func:`usable_cluster` — the cluster cut to the devices a chain of stages can use.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.plan.build import StageSpec
from gpp_solver.types import Cluster, Graph, Node


def _free(n: Node) -> bool:
    return not any(n.fw_time) and not any(n.bw_time) and n.weight_bytes == 0


def _op(n: Node) -> str | None:
    op = n.extra.get("op")
    return op if isinstance(op, str) else None


def pipedream_core(graph: Graph) -> tuple[list[str], list[str], list[str]]:
    """``(core nodes, detached sources, detached sinks)``, each in graph order."""

    def is_input(n: Node) -> bool:
        op = _op(n)
        return op.startswith("Input") if op is not None else _free(n)

    def is_dangling(n: Node) -> bool:
        op = _op(n)
        return op.startswith("__getitem__") if op is not None else _free(n)

    inputs = [v for v in graph.ids if not graph.preds(v) and is_input(graph.node(v))]
    if len(inputs) == len(graph.ids):
        return list(graph.ids), [], []
    gone = set(inputs)
    sinks = [
        v
        for v in graph.ids
        if v not in gone and not any(s not in gone for s in graph.succs(v)) and is_dangling(graph.node(v))
    ]
    if len(sinks) + len(inputs) == len(graph.ids):
        sinks = []
    gone |= set(sinks)
    return [v for v in graph.ids if v not in gone], inputs, sinks


def attach_detached(
    graph: Graph, rows: Sequence[tuple[Sequence[str], Sequence[int], int]], inputs: Iterable[str], sinks: Iterable[str]
) -> list[StageSpec]:
    """Stage specs from ``(nodes, devices, micro_batch_size)`` rows (pipeline order) with the
    detached nodes put back."""
    groups = [list(nodes) for nodes, _, _ in rows]
    stage_of = {v: i for i, g in enumerate(groups) for v in g}
    for v in inputs:
        consumers = [stage_of[s] for s in graph.succs(v) if s in stage_of]
        i = min(consumers, default=0)
        groups[i].append(v)
        stage_of[v] = i
    for v in sinks:
        producers = [stage_of[p] for p in graph.preds(v) if p in stage_of]
        i = max(producers, default=len(groups) - 1)
        groups[i].append(v)
        stage_of[v] = i
    return [StageSpec(nodes=tuple(g), devices=tuple(devs), micro_batch_size=b) for g, (_, devs, b) in zip(groups, rows)]


def candidate_micro_batches(mini_batch_size: int, given: Sequence[int] | None = None) -> list[int]:
    """``given`` (each must divide ``B``) or the powers of two dividing ``B``, ascending."""
    B = mini_batch_size  # the paper's B
    return list(check_micro_batch_sizes(B, None if given is None else list(given)))


def usable_cluster(cluster: Cluster, n_core: int, max_b: int) -> tuple[Cluster, int]:
    """The cluster a sequential DP plans on: no more devices than a chain can use.

    A chain has at most ``n_core`` stages (each holds a node) and a stage at most ``b`` replicas
    (``b % d == 0``), so at most ``n_core * max_b`` devices are ever used (in the hierarchical case
    at most that many nodes, each stage spanning ``rho | b`` nodes).  The DP's tables and loops
    grow with the device count, so a larger cluster is planned on its first devices (or nodes):
    the same plans, in time and memory independent of the unusable devices.  Returns the cluster
    and its device count (for ``search.extra["devices_considered"]``)."""
    K, dpn, cap = cluster.devices, cluster.devices_per_node, n_core * max_b
    if dpn is not None and dpn < K and K % dpn == 0:
        keep = min(K, cap * dpn)  # whole nodes: the hierarchical DP runs on K // dpn of them
    else:
        keep = min(K, cap)
    return (cluster if keep == K else cluster.with_(devices=keep)), keep
