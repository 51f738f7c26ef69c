"""What a stage of ``d`` devices may be in the TPS lower bound (:mod:`.tps_bound`): the degrees ``d``
it may take, the largest bandwidths its all-reduce and its transfers can get (step 1 of the
bound's proof), and the memory tolerance under which it fits."""

from __future__ import annotations

from gpp_solver.cost.network import best_bandwidth
from gpp_solver.types import Cluster

MEMORY_REL_TOL = 1e-9
"""The validator's memory tolerance: a stage fits when ``M(S) <= memory * (1 + 1e-9)``."""


def degrees(b: int, devices: int) -> list[int]:
    """Data-parallel degrees a stage may take: ``1 <= d <= devices`` with ``b % d == 0``."""
    return [d for d in range(1, min(devices, b) + 1) if b % d == 0]


def allreduce_bandwidth_ub(cluster: Cluster, d: int) -> float:
    """The largest bandwidth an all-reduce among ``d`` devices can get (step 1 of the proof)."""
    return best_bandwidth(cluster, d)


def transfer_bandwidth_ub(cluster: Cluster, d: int) -> float:
    """The largest bandwidth a transfer of a stage of ``d`` devices can get (step 1 of the proof):
    it joins them with at least one device of the peer stage."""
    return best_bandwidth(cluster, d + 1)
