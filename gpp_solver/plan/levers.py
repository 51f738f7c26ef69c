"""What the memory levers the planners ``gpp`` and ``graphpipe`` choose (``recompute``, ``zero``;
docs/planners.md) share: the option's reading, when memory binds a plan, and the search that
plans on a view of the input (what a stage with the lever holds, as the planners can price it) on
a memory lowered, round by round, until the plan, priced exactly with the lever, fits.

Each choice is ``"off"`` (the planner as it is), ``"on"`` (every stage the lever applies to) or
``"auto"`` (the default: the planner's plan, and where none fits or the plan uses at least
:data:`BINDING_SHARE` of the memory, the plan with the lever too; the faster of the two).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gpp_solver.cost.memory import overheads_priced
from gpp_solver.errors import (
    InfeasibleError,
    InvalidInputError,
    InvalidPlanError,
    SearchSpaceTooLargeError,
    SolverError,
    show,
)
from gpp_solver.plan.overheads import iteration_first
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

CHOICES = ("auto", "on", "off")
#: the planners that take the choices
PLANNERS = ("gpp", "graphpipe")
#: ``"auto"`` tries a lever beside a plan that uses at least this share of the memory (below it,
#: memory did not bind the search, and the levers only cost time)
BINDING_SHARE = 0.9
#: plans tried after the first, each on a memory lowered by what the last one needed beyond the limit
ROUNDS = 6
#: tolerance of a fit, as the validator's
FIT = 1 + 1e-9


def choice_of(lever: str, planner: str, options: dict) -> str:
    """The option ``lever``, taken out of the planner's ``options``: ``"auto"`` when absent for the
    planners that take it, ``"off"`` for the others, which refuse it by name."""
    if lever not in options:
        return "auto" if planner in PLANNERS else "off"
    if planner not in PLANNERS:
        raise InvalidInputError(f"{lever}: only for the planners {', '.join(PLANNERS)}, but the planner is {planner!r}")
    value = options.pop(lever)
    if value not in CHOICES:
        raise InvalidInputError(f"{lever} must be one of {', '.join(map(repr, CHOICES))}, got {show(value)}")
    return str(value)


def binding(plan: Plan, cluster: Cluster) -> bool:
    """Whether memory bound ``plan``'s search: it uses at least :data:`BINDING_SHARE` of the devices'."""
    return plan.predicted.peak_memory_bytes >= BINDING_SHARE * cluster.memory_bytes


@dataclass(frozen=True)
class Attempt:
    """What :func:`lowered_search` found: the plan that fits (or ``None``) and the least memory a
    plan it priced needs."""

    plan: Plan | None
    needs: float | None
    rounds: int


def lowered_search(
    run: Callable[[Cluster, float | None], Plan],
    price: Callable[[Plan], Plan],
    graph: Graph,
    cluster: Cluster,
    deadline: float | None,
    lever: str,
) -> Attempt:
    """``run(seen, seconds)`` (a planner on the lever's view, with the seconds left) on a memory
    lowered, round by round, by what its plan, priced exactly with the lever (``price``), needs
    beyond ``cluster``'s; the first plan that fits."""
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
            found = run(seen, left)
            plan = price(found)
        except (InfeasibleError, SolverError, SearchSpaceTooLargeError, InvalidPlanError) as exc:
            logger.info("%s: no plan (%s)", lever, exc)  # a bad option is raised, not taken for this
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


@dataclass(frozen=True)
class Lever:
    """A lever's names: its option and ``search.extra`` key, its name in messages, the stage
    flag's words in the error when no plan fits with it on every stage, and whether a stage uses it."""

    key: str
    name: str
    every: str  # "no plan with every stage {every} fits ..."
    uses: Callable[[Any], bool]


def planned(
    lever: Lever,
    choice: str,
    base: Callable[[], Plan],
    search: Callable[[float | None], Attempt],
    cluster: Cluster,
    time_limit: float | None,
) -> Plan:
    """The plan for ``choice``: ``base()`` (the planner as it is) unless ``"on"``; beside it, where
    it has none or memory binds it and ``choice`` allows, ``search(deadline)`` (the lever's
    :func:`lowered_search`, within the time limit counted from the start); the faster of the two
    by iteration time, recorded (:func:`recorded`)."""
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
    attempt = search(None if time_limit is None else start + time_limit)
    plan = without
    if attempt.plan is not None and (without is None or iteration_first(attempt.plan) < iteration_first(without)):
        plan = attempt.plan
    if plan is None:
        raise _no_plan(lever, refusal, attempt, cluster)
    return recorded(lever, plan, choice, attempt, without, time.perf_counter() - start)


def _no_plan(lever: Lever, refusal: InfeasibleError | None, attempt: Attempt, cluster: Cluster) -> InfeasibleError:
    """The planner's own refusal (its figure of the memory a plan needs), or the lever's."""
    if refusal is not None:
        return InfeasibleError(
            f"{refusal} (with {lever.name}: no plan fits either)", required_memory_bytes=refusal.required_memory_bytes
        )
    need = f": the least a plan found needs is {attempt.needs:.6g} bytes per device" if attempt.needs else ""
    return InfeasibleError(
        f"no plan with every stage {lever.every} fits {cluster.memory_bytes:.6g} bytes per device{need}",
        required_memory_bytes=attempt.needs,
    )


def recorded(lever: Lever, plan: Plan, choice: str, attempt: Attempt, base: Plan | None, seconds: float) -> Plan:
    """``plan`` with ``search.extra[lever.key]``: the choice, the stages that use the lever, and
    its rounds and the iteration time of the plan without (``None``: none fits); ``seconds``, the
    wall time of both searches, is the plan's; a plan of the second search claims no more than
    ``feasible`` (its search proved what it proved for the view, not for the input)."""
    record = {
        "choice": choice,
        "stages": [s.id for s in plan.stages if lever.uses(s)],
        "rounds": attempt.rounds,
        "without_iteration_time": base.predicted.iteration_time if base is not None else None,
    }
    search = replace(plan.search, seconds=seconds, extra={**dict(plan.search.extra), lever.key: record})
    if plan is attempt.plan and search.status not in (Status.FEASIBLE, Status.TIME_LIMIT):
        search = replace(search, status=Status.FEASIBLE)
    return replace(plan, search=search)
