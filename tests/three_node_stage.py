"""A hand-made three-node chain and a one-device cluster with the runtime's memory overheads, shared
by the memory-rule tests: weights 100 (a), 300 (b), 0 (c) bytes; activations 50, 20, 10 and outputs
5 bytes per sample; SGD (optimizer state factor 2)."""

from __future__ import annotations


def memory_graph(nodes: list[tuple[str, float, float, float]], edges: list[list[str]]) -> dict:
    """A gpp-graph/1 document of ``(id, weight_bytes, activation_bytes, output_bytes)`` nodes, every
    time 1 at micro-batch size 1 (the memory rules read no time)."""
    return {
        "format": "gpp-graph/1",
        "micro_batch_sizes": [1],
        "nodes": [
            {"id": v, "fw_time": [1], "bw_time": [1], "weight_bytes": w, "activation_bytes": a, "output_bytes": o}
            for v, w, a, o in nodes
        ],
        "edges": edges,
    }


DOC = memory_graph([("a", 100, 50, 5), ("b", 300, 20, 5), ("c", 0, 10, 5)], [["a", "b"], ["b", "c"]])
CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 1,
    "memory_bytes": 1e9,
    "inter_node_bandwidth": 1e9,
    "optimizer_state_factor": 2.0,
    "memory_overheads": True,
}
