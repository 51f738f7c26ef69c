"""The plan checked by ``gpp_solver``'s own validator, as ``gpp validate`` does.

With the profiled graph and the cluster (``runtime.train --graph G --cluster C``) the runtime
calls ``gpp_solver.plan.validate.validate`` exactly as ``gpp validate`` does (C1–C4, devices,
divisibility, memory, predicted figures). Without them it still runs the same validator on the
traced model's structure (node ids and edges, zero costs) and a cluster of the plan's devices
with unbounded memory, so C1 convexity, C2 stage edges (a missing, extra or cyclic edge), C3 and
C4 are checked the same way (a missing ``in_flight_samples`` is taken from the order); memory and
predictions need the graph and cluster.
"""

from __future__ import annotations

from gpp_solver.formats.cluster import load_cluster
from gpp_solver.formats.graph import graph_from_dict, load_graph
from gpp_solver.formats.plan_json import plan_from_dict
from gpp_solver.plan.validate import validate
from gpp_solver.types import Cluster

from ..capture.fx_graph import ModelGraph
from .plan_io import Plan


def structure_graph(mg: ModelGraph, plan: Plan) -> dict:
    """A gpp-graph/1 of the traced model's graph nodes (``mg.groups``) and edges with zero costs."""
    nodes = [{"id": gid, "fw_time": [0.0], "bw_time": [0.0], "weight_bytes": 0,
              "activation_bytes": 0, "output_bytes": 0} for gid, _ in mg.groups]
    edges = [{"src": a, "dst": b} for a, b in mg.edges()]
    return {"format": "gpp-graph/1", "name": "traced model", "micro_batch_sizes": [1],
            "nodes": nodes, "edges": edges}


def check_plan(plan: Plan, mg: ModelGraph, graph_path: str | None = None,
               cluster_path: str | None = None) -> None:
    """InvalidPlanError / InvalidInputError at the first violation ``gpp validate`` would name."""
    doc = plan.raw
    if graph_path and cluster_path:
        validate(plan_from_dict(doc), load_graph(graph_path), load_cluster(cluster_path))
        return
    graph = graph_from_dict(structure_graph(mg, plan))
    # unbounded memory: a Cluster built directly (a document's memory_bytes stops at 1e18)
    cluster = Cluster(devices=plan.world_size, memory_bytes=float("inf"), inter_node_bandwidth=1.0)
    validate(plan.solver, graph, cluster, check_predictions=False)  # in_flight filled where left out
