"""CP-SAT verify and tighten of every stage's micro-batch order for a FIXED partition (the public
entry; the model itself — variables, constraints, memory — is :mod:`gpp_solver.cp_orders.order_model`
and its data in ticks :mod:`gpp_solver.cp_orders.schedule_data`, whose names are re-exported here).

The partition (stages, devices, micro-batch sizes) is the plan's; only the orders are free.
:func:`verify_orders` checks given orders against the model; :func:`tighten` searches for orders
with a shorter simulated iteration time (then, at that makespan, less peak memory).

**Determinism.** With ``workers=1`` and a fixed ``seed`` the search is reproducible when it ends
before the time limit (an ``OPTIMAL`` proof); with ``deterministic=True`` the limit is CP-SAT's
deterministic time (``max_deterministic_time = time_limit``, wall limit 4x as a guard) and the
result is reproducible on any machine load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpp_solver.action import has_weight_actions
from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.cp_orders.order_model import (
    MEMORY_RESOLUTION,
    Key,
    Order,
    ScheduleVars,
    Solved,
    add_memory_objective,
    add_order_hint,
    build_schedule_model,
    model_from_data,
    solve_model,
)
from gpp_solver.cp_orders.schedule_data import (
    DEFAULT_RESOLUTION,
    ScheduleData,
    max_in_flight_micro_batches,
    schedule_data,
)
from gpp_solver.errors import DeadlockError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate
from gpp_solver.plan.validate import validate
from gpp_solver.types import Cluster, Graph, Plan, Schedule

__all__ = [
    "DEFAULT_RESOLUTION",
    "MAX_ACTIONS",
    "MEMORY_RESOLUTION",
    "Key",
    "Order",
    "ScheduleData",
    "ScheduleVars",
    "Solved",
    "TightenResult",
    "VerifyResult",
    "add_memory_objective",
    "add_order_hint",
    "build_schedule_model",
    "max_in_flight_micro_batches",
    "model_from_data",
    "schedule_data",
    "solve_model",
    "tighten",
    "tighten_plan_if_fits",
    "verify_orders",
]

logger = logging.getLogger(__name__)

MAX_ACTIONS = 4000  # above this many F/B actions in all, tighten answers "too-large"


# --------------------------------------------------------------------------------------- verify
@dataclass(frozen=True)
class VerifyResult:
    """Are the plan's orders feasible (C4, no deadlock, memory), and what is their makespan?"""

    feasible: bool
    status: str  # CP-SAT status name of the fixed-order model
    makespan: float | None  # simulator, exact float (None when infeasible)
    makespan_cp: float | None  # CP-SAT optimum in ticks * unit
    unit: float
    reason: str = ""


def verify_orders(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    *,
    orders: Mapping[int, Sequence[tuple[str, int]]] | None = None,
    time_limit: float = 10.0,
    unit: float | None = None,
    resolution: int = DEFAULT_RESOLUTION,
) -> VerifyResult:
    """Check the plan's orders (or ``orders``) with CP-SAT, each stage's order fixed by precedences."""
    orders = {s.id: s.schedule.order for s in plan.stages} if orders is None else dict(orders)
    model, v = build_schedule_model(plan, graph, cluster, orders=orders, unit=unit, resolution=resolution)
    res = solve_model(model, v, time_limit=time_limit)
    d = v.data
    reasons = [
        f"stage {s} holds {in_flight_from_order(orders[s], d.micro_batch[s]) // d.micro_batch[s]} "
        f"micro-batches but memory allows {d.max_in_flight[s]}"
        for s in d.stages
        if in_flight_from_order(orders[s], d.micro_batch[s]) > d.max_in_flight[s] * d.micro_batch[s]
    ]
    makespan = None
    if res.status == "OPTIMAL":
        stage_plan = _with_orders(plan, orders)
        makespan = simulate(stage_plan, graph, cluster).iteration_time
    else:
        try:
            simulate(_with_orders(plan, orders), graph, cluster)
        except DeadlockError as exc:
            reasons.append(str(exc).splitlines()[0])
    return VerifyResult(
        res.status == "OPTIMAL",
        res.status,
        makespan,
        None if res.objective_ticks is None else res.objective_ticks * d.unit,
        d.unit,
        "; ".join(reasons),
    )


def _with_orders(plan: Plan, orders: Mapping[int, Order]) -> Plan:
    return replace(
        plan,
        stages=tuple(replace(s, schedule=Schedule("custom", s.schedule.k, tuple(orders[s.id]))) for s in plan.stages),
    )


