"""The GraphPipe planner: SP tree -> binary search on TPS (DP probes) -> plan (GraphPipe §5-§6).

``solve(graph, budget, **options)`` is the Python entry point; ``plan_graphpipe(graph, cluster,
mini_batch_size, ...)`` is the same behind the planner protocol of :mod:`gpp_solver.planners`.

Steps: decompose the graph into a series-parallel tree (:mod:`gpp_solver.sp_tree`; non-SP graphs
are SP-ized by adding dependencies); for every micro-batch size find the smallest bottleneck TPS
the stage DP reaches (:mod:`gpp_solver.binary_search`, :mod:`gpp_solver.dp`); keep the size whose
plan has the smallest iteration-time estimate; give every stage a contiguous device range
(:func:`gpp_solver.dp.assign_devices`); let ``plan_build`` derive stage edges, Algorithm 2 in-flight
counts, kFkB orders and the cost model's exact figures; validate.

Options: ``mini_batch_size`` (default: 16 samples per device, GraphPipe A.2's MMT setting),
``micro_batch_sizes`` (default: powers of two dividing it), ``search_k`` (each stage's kFkB ``k``
from ``K_OPTIONS`` by A.1's rule ``argmin_k max_y ComputeInFlight``, applied by Algorithm 2 in
``plan_build``; TPS does not depend on ``k`` in the cost model and ``k = 1`` is among the options,
so the DP's memory check at ``k = 1`` stays an upper bound), ``per_stage_micro_batch`` (each
stage its own micro-batch size from ``micro_batch_sizes`` — and with ``search_k`` its own ``k`` — by
the DP of :mod:`gpp_solver.dp_general`, whose state carries the successor side's schedule
configuration; its in-flight figures are Algorithm 2 on the SP stage order, an upper bound of
``plan_build``'s; status ``optimal-within-search-space`` only when the DP's bottleneck equals the
plan's exact TPS, else ``feasible``), ``degree_options``
(data-parallel degrees, default powers of two), ``time_limit`` (seconds), ``progress`` (``None``:
a tqdm bar on stderr when it is a terminal and the search runs over a second; ``False``: never).

``search.status`` is ``optimal-within-search-space`` when every micro-batch size was searched to
the end (the bottleneck TPS is then the smallest the DP's search space holds, measured with its
conservative stage estimates; the plan's exact TPS is at most that), ``time-limit`` otherwise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Sequence

from .micro_batch import check_micro_batch_sizes
from .progress import ProgressBar
from .binary_search import TpsSearch, sweep
from .cluster import as_cluster
from .cost import iteration_time_estimate, stage_costs
from .dp import DPStage, StageDP, assign_devices
from .errors import GppError, InfeasibleError, InvalidInputError
from .graph import as_graph
from .plan_build import StageSpec, build_plan, stage_graph_edges
from .sp_tree import decompose
from .types import Cluster, Graph, Plan, SearchInfo
from .validate import validate

logger = logging.getLogger(__name__)

PLANNER = "graphpipe"
SAMPLES_PER_DEVICE = 16


K_OPTIONS = (1, 2, 4, 8)


def _specs(stages: Sequence[DPStage], b: int, devices_per_node: int | None, k: int | None = 1) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [StageSpec(nodes=s.nodes, devices=d, micro_batch_size=b, k=k) for s, d in zip(stages, devs)]


def _estimate(graph: Graph, cluster: Cluster, specs: Sequence[StageSpec], B: int) -> float:
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    costs = stage_costs(graph, cluster, specs, B)
    return iteration_time_estimate(costs, stage_graph_edges(graph, stage_of), B)


def spend_leftover_devices(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int,
                           degree_options: Sequence[int]) -> tuple[DPStage, ...]:
    """Give devices the DP left unused to stages, greedily, while the iteration estimate improves.

    The DP stops at the fewest devices that reach the optimal bottleneck; the rest would idle.  A
    step raises one stage's degree to the next allowed one (``b % d == 0``) when enough devices are
    free, and keeps the step that lowers the cost model's iteration estimate most, provided the
    plan's exact bottleneck TPS does not rise.  A larger degree only lowers a stage's activation
    memory (the stage graph, hence the in-flight counts, are unchanged), so memory stays within
    the limit; the plan's TPS stays at most the DP's target.
    """
    cur = tuple(stages)
    opts = sorted(d for d in degree_options if b % d == 0)
    free = cluster.devices - sum(s.degree for s in cur)
    best = _estimate(graph, cluster, _specs(cur, b, cluster.devices_per_node), B)
    tps0 = max(c.time_per_sample for c in stage_costs(graph, cluster, _specs(cur, b, cluster.devices_per_node), B))
    while free > 0:
        step = None
        for i, st in enumerate(cur):
            bigger = [d for d in opts if d > st.degree and d - st.degree <= free]
            if not bigger:
                continue
            trial = cur[:i] + (replace(st, degree=bigger[0]),) + cur[i + 1:]
            specs = _specs(trial, b, cluster.devices_per_node)
            tps = max(c.time_per_sample for c in stage_costs(graph, cluster, specs, B))
            est = _estimate(graph, cluster, specs, B)
            if est < best * (1 - 1e-12) and tps <= tps0 * (1 + 1e-12) and (step is None or est < step[0]):
                step = (est, trial, bigger[0] - st.degree)
        if step is None:
            break
        best, cur, used = step
        free -= used
    return cur


class _Progress(ProgressBar):
    """GraphPipe's DP passes (one bar; see :mod:`gpp_solver.progress`)."""

    def __init__(self, total: int | None, enabled: bool | None) -> None:
        super().__init__(total, "graphpipe: DP passes", "pass", enabled)

    def step(self, active: int) -> None:
        self.set_postfix_str(f"{active} micro-batch sizes open")
        self.update(1)


