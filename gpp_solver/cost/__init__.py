"""The cost model of ``../shared/spec/cost-model.md``: stage costs, transfers, memory, micro-batch checks.

``gpp_solver.cost.stage_costs`` is the reference pricing; every fast pricer of a planner is held equal to it.
"""

from gpp_solver.cost.model import (CostTables, NodeConfig, StageCost, StageLike, allreduce_time, comm_time,
                                   data_parallel, in_flight_from_order, interp_time, iteration_time_estimate,
                                   node_config, stage_activation_bytes, stage_compute, stage_compute_parts,
                                   stage_costs, stage_memory, stage_transfers, stage_weight_bytes)

__all__ = ["CostTables", "NodeConfig", "StageCost", "StageLike", "allreduce_time", "comm_time", "data_parallel",
           "in_flight_from_order", "interp_time", "iteration_time_estimate", "node_config",
           "stage_activation_bytes", "stage_compute", "stage_compute_parts", "stage_costs", "stage_memory",
           "stage_transfers", "stage_weight_bytes"]
