"""The seed planners of ``plan_gpp``, each run with its natural (deterministic) algorithm.

The wall clock is only a safety stop: all seed planners together may run until
``SEED_SAFETY_SHARE * budget`` seconds after the first starts; each gets the time left until then
as its ``time_limit``.  A planner that reports ``time-limit`` (or raises, or is skipped, after that
stop passed) makes the run *cut*: ``plan_gpp`` then reports status ``time-limit``, because what
it returns now depends on the machine's speed.  A plan stopped by its own limit is still valid and
is kept as a candidate.  When nothing is cut, the seed plans do not depend on the machine's speed.
Every outcome is recorded (status, seconds, the limit it got).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Any

from gpp_solver._backend.progress import note
from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

SEED_SAFETY_SHARE = 0.6  # all seed planners together: stopped after this share of the time limit
#: the registered planners that take ``micro_batch_sizes``; a restriction is passed to them, and the
#: plan of any seed planner with a stage outside the allowed sizes is dropped
TAKES_MICRO_BATCH_SIZES = frozenset({"gpp", "graphpipe", "pipedream", "pipedream-2bw", "alpa", "milp", "exact"})


def within_sizes(plan: Plan, micro_batch_sizes: Collection[int] | None) -> bool:
    """Whether every stage of ``plan`` uses a micro-batch size in ``micro_batch_sizes`` (``None``: any)."""
    return micro_batch_sizes is None or all(s.micro_batch_size in micro_batch_sizes for s in plan.stages)


def seed_fn(name: str) -> Any:
    """The registered planner ``name``, or ``None`` when it is not installed."""
    try:
        return get_planner(name)
    except InvalidInputError:
        return None


def run_seed_planners(
    graph: Graph,
    cluster: Cluster,
    B: int,
    names: Sequence[str],
    budget: float,
    progress: bool = False,
    micro_batch_sizes: Sequence[int] | None = None,
) -> tuple[dict[str, Plan], dict[str, dict[str, Any]], bool]:
    """Run the seed planners in turn under one safety stop ``SEED_SAFETY_SHARE * budget`` from now;
    ``micro_batch_sizes`` restricts every seed plan's stages to those sizes (passed to the planners
    that take it; a plan outside them is dropped and recorded).

    Returns the plans, a record per planner and ``cut``: whether the safety stop was reached (a
    planner reported ``time-limit``, or raised or was skipped after the stop), so that the caller's
    result may depend on the machine's speed."""
    plans: dict[str, Plan] = {}
    info: dict[str, dict[str, Any]] = {}
    stop = time.perf_counter() + SEED_SAFETY_SHARE * budget
    cut = False
    for name in names:
        fn = seed_fn(name)
        if fn is None:
            info[name] = {"status": "missing"}
            continue
        left = stop - time.perf_counter()
        if left <= 0.0:
            info[name] = {"status": "skipped (seed time used up)"}
            cut = True
            continue
        t0 = time.perf_counter()
        note(progress, "gpp: seed planner %s running (at most %.1f s)", name, left)
        try:
            opts = (
                {"micro_batch_sizes": tuple(micro_batch_sizes)}
                if micro_batch_sizes is not None and name in TAKES_MICRO_BATCH_SIZES
                else {}
            )
            p = fn(graph, cluster, B, time_limit=left, **opts)
            validate(p, graph, cluster)
        except Exception as exc:  # noqa: BLE001 — a seed planner must never break this one
            late = time.perf_counter() > stop
            cut |= late
            logger.info("seed planner %s skipped: %s: %s", name, type(exc).__name__, exc)
            info[name] = {
                "status": f"error: {type(exc).__name__}",
                "seconds": time.perf_counter() - t0,
                "time_limit": left,
                **({"after_safety_stop": True} if late else {}),
            }
            continue
        if not within_sizes(p, micro_batch_sizes):
            info[name] = {"status": "dropped: micro-batch size not allowed", "seconds": time.perf_counter() - t0}
            continue
        plans[name] = p
        note(
            progress,
            "gpp: seed planner %s: %s in %.2f s, iteration %.6g s",
            name,
            p.search.status,
            time.perf_counter() - t0,
            p.predicted.iteration_time,
        )
        if p.search.status is Status.TIME_LIMIT:
            cut = True
        info[name] = {
            "status": p.search.status,
            "seconds": time.perf_counter() - t0,
            "time_limit": left,
            "time_per_sample": p.predicted.time_per_sample,
            "iteration_time": p.predicted.iteration_time,
        }
    return plans, info, cut