def plan_graphpipe(graph: Graph, cluster: Cluster, mini_batch_size: int, *, time_limit: float | None = None,
                   progress: bool | None = None, micro_batch_sizes: Sequence[int] | None = None,
                   per_stage_micro_batch: bool = False, search_k: bool = False,
                   degree_options: Sequence[int] | None = None, validate_plan: bool = True) -> Plan:
    """Plan ``graph`` on ``cluster`` for mini-batch ``mini_batch_size`` (see the module docstring)."""
    t0 = time.perf_counter()
    B = mini_batch_size
    if not isinstance(B, int) or isinstance(B, bool) or B < 1:
        raise InvalidInputError(f"mini_batch_size must be a positive integer, got {B!r}")
    sizes = check_micro_batch_sizes(B, micro_batch_sizes)
    if time_limit is not None and time_limit <= 0:
        raise InvalidInputError(f"time_limit must be positive, got {time_limit!r}")
    deadline = None if time_limit is None else t0 + time_limit
    dec = decompose(graph)
    if dec.forced_cuts:
        logger.info("graph '%s' is not series-parallel: %d series cuts forced, %d dependencies added",
                    graph.name, len(dec.forced_cuts), dec.added_pairs)
    if per_stage_micro_batch:
        plan = _plan_per_stage(graph, cluster, B, dec, sizes, search_k, degree_options, deadline)
        plan = replace(plan, search=replace(plan.search, seconds=time.perf_counter() - t0))
        if validate_plan:
            validate(plan, graph, cluster)
        return plan
    dp = StageDP(graph, cluster, B, decomposition=dec, degree_options=degree_options)

    def score(res: TpsSearch) -> float:
        return _estimate(graph, cluster, _specs(res.stages, res.b, cluster.devices_per_node), B)

    bar = _Progress(None, progress)
    try:
        sw = sweep(dp, sizes, score, deadline=deadline, on_pass=bar.step)
    finally:
        bar.close()
    if sw.best is None:
        raise _infeasible(dp, sizes, cluster)
    best = sw.best
    status = "time-limit" if sw.timed_out else "optimal-within-search-space"
    extra = {"micro_batch_size": best.b, "dp_time_per_sample": best.tps, "dp_runs": sw.probes,
             "micro_batch_sizes_searched": list(sw.tried), "micro_batch_sizes_infeasible": list(sw.infeasible), "sp_added_dependencies": dec.added_pairs,
             "objective": "min bottleneck TPS per micro-batch size (DP estimate), then min iteration estimate"}
    stages, b_final = best.stages, best.b
    if sum(st.degree for st in stages) < cluster.devices:
        stages = spend_leftover_devices(graph, cluster, stages, best.b, B, dp.degree_options)
    if dp.placement_sensitive and not sw.timed_out:
        stages, b_final = _reprice_optimistic(graph, cluster, B, dec, dp, sw, stages, deadline, extra)
    if b_final != best.b:
        extra["micro_batch_size"] = b_final
    specs = _specs(stages, b_final, cluster.devices_per_node, None if search_k else 1)
    plan = build_plan(graph, cluster, specs, B, planner=PLANNER,
                      search=SearchInfo(seconds=0.0, status=status, epsilon=None, extra=extra),
                      k_options=K_OPTIONS if search_k else (1,))
    if plan.predicted.time_per_sample > best.tps * (1 + 1e-9) + 1e-15:
        logger.warning("plan TPS %.9g exceeds the DP's target %.9g: the DP estimate is not an upper bound here",
                       plan.predicted.time_per_sample, best.tps)
    plan = replace(plan, search=replace(plan.search, seconds=time.perf_counter() - t0))
    if validate_plan:
        validate(plan, graph, cluster)
    return plan


