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
  the plan uses at least ``levers.BINDING_SHARE`` of the memory, the plan with recomputation too; the
  faster of the two (by simulated iteration time) is returned, so the choice never gives a slower
  plan than ``"off"``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpp_solver.cost.memory import order_memory
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.levers import FIT, Attempt, Lever, lowered_search
from gpp_solver.plan.levers import choice_of as lever_choice
from gpp_solver.plan.levers import planned as planned_with_lever
from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)

#: the option ``recompute``, ``search.extra["recompute"]``
LEVER = Lever("recompute", "recomputation", "recomputing", lambda s: s.recompute)


def choice_of(planner: str, options: dict) -> str:
    """The ``recompute`` option, taken out of the planner's ``options`` (:func:`levers.choice_of`)."""
    return lever_choice("recompute", planner, options)


def planned(
    choice: str,
    base: Callable[[], Plan],
    run: Callable[[Graph, Cluster, float | None], Plan],
    graph: Graph,
    cluster: Cluster,
    time_limit: float | None,
) -> Plan:
    """The plan for ``choice`` (:func:`gpp_solver.plan.levers.planned`), with recomputation's
    search :func:`plan_recomputing` (``run``: the planner on the view, orders without ``W``)."""
    return planned_with_lever(
        LEVER,
        choice,
        base,
        lambda deadline: plan_recomputing(run, graph, cluster, every=choice == "on", deadline=deadline),
        cluster,
        time_limit,
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
    return lowered_search(
        lambda seen, left: run(view, seen, left),
        lambda found: choose_stages(found, graph, cluster, every=every),
        graph,
        cluster,
        deadline,
        "recomputation",
    )
