"""Baseline planners (PipeDream, PipeDream-2BW, Piper, Alpa-style, exact MILP) behind the planner protocol."""