def _per_stage_specs(stages: Sequence[Any], devices_per_node: int | None) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [StageSpec(nodes=s.nodes, devices=d, micro_batch_size=s.micro_batch_size, k=s.k)
            for s, d in zip(stages, devs)]


def _spend_leftover_per_stage(graph: Graph, cluster: Cluster, stages: tuple, B: int, opts: Sequence[int]) -> tuple:
    """:func:`spend_leftover_devices` with each stage's own ``b``: raise one degree at a time
    (``b % d == 0``) while the iteration estimate improves and the exact TPS does not rise."""
    dpn = cluster.devices_per_node
    free = cluster.devices - sum(s.degree for s in stages)
    specs = _per_stage_specs(stages, dpn)
    best_est = _estimate(graph, cluster, specs, B)
    tps0 = max(c.time_per_sample for c in stage_costs(graph, cluster, specs, B))
    while free > 0:
        step = None
        for i, st in enumerate(stages):
            bigger = [d for d in opts if d > st.degree and d - st.degree <= free and st.micro_batch_size % d == 0]
            if not bigger:
                continue
            trial = stages[:i] + (replace(st, degree=bigger[0]),) + stages[i + 1:]
            tspecs = _per_stage_specs(trial, dpn)
            tps = max(c.time_per_sample for c in stage_costs(graph, cluster, tspecs, B))
            est = _estimate(graph, cluster, tspecs, B)
            if est < best_est * (1 - 1e-12) and tps <= tps0 * (1 + 1e-12) and (step is None or est < step[0]):
                step = (est, trial, bigger[0] - st.degree)
        if step is None:
            break
        best_est, stages, used = step
        free -= used
    return stages


