"""CP-SAT over every stage's micro-batch order for a FIXED partition: the model's data in ticks
(:class:`ScheduleData`, :func:`schedule_data`), the model itself — variables, constraints, memory
(:func:`build_schedule_model`, :func:`solve_model`) — and the verify and tighten steps that use it
(:func:`verify_orders`, :func:`tighten`, the public entry).

The partition (stages, devices, micro-batch sizes) is the plan's; only the orders are free.
:func:`verify_orders` checks given orders against the model; :func:`tighten` searches for orders
with a shorter simulated iteration time (then, at that makespan, less peak memory).

**Data.** Per stage ``S``: ``n_S = B / b_S`` micro-batches, durations ``F(S)`` (forward compute +
forward halves of its transfers), ``B(S)`` (backward halves), all-reduce tail ``A(S)`` from
:func:`gpp_solver.cost.model.stage_costs`, the largest number of micro-batches ``K_S`` the memory
limit lets it hold (``M(S) <= memory_bytes`` with ``in_flight = K_S * b_S``, and in a stage whose
order holds ``W`` as many pending weight gradients: ``docs/zero-bubble.md``, *Memory rule*).

**Ticks.** CP-SAT needs integers: one tick is ``unit`` seconds, by default the serial horizon
(every action of every stage one after another, plus the largest all-reduce) divided by
``resolution`` (10^6).  Each duration is rounded to the nearest tick, and at least one tick, so
an action's modelled length is off by at most one tick (half a tick unless it is shorter than
half a tick) and a makespan in ticks by at most one tick per action on its critical path.
``OPTIMAL`` is therefore proven for the rounded durations; every makespan the order model reports
(``makespan``, ``makespan_before/after``) is the exact float of the simulator re-run on the
orders, and ``lower_bound`` is the solver's bound in ticks times ``unit``.

**Model.** The model follows the simulator's rules (``docs/cost-model.md``, *Iteration time*)
exactly, up to the rounding of durations to integer ticks (*Ticks*, above):

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

**Determinism.** With ``workers=1`` and a fixed ``seed`` the search is reproducible when it ends
before the time limit (an ``OPTIMAL`` proof); with ``deterministic=True`` the limit is CP-SAT's
deterministic time (``max_deterministic_time = time_limit``, wall limit 4x as a guard) and the
result is reproducible on any machine load.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ortools.sat.python import cp_model

from gpp_solver._backend.progress import ProgressBar
from gpp_solver.action import Action, has_weight_actions
from gpp_solver.cost.memory import stage_memory
from gpp_solver.cost.model import in_flight_from_order, stage_costs
from gpp_solver.errors import DeadlockError, InvalidInputError, SolverError
from gpp_solver.plan.build import build_plan, spec_of
from gpp_solver.plan.simulate import simulate, simulate_orders
from gpp_solver.plan.validate import check_order, validate
from gpp_solver.types import Cluster, Graph, Plan, Schedule, Stage

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


# -------------------------------------------------------------------------------- data in ticks
DEFAULT_RESOLUTION = 1_000_000  # ticks in the serial horizon


@dataclass(frozen=True)
class ScheduleData:
    """Everything the model needs, already in ticks (``unit`` seconds each)."""

    stages: tuple[int, ...]
    n: Mapping[int, int]  # micro-batches per stage
    micro_batch: Mapping[int, int]  # b per stage
    forward: Mapping[int, int]  # ticks
    backward: Mapping[int, int]
    allreduce: Mapping[int, int]
    edges: tuple[tuple[int, int], ...]
    max_in_flight: Mapping[int, int]  # K_S, micro-batches (n_S when memory does not bind)
    unit: float  # seconds per tick
    horizon: int  # ticks; no schedule without deadlock is longer
    memory_base: Mapping[int, float] = field(default_factory=dict)  # bytes: optimizer_state_factor * W
    memory_per_micro_batch: Mapping[int, float] = field(default_factory=dict)  # bytes per device per micro-batch
    # stages with a split backward: their W duration in ticks (``backward`` is then the input gradient's)
    weight: Mapping[int, int] = field(default_factory=dict)

    @property
    def actions(self) -> int:
        return sum((3 if s in self.weight else 2) * n for s, n in self.n.items())

    def kinds(self, s: int) -> tuple[str, ...]:
        """The action kinds of stage ``s``: ``F``, ``B`` and, with a split backward, ``W``."""
        return ("F", "B", "W") if s in self.weight else ("F", "B")

    def release(self, s: int) -> str:
        """The kind whose end frees a micro-batch's activations on stage ``s`` (``W`` or ``B``)."""
        return "W" if s in self.weight else "B"


