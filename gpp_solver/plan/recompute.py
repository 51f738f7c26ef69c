"""Recomputation as a choice of the planners ``gpp`` and ``graphpipe`` (``solve(..., recompute=...)``,
``gpp plan --recompute``; docs/planners.md, *Recomputation*).

A stage that recomputes (``Stage.recompute``, docs/cost-model.md) keeps its received values alone
between a micro-batch's forward and its backward, and runs the forward again in the backward. The
planners search partitions with a graph as such a stage sees it (:func:`recompute_view`: every
backward longer by its forward, no activations kept), on a memory lowered until the plan, priced
exactly with the stage's own rule, fits (:func:`plan_recomputing`); each stage of the partition
found then recomputes only where it does not fit without (:func:`choose_stages`), since that is
slower. The choices:

* ``"off"``: no stage recomputes (the planner as it is);
* ``"on"``: every stage recomputes;
* ``"auto"`` (the default of ``gpp`` and ``graphpipe``): the planner's plan, and where none fits or
  the plan uses at least :data:`BINDING_SHARE` of the memory, the plan with recomputation too; the
  faster of the two (by simulated iteration time) is returned, so the choice never gives a slower
  plan than ``"off"``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpp_solver.cost.memory import order_memory, overheads_priced
from gpp_solver.errors import (
    InfeasibleError,
    InvalidInputError,
    InvalidPlanError,
    SearchSpaceTooLargeError,
    SolverError,
    show,
)
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.overheads import iteration_first
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

CHOICES = ("auto", "on", "off")
#: the planners that take the choice
PLANNERS = ("gpp", "graphpipe")
#: ``"auto"`` tries recomputation beside a plan that uses at least this share of the memory (below
#: it, memory did not bind the search, and recomputation only costs time)
BINDING_SHARE = 0.9
#: plans tried after the first, each on a memory lowered by what the last one needed beyond the limit
ROUNDS = 6
#: tolerance of a fit, as the validator's
FIT = 1 + 1e-9


def choice_of(planner: str, options: dict) -> str:
    """The ``recompute`` option, taken out of the planner's ``options``: ``"auto"`` when absent for
    the planners that take it, ``"off"`` for the others, which refuse it by name."""
    if "recompute" not in options:
        return "auto" if planner in PLANNERS else "off"
    if planner not in PLANNERS:
        raise InvalidInputError(
            f"recompute: only for the planners {', '.join(PLANNERS)}, but the planner is {planner!r}"
        )
    value = options.pop("recompute")
    if value not in CHOICES:
        raise InvalidInputError(f"recompute must be one of {', '.join(map(repr, CHOICES))}, got {show(value)}")
    return str(value)


def planned(
    choice: str,
    base: Callable[[], Plan],
    run: Callable[[Graph, Cluster, float | None], Plan],
    graph: Graph,
    cluster: Cluster,
    time_limit: float | None,
) -> Plan:
    """The plan for ``choice``: ``base()`` (the planner as it is) unless ``"on"``; beside it, where
    it has none or memory binds it and ``choice`` allows, :func:`plan_recomputing` with ``run`` (the
    planner on the view, orders without ``W``); the faster of the two, recorded (:func:`recorded`)."""
    start = time.perf_counter()
    without, refusal = None, None
    if choice != "on":
        try:
            without = base()
        except InfeasibleError as exc:
            if choice == "off":
                raise
            refusal = exc
    if choice == "off" or (without is not None and not binding(without, cluster)):
        return without
    deadline = None if time_limit is None else start + time_limit
    attempt = plan_recomputing(run, graph, cluster, every=choice == "on", deadline=deadline)
    plan = without
    if attempt.plan is not None and (without is None or iteration_first(attempt.plan) < iteration_first(without)):
        plan = attempt.plan
    if plan is None:
        raise _no_plan(refusal, attempt, cluster)
    return recorded(plan, choice, attempt, without, time.perf_counter() - start)


def _no_plan(refusal: InfeasibleError | None, attempt: Attempt, cluster: Cluster) -> InfeasibleError:
    """The planner's own refusal (its figure of the memory a plan needs), or recomputation's."""
    if refusal is not None:
        return InfeasibleError(
            f"{refusal} (with recomputation: no plan fits either)", required_memory_bytes=refusal.required_memory_bytes
        )
    need = f": the least a plan found needs is {attempt.needs:.6g} bytes per device" if attempt.needs else ""
    return InfeasibleError(
        f"no plan with every stage recomputing fits {cluster.memory_bytes:.6g} bytes per device{need}",
        required_memory_bytes=attempt.needs,
    )


def recompute_view(graph: Graph) -> Graph:
    """``graph`` as the planners see a stage that recomputes: each node's backward times (and the
    graph's per-node backward overhead) longer by its forward's, no activation bytes kept, and no
    profile record (its runtime's overheads are priced on the plan, not on this view)."""
    doc = graph_to_dict(graph)
    for node in doc["nodes"]:
        node["bw_time"] = [b + f for b, f in zip(node["bw_time"], node["fw_time"])]
        node["activation_bytes"] = 0.0
        node.pop("workspace_bytes", None)
        node.pop("weight_copy_bytes", None)
    overhead = doc.get("op_overhead")
    if isinstance(overhead, dict):
        doc["op_overhead"] = {**overhead, "bw": overhead.get("bw", 0.0) + overhead.get("fw", 0.0)}
    extra = dict(doc.get("extra") or {})
    extra.pop("profile", None)
    doc["extra"] = extra
    return graph_from_dict(doc)


def choose_stages(found: Plan, graph: Graph, cluster: Cluster, *, every: bool) -> Plan:
    """``found``'s partition, devices and orders priced exactly under ``cluster``, each stage
    recomputing (``every``) or only where it does not fit without: a stage's memory depends on its
    own choice alone (its received values are the same either way)."""
    specs = [
        StageSpec(s.nodes, s.devices, s.micro_batch_size, k=s.schedule.k, order=s.schedule.order, recompute=True)
        for s in found.stages
    ]
    if not every:
        specs = [
            replace(spec, recompute=False)
            if order_memory(graph, cluster, replace(spec, recompute=False), spec.order, specs)
            <= cluster.memory_bytes * FIT
            else spec
            for spec in specs
        ]
    return build_plan(
        graph, cluster, specs, found.mini_batch_size, planner=found.planner, search=found.search, schedule="1f1b"
    )


@dataclass(frozen=True)
class Attempt:
    """What :func:`plan_recomputing` found: the plan that fits (or ``None``) and the least memory a
    plan it priced needs."""

    plan: Plan | None
    needs: float | None
    rounds: int


def plan_recomputing(
    run: Callable[[Graph, Cluster, float | None], Plan],
    graph: Graph,
    cluster: Cluster,
    *,
    every: bool,
    deadline: float | None = None,
) -> Attempt:
    """``run(view, cluster, seconds)`` (a planner on :func:`recompute_view`, with the seconds left)
    on a memory lowered, round by round, by what its plan, priced exactly with recomputation
    (:func:`choose_stages`), needs beyond ``cluster``'s; the first plan that fits."""
    view = recompute_view(graph)
    held = cluster.runtime_memory_bytes if overheads_priced(cluster, graph) else 0.0
    seen = replace(cluster, memory_overheads=False, memory_bytes=cluster.memory_bytes - held)
    needs: float | None = None
    rounds = 0
    for _ in range(ROUNDS + 1):
        left = None if deadline is None else deadline - time.perf_counter()
        if left is not None and left <= 0:
            break
        rounds += 1
        try:
            found = run(view, seen, left)
            plan = choose_stages(found, graph, cluster, every=every)
        except (InfeasibleError, SolverError, SearchSpaceTooLargeError, InvalidPlanError) as exc:
            logger.info("recomputation: no plan (%s)", exc)  # a bad option is raised, not taken for this
            break
        peak = plan.predicted.peak_memory_bytes
        if peak <= cluster.memory_bytes * FIT:
            return Attempt(plan, peak, rounds)
        needs = peak if needs is None else min(needs, peak)
        excess = peak - cluster.memory_bytes
        lowered = min(
            seen.memory_bytes - max(excess, 0.01 * seen.memory_bytes), found.predicted.peak_memory_bytes * 0.999
        )
        if lowered <= 1.0:
            break
        seen = replace(seen, memory_bytes=lowered)
    return Attempt(None, needs, rounds)


def binding(plan: Plan, cluster: Cluster) -> bool:
    """Whether memory bound ``plan``'s search: it uses at least :data:`BINDING_SHARE` of the devices'."""
    return plan.predicted.peak_memory_bytes >= BINDING_SHARE * cluster.memory_bytes


def recorded(plan: Plan, choice: str, attempt: Attempt, base: Plan | None, seconds: float) -> Plan:
    """``plan`` with ``search.extra["recompute"]``: the choice, the stages that recompute, and
    its rounds and the iteration time of the plan without (``None``: none fits); ``seconds``, the
    wall time of both searches, is the plan's; a plan of the second search claims no more than
    ``feasible`` (its search proved what it proved for the view, not for the graph)."""
    stages = [s.id for s in plan.stages if s.recompute]
    record = {
        "choice": choice,
        "stages": stages,
        "rounds": attempt.rounds,
        "without_iteration_time": base.predicted.iteration_time if base is not None else None,
    }
    search = replace(plan.search, seconds=seconds, extra={**dict(plan.search.extra), "recompute": record})
    if plan is attempt.plan and search.status not in (Status.FEASIBLE, Status.TIME_LIMIT):
        search = replace(search, status=Status.FEASIBLE)
    return replace(plan, search=search)
