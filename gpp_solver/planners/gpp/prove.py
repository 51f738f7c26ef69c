"""``prove_by_milp``: gpp's optional proof run of the exact planner (``milp``) on the same instance."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.gpp.plans import reschedule, uniform_micro_batch
from gpp_solver.planners.gpp.pool import Pool
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import Cluster, Graph, Status

logger = logging.getLogger(__name__)


def prove_by_milp(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    deadline: float,
    pool: Pool,
    micro_batch_sizes: Sequence[int] | None = None,
    schedule: str = "1f1b",
) -> tuple[float | None, bool]:
    """Run the exact planner (``milp``) if installed in the time left: its optimal TPS (or
    ``None``) and whether the wall clock cut it (no time left, or its status ``time-limit``)."""
    try:
        fn = get_planner("milp")
    except InvalidInputError:
        return None, False
    left = deadline - time.perf_counter()
    if left <= 0:
        return None, True
    try:
        p = fn(
            graph,
            cluster,
            mini_batch_size,
            time_limit=left,
            **({} if micro_batch_sizes is None else {"micro_batch_sizes": tuple(micro_batch_sizes)}),
        )
        validate(p, graph, cluster)
    except Exception as exc:  # noqa: BLE001
        logger.info("exact planner failed: %s: %s", type(exc).__name__, exc)
        return None, time.perf_counter() > deadline
    pool.add(reschedule(p, graph, cluster, schedule), {"origin": "milp", "micro_batch_size": uniform_micro_batch(p)})
    return (
        p.predicted.time_per_sample if p.search.status is Status.OPTIMAL_TIME_PER_SAMPLE else None
    ), p.search.status is Status.TIME_LIMIT
