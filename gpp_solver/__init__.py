"""gpp_solver: planner for graph pipeline parallelism (GraphPipe) and its baselines."""
