"""The GraphPipe planner: SP tree -> binary search on TPS (DP probes) -> plan (GraphPipe §5-§6).

``solve(graph, budget, **options)`` is the Python entry point; ``plan_graphpipe(graph, cluster,
mini_batch_size, ...)`` is the same behind the planner protocol of :mod:`gpp_solver.planners.registry`.

Steps: decompose the graph into a series-parallel tree (:mod:`gpp_solver.sp_tree`; non-SP graphs
are SP-ized by adding dependencies); for every micro-batch size find the smallest bottleneck TPS
the stage DP reaches (:mod:`gpp_solver.binary_search`, :mod:`gpp_solver.planners.graphpipe.dp`); give every stage a
contiguous device range (:func:`gpp_solver.planners.graphpipe.dp.assign_devices`, then the leftover-device pass); let
``plan_build`` derive stage edges, Algorithm 2 in-flight counts, kFkB orders, the cost model's
exact figures and the simulated iteration time; keep the staging whose plan has the least
*simulated* iteration time (the paper's sweep "to maximize training throughput", A.2; ties: smaller
TPS, then larger ``b``).  Candidates are simulated best iteration *estimate* first, and one whose
lower bound ``B * TPS`` (its busiest stage's work) already exceeds the best simulated iteration is
skipped, so the pick is the best of them all; ``simulate_top=k`` simulates only the best ``k`` by
estimate.  The DP stays exact for each ``b``.

**Depth sweep** (``depth_tradeoff``, on by default; ``False`` keeps Algorithm 1's objective alone:
the least TPS per ``b``): the paper's DP returns, for every target TPS, the fewest in-flight
micro-batches at the source (the stage graph's depth), and its binary search keeps only the least
target.  The sweep also keeps, for every ``b`` and every bound ``e`` on the depth below that
staging's depth (up to ``max_depth_bound``, default 8), the least TPS the DP reaches
(:func:`gpp_solver.binary_search.search_depths`), so a shallower staging at a slightly larger
bottleneck — fewer warm-up/cool-down bubbles, e.g. one data-parallel stage instead of a 4-stage
chain, or 3 stages instead of 4 when a mini-batch holds two micro-batches — can win the simulated
comparison.  This is how the baselines pick too (PipeDream-2BW, for one, keeps the least simulated
iteration time among its configurations).  Sizes whose every plan is provably slower than the
least-TPS search's best staging (``B * StageDP.lower_bound(b)`` above its simulated iteration) are
not swept.

**Shared sinks** (on by default; ``shared_sinks=False`` for the strict vertex-SP space): GraphPipe's
decompositions share terminals — a series split's halves share the boundary node, a parallel
split's branches share source and sink — so the stage holding a parallel block's sink (MMT's and
CANDLE-Uno's concat, DLRM's interaction) may also hold the last operators of one branch, or a
group of whole branches (the parallel split's group that keeps the sink); §7.5's
plan is of that kind ("one stage necessarily contains the concatenation operator").  The DP adds
those stages (:func:`gpp_solver.planners.graphpipe.dp_kernel.add_shared_sinks`); where the optimum is reached both
with and without one, both tracebacks are simulated.  The per-stage micro-batch DP
(``per_stage_micro_batch``) does not have them.

Options: ``mini_batch_size`` (default: 16 samples per device, GraphPipe A.2's MMT setting),
``micro_batch_sizes`` (default: powers of two dividing it), ``search_k`` (each stage's kFkB ``k``
from ``K_OPTIONS`` by A.1's rule ``argmin_k max_y ComputeInFlight``, applied by Algorithm 2 in
``plan_build``; TPS does not depend on ``k`` in the cost model and ``k = 1`` is among the options,
so the DP's memory check at ``k = 1`` stays an upper bound), ``per_stage_micro_batch`` (each
stage its own micro-batch size from ``micro_batch_sizes`` — and with ``search_k`` its own ``k`` — by
the DP of :mod:`gpp_solver.planners.graphpipe.dp_general`, whose state carries the successor side's schedule
configuration; its in-flight figures are Algorithm 2 on the SP stage order, an upper bound of
``plan_build``'s; status ``optimal-within-search-space`` only when the DP's bottleneck equals the
plan's exact TPS, else ``feasible``), ``degree_options``
(data-parallel degrees, default powers of two), ``time_limit`` (seconds), ``progress`` (``None``:
a tqdm bar on stderr when it is a terminal and the search runs over a second; ``False``: never).

``search.status`` is ``optimal-within-search-space`` when every micro-batch size was searched to
the end and the plan's stages are the DP's min-TPS staging of the chosen ``b`` (its bottleneck
TPS, ``search.extra["dp_time_per_sample"]``, is then the smallest the DP's search space holds at
that ``b``, measured with its conservative stage estimates; the plan's exact TPS is at most that);
``feasible`` when the depth sweep chose a shallower staging with a larger TPS
(``dp_min_time_per_sample`` is that ``b``'s optimum); ``time-limit`` when the search was cut short.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver._backend.progress import ProgressBar
from gpp_solver.binary_search import TpsSearch, search_depths, search_many
from gpp_solver.formats.cluster import as_cluster
from gpp_solver.cost.model import (CostTables, allreduce_time, comm_time, iteration_time_estimate, stage_costs,
                                   stage_transfers)
from gpp_solver.planners.graphpipe.dp import DPStage, StageDP, assign_devices
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.formats.graph import as_graph
from gpp_solver.plan.build import StageSpec, build_plan, stage_graph_edges
from gpp_solver.sp_tree import decompose
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status
from gpp_solver.plan.validate import validate

logger = logging.getLogger(__name__)

PLANNER = "graphpipe"
SAMPLES_PER_DEVICE = 16


K_OPTIONS = (1, 2, 4, 8)
#: how many stagings, best by iteration estimate, are built and simulated (``None``: all of them,
#: each skipped when its lower bound ``B * TPS`` already exceeds the best simulated iteration)
SIMULATE_TOP = None
#: the stagings, best by iteration estimate, that also get a second opinion (the optimistic-transfer
#: DP's proposal, the traceback with separate sink-side stages): each costs DP passes
VARIANTS_TOP = 3
#: the depth sweep's largest bound below the least-TPS staging's depth (see ``depth_tradeoff``)
MAX_DEPTH_BOUND = 8


def _specs(stages: Sequence[DPStage], b: int, devices_per_node: int | None, k: int | None = 1) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [StageSpec(nodes=s.nodes, devices=d, micro_batch_size=b, k=k) for s, d in zip(stages, devs)]


def _estimate(graph: Graph, cluster: Cluster, specs: Sequence[StageSpec], B: int) -> float:
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    costs = stage_costs(graph, cluster, specs, B)
    return iteration_time_estimate(costs, stage_graph_edges(graph, stage_of), B)


def _price(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int, tables: CostTables
           ) -> tuple[float, float]:
    """``(TPS, iteration estimate)`` of DP stages at ``b`` on their :func:`assign_devices` ranges:
    the figures of :func:`gpp_solver.cost.model.stage_costs` and :func:`~gpp_solver.cost.model.iteration_time_estimate`
    (same formulas, same transfers), with each stage's compute summed from ``tables`` at once
    instead of node by node — this runs for every candidate staging and every leftover-device step."""
    devs = assign_devices(stages, cluster.devices_per_node)
    stage_of = {v: i for i, s in enumerate(stages) for v in s.nodes}
    transfers = stage_transfers(graph, stage_of)
    per_mb, allreduce, tps = [], [], 0.0
    for i, (st, dv) in enumerate(zip(stages, devs)):
        d = len(dv)
        ix = [graph.index[v] for v in st.nodes]
        comm_half = sum(comm_time(nb, b / d, cluster.bandwidth(dv + devs[peer]), cluster.latency)
                        for peer, nb in transfers.get(i, []))
        a = allreduce_time(float(tables.weight[ix].sum()), d, cluster.bandwidth(dv))
        m = float(tables.compute_at(b / d)[ix].sum()) + 2 * comm_half
        per_mb.append(m)
        allreduce.append(a)
        tps = max(tps, m / b + a / B)
    preds: dict[int, list[int]] = {i: [] for i in range(len(stages))}
    for u, v in stage_graph_edges(graph, stage_of):
        preds[v].append(u)
    longest: dict[int, float] = {}

    def path(i: int) -> float:         # longest path of per-micro-batch times ending at stage i
        if i not in longest:
            longest[i] = per_mb[i] + max((path(u) for u in preds[i]), default=0.0)
        return longest[i]

    L = max(path(i) for i in range(len(stages)))
    return tps, L + (B // b - 1) * max(per_mb) + max(allreduce)


def spend_leftover_devices(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int,
                           degree_options: Sequence[int], tables: CostTables | None = None) -> tuple[DPStage, ...]:
    """Give devices the DP left unused to stages, greedily, while the iteration estimate improves.

    The DP stops at the fewest devices that reach the optimal bottleneck; the rest would idle.  A
    step raises one stage's degree to the next allowed one (``b % d == 0``) when enough devices are
    free, and keeps the step that lowers the cost model's iteration estimate most, provided the
    plan's exact bottleneck TPS does not rise.  A larger degree only lowers a stage's activation
    memory (the stage graph, hence the in-flight counts, are unchanged), so memory stays within
    the limit; the plan's TPS stays at most the DP's target.
    """
    tables = tables or CostTables(graph)
    opts = sorted(d for d in degree_options if b % d == 0)
    return raise_degrees(tuple(stages), cluster.devices, lambda st: opts,
                         lambda trial: _price(graph, cluster, trial, b, B, tables))


def raise_degrees(stages: tuple, devices: int, allowed: Callable[[Any], Sequence[int]],
                  price: Callable[[tuple], tuple[float, float]]) -> tuple:
    """The greedy loop of :func:`spend_leftover_devices`: ``price(stages) -> (exact TPS, estimate)``;
    ``allowed(stage)`` lists the degrees a stage may take (ascending)."""
    cur = stages
    free = devices - sum(s.degree for s in cur)
    tps0, best = price(cur)
    while free > 0:
        step = None
        for i, st in enumerate(cur):
            bigger = [d for d in allowed(st) if d > st.degree and d - st.degree <= free]
            if not bigger:
                continue
            trial = cur[:i] + (replace(st, degree=bigger[0]),) + cur[i + 1:]
            tps, est = price(trial)
            if est < best * (1 - 1e-12) and tps <= tps0 * (1 + 1e-12) and (step is None or est < step[0]):
                step = (est, trial, bigger[0] - st.degree)
        if step is None:
            break
        best, cur, used = step
        free -= used
    return cur


class _Progress(ProgressBar):
    """GraphPipe's DP passes (one bar; see :mod:`gpp_solver._backend.progress`)."""

    def __init__(self, total: int | None, enabled: bool | None) -> None:
        super().__init__(total, "graphpipe: DP passes", "pass", enabled)

    def step(self, active: int) -> None:
        self.set_postfix_str(f"{active} micro-batch sizes open")
        self.update(1)


