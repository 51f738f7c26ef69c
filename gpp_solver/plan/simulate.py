"""Event simulation of a plan under the cost model (``docs/cost-model.md``, *Iteration time*).

Every stage runs its ``schedule.order`` in sequence.  ``F(S, j)`` lasts the stage's forward compute
plus the forward halves of its transfers and starts when the stage is free and every predecessor
stage has finished the forwards covering micro-batch ``j``'s samples ``[j*b, (j+1)*b)`` (with
unequal micro-batch sizes that can be several micro-batches or part of one); ``B(S, j)`` likewise
waits for the backwards of every successor covering those samples.  Each stage ends with its
all-reduce ``A(S)`` and its optimizer step ``O(S)`` after its last action.  In an order with ``W`` actions (split backward,
``docs/zero-bubble.md``) ``B(S, j)`` is the input gradient alone and ``W(S, j)``, the weight
gradient, waits only on the stage itself.  The makespan is the iteration time.  Orders that
wait on each other forever raise :class:`DeadlockError` naming the waiting stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpp_solver.cost.memory import order_memory
from gpp_solver.cost.model import StageCost, in_flight_from_order, stage_costs
from gpp_solver.errors import DeadlockError, SolverError, check_types
from gpp_solver.plan.grid import order_grid
from gpp_solver.types import Cluster, Graph, Plan


@dataclass(frozen=True)
class Task:
    stage: int  # stage id
    kind: str  # "F", "B" or "W"
    micro_batch: int
    start: float
    end: float


@dataclass(frozen=True)
class StageStats:
    stage: int
    busy: float  # compute + communication + all-reduce
    idle_fraction: float  # 1 - busy / makespan
    peak_in_flight_samples: int
    memory_bytes: float
    idle: float = 0.0  # makespan - busy (the stage's bubbles, seconds)
    allreduce: float = 0.0  # A(S), run right after the stage's last backward
    optimizer: float = 0.0  # O(S), the optimizer step right after the all-reduce


@dataclass(frozen=True)
class SimResult:
    iteration_time: float
    throughput: float
    tasks: tuple[Task, ...]
    stages: tuple[StageStats, ...]

    @property
    def peak_memory_bytes(self) -> float:
        return max(s.memory_bytes for s in self.stages)

    def stage_tasks(self, stage: int) -> list[Task]:
        """The timed actions of one stage, in the order it ran them."""
        return sorted((t for t in self.tasks if t.stage == stage), key=lambda t: (t.start, t.end))

    def allreduce_span(self, stage: int) -> tuple[float, float]:
        """``(start, end)`` of the stage's all-reduce tail: it starts when its last action ends."""
        st = next(s for s in self.stages if s.stage == stage)
        start = max((t.end for t in self.tasks if t.stage == stage), default=0.0)
        return start, start + st.allreduce


def _covering(j: int, b_self: int, b_other: int) -> range:
    """Micro-batches of a neighbour (size ``b_other``) covering samples of our micro-batch ``j``."""
    lo = (j * b_self) // b_other
    hi = ((j + 1) * b_self - 1) // b_other
    return range(lo, hi + 1)


def _deadlock(
    orders: Mapping[int, Sequence[tuple[str, int]]],
    ptr: Mapping[int, int],
    preds: Mapping[int, list[int]],
    succs: Mapping[int, list[int]],
    micro_batch: Mapping[int, int],
    done: Mapping[tuple[int, str, int], float],
) -> DeadlockError:
    """A :class:`DeadlockError` naming every waiting stage, what it waits for, and the grid.

    The error carries ``waiting``: ``((stage, kind, micro_batch, step), ...)`` of the stuck stages.
    """
    waiting = []
    parts = []
    for s, order in orders.items():
        if ptr[s] >= len(order):
            continue
        kind, j = order[ptr[s]]
        deps = preds[s] if kind == "F" else succs[s]
        missing = [
            f"{kind}{q} of stage {p}"
            for p in deps
            for q in _covering(j, micro_batch[s], micro_batch[p])
            if (p, kind, q) not in done
        ]
        waiting.append((s, kind, j, ptr[s]))
        parts.append(
            f"stage {s} at {kind}{j} (step {ptr[s]}) waits for "
            + ", ".join(missing[:3])
            + (" ..." if len(missing) > 3 else "")
        )
    grid = order_grid(orders, marks={(s, step) for s, _, _, step in waiting})
    exc = DeadlockError("schedule deadlocks: " + "; ".join(parts) + " — they wait on each other forever\n" + grid)
    exc.waiting = tuple(waiting)  # type: ignore[attr-defined]
    return exc


