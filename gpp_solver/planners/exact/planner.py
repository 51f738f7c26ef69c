"""``plan_exact``: the plan of least simulated iteration time over all convex partitions (small graphs).

The space is the MILP's (``planners/milp/space.py``: convex stages, acyclic stage graph, one
micro-batch size, data-parallel degrees dividing it, contiguous device ranges, 1F1B orders); the
objective is the simulated iteration time of ``docs/cost-model.md`` — what users care about,
where ``milp`` optimises the bottleneck time-per-sample.  The search is
:func:`gpp_solver.planners.exact.search.search_exact` (enumeration with the ``B * TPS`` lower bound).

Statuses: :data:`STATUS_OPTIMAL` when the enumeration finished (no plan of the space that fits
has a lower simulated iteration time), ``time-limit`` when the deadline stopped it (the best plan
found is returned).  Nothing fits: :class:`InfeasibleError` with the least memory per device that
admits a plan of the space (rounded up to whole bytes).  Deadline before any plan:
:class:`TimeLimitError`.  Too large: :class:`SearchSpaceTooLargeError` (limits in ``search.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpp_solver.errors import InfeasibleError, InvalidInputError, SearchSpaceTooLargeError, SolverError, TimeLimitError
from gpp_solver.formats.cluster import as_cluster
from gpp_solver.formats.graph import as_graph
from gpp_solver.plan.build import build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.exact.search import ExactResult, search_exact
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

STATUS_OPTIMAL = Status.OPTIMAL_ITERATION_TIME
"""Status of a plan proven to have the least simulated iteration time of the space."""
STATUS_TIME_LIMIT = Status.TIME_LIMIT


def result_info(r: ExactResult) -> dict[str, Any]:
    """The search's figures for ``search.extra``."""
    return {
        "objective": "simulated iteration time",
        "finished": r.finished,
        "partitions": r.partitions,
        "pairs": r.pairs,
        "pairs_searched": r.pairs_searched,
        "simulated": r.simulated,
        "usable_devices": r.usable_devices,
        "enumeration_seconds": round(r.seconds, 6),
    }


def plan_from_result(
    graph: Graph, cluster: Cluster, mini_batch_size: int, r: ExactResult, *, planner: str = "exact"
) -> Plan:
    """The full plan of ``r.best``, checked against the simulated time the search found."""
    B = mini_batch_size  # the paper's B
    assert r.best is not None
    plan = build_plan(
        graph,
        cluster,
        r.best.specs(),
        B,
        planner=planner,
        search=SearchInfo(r.seconds, STATUS_OPTIMAL if r.finished else STATUS_TIME_LIMIT),
    )
    if not math.isclose(plan.predicted.iteration_time, r.iteration_time, rel_tol=1e-9):
        raise SolverError(
            f"exact: the built plan's iteration time {plan.predicted.iteration_time:.12g} differs "
            f"from the searched {r.iteration_time:.12g}"
        )
    return plan


