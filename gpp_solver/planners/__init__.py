"""Planners behind one protocol and a registry by name; one sub-package per planner."""

from gpp_solver.planners.registry import (REGISTRY, Planner, available_planners, get_planner, register,
                                          reject_unknown_options)

__all__ = ["REGISTRY", "Planner", "available_planners", "get_planner", "register", "reject_unknown_options"]
