"""The cost-model figures of a FIXED partition that the CP-SAT order model takes, in integer ticks
(the model itself is :mod:`gpp_solver.cp_orders.order_model`).

Per stage ``S``: ``n_S = B / b_S`` micro-batches, durations ``F(S)`` (forward compute + forward
halves of its transfers), ``B(S)`` (backward halves), all-reduce tail ``A(S)`` from
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
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpp_solver.action import has_weight_actions
from gpp_solver.cost.memory import stage_memory
from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InvalidInputError
from gpp_solver.types import Cluster, Graph, Plan, Stage

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