def plan_graphpipe(graph: Graph, cluster: Cluster, mini_batch_size: int, *, time_limit: float | None = None,
                   progress: bool | None = None, micro_batch_sizes: Sequence[int] | None = None,
                   per_stage_micro_batch: bool = False, search_k: bool = False,
                   degree_options: Sequence[int] | None = None, depth_tradeoff: bool = True,
                   simulate_top: int | None = SIMULATE_TOP, validate_plan: bool = True, shared_sinks: bool = True,
                   max_depth_bound: int | None = MAX_DEPTH_BOUND) -> Plan:
    """Plan ``graph`` on ``cluster`` for mini-batch ``mini_batch_size`` (see the module docstring)."""
    t0 = time.perf_counter()
    B = mini_batch_size
    if not isinstance(B, int) or isinstance(B, bool) or B < 1:
        raise InvalidInputError(f"mini_batch_size must be a positive integer, got {B!r}")
    sizes = check_micro_batch_sizes(B, micro_batch_sizes)
    if time_limit is not None and time_limit <= 0:
        raise InvalidInputError(f"time_limit must be positive, got {time_limit!r}")
    for name, v in (("simulate_top", simulate_top), ("max_depth_bound", max_depth_bound)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise InvalidInputError(f"{name} must be a positive integer or None, got {v!r}")
    deadline = None if time_limit is None else t0 + time_limit
    dec = decompose(graph)
    if dec.forced_cuts:
        logger.info("graph '%s' is not series-parallel: %d series cuts forced, %d dependencies added",
                    graph.name, len(dec.forced_cuts), dec.added_pairs)
    if per_stage_micro_batch:
        from gpp_solver.planners.graphpipe.per_stage import plan_per_stage

        plan = plan_per_stage(graph, cluster, B, dec, sizes, search_k, degree_options, deadline)
        plan = replace(plan, search=replace(plan.search, seconds=time.perf_counter() - t0))
        if validate_plan:
            validate(plan, graph, cluster)
        return plan
    dp = StageDP(graph, cluster, B, decomposition=dec, degree_options=degree_options, shared_sinks=shared_sinks)
    bar = _Progress(None, progress)
    try:
        if depth_tradeoff:
            def deepen(first: dict[int, TpsSearch]) -> list[int]:
                """The sizes where a shallower staging could beat the incumbent: the first phase's
                best staging by estimate, simulated; no plan at ``b`` finishes an iteration in less
                than ``B * dp.lower_bound(b)`` (its busiest device's compute alone)."""
                if not first:
                    return []
                r = min(first.values(), key=lambda r: (_price(graph, cluster, r.stages, r.b, B, dp._costs)[1],
                                                       r.tps, -r.b))
                inc = _build(graph, cluster, r.stages, r.b, B, dp, search_k).predicted.iteration_time
                return [b for b in first if B * dp.lower_bound(b) < inc * (1 - 1e-12)]

            per_b = search_depths(dp, sizes, deadline=deadline, on_pass=bar.step, deepen=deepen,
                                  max_bound=max_depth_bound)
        else:
            one = search_many(dp, sizes, deadline=deadline, on_pass=bar.step)
            per_b = {b: [] if one[b] is None else [one[b]] for b in sizes}
    finally:
        bar.close()
    results = [r for b in sizes for r in per_b[b]]
    if not results:
        raise _infeasible(dp, sizes, cluster)
    timed_out = any(not r.exact for r in results)
    min_tps = {b: min(r.tps for r in per_b[b]) for b in sizes if per_b[b]}
    tables = dp._costs
    ranked = sorted(results, key=lambda r: (_price(graph, cluster, r.stages, r.b, B, tables)[1], r.tps, -r.b))
    short = ranked if simulate_top is None else ranked[:max(1, simulate_top)]
    proposals: list[dict] = []
    optimistic: dict[int, list[tuple[str, TpsSearch, tuple[DPStage, ...]]]] = {}
    if dp.placement_sensitive and not timed_out:
        for c in _optimistic_proposals(graph, cluster, B, dec, dp,
                                       [r for r in short[:VARIANTS_TOP] if r.tps == min_tps[r.b]], deadline, proposals):
            optimistic.setdefault(c[1].b, []).append(c)
    cands: list[tuple[str, TpsSearch, tuple[DPStage, ...]]] = []
    for rank, r in enumerate(short):          # best estimate first, each b's optimistic proposals right after it
        variants = [("conservative DP", r.stages)]
        if dp.idx.sites and rank < VARIANTS_TOP and (deadline is None or time.perf_counter() < deadline):
            # the same optimum traced back with separate sink-side stages where both reach it
            alt = tuple(dp.stages_many([(r.b, r.tps)], prefer_shared=False)[0])
            if alt != tuple(r.stages):
                variants.append(("conservative DP, separate sink stages", alt))
        for origin, st in variants:
            if sum(s.degree for s in st) < cluster.devices:
                st = spend_leftover_devices(graph, cluster, st, r.b, B, dp.degree_options, tables)
            cands.append((origin, r, tuple(st)))
        if r.b in optimistic and r.tps == min_tps[r.b]:
            cands.extend(optimistic[r.b])
    best = None         # (plan, origin, search result)
    tried = []
    for origin, r, st in cands:
        entry = {"micro_batch_size": r.b, "dp_time_per_sample": r.tps, "stages_from": origin}
        tried.append(entry)
        bound = B * _price(graph, cluster, st, r.b, B, tables)[0]     # every stage is busy B * TPS(S)
        if best is not None and bound > best[0].predicted.iteration_time * (1 + 1e-12):
            entry["not_simulated_lower_bound"] = bound      # cannot beat the best simulated plan
            continue
        plan = _build(graph, cluster, st, r.b, B, dp, search_k, leftover=False)
        entry.update(depth=plan.depth, stages=len(plan.stages), simulated_iteration_time=plan.predicted.iteration_time)
        if best is None or _better(plan, best[0]):
            best = (plan, origin, r)
    assert best is not None
    plan, origin, chosen = best
    for p in proposals:
        p["accepted"] = origin.startswith("optimistic") and p["micro_batch_size"] == chosen.b
    b_final = chosen.b
    if timed_out:
        status = Status.TIME_LIMIT
    elif chosen.tps <= min_tps[b_final]:
        status = Status.OPTIMAL_WITHIN_SEARCH_SPACE
    else:
        status = Status.FEASIBLE     # a shallower staging at a larger bottleneck (depth_tradeoff)
    extra = {"micro_batch_size": b_final, "dp_time_per_sample": chosen.tps,
             "dp_min_time_per_sample": min_tps[b_final], "dp_runs": max(r.probes for r in results),
             "micro_batch_sizes_searched": list(sizes),
             "micro_batch_sizes_infeasible": [b for b in sizes if not per_b[b]],
             "sp_added_dependencies": dec.added_pairs, "stages_from": origin,
             "objective": "min bottleneck TPS per micro-batch size (DP estimate)"
                          + (" and per bound on the stage graph's depth" if depth_tradeoff else "")
                          + ("; of all of them" if len(short) == len(ranked)
                             else f"; of the {len(short)} with the least iteration estimate")
                          + ", the least simulated iteration time",
             "simulated_candidates": tried}
    if depth_tradeoff:
        extra["depth_tradeoff"] = True
        extra["depth_bound"] = chosen.depth_bound
    if dp.placement_sensitive and not timed_out:
        extra["optimistic_transfer_proposals"] = proposals
    plan = replace(plan, search=replace(plan.search, status=status, extra={**plan.search.extra, **extra}))
    if plan.predicted.time_per_sample > chosen.tps * (1 + 1e-9) + 1e-15:
        logger.warning("plan TPS %.9g exceeds the DP's target %.9g: the DP estimate is not an upper bound here",
                       plan.predicted.time_per_sample, chosen.tps)
    plan = replace(plan, search=replace(plan.search, seconds=time.perf_counter() - t0))
    if validate_plan:
        validate(plan, graph, cluster)
    return plan


def _build(graph: Graph, cluster: Cluster, stages: Sequence[DPStage], b: int, B: int, dp: StageDP, search_k: bool,
           leftover: bool = True) -> Plan:
    """The priced plan of DP stages at ``b`` (devices by :func:`assign_devices`; with ``leftover``
    the unused devices first go through :func:`spend_leftover_devices`)."""
    if leftover and sum(s.degree for s in stages) < cluster.devices:
        stages = spend_leftover_devices(graph, cluster, stages, b, B, dp.degree_options, dp._costs)
    specs = _specs(stages, b, cluster.devices_per_node, None if search_k else 1)
    return build_plan(graph, cluster, specs, B, planner=PLANNER,
                      search=SearchInfo(seconds=0.0, status=Status.TIME_LIMIT, epsilon=None, extra={}),
                      k_options=K_OPTIONS if search_k else (1,))


def _better(plan: Plan, than: Plan) -> bool:
    """Least simulated iteration time; ties (relative 1e-12) by the smaller TPS, then the larger ``b``."""
    a, b = plan.predicted.iteration_time, than.predicted.iteration_time
    if abs(a - b) > 1e-12 * max(abs(a), abs(b)):
        return a < b
    ta, tb = plan.predicted.time_per_sample, than.predicted.time_per_sample
    if abs(ta - tb) > 1e-12 * max(abs(ta), abs(tb)):
        return ta < tb
    return plan.stages[0].micro_batch_size > than.stages[0].micro_batch_size


def _optimistic_proposals(graph: Graph, cluster: Cluster, B: int, dec, dp: StageDP, results: Sequence[TpsSearch],
                          deadline: float | None, log: list[dict]) -> list[tuple[str, TpsSearch, tuple[DPStage, ...]]]:
    """Second opinion from a DP that prices every transfer at the faster bandwidth.

    The search's stage estimate counts every transfer at the slower (inter-node) bandwidth unless
    the whole cluster is one node — an upper bound, but a loose one where most transfers end up
    inside a node (DLRM on 8 V100s: DP TPS 5.6e-5 for a plan whose exact TPS is 4.3e-5), so the DP
    stops at a bottleneck that is not the real one.  Here the optimistic DP searches the micro-batch
    sizes of ``results`` (the shortlisted ones); its stages get devices the same way
    (:func:`assign_devices`, leftover pass) and are priced *exactly* by the cost model.  A proposal
    becomes a candidate (to be simulated beside the others) only when its exact TPS is at most the
    conservative DP's optimum at that ``b`` (so the claim "plan TPS <= DP optimum" still holds).
    """
    odp = StageDP(graph, cluster, B, decomposition=dec, degree_options=dp.degree_options, optimistic_transfers=True,
                  shared_sinks=dp.shared_sinks)
    found = search_many(odp, [r.b for r in results], deadline=deadline)
    out = []
    for r in results:
        res = found.get(r.b)
        if res is None:
            continue
        variants = [("optimistic-transfer DP, exactly priced", tuple(res.stages))]
        if odp.idx.sites and (deadline is None or time.perf_counter() < deadline):
            alt = tuple(odp.stages_many([(r.b, res.tps)], prefer_shared=False)[0])
            if alt != variants[0][1]:
                variants.append(("optimistic-transfer DP, separate sink stages, exactly priced", alt))
        for origin, st in variants:
            if sum(s.degree for s in st) < cluster.devices:
                st = spend_leftover_devices(graph, cluster, st, r.b, B, dp.degree_options, dp._costs)
            specs = _specs(st, r.b, cluster.devices_per_node)
            tps = max(c.time_per_sample for c in stage_costs(graph, cluster, specs, B))
            ok = tps <= r.tps * (1 + 1e-9)
            log.append({"micro_batch_size": r.b, "optimistic_dp_tps": res.tps, "exact_tps": tps, "variant": origin,
                        "iteration_estimate": _estimate(graph, cluster, specs, B), "meets_dp_optimum": bool(ok),
                        "accepted": False})
            if ok:
                out.append((origin, r, st))
    return out


def _infeasible(dp: StageDP, sizes: Sequence[int], cluster: Cluster) -> InfeasibleError:
    """No micro-batch size fits *within GraphPipe's search space*: say how much memory (or how many
    devices) would.

    The search space is series-parallel-tree partitions (:mod:`gpp_solver.sp_tree`; non-SP graphs
    are SP-ized, which forbids some convex partitions), one micro-batch size for all stages from
    ``sizes``, 1F1B in-flight counts, power-of-two data-parallel degrees (``degree_options``).  A
    plan outside it may still fit: the exact MILP (:mod:`gpp_solver.planners.milp.planner`) finds plans in
    memory-tight cases where this planner reports infeasible (``benchmarks/optimality_gap.py
    --tight``).  So ``required_memory_bytes`` is the smallest memory per device with which *this
    search space* holds a plan on these devices, not the least any plan needs.
    """
    mems = [m for m in (dp.min_memory(b) for b in sizes) if m is not None]
    need_mem = min(mems) if mems else None
    devs = [d for d in (dp.min_devices_any_tps(b) for b in sizes) if d is not None]
    need_dev = min(devs) if devs else None
    space = (f"GraphPipe's search space (series-parallel-tree partitions"
             f"{' with shared sinks' if dp.shared_sinks else ''}, one micro-batch size per plan "
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
          degree_options: Sequence[int] | None = None, depth_tradeoff: bool = True, shared_sinks: bool = True) -> Plan:
    """Plan ``graph`` (Graph, gpp-graph/1 dict, path or DiGraph) on ``budget`` (Cluster, dict, path).

    ``mini_batch_size`` defaults to 16 samples per device.  Raises :class:`InfeasibleError` when no
    plan *within GraphPipe's search space* fits (series-parallel-tree partitions with shared sinks, one micro-batch size,
    1F1B, power-of-two degrees); its ``required_memory_bytes`` is the smallest memory per device of
    that search space — the exact MILP may find a plan with less.  The plan returned has passed ``validate``.
    """
    g = as_graph(graph)
    c = as_cluster(budget)
    B = SAMPLES_PER_DEVICE * c.devices if mini_batch_size is None else mini_batch_size
    return plan_graphpipe(g, c, B, time_limit=time_limit, progress=progress, micro_batch_sizes=micro_batch_sizes,
                          per_stage_micro_batch=per_stage_micro_batch, search_k=search_k,
                          degree_options=degree_options, depth_tradeoff=depth_tradeoff, shared_sinks=shared_sinks)
