"""Planning under the runtime's memory overheads (a cluster with ``memory_overheads``, or one that
does not state it planning a profiled graph: ``cost.memory.overheads_priced``).

The planners search (and check their plans) with the model without overheads (``osf * W_S +
in_flight / d * sum act_v``); the runtime's overheads (received buffers, messages posted ahead,
gradient buckets, temporaries: ``cost.memory.memory_with_overheads``) are then priced on the plan a
planner returns, by the same cost core that ``validate`` and ``simulate`` use.
Where a stage then exceeds the device memory, the planner runs again with the device memory it
sees lowered by what the plan needs beyond the real one (at least 1%) and below that plan's own
peak without the overheads, and bisected back up where a lowered memory gives no plan, so the plan returned fits under the whole model; its status then
claims no more than ``feasible`` (the optimum was proven for the lowered memory, not the real one).
The cluster's ``runtime_memory_bytes``, the same on every device, is taken off the memory the
planners see from the start (a plan optimal for the rest is optimal with it). When ``ROUNDS`` more tries find no plan that fits, it raises
``InfeasibleError``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

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


def plan_within_overheads(
    run: Callable[[Cluster], Plan],
    graph: Graph,
    cluster: Cluster,
    *,
    refine: int = 0,
    above: int = 0,
    key: Callable[[Plan], tuple[float, ...]] | None = None,
    deadline: float | None = None,
) -> Plan:
    """``run`` (a planner on a cluster) under the whole memory model of ``cluster`` (module docstring).

    The memory the planner sees is searched: a plan over the real limit by ``x`` bytes lowers it by
    ``x`` (at least 1%), and below that plan's own peak without the overheads (a planner shown more
    would return it again); a lowered memory with no plan bisects back towards the last one that gave
    a plan; the first plan that fits is returned.  With ``refine=R`` the search goes on for up to
    ``R`` more rounds after that, bisecting between the highest memory whose plan fitted and the
    lowest whose plan did not, and returns the least ``key`` (default: iteration time, then time
    per sample) of the plans that fit — a plan that uses the last of the memory is then in reach.
    With ``above=U`` up to ``U`` more rounds show the planner more memory than the device's
    (:func:`_above`): the whole model is not always above the planner's own (it prices the
    optimizer's step apart from the activations a stage holds), so a plan the planner prices above
    the limit may fit.  Past ``deadline`` (``time.perf_counter()``) no further round starts."""
    if not overheads_priced(cluster, graph):
        return run(cluster)
    held = cluster.runtime_memory_bytes  # the same on every device: the planners plan without it
    if held >= cluster.memory_bytes:
        raise InfeasibleError(
            f"the runtime holds {held:.6g} bytes of each device (runtime_memory_bytes) and the devices "
            f"have {cluster.memory_bytes:.6g}: nothing is left for a stage"
        )
    seen = replace(cluster, memory_overheads=False, memory_bytes=cluster.memory_bytes - held)
    search = _LimitSearch(base=seen.memory_bytes)
    fitted: list[Plan] = []
    extra = 0
    for round_ in range(ROUNDS + 1 + refine):
        if round_ and deadline is not None and time.perf_counter() > deadline:
            break
        try:
            found = run(seen)
        except InfeasibleError as exc:
            if round_ == 0:
                raise _with_held(exc, cluster, held) from None
            nxt = search.after_no_plan(seen.memory_bytes)
        else:
            plan = priced(found, graph, cluster)
            if plan.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9):
                fitted.append(_claimed(plan, seen.memory_bytes < search.base))
                extra += 1
                if extra > refine:
                    break
                nxt = search.after_fit(seen.memory_bytes)
            else:
                nxt = search.after_over(
                    seen.memory_bytes,
                    found.predicted.peak_memory_bytes,
                    plan.predicted.peak_memory_bytes - cluster.memory_bytes,
                )
                nxt = nxt if round_ < ROUNDS + len(fitted) else None
                if nxt is not None:
                    logger.info(
                        "with the runtime's overheads the plan's largest stage needs %.6g bytes; planning again "
                        "with %.6g bytes per device",
                        plan.predicted.peak_memory_bytes,
                        nxt,
                    )
                search.needs = min(search.needs or math.inf, plan.predicted.peak_memory_bytes)
        if nxt is None:
            break
        seen = replace(seen, memory_bytes=nxt)
    if above:
        fitted += _above(run, graph, cluster, search.base, above, deadline)
    if fitted:
        return min(fitted, key=key or iteration_first)
    raise InfeasibleError(
        f"no plan found fits {cluster.memory_bytes:.6g} bytes per device with the runtime's memory overheads"
        + (f": the least a plan found needs is {search.needs:.6g} bytes per device" if search.needs else "")
        + " (memory_overheads in docs/cost-model.md)",
        required_memory_bytes=search.needs,
    )


def _above(
    run: Callable[[Cluster], Plan], graph: Graph, cluster: Cluster, base: float, rounds: int, deadline: float | None
) -> list[Plan]:
    """The plans that fit of up to ``rounds`` runs shown more memory than ``base`` (the device's,
    less what the runtime holds): first as much as the planner wants (its plan without a memory
    limit: the best there is when it fits), then bisecting between the highest memory shown whose
    plan fitted (at first ``base``) and the lowest whose plan did not (at most that plan's own peak,
    since showing more would give it again)."""
    fitted: list[Plan] = []
    low, high, shown = base, math.inf, math.inf
    for _round in range(rounds):
        if deadline is not None and time.perf_counter() > deadline:
            break
        seen = replace(cluster, memory_overheads=False, memory_bytes=shown)
        try:
            found = run(seen)
        except InfeasibleError:
            if math.isinf(shown):
                break  # no plan with any memory
            high = shown
        else:
            plan = priced(found, graph, cluster)
            if plan.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9):
                fitted.append(_claimed(plan, not math.isinf(shown)))
                if math.isinf(shown):
                    break  # the planner's best plan with no limit fits
                low = shown
            else:
                high = min(shown, found.predicted.peak_memory_bytes * (1 - 1e-3))
        if high - low <= 1e-3 * base:
            break
        shown = (low + high) / 2
    return fitted


def iteration_first(plan: Plan) -> tuple[float, float]:
    """The key plans are compared by: iteration time, then time per sample."""
    return (plan.predicted.iteration_time, plan.predicted.time_per_sample)


def _claimed(plan: Plan, lowered: bool) -> Plan:
    """A plan made for a lowered memory claims no more than ``feasible`` (module docstring); one
    whose search reached its time limit still says so."""
    if lowered and plan.search.status not in (Status.FEASIBLE, Status.TIME_LIMIT):
        return replace(plan, search=replace(plan.search, status=Status.FEASIBLE))
    return plan


def _with_held(exc: InfeasibleError, cluster: Cluster, held: float) -> InfeasibleError:
    if not held:
        return exc
    return InfeasibleError(
        f"{exc} (the devices' {cluster.memory_bytes:.6g} bytes less the {held:.6g} the runtime "
        "holds on each: runtime_memory_bytes)",
        required_memory_bytes=exc.required_memory_bytes,
    )


@dataclass
class _LimitSearch:
    """The memory ``plan_within_overheads`` shows the planner next: the highest memory whose plan
    fitted (``fits``), the lowest whose plan did not or that gave none (``too_large``)."""

    base: float
    fits: float | None = None
    too_large: float | None = None
    needs: float | None = None  # the least memory a plan found needs under the whole model

    def _between(self, low: float) -> float | None:
        if self.too_large is None or self.too_large - low <= 1e-3 * self.base:
            return None
        return (low + self.too_large) / 2

    def after_no_plan(self, seen: float) -> float | None:
        return self._between(max(seen, self.fits or 0.0))

    def after_fit(self, seen: float) -> float | None:
        self.fits = seen if self.fits is None else max(self.fits, seen)
        return self._between(self.fits)

    def after_over(self, seen: float, own_peak: float, excess: float) -> float | None:
        """After a plan over the limit by ``excess``: a memory the plan does not fit without the
        overheads (below its own peak ``own_peak``, which any memory above would give again), lower
        by at least ``excess`` (and 1%)."""
        top = min(seen, own_peak * (1 - 1e-3))
        self.too_large = top if self.too_large is None else min(self.too_large, top)
        if self.fits is not None:
            return self._between(self.fits)
        limit = min(seen - max(excess, 0.01 * seen), top)
        return limit if limit > 1.0 else None
