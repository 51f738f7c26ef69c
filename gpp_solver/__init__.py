"""gpp_solver: planner for graph pipeline parallelism (GraphPipe) and its baselines.

>>> import gpp_solver as gs
>>> g = gs.graph_from_dict({"micro_batch_sizes": [1], "nodes": [
...     {"id": "a", "fw_time": [1.0], "bw_time": [2.0], "weight_bytes": 0, "activation_bytes": 0,
...      "output_bytes": 0}], "edges": []})
>>> g.ids
('a',)
"""

from gpp_solver.api import solve
from gpp_solver.compare import compare
from gpp_solver.errors import (
    DeadlockError,
    GppError,
    InfeasibleError,
    InvalidClusterError,
    InvalidGraphError,
    InvalidInputError,
    InvalidPlanError,
    SearchSpaceTooLargeError,
    SolverError,
    TimeLimitError,
    VizUnavailableError,
)
from gpp_solver.formats.cluster import (
    as_cluster,
    cluster_from_dict,
    cluster_to_dict,
    load_cluster,
    save_cluster,
    v100_cluster,
)
from gpp_solver.formats.graph import (
    as_graph,
    graph_from_dict,
    graph_from_networkx,
    graph_to_dict,
    graph_to_networkx,
    load_graph,
    save_graph,
)
from gpp_solver.formats.plan_json import load_plan, plan_from_dict, plan_to_dict, save_plan
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import SimResult, simulate
from gpp_solver.plan.validate import validate
from gpp_solver.types import (
    Cluster,
    Edge,
    Graph,
    Node,
    Plan,
    PlanPrediction,
    Schedule,
    SearchInfo,
    SolveOptions,
    Stage,
    StagePrediction,
    Status,
    Tmpc,
)

__all__ = [
    "as_cluster",
    "cluster_from_dict",
    "cluster_to_dict",
    "load_cluster",
    "save_cluster",
    "v100_cluster",
    "DeadlockError",
    "GppError",
    "InfeasibleError",
    "InvalidClusterError",
    "InvalidGraphError",
    "InvalidInputError",
    "InvalidPlanError",
    "SearchSpaceTooLargeError",
    "SolverError",
    "TimeLimitError",
    "VizUnavailableError",
    "as_graph",
    "graph_from_dict",
    "graph_from_networkx",
    "graph_to_dict",
    "graph_to_networkx",
    "load_graph",
    "save_graph",
    "StageSpec",
    "build_plan",
    "load_plan",
    "plan_from_dict",
    "plan_to_dict",
    "save_plan",
    "SimResult",
    "simulate",
    "solve",
    "compare",
    "Cluster",
    "Edge",
    "Graph",
    "Node",
    "Plan",
    "PlanPrediction",
    "Schedule",
    "SearchInfo",
    "SolveOptions",
    "Stage",
    "StagePrediction",
    "Status",
    "Tmpc",
    "validate",
]
