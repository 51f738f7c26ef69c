"""The seed planners of ``plan_gpp``, run in turn under a share of its time limit.

Each gets ``min(SEED_MAX_SHARE * budget, seed time left)`` with ``SEED_BUDGET_SHARE * budget`` for
all of them.  A plan stopped by its own time limit is dropped (keeping it would make ``gpp``'s
result depend on the machine's speed); one that raises or fails validation is skipped.  Every
outcome is recorded (status, seconds, the limit it got).
"""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any, Sequence

from .errors import InvalidInputError
from .planners import get_planner
from .types import Cluster, Graph, Plan
from .validate import validate

logger = logging.getLogger(__name__)

SEED_BUDGET_SHARE = 0.4          # all seed planners together: at most this share of the time limit
SEED_MAX_SHARE = 0.2             # one seed planner: at most this share of the time limit

FALLBACKS = {"graphpipe": ("gpp_solver.planner_graphpipe", "plan_graphpipe")}


def seed_fn(name: str) -> Any:
    """The registered planner, or (for ``graphpipe``) its module under the name it landed with."""
    try:
        return get_planner(name)
    except InvalidInputError:
        pass
    if name in FALLBACKS:
        mod, attr = FALLBACKS[name]
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError):
            return None
    return None


def run_seed_planners(graph: Graph, cluster: Cluster, B: int, names: Sequence[str],
                      budget: float) -> tuple[dict[str, Plan], dict[str, dict[str, Any]]]:
    """Run the seed planners in turn, each under ``min(SEED_MAX_SHARE * budget, seed time left)``
    with ``SEED_BUDGET_SHARE * budget`` for all of them.  A plan stopped by its time limit is
    dropped (it would make the result depend on the machine's speed); so is one that raises."""
    plans: dict[str, Plan] = {}
    info: dict[str, dict[str, Any]] = {}
    seed_deadline = time.perf_counter() + SEED_BUDGET_SHARE * budget
    for name in names:
        fn = seed_fn(name)
        if fn is None:
            info[name] = {"status": "missing"}
            continue
        left = min(SEED_MAX_SHARE * budget, seed_deadline - time.perf_counter())
        if left <= 0.05:
            info[name] = {"status": "skipped (seed time used up)"}
            continue
        t0 = time.perf_counter()
        try:
            p = fn(graph, cluster, B, time_limit=left)
            validate(p, graph, cluster)
        except Exception as exc:  # noqa: BLE001 — a seed planner must never break this one
            logger.info("seed planner %s skipped: %s: %s", name, type(exc).__name__, exc)
            info[name] = {"status": f"error: {type(exc).__name__}", "seconds": time.perf_counter() - t0,
                          "time_limit": left}
            continue
        if p.search.status == "time-limit":
            info[name] = {"status": "time-limit (dropped)", "seconds": time.perf_counter() - t0, "time_limit": left}
            continue
        plans[name] = p
        info[name] = {"status": p.search.status, "seconds": time.perf_counter() - t0, "time_limit": left,
                      "time_per_sample": p.predicted.time_per_sample,
                      "iteration_time": p.predicted.iteration_time}
    return plans, info
