"""PipeDream-2BW (Narayanan et al., ICML'21): the sequential baseline GraphPipe measured against.

Search space, enumerated exhaustively (so the status is ``optimal-within-search-space``):

- the nodes in the graph's topological order (PipeDream's pre-processing: ``Input`` sources and
  ``__getitem__`` sinks are placed with their consumer / producer afterwards, see
  :mod:`.sequential`) are cut into ``w`` contiguous stages of **equal compute** (forward + backward
  at the stage's per-replica micro-batch; cut where the running sum is nearest to ``i/w`` of the
  total).  2BW itself splits a model of identical transformer blocks into equal block counts,
  which is the same thing for such models; ``balance="layers"`` cuts by node count instead;
- every stage is replicated ``d`` times (``w * d <= K``, ``b % d == 0``), stage ``i`` on devices
  ``[i d, (i + 1) d)``;
- the micro-batch size ``b`` is one of the powers of two dividing ``B`` (or ``micro_batch_sizes``).

Schedule: 1F1B (2BW's schedule is 1F1B with double-buffered weight updates), so activations are the
shared model's.  **Memory**: 2BW keeps two versions of the weights (the version being updated and
the one older in-flight micro-batches still use), so beyond the shared model's
``optimizer_state_factor * W`` (weights + gradients + optimizer state) a stage needs one more copy
of its weights: ``M = (osf + 1) * W + in_flight / d * activations``.  ``build_plan`` and the
validator know only the shared formula, so this planner checks the extra ``W`` itself before it
accepts a configuration (and reports it in ``search.extra["weight_versions_bytes"]``).

Among the valid ``(w, d, b)`` the one with the smallest simulated iteration time wins (ties: fewer
devices, then fewer stages, then smaller ``b``): ``search.objective`` says so.
"""

from __future__ import annotations

import logging
import time as _time
from dataclasses import replace
from typing import Any

from gpp_solver.errors import InfeasibleError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import parse_options
from gpp_solver.planners.sequential.options import PipeDream2BWOptions
from gpp_solver.planners.sequential.pipedream_2bw_search import LazySearch
from gpp_solver.types import Cluster, Graph, Plan, Status

OBJECTIVE = (
    "least simulated iteration time over chains of w equal-compute stages, each replicated d times, and "
    "micro-batch sizes b (PipeDream-2BW's space, enumerated)"
)

logger = logging.getLogger(__name__)


def plan_pipedream_2bw(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """Best ``(w, d, b)`` of PipeDream-2BW's space by simulated iteration time (module docstring).

    ``options`` are the fields of :class:`PipeDream2BWOptions`.

    The search is :class:`.pipedream_2bw_search.LazySearch` (its docstring: lazy pricing, why the
    answer is that of pricing everything, the time limit).  ``search.extra``: ``configurations``
    (enumerated, the whole space), ``memory_checked`` (their exact memory computed: the stage
    graph's in-flight counts, no time figures), ``priced`` (fully priced: those of them within
    memory), ``within_memory`` (priced and within memory with two weight versions, the same count;
    unpriced ones are not counted), ``set_aside_for_memory`` (over the cap by the cheap memory
    bound, unpriced), ``simulated`` (built and accepted).
    """
    o = parse_options("pipedream-2bw", PipeDream2BWOptions, options)
    t0 = _time.perf_counter()
    search = LazySearch(graph, cluster, mini_batch_size, o, None if time_limit is None else t0 + time_limit)
    search.run()
    best = search.pick()
    if best is None:
        search.price_set_aside()  # nothing fits: the least need over the whole space
        raise InfeasibleError(
            f"pipedream-2bw: no (w, d, b) of graph '{graph.name}' fits {search.cap:.4g} bytes per device with two "
            f"weight versions on {cluster.devices} devices (B={mini_batch_size}); the smallest configuration needs "
            f"{search.least_need:.4g} bytes",
            required_memory_bytes=search.least_need,
        )
    extra = {
        "w": len(best.stages),
        "d": best.stages[0].data_parallel,
        "balance": o.balance,
        "configurations": len(search.configs),
        "memory_checked": search.memory_checked,
        "priced": search.priced,
        "within_memory": search.within,
        "set_aside_for_memory": len(search.aside),
        "simulated": len(search.built),
        "memory_model": "(osf + 1) * W + activations (two weight versions)",
        "weight_versions_bytes": max(
            st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes) for st in best.stages
        ),
        **{k: v for k, v in best.search.extra.items()},
    }
    status = Status.OPTIMAL_WITHIN_SEARCH_SPACE if search.complete else Status.TIME_LIMIT
    plan = replace(
        best,
        search=replace(best.search, seconds=_time.perf_counter() - t0, status=status, extra=extra, objective=OBJECTIVE),
    )
    validate(plan, graph, cluster)
    return plan
