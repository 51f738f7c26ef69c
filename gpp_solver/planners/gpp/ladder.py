"""``gpp``'s memory ladder: the search run again below the memory of the plan it found.

Every plan that fits a smaller memory also fits this one, so a planner that is given more memory
should never answer with a slower plan.  ``gpp``'s phases do not promise that on their own: the seed
planners (GraphPipe's and PipeDream's DPs) minimise the bottleneck time per sample, and among the many
partitions of equal time per sample the one each DP returns — and with it the iteration time the
pick compares — changes with the memory limit in no particular direction (DLRM on 16 V100s: 0.0195 s
an iteration at the memory of the unconstrained plan, 0.0157 s at 70% of it).

So, after its phases, a ``gpp`` run with ``ladder = k`` rungs runs the same phases again, as a
fresh run, with the memory limit set to ``(1 - LADDER_STEP)`` times the peak of the plan found at the
rung above, down to ``k`` rungs or to the first limit where no plan fits.  By default
(:func:`default_rungs`) ``k = LADDER_RUNGS`` on small instances (``options.is_small``) with a time
limit of at least ``LADDER_MIN_LIMIT``, the default's, and 0 otherwise.

Each run's answer is its pick tightened and recorded (:func:`gpp_solver.planners.gpp.answer.finish`):
CP-SAT may shorten a pick a good deal, so the runs are compared after it.  A rung's pick whose
iteration-time lower bound, ``B`` times its time per sample, cannot beat the best answer so far is
not tightened.  Every answer fits the memory asked for; the least by the run's objective among the
first run's and the rungs' answers is returned, with its own run's record and
``search.extra["ladder"]``: each rung's memory limit and answer (or why it stopped) and which rung
was picked.  The rungs share the time limit: each gets what is left of it; a rung stopped for time,
or skipped for want of it, makes the status ``time-limit``.  A rung's answer is ``feasible`` (or
``optimal-time-per-sample`` when it meets the first run's proven MILP optimum): a proof a rung's run
made holds at its own limit, not at this one.  The ladder is skipped where the first run's exact
search proved its plan optimal (nothing below can beat it).

What it does not promise: the ladder makes the answer at memory ``M`` at least as good as the picks
at the limits it visits below ``M``; a limit it does not visit may still give a faster plan.  The
conformance tests (``tests/planners/gpp/test_memory_ladder.py``) sweep limits on the paper's
workloads and hold the sweep to monotone.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpp_solver._backend.progress import note
from gpp_solver.errors import InfeasibleError, TimeLimitError
from gpp_solver.planners.gpp.pool import LAZY_BOUND_SLACK
from gpp_solver.planners.gpp.run import GppRun
from gpp_solver.types import Plan, Status

#: rungs below the first run's plan, on small instances (``GppOptions.ladder = None``)
LADDER_RUNGS = 3
#: each rung's limit is this share below the peak of the plan found at the rung above
LADDER_STEP = 0.1
#: the ladder is on by default only with a time limit of at least this many seconds (the default limit)
LADDER_MIN_LIMIT = 10.0
#: a rung is not started with less than this share of the time limit left
MIN_RUNG_SHARE = 0.05


def ladder_rungs(run: GppRun) -> int:
    """How many rungs this run descends (``GppOptions.ladder``; ``None``: :func:`default_rungs`)."""
    if run.o.ladder is not None:
        return run.o.ladder
    return default_rungs(run.small, run.budget)


def default_rungs(small: bool, time_limit: float) -> int:
    """``LADDER_RUNGS`` on a small instance with a time limit of at least ``LADDER_MIN_LIMIT``, else 0:
    the rungs take about three times the first run (seconds where PipeDream's DP seeds it), and a
    shorter limit asks for speed.  A rule on the input, so the plan still does not depend on the
    machine's speed."""
    return LADDER_RUNGS if small and time_limit >= LADDER_MIN_LIMIT else 0


def descend(
    run: GppRun,
    first: Plan,
    pick: Callable[[GppRun], tuple[Plan, dict[str, Any]]],
    finish: Callable[[GppRun, Plan, dict[str, Any]], Plan],
) -> Plan:
    """The best of ``first`` (the first run's answer) and the answers of the rungs below it (module
    docstring); ``pick(run)`` is a fresh run's pick and ``finish`` makes it that run's answer
    (tightened and recorded).  A rung's pick whose iteration-time bound cannot beat the best answer
    is not finished."""
    rungs = ladder_rungs(run)
    record: dict[str, Any] = {"rungs": rungs, "steps": [], "picked": 0}
    if rungs == 0 or first.search.status == Status.OPTIMAL_ITERATION_TIME:
        if rungs:
            record["skipped"] = "proven optimal"
        return _answer(run, first, first.search.status, record)
    rung_options = replace(run.o, ladder=0, seed_plans=None, prove=False)
    best, above, cut = first, first, False
    for k in range(1, rungs + 1):
        limit = above.predicted.peak_memory_bytes * (1 - LADDER_STEP)
        left = run.t0 + run.budget - time.perf_counter()
        if left < MIN_RUNG_SHARE * run.budget:
            record["steps"].append({"memory_bytes": limit, "stopped": "time"})
            cut = True
            break
        note(
            run.progress,
            "gpp: memory ladder, rung %d of %d: the search again at %.6g bytes per device (%.0f%% below the plan's peak)",
            k,
            rungs,
            limit,
            100 * LADDER_STEP,
        )
        sub = GppRun.create(
            run.graph, replace(run.cluster, memory_bytes=limit), run.B, rung_options, left, run.progress
        )
        try:
            plan, meta = pick(sub)
        except InfeasibleError:
            record["steps"].append({"memory_bytes": limit, "stopped": "no plan fits"})
            break
        except TimeLimitError:
            record["steps"].append({"memory_bytes": limit, "stopped": "time"})
            cut = True
            break
        above = plan
        step = {
            "memory_bytes": limit,
            "time_per_sample": plan.predicted.time_per_sample,
            "peak_memory_bytes": plan.predicted.peak_memory_bytes,
            "origin": meta.get("origin"),
        }
        record["steps"].append(step)
        if not run.score(_bound(run, plan)) < run.score(best):
            step["iteration_time_before_tightening"] = plan.predicted.iteration_time
            step["finished"] = "no: its bound cannot beat the answer"
            cut |= sub.timed_out
            continue
        plan = finish(sub, plan, meta)
        cut |= plan.search.status == Status.TIME_LIMIT
        step["iteration_time"] = plan.predicted.iteration_time
        if run.score(plan) < run.score(best):
            best = plan
            record["picked"] = k
    if cut or first.search.status == Status.TIME_LIMIT:
        status = Status.TIME_LIMIT
    elif best is first:
        status = first.search.status
    elif run.proven is not None and best.predicted.time_per_sample <= run.proven * (1 + 1e-9):
        status = Status.OPTIMAL_TIME_PER_SAMPLE  # the MILP's optimum at this memory bounds the rungs' plans too
    else:
        status = Status.FEASIBLE  # a rung's proof holds at its own limit, not at this one
    return _answer(run, best, status, record)


def _bound(run: GppRun, plan: Plan) -> Plan:
    """``plan`` with its iteration time set to a lower bound under any orders: ``B`` times its time
    per sample (the slowest stage's ``n (F + B) + A``, :class:`~gpp_solver.planners.gpp.pool.Pool`),
    less the pool's float slack; what tightening cannot go below."""
    bound = run.B * plan.predicted.time_per_sample * (1 - LAZY_BOUND_SLACK)
    return replace(plan, predicted=replace(plan.predicted, iteration_time=min(bound, plan.predicted.iteration_time)))


def _answer(run: GppRun, plan: Plan, status: Status, record: dict[str, Any]) -> Plan:
    extra = {**(plan.search.extra or {}), "ladder": record}
    seconds = time.perf_counter() - run.t0
    return replace(plan, search=replace(plan.search, seconds=seconds, status=status, extra=extra))
