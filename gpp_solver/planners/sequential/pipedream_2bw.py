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

import heapq
import logging
import time as _time
from dataclasses import replace
from typing import Any

import numpy as np

from gpp_solver.planners.registry import parse_options
from gpp_solver.planners.sequential.options import PipeDream2BWOptions
from gpp_solver.cost.model import node_compute
from gpp_solver.errors import InfeasibleError
from gpp_solver.plan.build import build_plan
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

OBJECTIVE = ("least simulated iteration time over chains of w equal-compute stages, each replicated d times, and "
             "micro-batch sizes b (PipeDream-2BW's space, enumerated)")
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.equal_partition import equal_partition
from gpp_solver.planners.sequential.seq_eval import MARGIN, SequentialPricer
from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core

logger = logging.getLogger(__name__)


#: relative slack of the cheap bounds below the priced one (their sums are in another order)
_CHEAP_SLACK = 1e-9


def plan_pipedream_2bw(graph: Graph, cluster: Cluster, mini_batch_size: int, *, time_limit: float | None = None,
                       progress: bool = False, **options: Any) -> Plan:
    """Best ``(w, d, b)`` of PipeDream-2BW's space by simulated iteration time (module docstring).

    ``options`` are the fields of :class:`PipeDream2BWOptions`.

    **Lazy pricing.**  Every configuration is enumerated, but priced (:mod:`.seq_eval`: memory
    with two weight versions, a lower bound ``L`` on the simulated iteration time) only when it
    might be needed.  Two cheap bounds stand below ``L`` (``n = B // b`` micro-batches, ``c_s``
    the forward + backward time of stage ``s``'s core nodes at ``b / d`` samples, ``a`` the
    negative part of the detached nodes' times, 0 for real profiles; ``L >= n (fwd + bwd)(s)``
    and ``fwd + bwd >= c_s + a`` since transfers, all-reduce and the first forward's wait are
    non-negative):

    - ``L0 = max(n (sum_s c_s / w + a), P)``, from the graph's total alone (the largest stage is at
      least the mean one) and ``P``, the longest path of forward + backward times at ``b / d``
      through the operator graph when no time is negative: the first micro-batch's forward runs
      through the stages that hold the path in order, each stage's forward lasting at least its
      operators' sum, then its backward back through them (``P`` bounds the *simulated* time,
      not ``L``: see below);
    - ``L1 = max_s (n (c_s + a) + A_s)``, from the equal-compute cuts of ``(w, b / d)``, with
      ``A_s`` the all-reduce of stage ``s``'s core weights among its ``d`` replicas (``L`` adds
      ``max(all-reduce, backward wait) >= `` the all-reduce of all its weights, and the all-reduce
      grows with the weights, which are non-negative; with a negative weight ``A_s = 0``);

    each less a slack of ``1e-9 n sum |f| + |g|`` for its sums being rounded in another order.
    A heap holds every configuration at its best known bound, and is popped in increasing
    ``(bound, priced, index)`` order: a configuration at ``L0`` gets its cuts and ``L1`` (or is set
    aside unpriced when its stages' core nodes alone need more than the cap:
    ``(osf + 1) W + b / d * act``, one micro-batch in flight), one at ``L1`` is priced (a
    memory-infeasible one leaves), one at ``L`` is built and simulated, as
    :func:`.seq_eval.select_by_simulation` does, until the popped bound exceeds the best simulated
    time by the relative ``MARGIN``.

    A priced configuration waits in the heap at ``max(L, P)``.

    **Same answer as pricing everything.**  Every bound in the heap is at most its
    configuration's simulated iteration time (``L0``, ``L1`` and ``L`` are at most ``L``; ``P``
    bounds the simulation directly), and the search stops when the least bound left exceeds the
    best simulated time so far by ``MARGIN``: every configuration not built is slower than the
    best one built.  The pick is the argmin of ``(iteration_time, w * d, w, b)`` over the plans
    built (unique per configuration), so it is the argmin over the whole space — what the
    exhaustive ``select_by_simulation`` (which builds every configuration with
    ``L <= best * (1 + MARGIN)``, the argmin among them) returns; the lazy search builds at most
    those.  When no configuration fits, nothing stops the search early, every configuration is
    priced (those set aside too) and ``least_need`` is exact.

    **Time limit.**  After the deadline the search stops as soon as one plan is accepted (then
    ``search.status`` is ``time-limit`` and the plan the best built so far); if none was built
    yet, the priced memory-feasible configurations are built in increasing ``L`` (pricing goes
    on only while there are none), as the exhaustive loop built those it had enumerated.

    ``search.extra``: ``configurations`` (enumerated, the whole space), ``memory_checked`` (their
    exact memory computed: the stage graph's in-flight counts, no time figures), ``priced``
    (fully priced: those of them within memory), ``within_memory`` (priced and within memory with
    two weight versions, the same count; unpriced ones are not counted), ``set_aside_for_memory`` (over the cap by the cheap memory bound, unpriced),
    ``simulated`` (built and accepted).
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
    idx = graph.index
    core_idx = np.asarray([idx[v] for v in order], dtype=np.int64)
    det_idx = np.asarray([idx[v] for v in list(inputs) + list(sinks)], dtype=np.int64)

    # ---- enumeration (b, then w, then d ascending) and the cheapest bound
    configs: list[tuple[int, int, int]] = []
    for b in candidate_micro_batches(B, o.micro_batch_sizes):
        divisors = [d for d in range(1, b + 1) if b % d == 0]         # d | b: no loop over unusable devices
        for w in range(1, min(K, len(order)) + 1):
            for d in divisors:
                if d > K // w:
                    break
                configs.append((b, w, d))
    sums_at: dict[float, tuple[np.ndarray, float, float, float]] = {}

    def sums(x: float) -> tuple[np.ndarray, float, float, float]:
        """Core nodes' f + g at ``x``, their total, the detached nodes' negative part, the slack."""
        r = sums_at.get(x)
        if r is None:
            f, g = pricer.fw_bw_at(x)
            fg = (f + g)[core_idx]
            neg = float(np.minimum(f[det_idx], 0.0).sum() + np.minimum(g[det_idx], 0.0).sum())
            absum = float(np.abs(f).sum() + np.abs(g).sum())
            r = sums_at[x] = (fg, float(fg.sum()), neg, _CHEAP_SLACK * absum)
        return r

    topo = [idx[v] for v in graph.topo_order]
    topo_preds = [[idx[p] for p in graph.preds(v)] for v in graph.topo_order]
    path_at: dict[float, float] = {}

    def longest_path(x: float) -> float:
        """``P``: the longest path of f + g at ``x`` through the operator graph, less its slack (0
        when some time is negative)."""
        r = path_at.get(x)
        if r is None:
            f, g = pricer.fw_bw_at(x)
            r = 0.0
            if bool(np.all(f >= 0.0) and np.all(g >= 0.0)):
                fg = (f + g).tolist()
                end = [0.0] * len(fg)
                for v, ps in zip(topo, topo_preds):
                    end[v] = fg[v] + max((end[p] for p in ps), default=0.0)
                r = max(end) * (1.0 - _CHEAP_SLACK)
            path_at[x] = r
        return r

    heap: list[tuple[float, int, int]] = []
    for i, (b, w, d) in enumerate(configs):
        _, total, neg, slack = sums(b / d)
        n = B // b
        heap.append((max(n * (total / w + neg) - n * slack, longest_path(b / d)), 0, i))
    heapq.heapify(heap)
    level = [0] * len(configs)                   # 0: at L0, 1: at L1, 2: priced (at L), 3: built
    ready: list[tuple[float, int, int]] = []     # the priced ones, for the time limit's last resort

    weights_at: dict[float, list[float]] = {}
    cuts_at: dict[tuple[float, int], list[int]] = {}

    def cuts_of(b: int, w: int, d: int) -> list[int]:
        x = b / d if balance == "compute" else 0.0
        cuts = cuts_at.get((x, w))
        if cuts is None:
            weights = weights_at.get(x)
            if weights is None:
                weights = weights_at[x] = (
                    [node_compute(graph.node(v).fw_time, graph.node(v).bw_time, sizes, x, pricer.terms.node_overhead)
                     for v in order] if balance == "compute" else [1.0] * len(order))
            cuts = cuts_at[x, w] = equal_partition(weights, w)
        return cuts

    def build(i: int) -> Plan | None:
        b, w, d = configs[i]
        cuts = cuts_of(b, w, d)
        rows = [(order[cuts[s]:cuts[s + 1]], tuple(range(s * d, (s + 1) * d)), b) for s in range(w)]
        plan = build_plan(graph, cluster, attach_detached(graph, rows, inputs, sinks), B, planner="pipedream-2bw",
                          search=SearchInfo(0.0, Status.OPTIMAL_WITHIN_SEARCH_SPACE))
        need = max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                   for st in plan.stages)
        return plan if need <= cap else None

    layouts: dict[tuple[int, int], list[tuple[int, ...]]] = {}

    def layout(w: int, d: int) -> list[tuple[int, ...]]:
        """Stage ``s`` on devices ``[s d, (s + 1) d)``."""
        lay = layouts.get((w, d))
        if lay is None:
            lay = layouts[w, d] = [tuple(range(s * d, (s + 1) * d)) for s in range(w)]
        return lay

    def price_need(i: int) -> tuple[float | None, float]:
        """Configuration ``i``'s memory need (two weight versions) and, when it fits, its bound
        ``L`` (``None`` when over the cap: the time figures are not computed)."""
        nonlocal priced, memory_checked, least_need
        b, w, d = configs[i]
        cuts = cuts_of(b, w, d)
        stage = np.repeat(np.arange(w), np.diff(cuts))
        mem, W = pricer.memory(stage, layout(w, d), b)
        memory_checked += 1
        need = float(np.max(mem + W))
        least_need = min(least_need, need)
        if need > cap * (1 + MARGIN):
            return None, need
        priced += 1
        return pricer.price(stage, layout(w, d), b).lower_bound, need

    # memory: a stage needs at least (osf + 1) W + b / d * act of its core nodes (one micro-batch
    # in flight; detached nodes only add), so a configuration over the cap by that is set aside
    # unpriced (and priced only if nothing fits, for ``least_need``)
    t = pricer.tables
    osf = cluster.optimizer_state_factor
    core_weight, core_act = t.weight[core_idx], t.activation[core_idx]
    mem_filter = bool(np.all(t.weight >= 0.0) and np.all(t.activation >= 0.0) and osf >= 0.0)
    ar_filter = bool(np.all(t.weight >= 0.0))
    aside: list[int] = []
    built: dict[int, Plan] = {}
    best_time = float("inf")
    least_need = float("inf")
    priced = within = memory_checked = 0
    complete = True
    while heap:
        bound, _, i = heap[0]
        if bound > best_time * (1.0 + MARGIN):
            break                                # every configuration left has L >= bound
        if deadline is not None and _time.perf_counter() > deadline:
            complete = False
            if best_time < float("inf"):
                break
            while ready and level[ready[0][2]] == 3:
                heapq.heappop(ready)             # built already
            if ready:                            # no plan yet: build the priced one of least bound now
                e = heapq.heappop(ready)
                level[e[2]] = 3                  # its entry in the heap is skipped when popped
                plan = build(e[2])
                if plan is not None:
                    built[e[2]] = plan
                    best_time = plan.predicted.iteration_time
                continue
        heapq.heappop(heap)
        b, w, d = configs[i]
        if level[i] == 3:
            continue
        if level[i] == 0:                        # L0 -> L1, or set aside for memory
            cuts = cuts_of(b, w, d)
            if mem_filter:
                starts = cuts[:-1]
                wc = np.add.reduceat(core_weight, starts)
                ac = np.add.reduceat(core_act, starts)
                if float(np.max((osf + 1.0) * wc + b / d * ac)) * (1.0 - _CHEAP_SLACK) > cap * (1 + MARGIN):
                    aside.append(i)
                    continue
            fg, _, neg, slack = sums(b / d)
            n = B // b
            per = n * (np.add.reduceat(fg, cuts[:-1]) + neg)
            if ar_filter and d > 1:
                ar = pricer.terms.tail(np.add.reduceat(core_weight, cuts[:-1]), np.full(w, float(d)),
                                       pricer.stage_bandwidths(layout(w, d)))
                l1 = float(np.max(per + ar)) - _CHEAP_SLACK * float(np.max(ar))
            else:
                l1 = float(np.max(per))
            level[i] = 1
            heapq.heappush(heap, (max(bound, l1 - n * slack), 0, i))
        elif level[i] == 1:                      # L1 -> L (priced), or out for memory
            lower, need = price_need(i)
            level[i] = 2
            if lower is None:
                continue
            within += 1
            entry = (max(lower, longest_path(b / d)), 1, i)
            heapq.heappush(heap, entry)
            heapq.heappush(ready, entry)
        else:                                    # the next configuration by (L, index): build it
            level[i] = 3
            plan = build(i)
            if plan is not None:
                built[i] = plan
                best_time = min(best_time, plan.predicted.iteration_time)

    best: Plan | None = None
    best_key = None
    for i in sorted(built):                      # the exhaustive loop's rule, in its order
        b, w, d = configs[i]
        plan = built[i]
        key = (plan.predicted.iteration_time, w * d, w, b)
        if best_key is None or key < best_key:
            best, best_key = plan, key
    if best is None:
        for i in aside:                          # nothing fits: the least need over the whole space
            price_need(i)
        raise InfeasibleError(
            f"pipedream-2bw: no (w, d, b) of graph '{graph.name}' fits {cap:.4g} bytes per device with two "
            f"weight versions on {K} devices (B={B}); the smallest configuration needs {least_need:.4g} bytes",
            required_memory_bytes=least_need)
    extra = {"w": len(best.stages), "d": best.stages[0].data_parallel, "balance": balance,
             "configurations": len(configs), "memory_checked": memory_checked, "priced": priced, "within_memory": within,
             "set_aside_for_memory": len(aside), "simulated": len(built),
             "memory_model": "(osf + 1) * W + activations (two weight versions)",
             "weight_versions_bytes": max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes)
                                          for st in best.stages),
             **{k: v for k, v in best.search.extra.items()}}
    status = Status.OPTIMAL_WITHIN_SEARCH_SPACE if complete else Status.TIME_LIMIT
    plan = replace(best, search=replace(best.search, seconds=_time.perf_counter() - t0, status=status, extra=extra,
                                        objective=OBJECTIVE))
    validate(plan, graph, cluster)
    return plan