# complexity: the simulator's one event loop: each branch is one kind of action or message
def simulate_orders(  # noqa: C901, PLR0912, PLR0915
    orders: Mapping[int, Sequence[tuple[str, int]]],
    micro_batch: Mapping[int, int],
    forward: Mapping[int, float],
    backward: Mapping[int, float],
    allreduce: Mapping[int, float],
    edges: Sequence[tuple[int, int]],
    mini_batch_size: int,
    *,
    record: bool = True,
    weight: Mapping[int, float] | None = None,
    accumulate: Mapping[int, float] | None = None,
    split_input: Mapping[int, float] | None = None,
) -> tuple[float, list[Task]]:
    """The makespan and the timed tasks of the given per-stage orders (pure, no cost model);
    ``record=False``: the makespan alone (the task list comes back empty, the figures are the same).

    ``weight[S]``: the weight-gradient part of ``backward[S]``.  In a stage whose order holds ``W``
    actions, ``B(S, j)`` lasts ``split_input[S]`` (absent: ``backward - weight``) and ``W(S, j)``
    lasts ``weight``, waiting on nothing but the stage's own order (``weight`` absent: 0).
    ``accumulate[S]``: one gradient sum, in each weight-gradient action after the stage's first
    (:func:`sums_in_backwards`; absent: 0)."""
    stages = list(orders)
    preds: dict[int, list[int]] = {s: [] for s in stages}
    succs: dict[int, list[int]] = {s: [] for s in stages}
    for a, b in edges:
        succs[a].append(b)
        preds[b].append(a)
    fin: dict[int, dict[str, dict[int, float]]] = {s: {"F": {}, "B": {}, "W": {}} for s in stages}
    acts = _timed_actions(orders, micro_batch, forward, backward, weight, preds, succs, fin, accumulate, split_input)
    if acts is None:  # an action kind this loop does not know
        return _simulate_any_kind(orders, micro_batch, forward, backward, allreduce, preds, succs, record, accumulate)
    ptr = {s: 0 for s in stages}
    free = {s: 0.0 for s in stages}
    tasks: list[Task] = []
    remaining = sum(len(o) for o in acts.values())
    while remaining:
        progress = False
        for s in stages:
            todo = acts[s]
            i, n_todo = ptr[s], len(todo)
            if i >= n_todo:
                continue
            b_s, ready0 = micro_batch[s], free[s]
            while i < n_todo:
                kind, j, deps, own, length = todo[i]
                ready = ready0
                ok = True
                for dd, same, b_p in deps:
                    if same:
                        t = dd.get(j)
                        if t is None:
                            ok = False
                            break
                        if t > ready:  # max(ready, t)
                            ready = t
                        continue
                    for q in _covering(j, b_s, b_p):
                        t = dd.get(q)
                        if t is None:
                            ok = False
                            break
                        if t > ready:
                            ready = t
                    if not ok:
                        break
                if not ok:
                    break
                end = ready + length
                own[j] = end
                if record:
                    tasks.append(Task(s, kind, j, ready, end))
                ready0 = end
                i += 1
                remaining -= 1
                progress = True
            ptr[s], free[s] = i, ready0
        if not progress:
            done = {(s, kind, j): t for s in stages for kind, d in fin[s].items() for j, t in d.items()}
            raise _deadlock(orders, ptr, preds, succs, micro_batch, done)
    makespan = max(free[s] + allreduce[s] for s in stages)
    return makespan, tasks


