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
   lower bound does not exceed the best plan built so far: ``_Pool``, same pick), picks the best among them and every seed plan by ``objective`` — ``"iteration_time"`` (default:
   the **simulated** iteration time, ties TPS) or ``"time_per_sample"`` (TPS, ties simulated
   time) — so the answer is never worse than any seed in that objective; then tightens its
   micro-batch orders with the CP-SAT schedule model when available (``tighten=None``: on when the
   model has at most ``TIGHTEN_MAX_ACTIONS`` actions and no safety stop was reached).

``seed_plans={name: plan}`` hands in plans already computed (those planners are not run again).

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

import logging
import time
from dataclasses import replace
from typing import Any, Sequence

from gpp_solver.planners.gpp.options import (OPTIONAL_SEED_PLANNERS, SEED_PLANNERS, SMALL_GRAPH_DEVICES,
                                             SMALL_GRAPH_NODES, SMALL_GRAPH_RESTARTS, WORK_SHARE, GppOptions)
from gpp_solver.planners.registry import get_planner, parse_options
from gpp_solver._backend.progress import ProgressBar, note
from gpp_solver.cost.model import CostTables
from gpp_solver.errors import InfeasibleError, InvalidInputError, TimeLimitError
from gpp_solver.planners.exact.planner import exact_for_gpp
from gpp_solver.planners.gpp.pool import Pool as _Pool
from gpp_solver.planners.gpp.plans import rebuild_as_gpp, states_from_plan, uniform_micro_batch
from gpp_solver.planners.gpp.seeds import run_seed_planners, within_sizes
from gpp_solver.planners.gpp.tighten import tighten_orders
from gpp_solver.planners.gpp.chains import chain_states
from gpp_solver.planners.gpp.local_search import SearchResult, search
from gpp_solver.cost.micro_batch import check_micro_batch_sizes, check_mini_batch_size, powers_of_two_dividing
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State, canonical
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status
from gpp_solver.plan.validate import validate

