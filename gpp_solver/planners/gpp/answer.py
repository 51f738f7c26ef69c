"""A ``gpp`` run's answer, as functions of its record
(:class:`~gpp_solver.planners.gpp.run.GppRun`): the exact searches' candidates and the pick
(:func:`exact_searches`), then the pick as a gpp plan with its orders tightened, its status and
``search`` record (:func:`finish`)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from gpp_solver.errors import InfeasibleError, TimeLimitError
from gpp_solver.plan.validate import validate
from gpp_solver.plan.zero_bubble import final_record
from gpp_solver.planners.exact.planner import exact_for_gpp
from gpp_solver.planners.gpp.plans import rebuild_as_gpp, reschedule, uniform_micro_batch
from gpp_solver.planners.gpp.prove import prove_by_milp as _prove
from gpp_solver.planners.gpp.run import GppRun
from gpp_solver.planners.gpp.seeds import STATES_SUFFICIENT_MEMORY
from gpp_solver.planners.gpp.tighten import tighten_orders
from gpp_solver.types import Plan, SearchInfo, Status


def exact_searches(run: GppRun) -> tuple[Plan, dict[str, Any]]:
    """The exact iteration-time search on small graphs (``planners/exact``: a better plan joins
    the pool; a finished search proves the least 1F1B iteration time over all convex
    partitions) and, with ``prove``, the MILP; then the best candidate, or why there is none."""
    o, pool = run.o, run.pool
    run.ex = None
    if o.exact is not False and o.objective == "iteration_time":
        run.ex = exact_for_gpp(
            run.graph,
            run.cluster,
            run.B,
            deadline=run.deadline,
            micro_batch_sizes=o.micro_batch_sizes,
            force=bool(o.exact),
            upper_bound=pool.best_iteration_time(),
        )
        run.timed_out |= run.ex.cut
        if run.ex.plan is not None:
            pool.add(
                reschedule(run.ex.plan, run.graph, run.cluster, run.o.schedule),
                {"origin": "exact", "micro_batch_size": uniform_micro_batch(run.ex.plan)},
            )
    worst_memory_found = min(run.worst_memory) if run.worst_memory else None
    run.proven = None
    if o.prove:
        run.proven, prove_cut = _prove(run.graph, run.cluster, run.B, run.deadline, pool, run.allowed, run.o.schedule)
        run.timed_out |= prove_cut
    if not pool and run.timed_out:
        raise TimeLimitError(f"gpp: the time limit ({run.budget:g} s) was reached before any plan was found")
    if not pool:
        need, source = _least_need(run, worst_memory_found)
        raise InfeasibleError(
            f"no plan fits in {run.cluster.memory_bytes:.6g} bytes per device on {run.cluster.devices} devices"
            + ("" if need is None else f"; {need:.6g} bytes per device give one ({source})"),
            required_memory_bytes=need,
        )
    best = pool.best()
    run.lap("exact")
    return best


def _least_need(run: GppRun, searched: float | None) -> tuple[float | None, str]:
    """The least memory per device at which a plan is known: the closest partition the searches
    reached (``searched``), or a seed planner's stated least memory
    (``seeds.STATES_SUFFICIENT_MEMORY``: at it that planner returns a plan that fits); and what
    found it."""
    known = [(searched, "the closest partition gpp's search reached")] if searched is not None else []
    for name in STATES_SUFFICIENT_MEMORY:
        need = run.seed_info.get(name, {}).get("required_memory_bytes")
        if need is not None:
            known.append((need, f"a memory with which {name}'s search space holds a plan"))
    if not known:
        return None, ""
    return min(known, key=lambda k: k[0])


def finish(run: GppRun, plan: Plan, meta: dict[str, Any]) -> Plan:
    """The pick as a gpp plan, its orders tightened, its status and ``search`` record."""
    graph, cluster, o = run.graph, run.cluster, run.o
    checked = None  # the stages as validated on this graph and cluster, when they are the answer's
    if plan.planner != "gpp":  # a seed plan's orders were made under the schedule when it joined the
        # pool, or kept (searches.pool_seeds: meta["orders"]); the same choice holds. One kept with its
        # own orders is the plan starts.run_seeds validated on this graph and cluster, which built
        # again would be itself: renamed ("built"), not built and validated a second time (seconds
        # on a plan of a million actions)
        orders = meta.get("orders", "remake")
        plan = rebuild_as_gpp(
            plan,
            graph,
            cluster,
            SearchInfo(0.0, Status.FEASIBLE),
            run.o.schedule,
            orders="built" if orders == "own" else orders,
        )
        checked = plan.stages if orders == "own" else None
    run.timed_out |= run.past_deadline()
    plan, tinfo, guard = tighten_orders(
        plan, graph, cluster, o.tighten, o.seed, run.budget, run.timed_out, run.progress
    )
    run.timed_out |= guard
    run.lap("tighten")
    status = Status.TIME_LIMIT if run.timed_out else Status.FEASIBLE
    if run.proven is not None and plan.predicted.time_per_sample <= run.proven * (1 + 1e-9):
        status = Status.OPTIMAL_TIME_PER_SAMPLE
    ex = run.ex
    # the exact search proves the least iteration time of kFkB orders: no claim over orders with W
    if (
        o.schedule == "1f1b"
        and ex is not None
        and ex.optimum is not None
        and plan.predicted.iteration_time <= ex.optimum * (1 + 1e-9)
    ):
        status = Status.OPTIMAL_ITERATION_TIME
    extra = {
        "exact": dict(ex.info) if ex is not None else {"status": "off"},
        "seed_planner": meta["origin"],
        "micro_batch_size": meta.get("micro_batch_size"),
        "moves": meta.get("moves", 0),
        "polish_moves": meta.get("polish_moves", 0),
        "tps_before": meta.get("tps_before", plan.predicted.time_per_sample),
        "tps_after": plan.predicted.time_per_sample,
        "seeds": run.seed_info,
        "per_micro_batch": run.per_b,
        "cp_tighten": tinfo,
        "max_iterations": o.max_iterations,
        "work": run.work,
        "exact_tps": run.proven,
        "iteration_time_estimate": plan.search.iteration_time_estimate,
        "phase_seconds": {k: round(v, 4) for k, v in run.phases.items()},
        "answer_reserve_seconds": round(run.reserve, 4),
        "plans_built": run.pool.built,
    }
    if o.schedule != "1f1b":
        extra["schedule"] = final_record(plan, o.schedule)
    plan = replace(plan, planner="gpp", search=SearchInfo(time.perf_counter() - run.t0, status, None, extra))
    if plan.stages is not checked:
        validate(plan, graph, cluster)
    return plan
