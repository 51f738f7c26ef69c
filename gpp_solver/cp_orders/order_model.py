"""The CP-SAT model of every stage's micro-batch order for a FIXED partition: variables,
constraints, solve (its data, in ticks, is :mod:`gpp_solver.cp_orders.schedule_data`; the verify
and tighten steps that use it are :mod:`gpp_solver.cp_orders.cp_schedule`).

The partition (stages, devices, micro-batch sizes) is the plan's; only the orders are free.  The
model follows the simulator's rules (``docs/cost-model.md``, *Iteration time*) exactly, up to the
rounding of durations to integer ticks (:mod:`~gpp_solver.cp_orders.schedule_data`):

* data — :class:`ScheduleData`: per stage ``S`` the micro-batches ``n_S``, the durations ``F(S)``,
  ``B(S)``, the all-reduce tail ``A(S)`` and the memory limit's ``K_S`` micro-batches in flight;
* variables — one fixed-size interval ``F_s{S}_j{j}`` / ``B_s{S}_j{j}`` per action, ``makespan``;
* constraints — see the commented blocks in :func:`build_schedule_model`;
* objective — ``makespan = max_S end(B(S, n_S - 1)) + A(S)``, minimised.

**Memory.** The cost model's in-flight count is the peak of forwards done minus backwards done
(times ``b``).  On one stage actions never overlap, so "``F(S, j + K)`` starts after ``B(S, j)``
ends" for every ``j`` is exactly "never more than ``K`` micro-batches in flight".  That
precedence form (default) propagates much better than a cumulative over live ranges
``[start F j, end B j)`` with capacity ``K``, which is kept as ``memory_form="cumulative"`` and
tested to give the same optimum.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ortools.sat.python import cp_model

from gpp_solver._backend.progress import ProgressBar
from gpp_solver.action import Action
from gpp_solver.cp_orders.schedule_data import DEFAULT_RESOLUTION, ScheduleData, schedule_data
from gpp_solver.errors import DeadlockError, InvalidInputError, SolverError
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.plan.validate import check_order
from gpp_solver.types import Cluster, Graph, Plan

Order = tuple[Action, ...]
Key = tuple[int, str, int]  # (stage, "F"/"B", micro-batch)


def _last_covering(j: int, b_self: int, b_other: int) -> int:
    """Last micro-batch of a neighbour (size ``b_other``) holding samples of our micro-batch ``j``;
    the earlier covering ones precede it in the neighbour's own chain (C4)."""
    return ((j + 1) * b_self - 1) // b_other


# ---------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class ScheduleVars:
    """The model's variables by index: ``start[(S, "F", j)]`` etc., and the ``makespan``."""

    data: ScheduleData
    start: Mapping[Key, cp_model.IntVar]
    interval: Mapping[Key, cp_model.IntervalVar]
    makespan: cp_model.IntVar

    def end(self, key: Key) -> cp_model.LinearExpr:
        s, kind, _ = key
        d = self.data
        return self.start[key] + (d.forward[s] if kind == "F" else d.backward[s] if kind == "B" else d.weight[s])


