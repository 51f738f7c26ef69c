"""GraphPipe with a micro-batch size per stage (``plan_graphpipe(..., per_stage_micro_batch=True)``).

The DP of :mod:`gpp_solver.planners.graphpipe.dp.general` (its state carries the successor side's Table 2 summary),
then the leftover-device pass with each stage's own ``b``, then ``build_plan``; the uniform-b
sweep's plan is kept as a candidate when it meets the per-stage DP's target.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import GppError, InfeasibleError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.planners.graphpipe.dp.general import GeneralStageDP
from gpp_solver.planners.graphpipe.dp.stage import assign_devices
from gpp_solver.planners.graphpipe.staging import K_OPTIONS, PLANNER, estimate_iteration, raise_degrees
from gpp_solver.planners.graphpipe.uniform import plan_uniform
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)

#: a candidate of :func:`plan_per_stage`: (origin, stage specs, the DP's stages or ``None``)
_Candidate = tuple[str, list[StageSpec], tuple | None]


def _per_stage_specs(stages: Sequence[Any], devices_per_node: int | None) -> list[StageSpec]:
    devs = assign_devices(stages, devices_per_node)
    return [
        StageSpec(nodes=s.nodes, devices=d, micro_batch_size=s.micro_batch_size, k=s.k) for s, d in zip(stages, devs)
    ]


def _spend_leftover_per_stage(
    graph: Graph, cluster: Cluster, stages: tuple, B: int, opts: Sequence[int], deadline: float | None = None
) -> tuple:
    """:func:`spend_leftover_devices` with each stage's own ``b``: raise one degree at a time
    (``b % d == 0``) while the iteration estimate improves and the exact TPS does not rise."""
    dpn = cluster.devices_per_node

    def price(trial: tuple) -> tuple[float, float]:
        specs = _per_stage_specs(trial, dpn)
        return (
            max(c.time_per_sample for c in stage_costs(graph, cluster, specs, B)),
            estimate_iteration(graph, cluster, specs, B),
        )

    return raise_degrees(
        stages, cluster.devices, lambda st: [d for d in opts if st.micro_batch_size % d == 0], price, deadline
    )


def plan_per_stage(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    dec,
    sizes: Sequence[int],
    search_k: bool,
    degree_options: Sequence[int] | None,
    deadline: float | None,
    schedule: str = "1f1b",
) -> Plan:
    """``per_stage_micro_batch=True``: the DP of :mod:`gpp_solver.planners.graphpipe.dp.general`, then the leftover-device
    pass (degree raises keep each stage's ``b``, ``k`` and the stage graph, so in-flight counts stay
    and memory only drops), then ``build_plan`` with every stage's own ``b`` and ``k``."""
    B = mini_batch_size  # the paper's B
    gdp = GeneralStageDP(
        graph,
        cluster,
        B,
        micro_batch_sizes=sizes,
        k_options=K_OPTIONS if search_k else (1,),
        decomposition=dec,
        degree_options=degree_options,
    )
    res = gdp.search(deadline=deadline)
    if res is None:
        raise _infeasible(gdp, sizes, cluster, deadline)
    cands, cut = _dp_stagings(graph, cluster, B, gdp, res.tps, deadline)
    if deadline is None or deadline > time.perf_counter():
        uni = _uniform_candidate(graph, cluster, B, dec, sizes, search_k, degree_options, deadline, schedule, res.tps)
        if uni is not None:
            cands.append(uni)
    extra = {
        "per_stage_micro_batch": True,
        "dp_time_per_sample": res.tps,
        "dp_runs": res.probes,
        "micro_batch_sizes_searched": list(sizes),
        "k_options": sorted({k for _, k in gdp.configs}),
        "sp_added_dependencies": dec.added_pairs,
        "objective": "min bottleneck TPS (DP estimate) over per-stage micro-batch sizes"
        + (" and k" if search_k else "")
        + ", then min simulated iteration time",
    }
    plan = _least_iteration_time(graph, cluster, B, cands, extra, schedule)
    tps = plan.predicted.time_per_sample
    if tps > res.tps * (1 + 1e-9) + 1e-15:
        logger.warning("plan TPS %.9g exceeds the DP's target %.9g", tps, res.tps)
    if not res.exact or cut or (deadline is not None and time.perf_counter() > deadline):
        status = Status.TIME_LIMIT
    elif abs(tps - res.tps) <= 1e-9 * abs(res.tps):
        status = Status.OPTIMAL_WITHIN_SEARCH_SPACE
    else:
        status = Status.FEASIBLE  # the DP's conservative transfer estimate is above the exact figure
    return replace(plan, search=replace(plan.search, status=status))