# -------------------------------------------------------------------------------------- tighten
@dataclass(frozen=True)
class TightenResult:
    plan: Plan  # never worse than the input (the input itself unless improved)
    status: str  # phase 1 (makespan): OPTIMAL / FEASIBLE / INFEASIBLE / UNKNOWN / too-large
    makespan_before: float  # simulator, seconds
    makespan_after: float  # simulator, seconds (== before when the input is kept)
    lower_bound: float | None = None  # CP-SAT's proven bound, ticks * unit (rounded durations)
    seconds: float = 0.0
    improved: bool = False
    unit: float = 0.0
    actions: int = 0
    memory_status: str = "skipped"  # phase 2 (memory at that makespan): CP-SAT status name or "skipped"
    peak_memory_before: float = 0.0
    peak_memory_after: float = 0.0
    wall_guard: bool = False  # deterministic mode: a phase ended by neither a proof nor its deterministic limit


def _rebuild(plan: Plan, graph: Graph, cluster: Cluster, orders: Mapping[int, Order]) -> Plan:
    specs = [
        StageSpec(
            s.nodes,
            s.devices,
            s.micro_batch_size,
            k=s.schedule.k,
            tensor_parallel=s.tensor_parallel,
            tmpc=s.tmpc,
            order=tuple(orders[s.id]),
        )
        for s in plan.stages
    ]
    return build_plan(graph, cluster, specs, plan.mini_batch_size, planner=plan.planner, search=plan.search)


def _memory_phase(
    data: ScheduleData,
    orders: Mapping[int, Order],
    makespan_ticks: int,
    *,
    time_limit: float,
    seed: int,
    workers: int,
    deterministic: bool,
) -> Solved:
    model, v = model_from_data(data)
    peak = {s: in_flight_from_order(orders[s], 1) for s in data.stages}
    choice = add_memory_objective(model, v, makespan_cap=makespan_ticks, peak_cap=peak)
    add_order_hint(model, v, orders)
    for xs in choice.values():
        for k, x in xs.items():
            model.add_hint(x, k == max(xs))
    return solve_model(model, v, time_limit=time_limit, seed=seed, workers=workers, deterministic=deterministic)


def _lighter(plan: Plan, graph: Graph, cluster: Cluster, new: Plan, orders: Mapping[int, Order] | None) -> Plan:
    """Phase 2's plan (its ``orders``) instead of phase 1's ``new`` when it simulates no slower
    (1e-6 relative, the tick rounding) and uses no more memory; else ``new``."""
    if orders is None:
        return new
    new2 = _rebuild(plan, graph, cluster, orders)
    if (
        new2.predicted.iteration_time <= new.predicted.iteration_time * (1 + 1e-6)
        and new2.predicted.peak_memory_bytes <= new.predicted.peak_memory_bytes
    ):
        return new2
    return new


def _keep_if_better(out: TightenResult, new: Plan, data: ScheduleData, t0: float, memory_bytes: float) -> TightenResult:
    """``out`` (its plan the input, ``t0`` the start of the search) with ``new`` in it when ``new``
    simulates faster, or as fast with a lower peak memory, or when the input's own orders break the
    memory limit (the solver's always respect it; a stage with ``W`` fits when its own memory does,
    as ``K_S`` bounds its kept gradients from above); logs the choice."""
    before, mem_before = out.makespan_before, out.peak_memory_before
    after, mem_after = new.predicted.iteration_time, new.predicted.peak_memory_bytes
    before_fits = all(
        s.in_flight_samples <= data.max_in_flight[s.id] * s.micro_batch_size
        or (has_weight_actions(s.schedule.order) and s.predicted.memory_bytes <= memory_bytes * (1 + 1e-9))
        for s in out.plan.stages
    )
    better = (
        (not before_fits)
        or after < before * (1 - 1e-9)
        or (after <= before * (1 + 1e-12) and mem_after < mem_before * (1 - 1e-9))
    )
    logger.info(
        "tighten: %s/%s, makespan %.6g -> %.6g s, peak memory %.4g -> %.4g B (%s)",
        out.status,
        out.memory_status,
        before,
        after,
        mem_before,
        mem_after,
        "kept" if better else "discarded",
    )
    if not better:
        return replace(out, seconds=time.perf_counter() - t0)
    return replace(
        out,
        plan=new,
        makespan_after=after,
        peak_memory_after=mem_after,
        improved=True,
        seconds=time.perf_counter() - t0,
    )


