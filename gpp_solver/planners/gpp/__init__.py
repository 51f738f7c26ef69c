"""``gpp``: the project's own planner: seeds from every planner, local search, CP-SAT tightening."""
