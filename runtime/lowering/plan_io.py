"""The plan as the runtime reads it: ``gpp_solver``'s own :class:`~gpp_solver.types.Plan`, read
once by ``gpp_solver``'s reader, and the runtime's views of it as functions.

A plan file goes through ``gpp_solver.formats.plan_json`` (the file itself through
``gpp_solver.formats.jsonio``), so unknown fields, wrong types, out-of-range numbers and
unreadable files are refused exactly as ``gpp validate`` refuses them. One leniency for
hand-written plans: a stage may leave ``in_flight_samples`` out; the peak of its own order is
used (as the validator computes it). The meaning of the plan (C1-C4, devices, divisibility)
is checked by ``gpp_solver``'s validator in :mod:`gpp_runtime.lowering.plan_check`. Every error is
an ``InvalidPlanError`` naming the stage and the field.
"""

from __future__ import annotations

import copy
from typing import Any

from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.jsonio import read_json
from gpp_solver.formats.plan_json import plan_from_dict
from gpp_solver.types import DEFAULT_OPTIMIZER_STATE_FACTOR, Plan, Stage


def read_plan(plan: Any) -> Plan:
    """A :class:`Plan` from a path (a JSON file, never pickle), a parsed ``gpp-plan/1`` document
    or a Plan."""
    if isinstance(plan, Plan):
        return plan
    if isinstance(plan, dict):
        return plan_from_dict(_with_in_flight(plan))
    if isinstance(plan, str) or hasattr(plan, "__fspath__"):
        return plan_from_dict(_with_in_flight(read_json(str(plan), "plan", InvalidPlanError)))
    raise InvalidPlanError(f"plan must be a path, a gpp-plan/1 dict or a Plan, not {type(plan).__name__}")


def _with_in_flight(doc: Any) -> Any:
    """``doc`` with each stage's missing ``in_flight_samples`` taken from its order, where the
    order and micro-batch size are well-formed (otherwise the reader names what is wrong)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("stages"), list):
        return doc
    filled = copy.deepcopy(doc)
    for st in filled["stages"]:
        if not isinstance(st, dict) or "in_flight_samples" in st:
            continue
        order = st.get("schedule", {}).get("order") if isinstance(st.get("schedule"), dict) else None
        micro_batch_size = st.get("micro_batch_size")
        if (
            isinstance(micro_batch_size, int)
            and not isinstance(micro_batch_size, bool)
            and micro_batch_size > 0
            and isinstance(order, list)
            and all(_is_action(a) for a in order)
        ):
            st["in_flight_samples"] = in_flight_from_order([tuple(a) for a in order], micro_batch_size)
    return filled


def _is_action(a: Any) -> bool:
    return (
        isinstance(a, list)
        and len(a) == 2
        and a[0] in ("F", "B", "W")
        and isinstance(a[1], int)
        and not isinstance(a[1], bool)
        and a[1] >= 0
    )


def world_size(plan: Plan) -> int:
    """Ranks the plan runs on: one per device it lists."""
    return plan.devices_used


def stage_of_rank(plan: Plan, rank: int) -> Stage:
    """The stage whose ``devices`` list ``rank``."""
    for s in plan.stages:
        if rank in s.devices:
            return s
    raise InvalidPlanError(f"no stage of the plan lists device {rank} in `devices`")


def replica_batch(stage: Stage) -> int:
    """Samples one replica of ``stage`` computes per micro-batch (``micro_batch_size / d``)."""
    return stage.micro_batch_size // len(stage.devices)


def predicted_time_per_sample(stage: Stage) -> float | None:
    """The stage's predicted time per sample, or None when the plan gives none (0)."""
    return stage.predicted.time_per_sample or None


def optimizer_state_factor(plan: Plan, cluster_factor: float | None = None) -> float:
    """The factor the plan's memory figures assume: the plan's record, else the cluster's, else 4.0."""
    for f in (plan.optimizer_state_factor, cluster_factor):
        if f is not None:
            return f
    return DEFAULT_OPTIMIZER_STATE_FACTOR