def model_from_data(
    data: ScheduleData,
    *,
    orders: Mapping[int, Sequence[tuple[str, int]]] | None = None,
    memory_form: str = "precedence",
) -> tuple[cp_model.CpModel, ScheduleVars]:
    """The CP-SAT model of :class:`ScheduleData` (pure).  With ``orders`` each stage's order is fixed."""
    if memory_form not in ("precedence", "cumulative"):
        raise InvalidInputError(f"memory_form must be 'precedence' or 'cumulative', got {memory_form!r}")
    model = cp_model.CpModel()
    model.name = "gpp-stage-orders"
    H = data.horizon
    dur = {"F": data.forward, "B": data.backward, "W": data.weight}

    # Variables: one fixed-size interval per action, named from its indices.
    start: dict[Key, cp_model.IntVar] = {}
    interval: dict[Key, cp_model.IntervalVar] = {}
    for s in data.stages:
        for j in range(data.n[s]):
            for kind in data.kinds(s):
                key = (s, kind, j)
                start[key] = model.new_int_var(0, H, f"{kind}_s{s}_j{j}_start")
                interval[key] = model.new_fixed_size_interval_var(start[key], dur[kind][s], f"{kind}_s{s}_j{j}")
    makespan = model.new_int_var(0, H, "makespan")
    v = ScheduleVars(data, start, interval, makespan)

    # One device group per stage: its actions never overlap.
    for s in data.stages:
        model.add_no_overlap([interval[(s, k, j)] for j in range(data.n[s]) for k in data.kinds(s)])

    # C4: F j before F j+1, B j before B j+1, F j before B j; split: B j before W j, W j before W j+1.
    for s in data.stages:
        for j in range(data.n[s]):
            model.add(start[(s, "B", j)] >= v.end((s, "F", j)))
            if s in data.weight:
                model.add(start[(s, "W", j)] >= v.end((s, "B", j)))
            if j + 1 < data.n[s]:
                for kind in data.kinds(s):
                    model.add(start[(s, kind, j + 1)] >= v.end((s, kind, j)))

    # Stage edges with sample coverage: F(S, j) after the covering forwards of each predecessor,
    # B(P, j) after the covering backwards of each successor (the last covering one suffices).
    for p, s in data.edges:
        bp, bs = data.micro_batch[p], data.micro_batch[s]
        for j in range(data.n[s]):
            model.add(start[(s, "F", j)] >= v.end((p, "F", _last_covering(j, bs, bp))))
        for j in range(data.n[p]):
            model.add(start[(p, "B", j)] >= v.end((s, "B", _last_covering(j, bp, bs))))

    # Memory: at most K_S micro-batches in flight on stage S.
    for s in data.stages:
        K, n = data.max_in_flight[s], data.n[s]
        if K >= n:
            continue
        if memory_form == "precedence":
            for j in range(n - K):  # with K = 0 this contradicts C4: nothing fits, infeasible
                model.add(start[(s, "F", j + K)] >= v.end((s, data.release(s), j)))
        else:
            live = []
            for j in range(n):
                size = model.new_int_var(0, H, f"live_s{s}_j{j}_size")
                end = model.new_int_var(0, H, f"live_s{s}_j{j}_end")
                model.add(end == v.end((s, data.release(s), j)))
                live.append(model.new_interval_var(start[(s, "F", j)], size, end, f"live_s{s}_j{j}"))
            model.add_cumulative(live, [1] * n, K)

    # Fixed orders (verify): each action after the previous one of its stage's order.
    if orders is not None:
        for s in data.stages:
            order = list(orders[s])
            check_order(s, order, data.n[s])
            for (k0, j0), (k1, j1) in zip(order, order[1:]):
                model.add(start[(s, k1, j1)] >= v.end((s, k0, j0)))

    # Objective: the last all-reduce tail ends the iteration.
    for s in data.stages:
        model.add(makespan >= v.end((s, data.release(s), data.n[s] - 1)) + data.allreduce[s])
    model.minimize(makespan)
    return model, v


def build_schedule_model(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    *,
    orders: Mapping[int, Sequence[tuple[str, int]]] | None = None,
    max_in_flight: Mapping[int, int] | None = None,
    memory_form: str = "precedence",
    unit: float | None = None,
    resolution: int = DEFAULT_RESOLUTION,
) -> tuple[cp_model.CpModel, ScheduleVars]:
    """The model of the plan's partition (pure: nothing is solved).  ``orders`` fixes the orders;
    ``max_in_flight`` (samples per stage id) overrides the memory limit."""
    data = schedule_data(plan, graph, cluster, max_in_flight=max_in_flight, unit=unit, resolution=resolution)
    return model_from_data(data, orders=orders, memory_form=memory_form)


def add_order_hint(model: cp_model.CpModel, v: ScheduleVars, orders: Mapping[int, Sequence[tuple[str, int]]]) -> bool:
    """Hint every start with the ASAP schedule of ``orders`` in ticks; False when they deadlock."""
    d = v.data
    try:
        ticks, tasks = simulate_orders(
            orders,
            d.micro_batch,
            {s: float(d.forward[s]) for s in d.stages},
            {s: float(d.backward[s] + d.weight.get(s, 0)) for s in d.stages},
            {s: float(d.allreduce[s]) for s in d.stages},
            d.edges,
            0,
            weight={s: float(w) for s, w in d.weight.items()},
        )
    except DeadlockError:
        return False
    for t in tasks:
        model.add_hint(v.start[(t.stage, t.kind, t.micro_batch)], int(round(t.start)))
    model.add_hint(v.makespan, int(round(ticks)))
    return True


MEMORY_RESOLUTION = 100_000  # memory units in the largest stage memory of the second phase