def _timed_actions(
    orders: Mapping[int, Sequence[tuple[str, int]]],
    micro_batch: Mapping[int, int],
    forward: Mapping[int, float],
    backward: Mapping[int, float],
    weight: Mapping[int, float] | None,
    preds: dict[int, list[int]],
    succs: dict[int, list[int]],
    fin: dict[int, dict[str, dict[int, float]]],
    accumulate: Mapping[int, float] | None = None,
    split_input: Mapping[int, float] | None = None,
) -> dict | None:
    """Per stage its actions in order as ``(kind, j, what it waits on, its finish-time dict, duration)``;
    ``None`` when an order holds a kind other than F, B and W.  Per stage and kind, the neighbours an
    action waits on: (their finish times of that kind, same micro-batch size?, their size) — with the
    same size micro-batch j waits on the neighbour's j alone, the common case."""
    stages = list(orders)
    deps_f = {s: [(fin[p]["F"], micro_batch[p] == micro_batch[s], micro_batch[p]) for p in preds[s]] for s in stages}
    deps_b = {s: [(fin[p]["B"], micro_batch[p] == micro_batch[s], micro_batch[p]) for p in succs[s]] for s in stages}
    acts: dict[int, list[tuple[str, int, list, dict[int, float], float]]] = {}
    for s in stages:
        acts[s] = []
        split = any(kind == "W" for kind, _ in orders[s])
        w = (weight or {}).get(s, 0.0) if split else 0.0
        b_in = split_input.get(s) if split and split_input else None
        dur = {"F": forward[s], "B": backward[s] - w if b_in is None else b_in, "W": w}
        deps = {"F": deps_f[s], "B": deps_b[s], "W": []}
        summing, extra, seen = ("W" if split else "B"), (accumulate or {}).get(s, 0.0), False
        for kind, j in orders[s]:
            if kind not in dur:
                return None
            length = dur[kind]
            if kind == summing:
                if seen:
                    length += extra
                seen = True
            acts[s].append((kind, j, deps[kind], fin[s][kind], length))
    return acts


def _simulate_any_kind(
    orders: Mapping[int, Sequence[tuple[str, int]]],
    micro_batch: Mapping[int, int],
    forward: Mapping[int, float],
    backward: Mapping[int, float],
    allreduce: Mapping[int, float],
    preds: Mapping[int, list[int]],
    succs: Mapping[int, list[int]],
    record: bool,
    accumulate: Mapping[int, float] | None = None,
) -> tuple[float, list[Task]]:
    """:func:`simulate_orders` for orders with a kind other than ``F``/``B`` (timed as a backward,
    waiting on the same kind of the successors): the general loop, keyed by kind."""
    stages = list(orders)
    done: dict[tuple[int, str, int], float] = {}
    ptr = {s: 0 for s in stages}
    free = {s: 0.0 for s in stages}
    tasks: list[Task] = []
    summed = {s: False for s in stages}  # a backward done: later ones sum into its gradients
    remaining = sum(len(o) for o in orders.values())
    while remaining:
        progress = False
        for s in stages:
            order = orders[s]
            while ptr[s] < len(order):
                kind, j = order[ptr[s]]
                deps = preds[s] if kind == "F" else succs[s]
                ready = free[s]
                ok = True
                for p in deps:
                    for q in _covering(j, micro_batch[s], micro_batch[p]):
                        t = done.get((p, kind, q))
                        if t is None:
                            ok = False
                            break
                        ready = max(ready, t)
                    if not ok:
                        break
                if not ok:
                    break
                end = ready + (forward[s] if kind == "F" else backward[s])
                if kind == "B":
                    if summed[s]:
                        end += (accumulate or {}).get(s, 0.0)
                    summed[s] = True
                done[(s, kind, j)] = end
                if record:
                    tasks.append(Task(s, kind, j, ready, end))
                free[s] = end
                ptr[s] += 1
                remaining -= 1
                progress = True
        if not progress:
            raise _deadlock(orders, ptr, preds, succs, micro_batch, done)
    return max(free[s] + allreduce[s] for s in stages), tasks


