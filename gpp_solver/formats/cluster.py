"""Read, validate and write ``gpp-cluster/1`` documents.

Required: ``devices`` (>= 1), ``memory_bytes`` (> 0), ``inter_node_bandwidth`` (> 0).
Defaults when absent: ``intra_node_bandwidth`` = the inter-node one, ``devices_per_node`` absent
(flat network: the inter-node bandwidth everywhere), ``latency`` = 0, ``optimizer_state_factor`` = 4.0,
``allreduce_bandwidth`` absent (the all-reduce priced at the point-to-point bandwidth), ``allreduce_latency`` = 0,
``memory_overheads`` unstated (the cost model's runtime memory terms priced for a graph the runtime
profiled, ``extra.profile``, and not for another), ``runtime_memory_bytes`` = 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpp_solver.errors import InvalidClusterError
from gpp_solver.formats.jsonio import document, extra, integer, number, read_json, require, write_json
from gpp_solver.formats.machines import machine_cluster
from gpp_solver.limits import MAX_BANDWIDTH, MAX_BYTES, MAX_COUNT, MAX_FACTOR, MAX_SECONDS, MIN_BANDWIDTH
from gpp_solver.types import CLUSTER_FORMAT, DEFAULT_OPTIMIZER_STATE_FACTOR, Cluster

E = InvalidClusterError


_FIELDS = frozenset(
    {
        "format",
        "devices",
        "memory_bytes",
        "devices_per_node",
        "intra_node_bandwidth",
        "inter_node_bandwidth",
        "latency",
        "optimizer_state_factor",
        "allreduce_bandwidth",
        "allreduce_latency",
        "memory_overheads",
        "runtime_memory_bytes",
        "extra",
    }
)


def cluster_from_dict(d: Any) -> Cluster:
    """Validate a ``gpp-cluster/1`` document; an unknown field (say ``gpus_per_node``) is an error naming it
    (extensions go under ``extra``, which planning does not read)."""
    document(d, "cluster", _FIELDS, CLUSTER_FORMAT, E)
    extra(d, "cluster", E)
    devices = integer(require(d, "devices", "cluster", E), "cluster: devices", E, minimum=1, maximum=MAX_COUNT)
    memory = number(
        require(d, "memory_bytes", "cluster", E),
        "cluster: memory_bytes",
        E,
        positive=True,
        minimum=1.0,
        maximum=MAX_BYTES,
    )

    def bandwidth(key: str, value: Any) -> float:
        return number(value, f"cluster: {key}", E, positive=True, minimum=MIN_BANDWIDTH, maximum=MAX_BANDWIDTH)

    inter = bandwidth("inter_node_bandwidth", require(d, "inter_node_bandwidth", "cluster", E))
    intra_raw = d.get("intra_node_bandwidth")
    intra = None if intra_raw is None else bandwidth("intra_node_bandwidth", intra_raw)
    dpn_raw = d.get("devices_per_node")
    dpn = None if dpn_raw is None else integer(dpn_raw, "cluster: devices_per_node", E, minimum=1, maximum=MAX_COUNT)
    latency = number(d.get("latency", 0.0), "cluster: latency", E, maximum=MAX_SECONDS)
    osf = number(
        d.get("optimizer_state_factor", DEFAULT_OPTIMIZER_STATE_FACTOR),
        "cluster: optimizer_state_factor",
        E,
        maximum=MAX_FACTOR,
    )
    ar_raw = d.get("allreduce_bandwidth")
    ar_bw = None if ar_raw is None else bandwidth("allreduce_bandwidth", ar_raw)
    ar_lat = number(d.get("allreduce_latency", 0.0), "cluster: allreduce_latency", E, maximum=MAX_SECONDS)
    overheads = d.get("memory_overheads")
    if overheads is not None and not isinstance(overheads, bool):
        raise E(f"cluster: memory_overheads must be true or false, got {overheads!r}")
    runtime_memory = number(d.get("runtime_memory_bytes", 0.0), "cluster: runtime_memory_bytes", E, maximum=MAX_BYTES)
    return Cluster(
        devices=devices,
        memory_bytes=memory,
        inter_node_bandwidth=inter,
        intra_node_bandwidth=intra if intra is not None else inter,
        devices_per_node=dpn,
        latency=latency,
        optimizer_state_factor=osf,
        allreduce_bandwidth=ar_bw,
        allreduce_latency=ar_lat,
        memory_overheads=overheads,
        runtime_memory_bytes=runtime_memory,
    )


def cluster_to_dict(c: Cluster) -> dict[str, Any]:
    d: dict[str, Any] = {"format": CLUSTER_FORMAT, "devices": c.devices, "memory_bytes": c.memory_bytes}
    if c.devices_per_node is not None:
        d["devices_per_node"] = c.devices_per_node
    d.update(
        {
            "intra_node_bandwidth": c.intra_node_bandwidth,
            "inter_node_bandwidth": c.inter_node_bandwidth,
            "latency": c.latency,
            "optimizer_state_factor": c.optimizer_state_factor,
        }
    )
    if c.allreduce_bandwidth is not None:
        d["allreduce_bandwidth"] = c.allreduce_bandwidth
    if c.allreduce_latency:
        d["allreduce_latency"] = c.allreduce_latency
    if c.memory_overheads is not None:
        d["memory_overheads"] = c.memory_overheads
    if c.runtime_memory_bytes:
        d["runtime_memory_bytes"] = c.runtime_memory_bytes
    return d


def load_cluster(path: str | Path) -> Cluster:
    return cluster_from_dict(read_json(path, "cluster", E))


def save_cluster(c: Cluster, path: str | Path) -> None:
    write_json(cluster_to_dict(c), path)


def as_cluster(obj: Any) -> Cluster:
    """Accept a :class:`Cluster`, a ``gpp-cluster/1`` dict or a path (the ``budget`` of ``solve``)."""
    if isinstance(obj, Cluster):
        return obj
    if isinstance(obj, dict):
        return cluster_from_dict(obj)
    if isinstance(obj, (str, Path)):
        return load_cluster(obj)
    raise E(f"cannot read a cluster from {type(obj).__name__}")


def v100_cluster(devices: int, *, devices_per_node: int = 4) -> Cluster:
    """The paper's setting (Summit): V100 16 GB, NVLink inside a node, InfiniBand between nodes
    (``machines.MACHINES["v100"]``, where the figures' sources are named)."""
    return machine_cluster("v100", devices, devices_per_node=devices_per_node)