def add_memory_objective(
    model: cp_model.CpModel, v: ScheduleVars, *, makespan_cap: int, peak_cap: Mapping[int, int]
) -> dict[int, dict[int, cp_model.IntVar]]:
    """Second phase: keep ``makespan <= makespan_cap`` and minimise memory instead.

    Each stage picks its in-flight bound ``k`` in ``1..peak_cap[S]`` (``x_s{S}_k{k}``, exactly one);
    the chosen ``k`` enforces ``F(S, j + k)`` after ``B(S, j)``.  Objective, lexicographic through
    weights: the largest stage memory ``M(S)``, then the sum over stages (in units of 1/100000 of the
    largest stage memory phase 1 reached, rounded up).
    Returns the choice literals ``{stage: {k: x}}`` (for hints and reading back).
    """
    d = v.data
    model.add(v.makespan <= makespan_cap)
    caps = {s: max(1, min(peak_cap[s], d.max_in_flight[s], d.n[s])) for s in d.stages}
    largest = max(d.memory_base[s] + caps[s] * d.memory_per_micro_batch[s] for s in d.stages)
    mem_unit = largest / MEMORY_RESOLUTION if largest > 0 else 1.0
    choice: dict[int, dict[int, cp_model.IntVar]] = {}
    mem_terms = []
    for s in d.stages:
        n = d.n[s]
        choice[s] = {k: model.new_bool_var(f"x_s{s}_k{k}") for k in range(1, caps[s] + 1)}
        model.add_exactly_one(choice[s].values())
        for k, x in choice[s].items():
            for j in range(n - k):
                model.add(v.start[(s, "F", j + k)] >= v.end((s, d.release(s), j))).only_enforce_if(x)
        units = {
            k: int(math.ceil((d.memory_base[s] + k * d.memory_per_micro_batch[s]) / mem_unit - 1e-9)) for k in choice[s]
        }
        mem_terms.append(sum(units[k] * x for k, x in choice[s].items()))
    peak = model.new_int_var(0, MEMORY_RESOLUTION, "peak_memory")
    for t in mem_terms:
        model.add(peak >= t)
    model.minimize(peak * (MEMORY_RESOLUTION * len(d.stages) + 1) + sum(mem_terms))
    return choice


# ---------------------------------------------------------------------------------------- solve
@dataclass(frozen=True)
class Solved:
    status: str  # CP-SAT status name
    orders: dict[int, Order] | None
    objective_ticks: int | None
    bound_ticks: int | None
    seconds: float
    # deterministic mode: something other than a proof or the deterministic limit (the wall-clock
    # guard, 4x that limit + 1 s) ended the search, so the result may depend on the machine's speed
    wall_guard: bool = False


class _SolutionBar(cp_model.CpSolverSolutionCallback):
    """Shows each improving solution's makespan on a terminal progress bar (see ``progress.py``)."""

    def __init__(self, bar: ProgressBar) -> None:
        super().__init__()
        self.bar = bar

    def on_solution_callback(self) -> None:
        self.bar.set_postfix_str(f"makespan {self.objective_value:.0f} ticks, bound {self.best_objective_bound:.0f}")
        self.bar.update(1)


def solve_model(
    model: cp_model.CpModel,
    v: ScheduleVars,
    *,
    time_limit: float,
    seed: int = 0,
    workers: int = 1,
    deterministic: bool = False,
    progress: bool = False,
) -> Solved:
    """Solve with an explicit time limit and read the orders back (each stage's actions by start)."""
    solver = cp_model.CpSolver()
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = max(1, workers)
    # A complete hint is checked and kept as the first solution before the search starts; the
    # "hint search" that then follows it branch by branch cost 6 s of a 7.5 s budget on a
    # 768-action Transformer instance without finding anything better, so skip it.
    solver.parameters.hint_conflict_limit = 0
    wall_limit = 4 * time_limit + 1 if deterministic else time_limit
    if deterministic:
        solver.parameters.max_deterministic_time = time_limit
        solver.parameters.max_time_in_seconds = wall_limit
    else:
        solver.parameters.max_time_in_seconds = time_limit
    t0 = time.perf_counter()
    with ProgressBar(None, "CP-SAT schedule", "solution", progress) as bar:
        code = solver.solve(model, _SolutionBar(bar) if bar.bar is not None else None)
    seconds = time.perf_counter() - t0
    status = solver.status_name(code)
    # without a proof, only a search that used up its deterministic time ended deterministically;
    # anything else (the wall-clock guard, whatever CP-SAT's own wall clock said) may depend on load
    guard = (
        deterministic
        and status not in ("OPTIMAL", "INFEASIBLE")
        and solver.response_proto.deterministic_time < 0.99 * time_limit
    )
    if status == "MODEL_INVALID":
        raise SolverError(f"CP-SAT says the schedule model is invalid: {model.validate()}")
    if status not in ("OPTIMAL", "FEASIBLE"):
        return Solved(status, None, None, None, seconds, guard)
    d = v.data
    orders = {}
    for s in d.stages:
        keys = [(s, k, j) for j in range(d.n[s]) for k in d.kinds(s)]
        keys.sort(key=lambda key: solver.value(v.start[key]))
        orders[s] = tuple(Action.of(k, j) for _, k, j in keys)
    return Solved(
        status, orders, int(solver.objective_value), int(math.ceil(solver.best_objective_bound - 1e-9)), seconds, guard
    )
