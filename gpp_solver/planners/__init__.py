"""Planners behind one protocol and a registry by name; one sub-package per planner."""

from gpp_solver.planners.registry import REGISTRY, Planner, available_planners, get_planner, parse_options, register

__all__ = ["REGISTRY", "Planner", "available_planners", "get_planner", "parse_options", "register"]
