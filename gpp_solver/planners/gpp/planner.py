"""``plan_gpp``: the project's own planner — the best seed plan, improved over ALL convex partitions.

GraphPipe's DP only reaches partitions that follow the series-parallel tree, and the sequential
planners only chains; both leave throughput on the table.  ``plan_gpp``:

1. runs the seed planners that are installed (default ``graphpipe`` and ``pipedream-2bw``, and on
   small instances — ``SMALL_GRAPH_NODES`` nodes, ``SMALL_GRAPH_DEVICES`` devices — also ``pipedream``
   and ``alpa``; on larger ones on request, ``seed_planners``; a missing one and one that raises are
   skipped and recorded) and, for every candidate micro-batch size ``b``, builds its
   own sequential seeds (balanced prefix cuts of two topological orders with devices re-split by a
   min-max over thresholds, and uniform chains of ``D / d`` stages with ``d`` devices each — the
   spaces of PipeDream-2BW and Alpa);
2. for each ``b`` (most promising first; a ``b`` whose perfect-balance bound ``B * TPS_lb(b)``
   cannot beat the best candidate so far is skipped) starts from the best of those states and the
   seed plans' partitions, and runs :func:`gpp_solver.planners.gpp.local_search.search` — boundary-node moves,
   merges, splits, device moves and re-splits, an exact re-partition of the loaded stage with each
   neighbour — every intermediate state a valid plan (acyclic stage graph, convex stages, memory
   with Algorithm 2's in-flight counts); the ``RESTART_SIZES`` best sizes are then searched again
   from their next ``restarts - 1`` start states;
3. (``polish``, objective ``iteration_time``) searches again with the iteration-time *estimate* as
   the first key (after memory), which favours shallower stage graphs, from the best plan of its
   own and from the least-estimate start states of the ``POLISH_SIZES`` most promising sizes;
4. builds full plans (``plan_build.build_plan``) only for the starts and results of the searches
   (with objective ``iteration_time`` and one start per size, only those whose iteration-time
   lower bound does not exceed the best plan built so far:
   :class:`~gpp_solver.planners.gpp.pool.Pool`, same pick), picks the best among them and every
   seed plan by ``objective`` — ``"iteration_time"`` (default: the **simulated** iteration time,
   ties TPS) or ``"time_per_sample"`` (TPS, ties simulated time) — so the answer is never worse than any seed in that objective; then tightens its
   micro-batch orders with the CP-SAT schedule model when available (``tighten=None``: on when the
   model has at most ``TIGHTEN_MAX_ACTIONS`` actions and no safety stop was reached).

``seed_plans={name: plan}`` hands in plans already computed (those planners are not run again).

**Memory ladder.**  On small instances with a time limit of at least 10 s (option ``ladder``) the
phases run again below the memory of the plan found, a few rungs down, and the best of the runs'
answers is returned, so that more memory does not give a slower plan
(:mod:`gpp_solver.planners.gpp.ladder`).

**Schedule.**  ``schedule`` (default ``"auto"``; ``docs/zero-bubble.md``): every candidate plan —
search states, seeds, the exact search's — is built with it (``build_plan``), so the pick, and with
it the partition and ``b``, is by the iteration time under that schedule; ``search.extra["schedule"]``
says which orders the plan uses.  ``optimal-iteration-time`` is claimed with ``"1f1b"`` alone.

**Time.**  ``time_limit`` (default ``DEFAULT_TIME_LIMIT`` = 10 s) covers everything, seed planners
included.  The wall clock is only a *safety stop*: the seed planners run with their natural
algorithms until ``SEED_SAFETY_SHARE`` of it (:mod:`gpp_solver.planners.gpp.seeds`), the local searches are
capped by ``max_iterations`` moves each and by ``max_work`` node-evaluations (states priced x
graph nodes) in all — at most ``max_work / WORK_SHARE`` per search, and a search that would start
with nothing left is skipped (``per_micro_batch[b]["skipped"] = "work"``), and one from a start
over memory while a plan is in hand gets a ``WORK_SHARE``-th of that (on 1,000-operator graphs such
repairs spent their share without reaching memory); counts, so these caps do
not depend on the machine (``search.extra["work"]``) — and stop at the deadline, CP-SAT gets ``TIGHTEN_SHARE`` of the limit
(at most ``TIGHTEN_MAX_SECONDS``, the default limit's share, so any larger limit gives the same
plan) in CP-SAT's *deterministic* time.  ``search.extra["phase_seconds"]`` records where the wall
time went (seeds, starts, search, restarts, polish, exact, tighten).  Whenever a safety stop is (or
may have been) reached — a seed planner reports ``time-limit`` or fails after the seed stop, a
search or a loop stops at the deadline, CP-SAT's wall guard may have fired — the status is
``time-limit``.

**Determinism.**  No randomness: moves are enumerated in a fixed order; CP-SAT runs
single-threaded with ``seed`` under a deterministic time limit, and whether it runs at all
(``tighten=None``) depends only on the plan's number of actions (``TIGHTEN_MAX_ACTIONS``).  So
whenever the status is not ``time-limit`` the plan does not depend on the machine's speed or load;
``search.extra["seeds"]`` records each seed planner's status and seconds.

**Status.**  ``feasible`` (or ``time-limit``).  With ``prove=True`` an exact planner (``milp``)
is run on the same instance; when it proves an optimum and the chosen plan's TPS matches it the
status is ``optimal-time-per-sample`` (least bottleneck TPS over convex partitions with one ``b``); its plan also
joins the candidates.  Option ``exact`` (``None``: graphs of at most 10 nodes, 8 usable devices,
``B <= 256``, see ``planners/exact/planner.py``) runs the exact iteration-time search in the time
left, pruned by the best plan so far; a faster plan joins the candidates, and a finished search
makes the status ``optimal-iteration-time``.
"""

from __future__ import annotations

from typing import Any

from gpp_solver.planners.gpp.answer import exact_searches, finish
from gpp_solver.planners.gpp.ladder import descend
from gpp_solver.planners.gpp.options import DEFAULT_TIME_LIMIT, GppOptions, candidate_micro_batch_sizes
from gpp_solver.planners.gpp.run import GppRun
from gpp_solver.planners.gpp.searches import polish_best, pool_seeds, restart, search_sizes
from gpp_solver.planners.gpp.starts import find_starts, run_seeds
from gpp_solver.planners.registry import parse_options
from gpp_solver.types import Cluster, Graph, Plan

__all__ = ["DEFAULT_TIME_LIMIT", "candidate_micro_batch_sizes", "plan_gpp"]


def plan_gpp(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """Plan with the best seed improved by local search over all convex partitions (module docstring);
    ``options`` are the fields of :class:`GppOptions`.  The phases are functions of one
    :class:`GppRun`."""
    o = parse_options("gpp", GppOptions, options)
    run = GppRun.create(graph, cluster, mini_batch_size, o, time_limit, progress)
    return descend(run, finish(run, *pick(run)), pick, finish)  # the memory ladder: planners/gpp/ladder.py


def pick(run: GppRun) -> tuple[Plan, dict[str, Any]]:
    """One run's pick: seeds, starts, the searches, the exact searches (``answer.finish`` makes it
    the run's answer)."""
    run_seeds(run)
    find_starts(run)
    pool_seeds(run)
    search_sizes(run)  # phase 1
    restart(run)  # phase 2
    polish_best(run)  # phase 3
    return exact_searches(run)
