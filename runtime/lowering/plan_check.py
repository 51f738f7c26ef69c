"""The plan checked by ``gpp_solver``'s own validator, as ``gpp validate`` does, once per run.

With the profiled graph and the cluster (``gpp_runtime.train --graph G --cluster C``) the runtime
calls ``gpp_solver.plan.validate.validate`` exactly as ``gpp validate`` does (C1–C4, devices,
divisibility, memory, predicted figures). Without them it still runs the same validator on the
traced model's structure (node ids and edges, zero costs) and a cluster of the started ranks
with unbounded memory, so C1 convexity, C2 stage edges (a missing, extra or cyclic edge), C3
(devices ``0..world-1``, disjoint), divisibility and C4 are checked the same way; memory and
predictions need the graph and cluster. Before either, the plan's world size must equal the
number of ranks started, and its stages must be what the runtime runs (no tensor parallelism, no
TMPC: the runtime cannot switch a node to another configuration, nor recompute one node alone).
"""

from __future__ import annotations

import math

from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.plan.validate import validate
from gpp_solver.types import Cluster, Graph, Plan

from ..capture.fx_graph import ModelGraph
from .plan_io import optimizer_state_factor, world_size


def structure_graph(mg: ModelGraph) -> dict:
    """A gpp-graph/1 of the traced model's graph nodes (``mg.groups``) and edges with zero costs."""
    nodes = [
        {"id": gid, "fw_time": [0.0], "bw_time": [0.0], "weight_bytes": 0, "activation_bytes": 0, "output_bytes": 0}
        for gid, _ in mg.groups
    ]
    edges = [{"src": a, "dst": b} for a, b in mg.edges()]
    return {"format": "gpp-graph/1", "name": "traced model", "micro_batch_sizes": [1], "nodes": nodes, "edges": edges}


def check_world(plan: Plan, world: int) -> None:
    """The plan runs on exactly the ``world`` ranks started (rank r = device r), with the stages
    the runtime supports."""
    if world_size(plan) != world:
        raise InvalidPlanError(
            f"the plan uses {_count(world_size(plan), 'device')} but {_count(world, 'rank')} "
            f"{'was' if world == 1 else 'were'} started (torchrun --nproc-per-node {world_size(plan)})"
        )
    owner: dict[int, int] = {}
    for s in plan.stages:
        for d in s.devices:
            if d in owner:
                raise InvalidPlanError(f"device {d} is listed by stages {owner[d]} and {s.id} (C3)")
            owner[d] = s.id
    if sorted(owner) != list(range(world)):
        raise InvalidPlanError(f"stage devices must be 0..{world - 1}, but got {sorted(owner)}")
    for s in plan.stages:
        if s.tensor_parallel != 1:
            raise InvalidPlanError(f"stage {s.id}: tensor_parallel = {s.tensor_parallel}: the runtime supports only 1")
        if s.tmpc:
            node, idx = next(iter(s.tmpc.items()))
            raise InvalidPlanError(
                f"stage {s.id}: node '{node}' runs in its TMPC {idx} (Piper's configurations, the plan's "
                "'tmpc'): the runtime runs every node in its base configuration only, and a recomputation "
                "only as a stage's 'recompute' (plan with gpp or graphpipe --recompute)"
            )


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def check_plan(plan: Plan, mg: ModelGraph, graph: Graph | None = None, cluster: Cluster | None = None) -> None:
    """InvalidPlanError / InvalidInputError at the first violation ``gpp validate`` would name
    (after :func:`check_world`)."""
    if graph is not None and cluster is not None:
        validate(plan, graph, cluster)
        return
    # unbounded memory: a Cluster built directly (a document's memory_bytes stops at 1e18)
    structure = Cluster(
        devices=world_size(plan),
        memory_bytes=math.inf,
        inter_node_bandwidth=1.0,
        optimizer_state_factor=optimizer_state_factor(plan),
    )
    validate(plan, graph_from_dict(structure_graph(mg)), structure, check_predictions=False)
