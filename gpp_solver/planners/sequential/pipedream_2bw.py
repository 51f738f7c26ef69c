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

import numpy as np

from gpp_solver.planners.registry import parse_options
from gpp_solver.planners.sequential.options import PipeDream2BWOptions
from gpp_solver.cost.model import node_compute
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.plan.build import build_plan
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

OBJECTIVE = ("least simulated iteration time over chains of w equal-compute stages, each replicated d times, and "
             "micro-batch sizes b (PipeDream-2BW's space, enumerated)")
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.seq_eval import MARGIN, SequentialPricer, select_by_simulation
from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core

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
                       progress: bool = False, **options: Any) -> Plan:
    """Best ``(w, d, b)`` of PipeDream-2BW's space by simulated iteration time (module docstring).

    Every configuration is priced with numpy (:mod:`.seq_eval`: memory with two weight versions,
    a lower bound on the simulated iteration time); only those whose bound does not exceed the
    best simulated time found are built and simulated, so the answer is the exhaustive one.
    ``options`` are the fields of :class:`PipeDream2BWOptions`.
    """
    o = parse_options("pipedream-2bw", PipeDream2BWOptions, options)
    balance = o.balance
    t0 = _time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    B, K = mini_batch_size, cluster.devices
    core, inputs, sinks = pipedream_core(graph)
    core_set = set(core)
    order = [v for v in graph.topo_order if v in core_set]
    sizes = graph.micro_batch_sizes
    cap = cluster.memory_bytes
    pricer = SequentialPricer(graph, cluster, B, order, inputs, sinks)
    weights_at: dict[float, list[float]] = {}
    cuts_at: dict[tuple[float, int], list[int]] = {}
    configs: list[tuple[int, int, int]] = []
    lower: list[float] = []
    least_need = float("inf")
    enumerated, cut = 0, False
    for b in candidate_micro_batches(B, o.micro_batch_sizes):
        divisors = [d for d in range(1, b + 1) if b % d == 0]         # d | b: no loop over unusable devices
        for w in range(1, min(K, len(order)) + 1):
            if configs and deadline is not None and _time.perf_counter() > deadline:
                cut = True          # the configurations enumerated so far are the search space
                break
            for d in divisors:
                if d > K // w:
                    break
                x = b / d if balance == "compute" else 0.0
                cuts = cuts_at.get((x, w))
                if cuts is None:
                    weights = weights_at.get(x)
                    if weights is None:
                        weights = weights_at[x] = (
                            [node_compute(graph.node(v).fw_time, graph.node(v).bw_time, sizes, x)
                             for v in order] if balance == "compute" else [1.0] * len(order))
                    cuts = cuts_at[x, w] = equal_partition(weights, w)
                stage = np.repeat(np.arange(w), np.diff(cuts))
                enumerated += 1
                pr = pricer.price(stage, [tuple(range(i * d, (i + 1) * d)) for i in range(w)], b)
                need = float(np.max(pr.memory + pr.weights))
                least_need = min(least_need, need)
                if need > cap * (1 + MARGIN):
                    continue
                configs.append((b, w, d))
                lower.append(pr.lower_bound)
        if cut:
            break

    def build(i: int) -> Plan | None:
        b, w, d = configs[i]
        x = b / d if balance == "compute" else 0.0
        cuts = cuts_at[x, w]
        rows = [(order[cuts[s]:cuts[s + 1]], tuple(range(s * d, (s + 1) * d)), b) for s in range(w)]
        plan = build_plan(graph, cluster, attach_detached(graph, rows, inputs, sinks), B, planner="pipedream-2bw",
                          search=SearchInfo(0.0, Status.OPTIMAL_WITHIN_SEARCH_SPACE))
        need = max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                   for st in plan.stages)
        return plan if need <= cap else None

    built, complete = select_by_simulation(lower, build, deadline)
    complete = complete and not cut
    best: Plan | None = None
    best_key = None
    for i in sorted(built):                      # the exhaustive loop's rule, in its order
        b, w, d = configs[i]
        plan = built[i]
        key = (plan.predicted.iteration_time, w * d, w, b)
        if best_key is None or key < best_key:
            best, best_key = plan, key
    if best is None:
        raise InfeasibleError(
            f"pipedream-2bw: no (w, d, b) of graph '{graph.name}' fits {cap:.4g} bytes per device with two "
            f"weight versions on {K} devices (B={B}); the smallest configuration needs {least_need:.4g} bytes",
            required_memory_bytes=least_need)
    extra = {"w": len(best.stages), "d": best.stages[0].data_parallel, "balance": balance,
             "configurations": enumerated, "within_memory": len(configs), "simulated": len(built),
             "memory_model": "(osf + 1) * W + activations (two weight versions)",
             "weight_versions_bytes": max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                                          for st in best.stages),
             **{k: v for k, v in best.search.extra.items()}}
    status = Status.OPTIMAL_WITHIN_SEARCH_SPACE if complete else Status.TIME_LIMIT
    plan = replace(best, search=replace(best.search, seconds=_time.perf_counter() - t0, status=status, extra=extra,
                                        objective=OBJECTIVE))
    validate(plan, graph, cluster)
    return plan
