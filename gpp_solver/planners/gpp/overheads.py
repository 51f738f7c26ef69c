"""``gpp`` under the runtime's memory overheads (``cost.memory.overheads_priced``: a profiled graph,
or a cluster with ``memory_overheads``): the best plan that fits the whole memory model.

The planners search with the model without overheads; :func:`gpp_solver.plan.overheads.plan_within_overheads`
then searches the memory a planner is shown.  For ``gpp`` that search is not enough on its own:
another planner, shown another lowered memory, may find a plan that fits and is faster (a plan
that uses the last of the memory, say).  So :func:`plan_gpp_within_overheads`

1. runs ``gpp`` (its optional seeds off: step 2 runs them) under ``plan_within_overheads`` with ``REFINE_ROUNDS`` more rounds after the first
   plan that fits (bisecting up towards the memory whose plan did not fit), keeping the best, until
   ``GPP_SHARE`` of the time limit (default ``DEFAULT_TIME_LIMIT``, each round given what is left);
2. runs each of ``PORTFOLIO`` (or the ``seed_planners`` given) the same way (its ``ABOVE_ROUNDS`` too), in an equal share of
   the time left, the cheapest first, so the time a quick planner leaves goes to the slower ones
   (and one that overruns its share cannot starve a quick one); those stopped for time run once
   more, sharing what the others left; each plan that fits
   re-issued as a ``gpp`` plan under the schedule asked for (``rebuild_as_gpp``) and priced again,
   or with its own orders where the remade ones do not fit the whole model;
3. returns the least by ``objective`` (iteration time, ties time per sample; or the reverse) of
   all that fit, so ``gpp`` is never slower than any of those planners on the same input, the
   runtime's overheads included.  When none fits, the error states the least memory a plan found
   needs.

The status is ``time-limit`` when a planner was stopped or skipped for time (one that found no plan
that fits by its deadline included), else that of the
plan returned.  The plan's ``search.extra["overheads"]`` records each candidate's planner, predicted iteration
time and peak.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from gpp_solver.errors import GppError, InfeasibleError, InvalidInputError, TimeLimitError
from gpp_solver.plan.overheads import plan_within_overheads, priced
from gpp_solver.planners.gpp.ladder import default_rungs
from gpp_solver.planners.gpp.options import DEFAULT_TIME_LIMIT, is_small
from gpp_solver.planners.gpp.plans import rebuild_as_gpp
from gpp_solver.planners.gpp.seeds import within_sizes
from gpp_solver.planners.registry import get_planner
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)

#: planners whose plans (under the overheads) join gpp's
#: in the order of their search times under the overheads on the suite's development models
#: (benchmarks/model_suite.py, 2 devices, 5 s: PipeDream-2BW 0.01 s on average, GraphPipe 0.2 s,
#: Alpa 0.3 s, PipeDream 0.5 s, Piper 3.3 s, several past their limit)
PORTFOLIO = ("pipedream-2bw", "graphpipe", "alpa", "pipedream", "piper")
#: rounds of memory bisection after gpp's first plan that fits
REFINE_ROUNDS = 2
#: rounds showing more memory than the device's (``plan_within_overheads``'s ``above``): the whole
#: model can be below the planners' own, so a plan they price above the limit may fit
ABOVE_ROUNDS = 3
#: gpp's own rounds stop at this share of the time limit; the other planners share the rest
GPP_SHARE = 0.6
#: no planner runs with less than this (seconds)
MIN_SECONDS = 0.05


def plan_gpp_within_overheads(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None,
    progress: bool,
    options: Mapping[str, Any],
) -> Plan:
    """The best plan that fits under the whole memory model (module docstring)."""
    t0 = time.perf_counter()
    budget = DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    gpp_until = t0 + GPP_SHARE * budget
    gpp = get_planner("gpp")
    key = _key(options.get("objective", "iteration_time"))
    candidates: list[tuple[str, Plan]] = []
    needs: list[float] = []
    errors: list[InfeasibleError] = []

    # PORTFOLIO runs the optional seeds, once; each round's own limit is a share of this one, so the
    # ladder's default follows this limit (ladder.default_rungs)
    own = {"optional_seeds": False, "ladder": default_rungs(is_small(graph, cluster), budget), **options}

    def run_gpp(seen: Cluster) -> Plan:
        left = max(gpp_until - time.perf_counter(), MIN_SECONDS)
        return gpp(graph, seen, mini_batch_size, time_limit=left, progress=progress, **own)

    try:
        found = plan_within_overheads(
            run_gpp, graph, cluster, refine=REFINE_ROUNDS, above=ABOVE_ROUNDS, key=key, deadline=gpp_until
        )
        candidates.append(("gpp", found))
    except InfeasibleError as exc:
        errors.append(exc)
    cut = False  # a planner skipped or stopped for time: the status says time-limit
    others = list(options.get("seed_planners") or PORTFOLIO)
    for _pass in range(2):  # a planner stopped for time runs again in what the others left
        stopped_ones: list[str] = []
        for i, name in enumerate(others):
            left = (t0 + budget - time.perf_counter()) / (len(others) - i)  # an equal share of what is left
            if left <= MIN_SECONDS:
                stopped_ones += others[i:]
                break
            found, stopped = _other(name, graph, cluster, mini_batch_size, left, options, errors)
            if stopped:
                stopped_ones.append(name)
            if found is not None:
                candidates.append((name, found))
        others = stopped_ones
    cut = bool(others)
    for exc in errors:
        if exc.required_memory_bytes is not None:
            needs.append(exc.required_memory_bytes)
    if not candidates:
        need = min(needs) if needs else None
        raise InfeasibleError(
            f"no plan fits {cluster.memory_bytes:.6g} bytes per device on {cluster.devices} devices with the "
            "runtime's memory overheads (memory_overheads in docs/cost-model.md)"
            + ("" if need is None else f": the least a plan found needs is {need:.6g} bytes per device"),
            required_memory_bytes=need,
        )
    origin, best = min(candidates, key=lambda c: key(c[1]))
    cut |= time.perf_counter() - t0 > budget or any(p.search.status == Status.TIME_LIMIT for _, p in candidates)
    status = Status.TIME_LIMIT if cut else best.search.status
    extra = dict(best.search.extra or {})
    extra["overheads"] = {
        "picked": origin,
        "candidates": [
            {
                "planner": n,
                "iteration_time": p.predicted.iteration_time,
                "peak_memory_bytes": p.predicted.peak_memory_bytes,
            }
            for n, p in candidates
        ],
    }
    return replace(best, search=replace(best.search, seconds=time.perf_counter() - t0, status=status, extra=extra))


def _key(objective: str) -> Callable[[Plan], tuple[float, float]]:
    if objective == "time_per_sample":
        return lambda p: (p.predicted.time_per_sample, p.predicted.iteration_time)
    return lambda p: (p.predicted.iteration_time, p.predicted.time_per_sample)


def _other(
    name: str,
    graph: Graph,
    cluster: Cluster,
    B: int,
    time_limit: float,
    options: Mapping[str, Any],
    errors: list[InfeasibleError],
) -> tuple[Plan | None, bool]:
    """``name``'s plan under the overheads, as a gpp plan that fits (None when there is none), and
    whether its search was stopped for time before it found one."""
    until = time.perf_counter() + time_limit
    try:
        fn = get_planner(name)
        plan = plan_within_overheads(
            lambda seen: fn(graph, seen, B, time_limit=max(until - time.perf_counter(), MIN_SECONDS)),
            graph,
            cluster,
            above=ABOVE_ROUNDS,
            deadline=until,
        )
    except InfeasibleError as exc:
        errors.append(exc)
        return None, time.perf_counter() >= until
    except (GppError, RecursionError) as exc:  # a planner that cannot plan this input is left out
        logger.info("gpp under overheads: %s gave no plan (%s)", name, exc)
        return None, isinstance(exc, TimeLimitError)
    allowed = options.get("micro_batch_sizes")
    if allowed is not None and not within_sizes(plan, tuple(allowed)):
        return None, False
    held = cluster.runtime_memory_bytes
    seen = replace(cluster, memory_overheads=False, memory_bytes=cluster.memory_bytes - held)
    status = Status.TIME_LIMIT if plan.search.status == Status.TIME_LIMIT else Status.FEASIBLE
    info = SearchInfo(plan.search.seconds, status, None, {"seed_planner": name})
    # its orders remade under the schedule asked for where that fits without the overheads, else its
    # own; with the overheads a remade order (a split backward's kept gradients) may not fit: its own then
    for orders in ("remake", "own"):
        try:
            out = priced(
                rebuild_as_gpp(plan, graph, seen, info, options.get("schedule", "auto"), orders=orders), graph, cluster
            )
        except InvalidInputError:
            continue
        if out.predicted.peak_memory_bytes <= cluster.memory_bytes * (1 + 1e-9) and math.isfinite(
            out.predicted.iteration_time
        ):
            return out, False
    return None, False
