"""Piper's planner: the downset DP with its knapsack and cost model."""
