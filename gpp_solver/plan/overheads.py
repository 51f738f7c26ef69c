"""Planning under the runtime's memory overheads (a cluster with ``memory_overheads``, or one that
does not state it planning a profiled graph: ``cost.memory.overheads_priced``).

The planners search (and check their plans) with the model without overheads (``osf * W_S +
in_flight / d * sum act_v``); the runtime's overheads (received buffers, messages posted ahead,
gradient buckets, temporaries: ``cost.memory.memory_with_overheads``) are then priced on the plan a
planner returns, by the same cost core that ``validate`` and ``simulate`` use.
Where a stage then exceeds the device memory, the planner runs again with the device memory it
sees lowered by what the plan needs beyond the real one (at least 1%), and bisected back up where a
lowered memory gives no plan, so the plan returned fits under the whole model; its status then
claims no more than ``feasible`` (the optimum was proven for the lowered memory, not the real one).
The cluster's ``runtime_memory_bytes``, the same on every device, is taken off the memory the
planners see from the start (a plan optimal for the rest is optimal with it). When ``ROUNDS`` more tries find no plan that fits, it raises
``InfeasibleError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from gpp_solver.cost.memory import order_memory, overheads_priced
from gpp_solver.errors import InfeasibleError
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

#: plans tried after the first, lowering the memory the planner sees or bisecting it back
ROUNDS = 8


def priced(plan: Plan, graph: Graph, cluster: Cluster) -> Plan:
    """``plan`` with every stage's ``memory_bytes`` (and the plan's peak) under ``cluster``'s model."""
    stages = tuple(
        replace(
            s,
            predicted=replace(s.predicted, memory_bytes=order_memory(graph, cluster, s, s.schedule.order, plan.stages)),
        )
        for s in plan.stages
    )
    peak = max(s.predicted.memory_bytes for s in stages)
    return replace(plan, stages=stages, predicted=replace(plan.predicted, peak_memory_bytes=peak))


def plan_within_overheads(run: Callable[[Cluster], Plan], graph: Graph, cluster: Cluster) -> Plan:
    """``run`` (a planner on a cluster) under the whole memory model of ``cluster`` (module docstring).

    The memory the planner sees is searched: a plan over the real limit by ``x`` bytes lowers it by
    ``x`` (at least 1%); a lowered memory with no plan bisects back towards the last one that gave
    a plan; the first plan that fits is returned."""
    if not overheads_priced(cluster, graph):
        return run(cluster)
    held = cluster.runtime_memory_bytes  # the same on every device: the planners plan without it
    if held >= cluster.memory_bytes:
        raise InfeasibleError(
            f"the runtime holds {held:.6g} bytes of each device (runtime_memory_bytes) and the devices "
            f"have {cluster.memory_bytes:.6g}: nothing is left for a stage"
        )
    seen = replace(cluster, memory_overheads=False, memory_bytes=cluster.memory_bytes - held)
    base = seen.memory_bytes
    too_large: float | None = None  # the lowest memory seen whose plan did not fit
    needs: float | None = None  # the least memory a plan found needs under the whole model
    for round_ in range(ROUNDS + 1):
        try:
            found = run(seen)
        except InfeasibleError as exc:
            if round_ == 0:
                if held:
                    raise InfeasibleError(
                        f"{exc} (the devices' {cluster.memory_bytes:.6g} bytes less the {held:.6g} the runtime "
                        "holds on each: runtime_memory_bytes)"
                    ) from None
                raise
            if round_ == ROUNDS or too_large is None or too_large - seen.memory_bytes <= 1e-3 * base:
                break
            seen = replace(seen, memory_bytes=(seen.memory_bytes + too_large) / 2)
            continue
        plan = priced(found, graph, cluster)
        if plan.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9):
            if seen.memory_bytes < base and plan.search.status != Status.FEASIBLE:
                plan = replace(plan, search=replace(plan.search, status=Status.FEASIBLE))
            return plan
        needs = plan.predicted.peak_memory_bytes if needs is None else min(needs, plan.predicted.peak_memory_bytes)
        too_large = seen.memory_bytes
        excess = plan.predicted.peak_memory_bytes - cluster.memory_bytes
        limit = seen.memory_bytes - max(excess, 0.01 * seen.memory_bytes)
        if round_ == ROUNDS or limit <= 1.0:
            break
        logger.info(
            "with the runtime's overheads the plan's largest stage needs %.6g bytes; planning again "
            "with %.6g bytes per device",
            plan.predicted.peak_memory_bytes,
            limit,
        )
        seen = replace(seen, memory_bytes=limit)
    raise InfeasibleError(
        f"no plan found fits {cluster.memory_bytes:.6g} bytes per device with the runtime's memory overheads"
        + (f": the least a plan found needs is {needs:.6g} bytes per device" if needs is not None else "")
        + " (memory_overheads in docs/cost-model.md)",
        required_memory_bytes=needs,
    )