def _plan_per_stage(graph: Graph, cluster: Cluster, B: int, dec, sizes: Sequence[int], search_k: bool,
                    degree_options: Sequence[int] | None, deadline: float | None) -> Plan:
    """``per_stage_micro_batch=True``: the DP of :mod:`gpp_solver.dp_general`, then the leftover-device
    pass (degree raises keep each stage's ``b``, ``k`` and the stage graph, so in-flight counts stay
    and memory only drops), then ``build_plan`` with every stage's own ``b`` and ``k``."""
    from .dp_general import GeneralStageDP

    gdp = GeneralStageDP(graph, cluster, B, micro_batch_sizes=sizes, k_options=K_OPTIONS if search_k else (1,),
                         decomposition=dec, degree_options=degree_options)
    res = gdp.search(deadline=deadline)
    if res is None:
        need = gdp.min_memory(deadline=deadline)
        msg = (f"no plan within GraphPipe's per-stage search space (series-parallel-tree partitions, a "
               f"micro-batch size per stage from {list(sizes)}, k from {sorted({k for _, k in gdp.configs})}, "
               f"data-parallel degrees {list(gdp.base.degree_options)}) fits in {cluster.memory_bytes:.6g} bytes "
               f"per device on {cluster.devices} devices")
        if need is not None:
            msg += f"; the smallest memory per device with which this search space holds a plan is {need:.6g} bytes"
        raise InfeasibleError(msg, required_memory_bytes=need)
    dpn, opts = cluster.devices_per_node, sorted(gdp.base.degree_options)
    cands = []                      # (origin, specs, DP stages or None)
    for st in gdp.stage_sets(res.tps):
        st = _spend_leftover_per_stage(graph, cluster, tuple(st), B, opts)
        specs = _per_stage_specs(st, dpn)
        cands.append(("per-stage DP", specs, st))
    left = None if deadline is None else deadline - time.perf_counter()
    if left is None or left > 0:
        try:        # the uniform sweep's plan lies in this search space too; keep it if it meets the target
            uni = plan_graphpipe(graph, cluster, B, time_limit=left, progress=False, micro_batch_sizes=sizes,
                                 search_k=search_k, degree_options=degree_options, validate_plan=False)
        except GppError:
            uni = None
        if uni is not None and uni.predicted.time_per_sample <= res.tps * (1 + 1e-9):
            specs = [StageSpec(s.nodes, s.devices, s.micro_batch_size, s.schedule.k) for s in uni.stages]
            cands.append(("uniform-b sweep", specs, None))
    extra = {"per_stage_micro_batch": True, "dp_time_per_sample": res.tps, "dp_runs": res.probes,
             "micro_batch_sizes_searched": list(sizes), "k_options": sorted({k for _, k in gdp.configs}),
             "sp_added_dependencies": dec.added_pairs,
             "objective": "min bottleneck TPS (DP estimate) over per-stage micro-batch sizes"
                          + (" and k" if search_k else "") + ", then min simulated iteration time"}
    plan = None
    for origin, specs, stages in cands:     # every candidate meets the DP's optimal target
        ex = {**extra, "stages_from": origin, "dp_stages": None if stages is None else
              [{"nodes": sorted(s.nodes, key=graph.index.__getitem__), "micro_batch_size": s.micro_batch_size,
                "k": s.k, "degree": s.degree, "in_flight_bound": s.in_flight_bound} for s in stages]}
        trial = build_plan(graph, cluster, specs, B, planner=PLANNER,
                           search=SearchInfo(seconds=0.0, status="time-limit", epsilon=None, extra=ex))
        if plan is None or trial.predicted.iteration_time < plan.predicted.iteration_time * (1 - 1e-12):
            plan = trial
    assert plan is not None
    tps = plan.predicted.time_per_sample
    if tps > res.tps * (1 + 1e-9) + 1e-15:
        logger.warning("plan TPS %.9g exceeds the DP's target %.9g", tps, res.tps)
    if not res.exact:
        status = "time-limit"
    elif abs(tps - res.tps) <= 1e-9 * abs(res.tps):
        status = "optimal-within-search-space"
    else:
        status = "feasible"        # the DP's conservative transfer estimate is above the exact figure
    return replace(plan, search=replace(plan.search, status=status))


def _reprice_optimistic(graph: Graph, cluster: Cluster, B: int, dec, dp: StageDP, sw, stages: Sequence[DPStage],
                        deadline: float | None, extra: dict) -> tuple[tuple[DPStage, ...], int]:
    """Second opinion from a DP that prices every transfer at the faster bandwidth.

    The search's stage estimate counts every transfer at the slower (inter-node) bandwidth unless
    the whole cluster is one node — an upper bound, but a loose one where most transfers end up
    inside a node (DLRM on 8 V100s: DP TPS 5.6e-5 for a plan whose exact TPS is 4.3e-5), so the DP
    stops at a bottleneck that is not the real one.  Here the optimistic DP searches the two best
    micro-batch sizes of the conservative sweep; its stages get devices the same way
    (:func:`assign_devices`, leftover pass) and are priced *exactly* by the cost model.  A proposal
    is kept only when its exact TPS is at most the conservative DP's target (so the claim "plan TPS
    <= DP optimum" still holds) and its exact iteration estimate beats the current plan's.
    """
    from .binary_search import search_many

    best = sw.best
    dpn = cluster.devices_per_node
    cur_specs = _specs(stages, best.b, dpn)
    cur = (_estimate(graph, cluster, cur_specs, B), tuple(stages), best.b)
    odp = StageDP(graph, cluster, B, decomposition=dec, degree_options=dp.degree_options, optimistic_transfers=True)
    sizes = [b for _, b in sw.ranked[:2]]
    found = search_many(odp, sizes, deadline=deadline)
    tried = []
    for b in sizes:
        res = found.get(b)
        if res is None:
            continue
        st = tuple(res.stages)
        if sum(s.degree for s in st) < cluster.devices:
            st = spend_leftover_devices(graph, cluster, st, b, B, dp.degree_options)
        specs = _specs(st, b, dpn)
        tps = max(c.time_per_sample for c in stage_costs(graph, cluster, specs, B))
        est = _estimate(graph, cluster, specs, B)
        ok = tps <= best.tps * (1 + 1e-9)
        tried.append({"micro_batch_size": b, "optimistic_dp_tps": res.tps, "exact_tps": tps,
                      "iteration_estimate": est, "accepted": bool(ok and est < cur[0] * (1 - 1e-12))})
        if ok and est < cur[0] * (1 - 1e-12):
            cur = (est, st, b)
    extra["optimistic_transfer_proposals"] = tried
    extra["stages_from"] = "optimistic-transfer DP, exactly priced" if any(t["accepted"] for t in tried) \
        else "conservative DP"
    return cur[1], cur[2]


