"""The cost model of ``docs/cost-model.md``: stage costs, transfers, memory, micro-batch checks.

``gpp_solver.cost.stage_costs`` is the reference pricing; every fast pricer of a planner uses the
same pricing core (:func:`comm_time`, :func:`allreduce_time`, :func:`time_per_sample`,
:func:`memory_per_device`), the one interpolation (:func:`interpolate`) and the one bandwidth rule
(``Cluster.bandwidth``, with the bounds of :mod:`gpp_solver.cost.network`), and is held equal to it
by ``tests/cost/test_pricers.py``.
"""

from gpp_solver.cost.memory import kept_gradient_bytes, order_memory, stage_memory
from gpp_solver.cost.model import (
    NodeConfig,
    StageCost,
    StageLike,
    comm_time,
    data_parallel,
    in_flight_from_order,
    interp_time,
    interpolate,
    iteration_time_estimate,
    memory_per_device,
    node_compute,
    node_config,
    pending_weight_samples,
    split_overhead,
    stage_activation_bytes,
    stage_compute,
    stage_compute_parts,
    stage_costs,
    stage_transfers,
    stage_weight_bytes,
    stage_weight_copy_bytes,
    stage_weight_grad_time,
    time_per_sample,
)
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms, allreduce_time

__all__ = [
    "CostTables",
    "NodeConfig",
    "StageCost",
    "StageLike",
    "TimeTerms",
    "allreduce_time",
    "comm_time",
    "data_parallel",
    "in_flight_from_order",
    "interp_time",
    "interpolate",
    "iteration_time_estimate",
    "kept_gradient_bytes",
    "memory_per_device",
    "node_compute",
    "node_config",
    "order_memory",
    "pending_weight_samples",
    "stage_activation_bytes",
    "stage_weight_copy_bytes",
    "stage_compute",
    "stage_compute_parts",
    "stage_costs",
    "stage_memory",
    "stage_transfers",
    "stage_weight_bytes",
    "split_overhead",
    "stage_weight_grad_time",
    "time_per_sample",
]