logger = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT = 10.0        # seconds, seed planners included
MAX_MICRO_BATCHES = 256          # candidate b keep B / b at most this (simulation cost)
RESTART_SIZES = 2                # phase 2 restarts the search for this many best micro-batch sizes
POLISH_SIZES = 2                 # phase 3 also polishes the best-estimate start of this many sizes
def candidate_micro_batch_sizes(B: int, extra: Sequence[int] = (), max_micro_batches: int = MAX_MICRO_BATCHES) -> list[int]:
    """The common rule's powers of two dividing ``B`` (:mod:`gpp_solver.cost.micro_batch`) with
    ``B / b <= max_micro_batches``, plus ``extra`` (seeds' sizes)."""
    out = {b for b in powers_of_two_dividing(B) if B // b <= max_micro_batches}
    out.update(x for x in extra if B % x == 0)
    return sorted(out) if out else [B]


def plan_gpp(graph: Graph, cluster: Cluster, mini_batch_size: int, *, time_limit: float | None = None,
             progress: bool = False, **options: Any) -> Plan:
    """Plan with the best seed improved by local search over all convex partitions (module docstring);
    ``options`` are the fields of :class:`GppOptions`."""
    o = parse_options("gpp", GppOptions, options)
    seed, tighten, micro_batch_sizes, seed_planners = o.seed, o.tighten, o.micro_batch_sizes, o.seed_planners
    small = len(graph.nodes) <= SMALL_GRAPH_NODES and cluster.devices <= SMALL_GRAPH_DEVICES   # options.py
    if tuple(seed_planners) == SEED_PLANNERS and small:
        seed_planners = SEED_PLANNERS + OPTIONAL_SEED_PLANNERS
    max_iterations, restarts, prove, objective, polish = o.max_iterations, o.restarts, o.prove, o.objective, o.polish
    if restarts is None:
        restarts = SMALL_GRAPH_RESTARTS if small else 1
    B = check_mini_batch_size(mini_batch_size)
    if time_limit is not None and not time_limit > 0:
        raise InvalidInputError(f"`time_limit > 0` must hold, but got (time_limit={time_limit})")

    def score(p: Plan) -> tuple[float, float]:
        it, tps = p.predicted.iteration_time, p.predicted.time_per_sample
        return (it, tps) if objective == "iteration_time" else (tps, it)

    log = logger.info if progress else logger.debug
    t0 = time.perf_counter()
    budget = time_limit if time_limit is not None else DEFAULT_TIME_LIMIT
    deadline = t0 + budget
    phases: dict[str, float] = {}           # wall seconds per phase (search.extra["phase_seconds"])

    def lap(name: str) -> None:
        phases[name] = time.perf_counter() - t0 - sum(phases.values())
    given = dict(o.seed_plans or {})
    allowed = None if micro_batch_sizes is None else check_micro_batch_sizes(B, micro_batch_sizes)
    seeds, seed_info, seeds_cut = run_seed_planners(graph, cluster, B, [n for n in seed_planners if n not in given],
                                                    budget, progress=progress, micro_batch_sizes=allowed)
    for name, p in given.items():
        try:
            validate(p, graph, cluster)
        except InvalidInputError as exc:
            seed_info[name] = {"status": f"error: {type(exc).__name__}", "given": True}
            continue
        if p.mini_batch_size != B:
            seed_info[name] = {"status": "error: mini_batch_size differs", "given": True}
            continue
        if not within_sizes(p, allowed):
            seed_info[name] = {"status": "dropped: micro-batch size not allowed", "given": True}
            continue
        seeds[name] = p
        seed_info[name] = {"status": p.search.status, "given": True, "seconds": p.search.seconds,
                           "time_per_sample": p.predicted.time_per_sample,
                           "iteration_time": p.predicted.iteration_time}
    lap("seeds")
    extra_b = [b for b in (uniform_micro_batch(p) for p in seeds.values()) if b is not None]
    if allowed is not None:
        bs = list(allowed)
    else:
        bs = candidate_micro_batch_sizes(B, extra_b)
    tables = CostTables(graph)
    timed_out = seeds_cut
    # start states per b: own chains + the seed plans' partitions, best first (distinct)
    starts: dict[int, tuple[Problem, list[tuple[str, State, Eval]]]] = {}
    by_estimate: dict[int, tuple[str, State, Eval]] = {}      # per b: the start with the least estimate
    for b in bs:
        P = Problem(graph, cluster, B, b, tables)
        seeded = [(name, st) for name, p in seeds.items() for st in states_from_plan(P, p)]
        evald, seen = [], set()

        def consider(label: str, st: State) -> None:
            e = P.evaluate(st.assign, st.devs)
            if e is not None:
                c = canonical(st, e)
                if c not in seen:
                    seen.add(c)
                    evald.append((label, c, P.evaluate(c.assign, c.devs)))

        for label, st in chain_states(P):       # generated lazily: out of time, no more own chain states
            if (by_estimate or evald or seeded) and time.perf_counter() > deadline:
                timed_out = True
                break
            consider(label, st)
        for label, st in seeded:
            consider(label, st)
        evald.sort(key=lambda x: x[2].key)
        if evald:
            starts[b] = (P, evald[:max(1, restarts)])
            fits = [x for x in evald if x[2].key[0] == 0]
            if fits:
                by_estimate[b] = min(fits, key=lambda x: (x[2].estimate, x[2].key))
        if time.perf_counter() > deadline and (by_estimate or starts):      # out of time, and a start to search from
            timed_out = True
            break
    order = sorted(starts, key=lambda b: (starts[b][1][0][2].key[0], starts[b][1][0][2].estimate, b))
    lap("starts")
    # lazy plans when the score starts with the iteration time, and the restarts (phase 2) need no
    # per-size scores (restarts == 1: the default beyond small instances)
    pool = _Pool(score, lazy=objective == "iteration_time" and restarts == 1)
    for name, p in seeds.items():
        pool.add(p, {"origin": name, "micro_batch_size": uniform_micro_batch(p)})
    per_b: dict[int, dict[str, Any]] = {}
    work = {"max_work": o.max_work, "used": 0, "searches": 0, "skipped": 0}   # node-evaluations

    def cap(repair: bool) -> int | None:
        """States the next search may price (``None``: no cap; 0: nothing left); a search from a
        start over memory while a plan is in hand (``repair``) gets a ``WORK_SHARE``-th of a share."""
        if o.max_work is None:
            return None
        share = o.max_work // WORK_SHARE
        return min(o.max_work - work["used"], share // WORK_SHARE if repair else share) // len(graph.nodes)

    def run_search(Q: Problem, st: State, e0: Eval | None = None) -> SearchResult | None:
        m = cap(e0 is not None and e0.key[0] > 0 and bool(pool))
        if m is not None and m <= 0:
            work["skipped"] += 1
            return None
        res = search(Q, st, max_iterations=max_iterations, deadline=deadline, max_evaluations=m)
        work["used"] += res.evaluations * len(graph.nodes)
        work["searches"] += 1
        return res

    best_key: dict[int, tuple] = {}
    best_score: dict[int, tuple[float, float]] = {}
    worst_memory: list[float] = []

    def run_b(b: int, chosen: list[tuple[str, State, Eval]]) -> bool:
        """Search from each chosen start at ``b``; keep the best result (and its start) as candidates."""
        P = starts[b][0]
        found: list[tuple[SearchResult, str, Eval, State]] = []
        for label, st, e0 in chosen:
            if time.perf_counter() > deadline and pool:         # out of time: keep at least one plan
                return False
            res = run_search(P, st, e0)
            if res is None:
                per_b.setdefault(b, {})["skipped"] = "work"
                break
            found.append((res, label, e0, st))
        if not found:
            return True
        res, label, e0, st = min(found, key=lambda f: f[0].ev.key)
        info = per_b.setdefault(b, {"restarts": 0, "iterations": 0})
        info["restarts"] += len(found)
        info["iterations"] += sum(f[0].iterations for f in found)
        info["evaluations"] = P.evaluations
        if any(f[0].stopped == "time" for f in found):
            info["stopped"] = "time"
        if b in best_key and best_key[b] <= res.ev.key:
            return all(f[0].stopped != "time" for f in found)
        best_key[b] = res.ev.key
        info.update({"start": label, "tps_before": e0.max_tps, "tps_after": res.ev.max_tps, "moves": res.moves,
                     "move_counts": res.move_counts, "stopped": info.get("stopped", res.stopped)})
        if res.ev.key[0] > 0:
            worst_memory.append(max(res.ev.memory))
            info["infeasible"] = True
            return True
        meta = {"origin": label, "micro_batch_size": b, "tps_before": e0.max_tps, "tps_after": res.ev.max_tps,
                "moves": res.moves}
        for s_, e_, m_ in ((res.state, res.ev, meta), (st, e0, {**meta, "moves": 0, "tps_after": e0.max_tps})):
            if e_.key[0] == 0:
                pool.add_state(P, s_, e_, m_)
                if not pool.lazy:
                    plan = pool.items[-1][0]
                    best_score[b] = min(best_score.get(b, score(plan)), score(plan))
        log("gpp: b=%d start %s TPS %.6g -> %.6g (%d moves, %s)", b, label, e0.max_tps, res.ev.max_tps,
            res.moves, res.stopped)
        return all(f[0].stopped != "time" for f in found)

    # phase 1: one search per micro-batch size from its best start (skipping hopeless sizes)
    note(progress, "gpp: local search over all convex partitions, %d micro-batch sizes (%.1f s left)",
         len(order), deadline - time.perf_counter())
    bar = ProgressBar(len(order), "gpp: local search", "micro-batch size", progress)
    for b in order:
        bar.set_postfix_str(f"b={b}")
        bar.update(1)
        P, start_list = starts[b]
        best_pm = pool.best()
        best_now = None if best_pm is None else score(best_pm[0])
        if best_now is not None and (B * P.lb_tps if objective == "iteration_time" else P.lb_tps) >= best_now[0]:
            per_b[b] = {"skipped": "bound"}
            continue
        if not run_b(b, start_list[:1]):
            timed_out = True
            per_b.setdefault(b, {})["stopped"] = "time"
    bar.close()
    lap("search")
    # phase 2: the other starts, for the most promising sizes
    for b in sorted(best_score, key=lambda x: (best_score[x], x))[:RESTART_SIZES]:
        if not run_b(b, starts[b][1][1:]):
            timed_out = True
    lap("restarts")
    # phase 3: search with the iteration-time estimate as first key (favours shallower stage graphs)
    # from the best plan of our own and from the least-estimate starts of the POLISH_SIZES sizes
    # whose starts promise the least estimate
    if polish and objective == "iteration_time" and time.perf_counter() < deadline:
        todo: list[tuple[int, str, State, dict[str, Any]]] = []
        own = pool.best(own=True)
        if own:
            p0, m0 = own
            b0 = uniform_micro_batch(p0)
            todo.append((b0, "best", states_from_plan(starts[b0][0], p0)[0], m0))
        for b in sorted(by_estimate, key=lambda x: (by_estimate[x][2].estimate, x))[:POLISH_SIZES]:
            label, st, e0 = by_estimate[b]
            todo.append((b, label, st, {"origin": label, "micro_batch_size": b, "tps_before": e0.max_tps,
                                        "moves": 0}))
        polish_problems: dict[int, Problem] = {}     # one per b: its evaluation cache serves each start
        for b, label, st0, m0 in todo:
            if time.perf_counter() > deadline:
                timed_out = True
                break
            if b not in polish_problems:
                polish_problems[b] = Problem(graph, cluster, B, b, tables, by_estimate=True)
                if b in starts:     # rebalance does not depend on the key: share its cache
                    polish_problems[b].share_rebalance_cache(starts[b][0])
            Q = polish_problems[b]
            res = run_search(Q, st0)
            if res is None:
                per_b.setdefault(b, {}).setdefault("polish", []).append({"from": label, "skipped": "work"})
                continue
            timed_out |= res.stopped == "time"
            if res.ev.key[0] == 0 and (res.moves or label != "best"):
                pool.add_state(Q, res.state, res.ev, {**m0, "moves": m0.get("moves", 0) + res.moves,
                                                      "polish_moves": res.moves, "tps_after": res.ev.max_tps})
            per_b.setdefault(b, {}).setdefault("polish", []).append(
                {"from": label, "moves": res.moves, "stopped": res.stopped, "estimate": res.ev.estimate})
    lap("polish")
    # exact iteration-time search on small graphs (planners/exact): a better plan joins the pool; a
    # finished search proves the least 1F1B iteration time over all convex partitions
    ex = None
    if o.exact is not False and objective == "iteration_time":
        ex = exact_for_gpp(graph, cluster, B, deadline=deadline, micro_batch_sizes=micro_batch_sizes, force=bool(o.exact),
                           upper_bound=pool.best_iteration_time())
        timed_out |= ex.cut
        if ex.plan is not None:
            pool.add(ex.plan, {"origin": "exact", "micro_batch_size": uniform_micro_batch(ex.plan)})
    worst_memory_found = min(worst_memory) if worst_memory else None
    proven = None
    if prove:
        proven, prove_cut = _prove(graph, cluster, B, deadline, pool, allowed)
        timed_out |= prove_cut
    if not pool and timed_out:
        raise TimeLimitError(f"gpp: the time limit ({budget:g} s) was reached before any plan was found")
    if not pool:
        need = worst_memory_found
        raise InfeasibleError(
            f"no plan fits in {cluster.memory_bytes:.6g} bytes per device on {cluster.devices} devices"
            + ("" if need is None else f"; the best partition found needs {need:.6g} bytes per device"),
            required_memory_bytes=need)
    plan, meta = pool.best()
    lap("exact")
    if plan.planner != "gpp":
        plan = rebuild_as_gpp(plan, graph, cluster, SearchInfo(0.0, Status.FEASIBLE))
    timed_out |= time.perf_counter() > deadline
    plan, tinfo, guard = tighten_orders(plan, graph, cluster, tighten, seed, budget, timed_out, progress)
    timed_out |= guard
    lap("tighten")
    status = Status.TIME_LIMIT if timed_out else Status.FEASIBLE
    if proven is not None and plan.predicted.time_per_sample <= proven * (1 + 1e-9):
        status = Status.OPTIMAL_TIME_PER_SAMPLE
    if ex is not None and ex.optimum is not None and plan.predicted.iteration_time <= ex.optimum * (1 + 1e-9):
        status = Status.OPTIMAL_ITERATION_TIME
    extra = {"exact": dict(ex.info) if ex is not None else {"status": "off"},"seed_planner": meta["origin"], "micro_batch_size": meta.get("micro_batch_size"),
             "moves": meta.get("moves", 0), "polish_moves": meta.get("polish_moves", 0), "tps_before": meta.get("tps_before", plan.predicted.time_per_sample),
             "tps_after": plan.predicted.time_per_sample, "seeds": seed_info, "per_micro_batch": per_b,
             "cp_tighten": tinfo, "max_iterations": max_iterations, "work": work, "exact_tps": proven,
             "iteration_time_estimate": plan.search.iteration_time_estimate,
             "phase_seconds": {k: round(v, 4) for k, v in phases.items()},
             "plans_built": pool.built}
    plan = replace(plan, planner="gpp", search=SearchInfo(time.perf_counter() - t0, status, None, extra))
    validate(plan, graph, cluster)
    return plan


def _prove(graph: Graph, cluster: Cluster, B: int, deadline: float,
           pool: _Pool, micro_batch_sizes: Sequence[int] | None = None) -> tuple[float | None, bool]:
    """Run the exact planner (``milp``) if installed in the time left: its optimal TPS (or
    ``None``) and whether the wall clock cut it (no time left, or its status ``time-limit``)."""
    try:
        fn = get_planner("milp")
    except InvalidInputError:
        return None, False
    left = deadline - time.perf_counter()
    if left <= 0:
        return None, True
    try:
        p = fn(graph, cluster, B, time_limit=left,
               **({} if micro_batch_sizes is None else {"micro_batch_sizes": tuple(micro_batch_sizes)}))
        validate(p, graph, cluster)
    except Exception as exc:  # noqa: BLE001
        logger.info("exact planner failed: %s: %s", type(exc).__name__, exc)
        return None, time.perf_counter() > deadline
    pool.add(p, {"origin": "milp", "micro_batch_size": uniform_micro_batch(p)})
    return (p.predicted.time_per_sample if p.search.status is Status.OPTIMAL_TIME_PER_SAMPLE else None), p.search.status is Status.TIME_LIMIT
