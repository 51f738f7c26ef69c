"""Exact planner for the iteration-time objective on small graphs (``exact``)."""
