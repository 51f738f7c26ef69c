"""Sharding the optimizer state over a stage's replicas (ZeRO-1) as a choice of the planners
``gpp`` and ``graphpipe`` (``solve(..., zero=...)``, ``gpp plan --zero``; docs/planners.md).

A stage whose replicas shard the optimizer state (``Stage.zero``, docs/cost-model.md, *Sharded
optimizer state*) holds ``2 + (osf - 2) / d`` bytes per weight byte in place of ``osf``, and pays
an all-gather of its weights after each step. The planners price every stage with one
``optimizer_state_factor``, so they search on a view of the cluster (:func:`zero_view`) whose
factor is what a stage of two replicas, the fewest that shard, holds: ``2 + (osf - 2) / 2``; the
plan found is priced exactly, each stage of two or more replicas sharding only where it does not
fit without (:func:`choose_sharding`; ``"on"``: every such stage), on a memory lowered round by
round until it fits (``levers.lowered_search``). The choices are ``levers``' (``"auto"``, the
default, never gives a slower plan than ``"off"``); ``"on"`` holds vacuously for a plan without
data parallelism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpp_solver.cost.memory import order_memory
from gpp_solver.plan.build import build_plan, spec_of
from gpp_solver.plan.levers import FIT, Attempt, Lever, lowered_search
from gpp_solver.plan.levers import choice_of as lever_choice
from gpp_solver.plan.levers import planned as planned_with_lever
from gpp_solver.types import Cluster, Graph, Plan

#: the option ``zero``, ``search.extra["zero"]``
LEVER = Lever("zero", "the optimizer state sharded", "of two or more replicas sharding", lambda s: bool(s.zero))


def choice_of(planner: str, options: dict) -> str:
    """The ``zero`` option, taken out of the planner's ``options`` (``levers.choice_of``)."""
    return lever_choice("zero", planner, options)


def zero_view(cluster: Cluster) -> Cluster:
    """``cluster`` as the planners see stages that shard: the optimizer state factor of a stage of
    two replicas that shards, ``2 + (osf - 2) / 2`` (``osf`` itself at 2 or less: nothing to shard)."""
    osf = cluster.optimizer_state_factor
    return replace(cluster, optimizer_state_factor=2.0 + (osf - 2.0) / 2.0 if osf > 2.0 else osf)


def choose_sharding(found: Plan, graph: Graph, cluster: Cluster, *, every: bool) -> Plan:
    """``found``'s partition, devices and orders priced exactly under ``cluster``, each stage of two
    or more replicas sharding (``every``) or only where it does not fit without: a stage's memory
    depends on its own choice alone."""
    specs = [spec_of(s, zero=int(s.data_parallel > 1)) for s in found.stages]
    if not every:
        specs = [
            replace(spec, zero=0)
            if order_memory(graph, cluster, replace(spec, zero=0), spec.order, specs) <= cluster.memory_bytes * FIT
            else spec
            for spec in specs
        ]
    return build_plan(graph, cluster, specs, found.mini_batch_size, planner=found.planner, search=found.search)


def plan_sharding(
    run: Callable[[Cluster, float | None], Plan],
    graph: Graph,
    cluster: Cluster,
    *,
    every: bool,
    deadline: float | None = None,
) -> Attempt:
    """``run(view, seconds)`` (a planner on :func:`zero_view` of the memory shown, with the seconds
    left), lowered round by round until its plan, priced with :func:`choose_sharding`, fits."""
    return lowered_search(
        lambda seen, left: run(zero_view(seen), left),
        lambda found: choose_sharding(found, graph, cluster, every=every),
        graph,
        cluster,
        deadline,
        LEVER.name,
    )


def planned(
    choice: str,
    base: Callable[[], Plan],
    run: Callable[[Cluster, float | None], Plan],
    graph: Graph,
    cluster: Cluster,
    time_limit: float | None,
) -> Plan:
    """The plan for ``choice`` (``levers.planned``) with :func:`plan_sharding`'s search (``run``:
    the planner on a cluster, with the seconds left)."""
    return planned_with_lever(
        LEVER,
        choice,
        base,
        lambda deadline: plan_sharding(run, graph, cluster, every=choice == "on", deadline=deadline),
        cluster,
        time_limit,
    )
