"""The seed planners of ``plan_gpp``, each run with its natural (deterministic) algorithm.

The wall clock is only a safety stop: all seed planners together may run until
``SEED_SAFETY_SHARE * budget`` seconds after the first starts; each gets the time left until then
as its ``time_limit``.  A planner that reports ``time-limit`` (or raises, or is skipped, after that
stop passed) makes the run *cut*: ``plan_gpp`` then reports status ``time-limit``, because what
it returns now depends on the machine's speed.  A plan stopped by its own limit is still valid and
is kept as a candidate.  When nothing is cut, the seed plans do not depend on the machine's speed.
Every outcome is recorded (status, seconds, the limit it got).

A seed planner whose own memory model refuses the limit (``InfeasibleError``: PipeDream-2BW holds
two versions of the weights, where ``gpp``'s plans hold one) is run once more with
``RELAXED_MEMORY`` times the memory, before the stop. Its plan joins the seed plans when it is
valid at the limit after all (under the cost model's memory rule, which holds one version), else its
partition is a start of the local search only (``partitions``), where ``gpp``'s own model prices
it: a plan found with more memory is so found again at its own peak.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import Any

from gpp_solver._backend.progress import note
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

SEED_SAFETY_SHARE = 0.6  # all seed planners together: stopped after this share of the time limit
#: a seed planner that refuses the limit runs once more with this many times the memory (module docstring)
RELAXED_MEMORY = 2.0
#: the registered planners that take ``micro_batch_sizes``; a restriction is passed to them, and the
#: plan of any seed planner with a stage outside the allowed sizes is dropped
TAKES_MICRO_BATCH_SIZES = frozenset({"gpp", "graphpipe", "pipedream", "pipedream-2bw", "alpa", "milp", "exact"})
#: options that turn off a seed planner's own validation of its plan: ``run_seed_planners`` validates
#: every seed plan itself (and records how long that took), so checking twice only costs time (a
#: validation of a 5,000-operator plan takes seconds)
NO_SELF_VALIDATION = {"graphpipe": {"validate_plan": False}}
#: seed planners whose refusal states a memory at which they do return a plan that fits the cost
#: model's rule: GraphPipe's DP prices memory with that rule; PipeDream-2BW holds two versions of the
#: weights, more than the rule's one.  ``gpp``'s own "no plan" message takes the least of their
#: figures and its search's (``answer.exact_searches``)
STATES_SUFFICIENT_MEMORY = ("graphpipe", "pipedream-2bw")


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
) -> tuple[dict[str, Plan], dict[str, Plan], dict[str, dict[str, Any]], bool]:
    """Run the seed planners in turn under one safety stop ``SEED_SAFETY_SHARE * budget`` from now;
    ``micro_batch_sizes`` restricts every seed plan's stages to those sizes (passed to the planners
    that take it; a plan outside them is dropped and recorded).

    Returns the plans, the partitions of the planners that refused the limit and planned with
    ``RELAXED_MEMORY`` times it (starts only, module docstring), a record per planner and ``cut``:
    whether the safety stop was reached (a planner reported ``time-limit``, or raised or was skipped
    after the stop), so that the caller's result may depend on the machine's speed."""
    plans: dict[str, Plan] = {}
    partitions: dict[str, Plan] = {}
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
            p = fn(graph, cluster, B, time_limit=left, **opts, **NO_SELF_VALIDATION.get(name, {}))
            v0 = time.perf_counter()
            validate(p, graph, cluster)
            checked = time.perf_counter() - v0
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
            if isinstance(exc, InfeasibleError) and exc.required_memory_bytes is not None:
                info[name]["required_memory_bytes"] = exc.required_memory_bytes
            if isinstance(exc, InfeasibleError) and not late:
                relaxed, record, late = _relaxed(fn, graph, cluster, B, stop, opts, micro_batch_sizes)
                cut |= late
                info[name]["relaxed"] = record
                if relaxed is not None and _valid(relaxed, graph, cluster):  # fits after all: a seed plan
                    plans[name] = relaxed
                elif relaxed is not None:
                    partitions[name] = relaxed
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
            "validate_seconds": checked,
        }
    return plans, partitions, info, cut


def _valid(plan: Plan, graph: Graph, cluster: Cluster) -> bool:
    try:
        validate(plan, graph, cluster)
    except InvalidInputError:
        return False
    return True


def _relaxed(
    fn, graph: Graph, cluster: Cluster, B: int, stop: float, opts: dict, micro_batch_sizes
) -> tuple[Plan | None, dict[str, Any], bool]:
    """The seed planner ``fn`` once more, with ``RELAXED_MEMORY`` times the memory (module
    docstring): its plan (None if it has none), a record, and whether the safety stop was reached."""
    left = stop - time.perf_counter()
    record: dict[str, Any] = {"memory_bytes": cluster.memory_bytes * RELAXED_MEMORY}
    if left <= 0.0:
        record["status"] = "skipped (seed time used up)"
        return None, record, True
    t0 = time.perf_counter()
    try:
        p = fn(graph, replace(cluster, memory_bytes=cluster.memory_bytes * RELAXED_MEMORY), B, time_limit=left, **opts)
    except Exception as exc:  # noqa: BLE001 — as above
        record.update(status=f"error: {type(exc).__name__}", seconds=time.perf_counter() - t0)
        return None, record, time.perf_counter() > stop
    record.update(status=p.search.status, seconds=time.perf_counter() - t0)
    if not within_sizes(p, micro_batch_sizes):
        record["status"] = "dropped: micro-batch size not allowed"
        return None, record, False
    return p, record, p.search.status is Status.TIME_LIMIT
