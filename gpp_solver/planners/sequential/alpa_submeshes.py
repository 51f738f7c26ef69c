"""Alpa's device groups ("submeshes", Zheng et al., OSDI'22, §5.2) for :mod:`.alpa`: the sizes a
stage may take on a cluster, and where the groups of a chain of stages go.

Sizes are powers of two up to a node's size, then whole nodes; groups are packed into nodes
largest first, so a group no larger than a node sits inside one node when the sizes allow it.
"""

from __future__ import annotations

import math

from gpp_solver.types import Cluster


def group_sizes(cluster: Cluster) -> list[int]:
    """Alpa's submesh sizes for ``cluster`` (powers of two within a node, then whole nodes)."""
    K, dpn = cluster.devices, cluster.devices_per_node
    if dpn is None or dpn >= K:
        dpn = K
    out, s = [], 1
    while s < dpn:
        out.append(s)
        s *= 2
    out.append(dpn)
    out += [dpn * k for k in range(2, K // dpn + 1)]
    return sorted(set(out))


def place_groups(cluster: Cluster, sizes: list[int]) -> list[tuple[int, ...]]:
    """Device ranges for groups (in pipeline order): largest first, each inside one node if it fits."""
    dpn = cluster.devices_per_node or cluster.devices
    free = {
        node: list(range(node * dpn, min((node + 1) * dpn, cluster.devices)))
        for node in range(math.ceil(cluster.devices / dpn))
    }
    out: dict[int, tuple[int, ...]] = {}
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = sizes[i]
        if s <= dpn:
            node = next((nd for nd in sorted(free) if len(free[nd]) >= s), None)
            if node is not None:
                out[i], free[node] = tuple(free[node][:s]), free[node][s:]
                continue
        pool = [d for nd in sorted(free) for d in free[nd]]
        take = pool[:s]
        out[i] = tuple(take)
        for nd in free:
            free[nd] = [d for d in free[nd] if d not in take]
    return [tuple(sorted(out[i])) for i in range(len(sizes))]
