"""A hand-made three-node chain and a one-device cluster with the runtime's memory overheads, shared
by the memory-rule tests: weights 100 (a), 300 (b), 0 (c) bytes; activations 50, 20, 10 and outputs
5 bytes per sample; SGD (optimizer state factor 2)."""

from __future__ import annotations

DOC = {
    "format": "gpp-graph/1",
    "micro_batch_sizes": [1],
    "nodes": [
        {"id": "a", "fw_time": [1], "bw_time": [1], "weight_bytes": 100, "activation_bytes": 50, "output_bytes": 5},
        {"id": "b", "fw_time": [1], "bw_time": [1], "weight_bytes": 300, "activation_bytes": 20, "output_bytes": 5},
        {"id": "c", "fw_time": [1], "bw_time": [1], "weight_bytes": 0, "activation_bytes": 10, "output_bytes": 5},
    ],
    "edges": [["a", "b"], ["b", "c"]],
}
CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 1,
    "memory_bytes": 1e9,
    "inter_node_bandwidth": 1e9,
    "optimizer_state_factor": 2.0,
    "memory_overheads": True,
}
