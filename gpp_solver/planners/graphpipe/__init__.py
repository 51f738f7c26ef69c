"""GraphPipe's planner: the stage DP over the series-parallel tree (Algorithm 1, §5) and its sweeps."""
