"""Clusters of usual machines by a short name: ``v100:8``, ``a100-40g:8``, ``a100-80g:4x8``, ``h100:2x8``.

``NAME:N`` is N devices (filling nodes of the machine's devices per node, the last one possibly
partial); ``NAME:NODESxPER_NODE`` is NODES nodes of PER_NODE devices each.  The figures are the
vendors' and are what the cost model takes (``docs/cost-model.md``): memory per device,
and the **one-direction** bandwidth of a point-to-point transfer (a transfer costs ``latency +
bytes / bandwidth``).  Vendors quote NVLink as the sum of both directions; it is halved here.

* ``v100`` — the GraphPipe paper's setting (Summit-like, §7): V100 SXM2 16 GB, 4 per node, 50 GB/s
  between two GPUs of a node (two NVLink 2 links at 25 GB/s per direction each; NVIDIA Tesla V100
  datasheet: 6 links, 300 GB/s total), 12.5 GB/s between nodes (InfiniBand EDR, 100 Gb/s).
* ``a100-40g`` / ``a100-80g`` — NVIDIA DGX A100 (NVIDIA A100 Tensor Core GPU datasheet; DGX A100
  system datasheet): 8 A100 SXM4 per node with 40 GB / 80 GB HBM2(e) (40 / 80 GiB as nvidia-smi
  shows them), NVLink 3 through NVSwitch 600 GB/s total per GPU = 300 GB/s per direction; one
  ConnectX-6 InfiniBand HDR 200 Gb/s adapter per GPU = 25 GB/s between nodes.
* ``h100`` — NVIDIA DGX H100 (NVIDIA H100 Tensor Core GPU datasheet; DGX H100 datasheet): 8 H100
  SXM5 80 GB per node, NVLink 4 900 GB/s total per GPU = 450 GB/s per direction; one ConnectX-7
  InfiniBand NDR 400 Gb/s adapter per GPU = 50 GB/s between nodes.

``latency`` is 10 µs per message for every machine: the order of one NCCL point-to-point call
(not a vendor figure; the link latencies themselves are 1–2 µs).  ``optimizer_state_factor`` is
the contract's default 4.0 (fp32 weights, gradients and Adam's two moments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpp_solver.errors import InvalidClusterError
from gpp_solver.types import Cluster

GiB = 2**30


@dataclass(frozen=True)
class Machine:
    """One kind of node: its devices and links (units: bytes, bytes/s, seconds)."""

    description: str
    memory_bytes: float  # per device
    devices_per_node: int
    intra_node_bandwidth: float  # one direction, between two devices of a node
    inter_node_bandwidth: float  # one direction, per device, between nodes
    latency: float = 1e-5


#: name -> machine (sources in the module docstring)
MACHINES: dict[str, Machine] = {
    "v100": Machine("V100 SXM2 16 GB, 4 per node (the GraphPipe paper's cluster)", 16 * GiB, 4, 50e9, 12.5e9),
    "a100-40g": Machine(
        "DGX A100: A100 SXM4 40 GB, 8 per node, NVLink 3, InfiniBand HDR", 40 * GiB, 8, 300e9, 200e9 / 8
    ),
    "a100-80g": Machine(
        "DGX A100: A100 SXM4 80 GB, 8 per node, NVLink 3, InfiniBand HDR", 80 * GiB, 8, 300e9, 200e9 / 8
    ),
    "h100": Machine("DGX H100: H100 SXM5 80 GB, 8 per node, NVLink 4, InfiniBand NDR", 80 * GiB, 8, 450e9, 400e9 / 8),
}

_SPEC = re.compile(r"([a-z0-9-]+):(\d+)(?:x(\d+))?")


def machine_cluster(name: str, devices: int, *, devices_per_node: int | None = None) -> Cluster:
    """``devices`` devices of machine ``name`` (``devices_per_node`` overrides the machine's)."""
    m = MACHINES.get(name)
    if m is None:
        raise InvalidClusterError(f"unknown machine {name!r}; known: {', '.join(MACHINES)}")
    if devices < 1:
        raise InvalidClusterError(f"--cluster {name}:N needs N >= 1, got {devices}")
    return Cluster(
        devices=devices,
        memory_bytes=m.memory_bytes,
        devices_per_node=devices_per_node or m.devices_per_node,
        intra_node_bandwidth=m.intra_node_bandwidth,
        inter_node_bandwidth=m.inter_node_bandwidth,
        latency=m.latency,
        optimizer_state_factor=4.0,
    )


def is_machine_spec(spec: str) -> bool:
    """Whether ``spec`` has the form ``NAME:N`` / ``NAME:NODESxPER_NODE`` (a file path does not)."""
    return _SPEC.fullmatch(spec) is not None


def parse_machine_spec(spec: str) -> Cluster:
    """``h100:2x8`` -> 16 H100 in 2 nodes of 8; ``a100-40g:8`` -> 8 A100 40 GB in one node."""
    m = _SPEC.fullmatch(spec)
    if m is None:
        raise InvalidClusterError(
            f"cluster {spec!r}: expected NAME:N or NAME:NODESxPER_NODE with NAME one of {', '.join(MACHINES)}"
        )
    name, a, b = m.group(1), int(m.group(2)), m.group(3)
    if b is None:
        return machine_cluster(name, a)
    per = int(b)
    if a < 1 or per < 1:
        raise InvalidClusterError(f"cluster {spec!r}: NODES and PER_NODE must be at least 1")
    return machine_cluster(name, a * per, devices_per_node=per)
