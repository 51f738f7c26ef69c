"""``gpp``'s memory ladder: the search run again below the memory of the plan it found.

Every plan that fits a smaller memory also fits this one, so a planner that is given more memory
should never answer with a slower plan.  ``gpp``'s phases do not promise that on their own: the seed
planners (GraphPipe's and PipeDream's DPs) minimise the bottleneck time per sample, and among the many
partitions of equal time per sample the one each DP returns — and with it the iteration time the
pick compares — changes with the memory limit in no particular direction (DLRM on 16 V100s: 0.0195 s
an iteration at the memory of the unconstrained plan, 0.0157 s at 70% of it).

So, after its phases, a ``gpp`` run with ``ladder = k`` rungs (default: ``LADDER_RUNGS`` on small
instances — ``SMALL_GRAPH_NODES`` nodes, ``SMALL_GRAPH_DEVICES`` devices — where a run takes well
under a second; 0 beyond) runs the same phases again, as a fresh run, with the memory limit set to
``(1 - LADDER_STEP)`` times the peak of the plan found at the rung above, down to ``k`` rungs or to
the first limit where no plan fits.  Every rung's pick fits the memory asked for; the least by the
run's objective among the first run's and the rungs' picks is the answer, tightened and recorded by
:func:`gpp_solver.planners.gpp.answer.finish`.  The rungs share the time limit: each gets what is
left of it (less the answer's reserve), a rung stopped for time or skipped for want of time makes
the status ``time-limit``.  The ladder is skipped where the first run's exact search proved its
plan optimal (nothing below can beat it).  ``search.extra["ladder"]`` records each rung's memory
limit and pick (or why it stopped) and which rung the answer came from.

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

from gpp_solver.errors import InfeasibleError, TimeLimitError
from gpp_solver.planners.gpp.run import GppRun
from gpp_solver.types import Plan

#: rungs below the first run's plan, on small instances (``GppOptions.ladder = None``)
LADDER_RUNGS = 3
#: each rung's limit is this share below the peak of the plan found at the rung above
LADDER_STEP = 0.1
#: a rung is not started with less than this share of the time limit left
MIN_RUNG_SHARE = 0.05


def ladder_rungs(run: GppRun) -> int:
    """How many rungs this run descends (``GppOptions.ladder``; ``None``: ``LADDER_RUNGS`` on small instances)."""
    if run.o.ladder is not None:
        return run.o.ladder
    return LADDER_RUNGS if run.small else 0


def descend(
    run: GppRun, best: tuple[Plan, dict[str, Any]], search: Callable[[GppRun], tuple[Plan, dict[str, Any]]]
) -> tuple[Plan, dict[str, Any]]:
    """The best of ``best`` (the first run's pick) and the picks of the rungs below it (module
    docstring); ``search(run)`` runs a fresh run's phases up to its pick."""
    rungs = ladder_rungs(run)
    record: dict[str, Any] = {"rungs": rungs, "steps": [], "picked": 0}
    run.ladder = record
    if rungs == 0 or _proven(run, best[0]):
        if rungs:
            record["skipped"] = "proven optimal"
        return best
    rung_options = replace(run.o, ladder=0, seed_plans=None, prove=False)
    above = best[0]
    for k in range(1, rungs + 1):
        limit = above.predicted.peak_memory_bytes * (1 - LADDER_STEP)
        left = run.t0 + run.budget - run.reserve - time.perf_counter()
        if left < MIN_RUNG_SHARE * run.budget:
            record["steps"].append({"memory_bytes": limit, "stopped": "time"})
            run.timed_out = True
            break
        sub = GppRun.create(
            run.graph, replace(run.cluster, memory_bytes=limit), run.B, rung_options, left, run.progress
        )
        try:
            plan, meta = search(sub)
        except InfeasibleError:
            record["steps"].append({"memory_bytes": limit, "stopped": "no plan fits"})
            break
        except TimeLimitError:
            record["steps"].append({"memory_bytes": limit, "stopped": "time"})
            run.timed_out = True
            break
        run.timed_out |= sub.timed_out
        record["steps"].append(
            {
                "memory_bytes": limit,
                "iteration_time": plan.predicted.iteration_time,
                "time_per_sample": plan.predicted.time_per_sample,
                "peak_memory_bytes": plan.predicted.peak_memory_bytes,
                "origin": meta.get("origin"),
            }
        )
        if run.score(plan) < run.score(best[0]):
            best = (plan, {**meta, "ladder_rung": k})
            record["picked"] = k
        above = plan
    return best


def _proven(run: GppRun, plan: Plan) -> bool:
    """Whether the first run's exact search proved ``plan``'s iteration time optimal (kFkB orders)."""
    ex = run.ex
    return (
        run.o.schedule == "1f1b"
        and ex is not None
        and ex.optimum is not None
        and plan.predicted.iteration_time <= ex.optimum * (1 + 1e-9)
    )