def _infeasible(dp: StageDP, sizes: Sequence[int], cluster: Cluster) -> InfeasibleError:
    """No micro-batch size fits *within GraphPipe's search space*: say how much memory (or how many
    devices) would.

    The search space is series-parallel-tree partitions (:mod:`gpp_solver.sp_tree`; non-SP graphs
    are SP-ized, which forbids some convex partitions), one micro-batch size for all stages from
    ``sizes``, 1F1B in-flight counts, power-of-two data-parallel degrees (``degree_options``).  A
    plan outside it may still fit: the exact MILP (:mod:`gpp_solver.baselines.milp`) finds plans in
    memory-tight cases where this planner reports infeasible (``benchmarks/optimality_gap.py
    --tight``).  So ``required_memory_bytes`` is the smallest memory per device with which *this
    search space* holds a plan on these devices, not the least any plan needs.
    """
    mems = [m for m in (dp.min_memory(b) for b in sizes) if m is not None]
    need_mem = min(mems) if mems else None
    devs = [d for d in (dp.min_devices_any_tps(b) for b in sizes) if d is not None]
    need_dev = min(devs) if devs else None
    space = (f"GraphPipe's search space (series-parallel-tree partitions, one micro-batch size per plan "
             f"from {list(sizes)}, 1F1B, data-parallel degrees {list(dp.degree_options)})")
    parts = [f"no plan within {space} fits in {cluster.memory_bytes:.6g} bytes per device on "
             f"{cluster.devices} devices; plans outside this search space (e.g. found by the exact MILP "
             f"planner) may still fit"]
    if need_mem is not None:
        parts.append(f"the smallest memory per device with which this search space holds a plan is "
                     f"{need_mem:.6g} bytes")
    else:
        parts.append("no stage split of this search space fits at any memory these devices can hold")
    if need_dev is not None and need_dev > cluster.devices:
        parts.append(f"or {need_dev} devices")
    return InfeasibleError("; ".join(parts), required_memory_bytes=need_mem,
                           required_devices=need_dev if need_dev is not None and need_dev > cluster.devices
                           else None)


def solve(graph: Any, budget: Any, *, mini_batch_size: int | None = None,
          micro_batch_sizes: Sequence[int] | None = None, per_stage_micro_batch: bool = False,
          search_k: bool = False, time_limit: float | None = None, progress: bool | None = None,
          degree_options: Sequence[int] | None = None) -> Plan:
    """Plan ``graph`` (Graph, gpp-graph/1 dict, path or DiGraph) on ``budget`` (Cluster, dict, path).

    ``mini_batch_size`` defaults to 16 samples per device.  Raises :class:`InfeasibleError` when no
    plan *within GraphPipe's search space* fits (series-parallel-tree partitions, one micro-batch size,
    1F1B, power-of-two degrees); its ``required_memory_bytes`` is the smallest memory per device of
    that search space — the exact MILP may find a plan with less.  The plan returned has passed ``validate``.
    """
    g = as_graph(graph)
    c = as_cluster(budget)
    B = SAMPLES_PER_DEVICE * c.devices if mini_batch_size is None else mini_batch_size
    return plan_graphpipe(g, c, B, time_limit=time_limit, progress=progress, micro_batch_sizes=micro_batch_sizes,
                          per_stage_micro_batch=per_stage_micro_batch, search_k=search_k,
                          degree_options=degree_options)
