"""The exact MILP planner (PuLP) for small graphs."""
