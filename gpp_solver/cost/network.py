"""The one bandwidth rule and the bounds planners derive from it.

The rule itself is :meth:`gpp_solver.types.Cluster.bandwidth`: a transfer or an all-reduce among a
set of devices gets the intra-node bandwidth when every device sits in one node (never on a flat
network, ``devices_per_node`` absent, nor when the cluster gives no intra-node figure), else the
inter-node one.  Planners that price before devices are placed need bounds of it; they take them
from here, never from the cluster's bandwidth fields directly.
"""

from __future__ import annotations

from gpp_solver.types import Cluster


def node_bandwidth(cluster: Cluster) -> float:
    """What a group of devices inside one node gets (the inter-node figure on a flat network)."""
    return cluster.bandwidth((0,))


def one_node(cluster: Cluster, devices: int | None = None) -> bool:
    """Whether the first ``devices`` devices (default: all of them) sit in one node."""
    return cluster.same_node(range(cluster.devices if devices is None else devices))


def link_bandwidths(cluster: Cluster) -> tuple[float, float]:
    """``(slowest, fastest)`` of the two kinds of link (equal on a flat network)."""
    a, b = node_bandwidth(cluster), cluster.inter_node_bandwidth
    return min(a, b), max(a, b)


def constant_bandwidth(cluster: Cluster, devices: int | None = None) -> float | None:
    """The bandwidth every group of the first ``devices`` devices (default: all) gets when placement
    cannot matter, else ``None``: a flat network, equal intra- and inter-node figures, or one node
    holding those devices."""
    intra, inter = node_bandwidth(cluster), cluster.inter_node_bandwidth
    if intra == inter:
        return inter
    if one_node(cluster, devices):
        return intra
    return None


def slowest_bandwidth(cluster: Cluster, devices: int | None = None) -> float:
    """The least bandwidth any group of the first ``devices`` devices (default: all) gets (its time
    is an upper bound)."""
    c = constant_bandwidth(cluster, devices)
    return c if c is not None else link_bandwidths(cluster)[0]


def best_bandwidth(cluster: Cluster, group: int) -> float:
    """The most bandwidth a group of ``group`` devices can get by placement (a node holds it only
    when it has at most ``devices_per_node`` devices)."""
    dpn = cluster.devices_per_node
    return link_bandwidths(cluster)[1] if dpn is not None and group <= dpn else cluster.inter_node_bandwidth