def plan_exact(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    micro_batch_sizes: Sequence[int] | None = None,
    max_stages: int | None = None,
    **options: Any,
) -> Plan:
    """The plan of least simulated iteration time (module docstring); ``time_limit`` in seconds
    (``None``: no limit, the size limits bound the work)."""
    t0 = time.perf_counter()
    graph, cluster = as_graph(graph), as_cluster(cluster)
    if options:
        raise InvalidInputError(
            f"planner 'exact' has no option {', '.join(map(repr, sorted(options)))}; "
            "its options: max_stages, micro_batch_sizes"
        )
    B = mini_batch_size
    if not isinstance(B, int) or isinstance(B, bool) or B < 1:
        raise InvalidInputError(f"mini_batch_size must be a positive integer, got {B!r}")
    if time_limit is not None and (
        isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0
    ):
        raise InvalidInputError(f"exact: `time_limit > 0` must hold, but got (time_limit={time_limit!r})")
    if max_stages is not None and (not isinstance(max_stages, int) or isinstance(max_stages, bool) or max_stages < 1):
        raise InvalidInputError(f"exact: max_stages must be a positive integer, got {max_stages!r}")
    deadline = None if time_limit is None else t0 + time_limit
    r = search_exact(graph, cluster, B, deadline=deadline, micro_batch_sizes=micro_batch_sizes, max_stages=max_stages)
    if r.best is None:
        if not r.finished:
            raise TimeLimitError(f"exact: time limit ({time_limit} s) reached before any plan was found")
        if r.required_memory is None:
            raise InfeasibleError(f"exact: no plan of the space fits on {cluster.devices} devices")
        need = math.ceil(r.required_memory)
        raise InfeasibleError(
            f"exact: no plan fits in {cluster.memory_bytes:.6g} bytes per device; "
            f"it needs at least {need} bytes per device",
            required_memory_bytes=need,
        )
    plan = plan_from_result(graph, cluster, B, r)
    status = STATUS_OPTIMAL if r.finished else STATUS_TIME_LIMIT
    plan = replace(
        plan,
        search=replace(
            plan.search,
            seconds=time.perf_counter() - t0,
            status=status,
            extra={**dict(plan.search.extra), **result_info(r), "micro_batch_size": r.best.micro_batch_size},
        ),
    )
    validate(plan, graph, cluster)
    return plan


# --------------------------------------------------------------------------------------------
# for ``gpp``: run the exact search on graphs small enough, within gpp's deadline

GPP_MAX_NODES = 10
"""``gpp`` runs the exact search by itself (``exact=None``) on graphs of at most this many nodes ..."""
GPP_MAX_DEVICES = 8
"""... with at most this many usable devices (``min(devices, nodes * B)``) ..."""
GPP_MAX_MICRO_BATCHES = 256
"""... and ``B`` at most this (every power-of-two ``b`` then keeps ``B / b`` micro-batches at most this)."""


@dataclass(frozen=True)
class ExactOutcome:
    """What :func:`exact_for_gpp` found: ``plan`` (planner ``gpp``) when it beats ``upper_bound``;
    ``optimum`` the proven least iteration time of the space (``None`` unless the search finished:
    then no plan of the space that fits is faster); ``cut`` whether the deadline stopped it."""

    plan: Plan | None
    optimum: float | None
    cut: bool
    info: Mapping[str, Any]


def exact_for_gpp(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    deadline: float,
    upper_bound: float,
    micro_batch_sizes: Sequence[int] | None = None,
    force: bool = False,
) -> ExactOutcome:
    """The exact search when the instance is small (``GPP_MAX_*``; ``force``: up to the exact
    search's own limits), pruned with ``upper_bound`` (the best iteration time ``gpp`` has)."""
    B = mini_batch_size  # the paper's B
    usable = min(cluster.devices, len(graph.nodes) * B)
    small = len(graph.nodes) <= GPP_MAX_NODES and usable <= GPP_MAX_DEVICES and B <= GPP_MAX_MICRO_BATCHES
    if not (small or force):
        return ExactOutcome(None, None, False, {"status": "skipped", "reason": "instance above gpp's exact limits"})
    if time.perf_counter() >= deadline:
        return ExactOutcome(None, None, True, {"status": "skipped", "reason": "no time left"})
    try:
        r = search_exact(
            graph, cluster, B, deadline=deadline, micro_batch_sizes=micro_batch_sizes, upper_bound=upper_bound
        )
    except SearchSpaceTooLargeError as exc:
        return ExactOutcome(None, None, False, {"status": "skipped", "reason": str(exc)})
    plan = plan_from_result(graph, cluster, B, r, planner="gpp") if r.best is not None else None
    optimum = r.iteration_time if r.finished and not math.isinf(r.iteration_time) else None
    info = {
        "status": STATUS_OPTIMAL if r.finished else STATUS_TIME_LIMIT,
        "improved": plan is not None,
        **result_info(r),
    }
    return ExactOutcome(plan, optimum, not r.finished, info)