def _ticks(seconds: float, unit: float) -> int:
    return max(1, int(round(seconds / unit)))


def _held_memory(graph: Graph, cluster: Cluster, stage: Stage, samples: int) -> float:
    """``M(S)`` with ``samples`` in flight; in a stage whose order holds ``W`` also as many pending
    weight gradients (their bound: ``B j`` runs after ``F j``), the gradients ``B`` keeps included."""
    pending = samples if has_weight_actions(stage.schedule.order) else 0
    return stage_memory(graph, cluster, stage, samples, None, pending)


def max_in_flight_micro_batches(plan: Plan, graph: Graph, cluster: Cluster) -> dict[int, int]:
    """``K_S``: most micro-batches stage ``S`` may hold with ``M(S) <= memory_bytes`` (0: none fits).

    Uses :func:`gpp_solver.cost.memory.stage_memory` and the validator's tolerance, so an order passes
    the memory check when its peak is at most ``K_S`` (exactly when, in an order without ``W``; with
    ``W`` the bound counts ``K_S`` micro-batches' kept gradients, at least what the order keeps).
    """
    out = {}
    for s in plan.stages:
        n = plan.mini_batch_size // s.micro_batch_size
        k = 0
        while k < n and _held_memory(graph, cluster, s, (k + 1) * s.micro_batch_size) <= cluster.memory_bytes * (
            1 + 1e-9
        ):
            k += 1
        out[s.id] = k
    return out


def schedule_data(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    *,
    max_in_flight: Mapping[int, int] | None = None,
    unit: float | None = None,
    resolution: int = DEFAULT_RESOLUTION,
) -> ScheduleData:
    """Cost-model figures of the plan's partition in ticks.  ``max_in_flight``: samples per stage
    id (overrides the memory limit for the stages it names).  A stage whose order holds ``W``
    actions gets a split backward: ``B`` the input gradient, ``W`` the weight gradient."""
    costs = stage_costs(graph, cluster, plan.stages, plan.mini_batch_size)
    ids = tuple(s.id for s in plan.stages)
    n = {s.id: plan.mini_batch_size // s.micro_batch_size for s in plan.stages}
    serial = sum(n[s.id] * (c.forward + c.backward) for s, c in zip(plan.stages, costs)) + max(c.tail for c in costs)
    if unit is None:
        unit = serial / resolution if serial > 0 else 1.0
    if not unit > 0:
        raise InvalidInputError(f"`unit > 0` must hold, but got (unit={unit})")
    split = {s.id for s in plan.stages if has_weight_actions(s.schedule.order)}
    fw = {s.id: _ticks(c.forward, unit) for s, c in zip(plan.stages, costs)}
    bw = {s.id: _ticks(c.backward_input if s.id in split else c.backward, unit) for s, c in zip(plan.stages, costs)}
    wt = {s.id: _ticks(c.backward_weight, unit) for s, c in zip(plan.stages, costs) if s.id in split}
    ar = {s.id: int(round(c.tail / unit)) for s, c in zip(plan.stages, costs)}
    k = max_in_flight_micro_batches(plan, graph, cluster)
    for sid, samples in (max_in_flight or {}).items():
        k[sid] = samples // plan.stage(sid).micro_batch_size
    horizon = sum(n[i] * (fw[i] + bw[i] + wt.get(i, 0)) for i in ids) + max(ar.values())
    base = {s.id: stage_memory(graph, cluster, s, 0) for s in plan.stages}
    per_mb = {s.id: _held_memory(graph, cluster, s, s.micro_batch_size) - base[s.id] for s in plan.stages}
    return ScheduleData(
        ids,
        n,
        {s.id: s.micro_batch_size for s in plan.stages},
        fw,
        bw,
        ar,
        tuple(plan.edges),
        {i: min(k[i], n[i]) for i in ids},
        unit,
        horizon,
        base,
        per_mb,
        wt,
    )


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


# complexity: one constraint family of the C4 rules per branch, in the order the module docstring states them
def model_from_data(  # noqa: C901, PLR0912, PLR0915
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
    specs = [spec_of(s, order=tuple(orders[s.id])) for s in plan.stages]
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