def sums_in_backwards(costs: Sequence[StageCost], mini_batch_size: int) -> tuple[list[float], list[float]]:
    """Per stage (in ``costs``' order), its tail without the gradient sums and one sum: the stage
    costs price a step's sums in ``O(S)``, the tail; they run inside the backwards after a stage's
    first (``accumulate`` of :func:`simulate_orders`), on the step's critical path where a later
    stage waits for them. The same total: a stage's busy time is unchanged."""
    tails, sums = [], []
    for c in costs:
        n = mini_batch_size // c.micro_batch_size - 1  # the sums: every micro-batch after the first
        total = c.accumulation if n > 0 else 0.0
        tails.append(max(0.0, c.tail - total) if total else c.tail)
        sums.append(total / n if total else 0.0)
    return tails, sums


def simulate(
    plan: Plan,
    graph: Graph,
    cluster: Cluster,
    *,
    record: bool = True,
    memory: Mapping[int, float] | None = None,
) -> SimResult:
    """Simulate ``plan`` (its own orders) and report iteration time, throughput, bubbles, memory.

    ``record=False``: no timed tasks (``tasks`` is empty; every figure is the same), for a check
    that needs the figures alone; ``memory``: each stage's ``order_memory`` by stage id, when the
    caller has it already (a plan of many micro-batches prices its orders in seconds)."""
    check_types(plan=(plan, Plan), graph=(graph, Graph), cluster=(cluster, Cluster))
    costs: list[StageCost] = stage_costs(graph, cluster, plan.stages, plan.mini_batch_size)
    by_id = {s.id: (s, c) for s, c in zip(plan.stages, costs)}
    orders = {s.id: s.schedule.order for s in plan.stages}
    tails, sums = sums_in_backwards(costs, plan.mini_batch_size)
    makespan, tasks = simulate_orders(
        orders,
        {i: s.micro_batch_size for i, (s, _) in by_id.items()},
        {i: c.forward for i, (_, c) in by_id.items()},
        {i: c.backward for i, (_, c) in by_id.items()},
        {i: tails[k] for k, i in enumerate(by_id)},
        plan.edges,
        plan.mini_batch_size,
        record=record,
        weight={i: c.backward_weight for i, (_, c) in by_id.items()},
        accumulate={i: sums[k] for k, i in enumerate(by_id)},
        split_input={i: c.backward_input for i, (_, c) in by_id.items()},
    )
    stats = []
    for i, (s, c) in by_id.items():
        n = sum(1 for a in s.schedule.order if a[0] == "F")
        split = any(a[0] == "W" for a in s.schedule.order)
        busy = n * (c.forward + (c.backward_input + c.backward_weight if split else c.backward)) + c.tail
        peak = in_flight_from_order(s.schedule.order, s.micro_batch_size)
        stats.append(
            StageStats(
                i,
                busy,
                1.0 - busy / makespan if makespan > 0 else 0.0,
                peak,
                order_memory(graph, cluster, s, s.schedule.order, plan.stages) if memory is None else memory[i],
                idle=makespan - busy,
                allreduce=c.allreduce,
                optimizer=c.optimizer,
            )
        )
    return SimResult(
        makespan, plan.mini_batch_size / makespan if makespan > 0 else float("inf"), tuple(tasks), tuple(stats)
    )


def require_finite(sim: SimResult) -> SimResult:
    """``sim``, or :class:`SolverError` when a figure is not finite (never printed as a result)."""
    bad = {
        k: v
        for k, v in (
            ("iteration time", sim.iteration_time),
            ("throughput", sim.throughput),
            ("peak memory", sim.peak_memory_bytes),
        )
        if not math.isfinite(v)
    }
    if bad:
        raise SolverError(
            f"the simulated figures are not finite ({', '.join(f'{k} {v}' for k, v in bad.items())}); "
            "the inputs are outside what the cost model can evaluate"
        )
    return sim