def _infeasible(gdp: GeneralStageDP, sizes: Sequence[int], cluster: Cluster, deadline: float | None) -> InfeasibleError:
    """No staging of the per-stage search space fits: say so, with the least memory that would do."""
    need = gdp.min_memory(deadline=deadline)
    msg = (
        f"no plan within GraphPipe's per-stage search space (series-parallel-tree partitions, a "
        f"micro-batch size per stage from {list(sizes)}, k from {sorted({k for _, k in gdp.configs})}, "
        f"data-parallel degrees {list(gdp.base.degree_options)}) fits in {cluster.memory_bytes:.6g} bytes "
        f"per device on {cluster.devices} devices"
    )
    if need is not None:
        msg += f"; the smallest memory per device with which this search space holds a plan is {need:.6g} bytes"
    return InfeasibleError(msg, required_memory_bytes=need)


def _dp_stagings(
    graph: Graph, cluster: Cluster, B: int, gdp: GeneralStageDP, tps: float, deadline: float | None
) -> tuple[list[_Candidate], bool]:
    """The per-stage DP's stagings at its optimal target ``tps``, each with the leftover devices
    spent; and whether the deadline left some unpriced (at least one is priced)."""
    dpn, opts = cluster.devices_per_node, sorted(gdp.base.degree_options)
    cands: list[_Candidate] = []
    for st in gdp.stage_sets(tps):
        if cands and deadline is not None and time.perf_counter() > deadline:
            return cands, True  # the other stagings of the optimum are not priced
        st = _spend_leftover_per_stage(graph, cluster, tuple(st), B, opts, deadline)
        specs = _per_stage_specs(st, dpn)
        cands.append(("per-stage DP", specs, st))
    return cands, False


def _uniform_candidate(
    graph: Graph,
    cluster: Cluster,
    B: int,
    dec,
    sizes: Sequence[int],
    search_k: bool,
    degree_options: Sequence[int] | None,
    deadline: float | None,
    schedule: str,
    tps: float,
) -> _Candidate | None:
    """The uniform sweep's plan, which lies in this search space too, when it meets the per-stage
    DP's target ``tps`` (``None`` when it does not, or the sweep finds no plan)."""
    try:
        uni = plan_uniform(
            graph,
            cluster,
            B,
            dec,
            sizes,
            deadline=deadline,
            progress=False,
            search_k=search_k,
            degree_options=degree_options,
            schedule=schedule,
        )
    except GppError:
        return None
    if uni.predicted.time_per_sample <= tps * (1 + 1e-9):
        specs = [StageSpec(s.nodes, s.devices, s.micro_batch_size, s.schedule.k) for s in uni.stages]
        return ("uniform-b sweep", specs, None)
    return None


def _least_iteration_time(
    graph: Graph, cluster: Cluster, B: int, cands: list[_Candidate], extra: dict[str, Any], schedule: str
) -> Plan:
    """The candidates built as plans (each recording its origin and DP stages in ``search.extra``
    beside ``extra``); the first of the least simulated iteration time (relative 1e-12)."""
    plan = None
    for origin, specs, stages in cands:  # every candidate meets the DP's optimal target
        ex = {**extra, "stages_from": origin, "dp_stages": None if stages is None else _dp_stage_records(graph, stages)}
        trial = build_plan(
            graph,
            cluster,
            specs,
            B,
            planner=PLANNER,
            search=SearchInfo(seconds=0.0, status=Status.TIME_LIMIT, epsilon=None, extra=ex),
            schedule=schedule,
        )
        if plan is None or trial.predicted.iteration_time < plan.predicted.iteration_time * (1 - 1e-12):
            plan = trial
    assert plan is not None
    return plan


def _dp_stage_records(graph: Graph, stages: tuple) -> list[dict[str, Any]]:
    """The DP's stages as ``search.extra["dp_stages"]`` records."""
    return [
        {
            "nodes": sorted(s.nodes, key=graph.index.__getitem__),
            "micro_batch_size": s.micro_batch_size,
            "k": s.k,
            "degree": s.degree,
            "in_flight_bound": s.in_flight_bound,
        }
        for s in stages
    ]
