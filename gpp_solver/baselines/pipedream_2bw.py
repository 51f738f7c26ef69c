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
devices, then fewer stages, then smaller ``b``).
"""

from __future__ import annotations

import logging
import time as _time
from dataclasses import replace
from typing import Any

import numpy as np

from ..cost import interp_time
from ..errors import InfeasibleError, InvalidInputError
from ..plan_build import build_plan
from ..types import Cluster, Graph, Plan, SearchInfo
from ..validate import validate
from .sequential import attach_detached, candidate_micro_batches, pipedream_core

logger = logging.getLogger(__name__)


def equal_partition(weights: list[float], w: int) -> list[int]:
    """Cut points ``0 = c_0 < c_1 < ... < c_w = n`` so every part has one or more items and part
    sums are near ``total / w`` (each cut at the prefix sum nearest to ``i * total / w``)."""
    n = len(weights)
    if not 1 <= w <= n:
        raise InvalidInputError(f"`1 <= w <= number of nodes` must hold, but got (w={w}, nodes={n})")
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    total = prefix[-1]
    cuts = [0]
    for i in range(1, w):
        lo, hi = cuts[-1] + 1, n - (w - i)        # leave one item for each later part
        target = total * i / w
        cand = np.arange(lo, hi + 1)
        cuts.append(int(cand[np.argmin(np.abs(prefix[cand] - target))]))
    cuts.append(n)
    return cuts


def plan_pipedream_2bw(graph: Graph, cluster: Cluster, mini_batch_size: int, *, time_limit: float | None = None,
                       progress: bool = False, balance: str = "compute", **options: Any) -> Plan:
    """Best ``(w, d, b)`` of PipeDream-2BW's space by simulated iteration time (module docstring)."""
    t0 = _time.perf_counter()
    if balance not in ("compute", "layers"):
        raise InvalidInputError(f"balance must be 'compute' or 'layers', got {balance!r}")
    B, K = mini_batch_size, cluster.devices
    core, inputs, sinks = pipedream_core(graph)
    order = [v for v in graph.topo_order if v in set(core)]
    sizes = graph.micro_batch_sizes
    osf, cap = cluster.optimizer_state_factor, cluster.memory_bytes
    best: Plan | None = None
    best_key = None
    least_need = float("inf")
    tried = 0
    timed_out = False
    for b in candidate_micro_batches(B, options.get("micro_batch_sizes")):
        for w in range(1, min(K, len(order)) + 1):
            for d in range(1, K // w + 1):
                if b % d:
                    continue
                if time_limit is not None and _time.perf_counter() - t0 > time_limit and best is not None:
                    timed_out = True
                    break
                x = b / d
                if balance == "compute":
                    weights = [interp_time(graph.node(v).fw_time, sizes, x) + interp_time(graph.node(v).bw_time, sizes, x)
                               for v in order]
                else:
                    weights = [1.0] * len(order)
                cuts = equal_partition(weights, w)
                rows = [(order[cuts[i]:cuts[i + 1]], tuple(range(i * d, (i + 1) * d)), b) for i in range(w)]
                specs = attach_detached(graph, rows, inputs, sinks)
                plan = build_plan(graph, cluster, specs, B, planner="pipedream-2bw",
                                  search=SearchInfo(0.0, "optimal-within-search-space"))
                tried += 1
                need = max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                           for st in plan.stages)
                least_need = min(least_need, need)
                if need > cap:
                    continue
                key = (plan.predicted.iteration_time, w * d, w, b)
                if best_key is None or key < best_key:
                    best, best_key = plan, key
    if best is None:
        raise InfeasibleError(
            f"pipedream-2bw: no (w, d, b) of graph '{graph.name}' fits {cap:.4g} bytes per device with two "
            f"weight versions on {K} devices (B={B}); the smallest configuration needs {least_need:.4g} bytes",
            required_memory_bytes=least_need)
    extra = {"w": len(best.stages), "d": best.stages[0].data_parallel, "balance": balance,
             "configurations": tried, "memory_model": "(osf + 1) * W + activations (two weight versions)",
             "weight_versions_bytes": max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                                          for st in best.stages),
             **{k: v for k, v in best.search.extra.items()}}
    status = "time-limit" if timed_out else "optimal-within-search-space"
    plan = replace(best, search=SearchInfo(_time.perf_counter() - t0, status, extra=extra))
    validate(plan, graph, cluster)
    return plan
