"""The four-layer chain the memory levers' tests plan (``test_recompute_choice.py``,
``test_zero_choice.py``): four layers, each 1e5 weight bytes (4e5 with Adam's state) and 1e5
activation bytes per sample, a mini-batch of 8 in micro-batches of 4 on 2 devices."""

from __future__ import annotations

NODE = {"fw_time": [1e-3], "bw_time": [2e-3], "weight_bytes": 1e5, "activation_bytes": 1e5, "output_bytes": 100}
GRAPH = {
    "format": "gpp-graph/1",
    "name": "four-layers",
    "micro_batch_sizes": [4],
    "nodes": [{"id": f"l{i}", **NODE} for i in range(4)],
    "edges": [[f"l{i}", f"l{i + 1}"] for i in range(3)],
}


def cluster(memory: float) -> dict:
    """Two devices of ``memory`` bytes, Adam's optimizer state factor."""
    return {
        "format": "gpp-cluster/1",
        "devices": 2,
        "memory_bytes": memory,
        "inter_node_bandwidth": 1e10,
        "latency": 1e-6,
        "optimizer_state_factor": 4.0,
    }
