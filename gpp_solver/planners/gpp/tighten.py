"""``plan_gpp``'s last step: CP-SAT tightening of the chosen plan's micro-batch orders
(:func:`gpp_solver.cp_schedule.tighten`) under a deterministic-time budget."""

from __future__ import annotations

import logging
from typing import Any

from gpp_solver._backend.progress import note
from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)


TIGHTEN_SHARE = 0.08  # CP-SAT tightening: this share of the time limit, in deterministic time ...
TIGHTEN_MAX_SECONDS = 0.8  # ... at most this (the default limit's share), so a larger limit gives the same plan
# CP-SAT runs (tighten=None) only on plans with at most this many actions (F, B and W): on MMT 16x16
# at 1,024 devices (2,752 actions) it took 3 s (model and import) and found nothing in its budget,
# on the Transformer at 32 devices with W actions (1,536) 2.9 s and found nothing either
TIGHTEN_MAX_ACTIONS = 1024
# the memory phase (least peak memory at the tightened makespan) only up to this many actions: on
# the paper's workloads it proved its optimum at 56-144 actions and found nothing in 1-2 s at 288
# and 512 (MMT and Transformer at 32 devices), where it was half of gpp's CP-SAT time
TIGHTEN_MEMORY_MAX_ACTIONS = 256


def tighten_orders(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    tighten: bool | None,
    seed: int,
    budget: float,
    cut: bool,
    progress: bool = False,
) -> tuple[Plan, dict[str, Any], bool]:
    """CP-SAT order tightening under a deterministic-time budget; also whether a wall-clock guard
    may have stopped it (then its result depends on the machine's speed).

    ``tighten=None`` runs it when the model has at most ``TIGHTEN_MAX_ACTIONS`` actions and the
    search was not already ``cut`` by the wall clock — both independent of the machine's speed."""
    if tighten is False:
        return plan, {"status": "off"}, False
    if tighten is None and cut:  # before importing CP-SAT (a second on a loaded machine)
        return plan, {"status": "skipped", "reason": "time limit reached"}, False
    try:
        from gpp_solver import cp_schedule
    except Exception as exc:  # noqa: BLE001
        return plan, {"status": f"unavailable: {type(exc).__name__}"}, False
    actions = sum(len(s.schedule.order) for s in plan.stages)
    limit_actions = min(TIGHTEN_MAX_ACTIONS, getattr(cp_schedule, "MAX_ACTIONS", TIGHTEN_MAX_ACTIONS))
    if tighten is None and (cut or actions > limit_actions):
        return (
            plan,
            {
                "status": "skipped",
                "actions": actions,
                "max_actions": limit_actions,
                "reason": "time limit reached" if cut else "too many actions",
            },
            False,
        )
    det = min(TIGHTEN_MAX_SECONDS, TIGHTEN_SHARE * budget)
    note(
        progress, "gpp: CP-SAT tightening the micro-batch orders (%d actions, %.2f s deterministic time)", actions, det
    )
    try:
        r = cp_schedule.tighten(
            plan,
            graph,
            cluster,
            time_limit=det,
            seed=seed,
            workers=1,
            deterministic=True,
            minimize_memory=actions <= TIGHTEN_MEMORY_MAX_ACTIONS,
            progress=progress,
        )
    except Exception as exc:  # noqa: BLE001
        logger.info("CP-SAT tightening failed: %s: %s", type(exc).__name__, exc)
        return plan, {"status": f"error: {type(exc).__name__}"}, False
    # cp_schedule guards each deterministic-time phase with a wall limit of 4x it + 1 s and says
    # whether a phase ended by neither a proof nor its deterministic limit (then it may depend on load)
    guard = r.wall_guard
    info = {
        "status": r.status,
        "deterministic_seconds": det,
        "makespan_before": r.makespan_before,
        "makespan_after": r.makespan_after,
        "improved": r.improved,
        "seconds": r.seconds,
        "actions": r.actions,
        "memory_status": r.memory_status,
        "wall_guard_possible": guard,
    }
    return r.plan, info, guard