def tighten(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    *,
    time_limit: float = 10.0,
    seed: int = 0,
    workers: int = 1,
    deterministic: bool = False,
    max_actions: int = MAX_ACTIONS,
    resolution: int = DEFAULT_RESOLUTION,
    minimize_memory: bool = True,
    progress: bool = False,
) -> TightenResult:
    """Search for better orders of the plan's partition, starting from its own orders as a hint.

    Phase 1 minimises the makespan (3/4 of ``time_limit`` when phase 2 runs, else all of it).
    Phase 2 (``minimize_memory``) keeps that makespan in ticks and minimises the largest stage
    memory, then the sum, in the time left; its orders replace phase 1's only if they simulate
    no slower (1e-6 relative, the tick rounding) and use no more memory.

    Returns the rebuilt plan (``build_plan`` with ``StageSpec(order=...)``, validated) when its
    simulated makespan is lower, or equal with a lower peak memory, or when the input's own orders
    break the memory limit (the solver's always respect it); otherwise the input plan.
    """
    t0 = time.perf_counter()
    before = simulate(plan, graph, cluster)
    actions = sum(len(s.schedule.order) for s in plan.stages)
    out = TightenResult(
        plan,
        "too-large",
        before.iteration_time,
        before.iteration_time,
        actions=actions,
        peak_memory_before=before.peak_memory_bytes,
        peak_memory_after=before.peak_memory_bytes,
    )
    if actions > max_actions:
        logger.info("tighten: %d actions > %d, keeping the plan's orders", actions, max_actions)
        return replace(out, seconds=time.perf_counter() - t0)
    model, v = build_schedule_model(plan, graph, cluster, resolution=resolution)
    d = v.data
    add_order_hint(model, v, {s.id: s.schedule.order for s in plan.stages})
    res = solve_model(
        model,
        v,
        time_limit=time_limit * (0.75 if minimize_memory else 1.0),
        seed=seed,
        workers=workers,
        deterministic=deterministic,
        progress=progress,
    )
    out = replace(
        out,
        status=res.status,
        unit=d.unit,
        wall_guard=res.wall_guard,
        lower_bound=None if res.bound_ticks is None else res.bound_ticks * d.unit,
    )
    if res.orders is None:
        return replace(out, seconds=time.perf_counter() - t0)
    new = _rebuild(plan, graph, cluster, res.orders)
    # the rest of the wall-clock budget; a fixed quarter of it in deterministic time when asked to
    left = 0.25 * time_limit if deterministic else time_limit - (time.perf_counter() - t0)
    if minimize_memory and left > 0:
        res2 = _memory_phase(
            d, res.orders, res.objective_ticks, time_limit=left, seed=seed, workers=workers, deterministic=deterministic
        )
        out = replace(out, memory_status=res2.status, wall_guard=out.wall_guard or res2.wall_guard)
        new = _lighter(plan, graph, cluster, new, res2.orders)
    validate(new, graph, cluster)
    return _keep_if_better(out, new, d, t0, cluster.memory_bytes)


def tighten_plan_if_fits(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    time_limit: float | None = 10.0,
    *,
    seed: int = 0,
    workers: int = 1,
    max_actions: int = MAX_ACTIONS,
    progress: bool = False,
) -> tuple[Plan, dict[str, Any]]:
    """Tighten when the model is small enough; the plan carries the record in ``search.extra["cp_tighten"]``.

    ``info``: ``status`` (CP-SAT's name, or ``too-large`` / ``skipped``), ``makespan_before`` /
    ``makespan_after`` (simulated seconds), ``lower_bound`` (seconds, for the rounded durations),
    ``memory_status`` (phase 2), ``peak_memory_before`` / ``peak_memory_after`` (bytes), ``improved``,
    ``seconds``, ``actions``, ``max_actions``, ``tick_seconds``.
    """
    if time_limit is not None and time_limit <= 0:
        mk = plan.predicted.iteration_time
        mem = plan.predicted.peak_memory_bytes
        info = {
            "status": "skipped",
            "makespan_before": mk,
            "makespan_after": mk,
            "lower_bound": None,
            "memory_status": "skipped",
            "peak_memory_before": mem,
            "peak_memory_after": mem,
            "improved": False,
            "seconds": 0.0,
            "actions": None,
            "max_actions": max_actions,
            "tick_seconds": None,
        }
    else:
        r = tighten(
            plan,
            graph,
            cluster,
            time_limit=10.0 if time_limit is None else time_limit,
            seed=seed,
            workers=workers,
            max_actions=max_actions,
            progress=progress,
        )
        plan = r.plan
        info = {
            "status": r.status,
            "makespan_before": r.makespan_before,
            "makespan_after": r.makespan_after,
            "lower_bound": r.lower_bound,
            "memory_status": r.memory_status,
            "peak_memory_before": r.peak_memory_before,
            "peak_memory_after": r.peak_memory_after,
            "improved": r.improved,
            "seconds": r.seconds,
            "actions": r.actions,
            "max_actions": max_actions,
            "tick_seconds": r.unit or None,
        }
    plan = replace(plan, search=replace(plan.search, extra={**dict(plan.search.extra), "cp_tighten": info}))
    return plan, info
