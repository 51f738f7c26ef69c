"""The local searches of a ``gpp`` run, as functions of its record
(:class:`~gpp_solver.planners.gpp.run.GppRun`; one search is
:func:`gpp_solver.planners.gpp.local_search.search`): the seed plans join the candidates
(:func:`pool_seeds`), one search per micro-batch size from its best start under the work budget
(phase 1, :func:`search_sizes`), restarts from the other starts of the most promising sizes
(phase 2, :func:`restart`) and the polish by iteration-time estimate (phase 3,
:func:`polish_best`), each with its record per size (``per_b``), and the work spent (``work``)."""

from __future__ import annotations

import time
from typing import Any

from gpp_solver._backend.progress import ProgressBar, note
from gpp_solver.planners.gpp.local_search import SearchResult, search
from gpp_solver.planners.gpp.options import WORK_SHARE
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State
from gpp_solver.planners.gpp.plans import reschedule, states_from_plan, uniform_micro_batch
from gpp_solver.planners.gpp.run import GppRun, Start

RESTART_SIZES = 2  # phase 2 restarts the search for this many best micro-batch sizes
#: a seed plan's orders made again under a zero-bubble schedule, in validations of that plan (its W
#: placements simulated and priced per stage; measured 1.9-3.9 on GraphPipe plans of 8,000-30,000 actions)
RESCHEDULE_VALIDATIONS = 4.0
POLISH_SIZES = 2  # phase 3 also polishes the best-estimate start of this many sizes


def pool_seeds(run: GppRun) -> None:
    """The seed plans join the candidates (first: the pick takes the first of equal scores), each
    with its orders made under the run's schedule (:func:`reschedule`) when there is time for it:
    that takes about ``RESCHEDULE_VALIDATIONS`` validations of the plan (measured on it in
    ``seeds.run_seed_planners``; seconds for the long pipelines of a 5,000-operator graph).  A seed
    with no time left keeps its own (valid) orders, the run is cut (status ``time-limit``), and
    ``search.extra["seeds"][name]["rescheduled"]`` says so."""
    o = run.o
    for name, p in run.seeds.items():
        orders = "remake"  # under 1F1B: as the seed plan came
        if o.schedule != "1f1b":
            cost = RESCHEDULE_VALIDATIONS * run.seed_info.get(name, {}).get("validate_seconds", 0.0)
            if time.perf_counter() + cost > run.deadline:
                run.seed_info.setdefault(name, {})["rescheduled"] = "no: time limit"
                run.timed_out = True
                orders = "own"
            else:
                q = reschedule(p, run.graph, run.cluster, o.schedule)
                p, orders = q, "own" if q is p else "built"
        run.pool.add(p, {"origin": name, "micro_batch_size": uniform_micro_batch(p), "orders": orders})


def cap(run: GppRun, repair: bool) -> int | None:
    """States the next search may price (``None``: no cap; 0: nothing left); a search from a
    start over memory while a plan is in hand (``repair``) gets a ``WORK_SHARE``-th of a share."""
    max_work = run.o.max_work
    if max_work is None:
        return None
    share = max_work // WORK_SHARE
    return min(max_work - run.work["used"], share // WORK_SHARE if repair else share) // len(run.graph.nodes)


def run_search(run: GppRun, Q: Problem, st: State, e0: Eval | None = None) -> SearchResult | None:
    m = cap(run, e0 is not None and e0.key[0] > 0 and bool(run.pool))
    if m is not None and m <= 0:
        run.work["skipped"] += 1
        return None
    res = search(Q, st, max_iterations=run.o.max_iterations, deadline=run.deadline, max_evaluations=m)
    run.work["used"] += res.evaluations * len(run.graph.nodes)
    run.work["searches"] += 1
    return res


def run_b(run: GppRun, b: int, chosen: list[Start]) -> bool:
    """Search from each chosen start at ``b``; keep the best result (and its start) as candidates.
    False when the clock stopped it."""
    P = run.starts[b][0]
    found: list[tuple[SearchResult, str, Eval, State]] = []
    for label, st, e0 in chosen:
        if run.past_deadline() and run.pool:  # out of time: keep at least one plan
            return False
        res = run_search(run, P, st, e0)
        if res is None:
            run.per_b.setdefault(b, {})["skipped"] = "work"
            break
        found.append((res, label, e0, st))
    if not found:
        return True
    info = run.per_b.setdefault(b, {"restarts": 0, "iterations": 0})
    info["restarts"] += len(found)
    info["iterations"] += sum(f[0].iterations for f in found)
    info["evaluations"] = P.evaluations
    if any(f[0].stopped == "time" for f in found):
        info["stopped"] = "time"
    best = min(found, key=lambda f: f[0].ev.key)
    finished = all(f[0].stopped != "time" for f in found)
    if b in run.best_key and run.best_key[b] <= best[0].ev.key:
        return finished
    return _record_b(run, b, P, best, info) or finished


def _record_b(run: GppRun, b: int, P: Problem, best: tuple[SearchResult, str, Eval, State], info: dict) -> bool:
    """The best search at ``b`` so far: its record, and its plan and start's as candidates.  True
    when it is over memory (then nothing joins the candidates)."""
    res, label, e0, st = best
    run.best_key[b] = res.ev.key
    info.update(
        {
            "start": label,
            "tps_before": e0.max_tps,
            "tps_after": res.ev.max_tps,
            "moves": res.moves,
            "move_counts": res.move_counts,
            "stopped": info.get("stopped", res.stopped),
        }
    )
    if res.ev.key[0] > 0:
        run.worst_memory.append(max(res.ev.memory))
        info["infeasible"] = True
        return True
    meta = {
        "origin": label,
        "micro_batch_size": b,
        "tps_before": e0.max_tps,
        "tps_after": res.ev.max_tps,
        "moves": res.moves,
    }
    pool = run.pool
    for s_, e_, m_ in ((res.state, res.ev, meta), (st, e0, {**meta, "moves": 0, "tps_after": e0.max_tps})):
        if e_.key[0] == 0:
            plan = pool.add_state(P, s_, e_, m_)
            if plan is not None:
                run.best_score[b] = min(run.best_score.get(b, run.score(plan)), run.score(plan))
    run.log(
        "gpp: b=%d start %s TPS %.6g -> %.6g (%d moves, %s)",
        b,
        label,
        e0.max_tps,
        res.ev.max_tps,
        res.moves,
        res.stopped,
    )
    return False


def search_sizes(run: GppRun) -> None:
    """Phase 1: one search per micro-batch size from its best start (skipping hopeless sizes)."""
    order, starts, pool = run.order, run.starts, run.pool
    note(
        run.progress,
        "gpp: local search over all convex partitions, %d micro-batch sizes (%.1f s left)",
        len(order),
        run.deadline - time.perf_counter(),
    )
    bar = ProgressBar(len(order), "gpp: local search", "micro-batch size", run.progress)
    for b in order:
        bar.set_postfix_str(f"b={b}")
        bar.update(1)
        P, start_list = starts[b]
        best_pm = pool.best()
        best_now = None if best_pm is None else run.score(best_pm[0])
        if (
            best_now is not None
            and (run.B * P.lb_tps if run.o.objective == "iteration_time" else P.lb_tps) >= best_now[0]
        ):
            run.per_b[b] = {"skipped": "bound"}
            continue
        if not run_b(run, b, start_list[:1]):
            run.timed_out = True
            run.per_b.setdefault(b, {})["stopped"] = "time"
    bar.close()
    run.lap("search")


def restart(run: GppRun) -> None:
    """Phase 2: the other starts, for the most promising sizes."""
    best_score = run.best_score
    for b in sorted(best_score, key=lambda x: (best_score[x], x))[:RESTART_SIZES]:
        if not run_b(run, b, run.starts[b][1][1:]):
            run.timed_out = True
    run.lap("restarts")


def polish_best(run: GppRun) -> None:
    """Phase 3: search with the iteration-time estimate as first key (favours shallower stage
    graphs) from the best plan of our own and from the least-estimate starts of the
    ``POLISH_SIZES`` sizes whose starts promise the least estimate."""
    if run.o.polish and run.o.objective == "iteration_time" and time.perf_counter() < run.deadline:
        polish_problems: dict[int, Problem] = {}  # one per b: its evaluation cache serves each start
        for b, label, st0, m0 in _polish_starts(run):
            if run.past_deadline():
                run.timed_out = True
                break
            if b not in polish_problems:
                polish_problems[b] = Problem(run.graph, run.cluster, run.B, b, run.tables, by_estimate=True)
                if b in run.starts:  # rebalance does not depend on the key: share its cache
                    polish_problems[b].share_rebalance_cache(run.starts[b][0])
            _polish_from(run, polish_problems[b], b, label, st0, m0)
    run.lap("polish")


def _polish_starts(run: GppRun) -> list[tuple[int, str, State, dict[str, Any]]]:
    todo: list[tuple[int, str, State, dict[str, Any]]] = []
    own = run.pool.best(own=True)
    if own:
        p0, m0 = own
        b0 = uniform_micro_batch(p0)
        todo.append((b0, "best", states_from_plan(run.starts[b0][0], p0)[0], m0))
    by_estimate = run.by_estimate
    for b in sorted(by_estimate, key=lambda x: (by_estimate[x][2].estimate, x))[:POLISH_SIZES]:
        label, st, e0 = by_estimate[b]
        todo.append((b, label, st, {"origin": label, "micro_batch_size": b, "tps_before": e0.max_tps, "moves": 0}))
    return todo


def _polish_from(run: GppRun, Q: Problem, b: int, label: str, st0: State, m0: dict[str, Any]) -> None:
    res = run_search(run, Q, st0)
    polished = run.per_b.setdefault(b, {}).setdefault("polish", [])
    if res is None:
        polished.append({"from": label, "skipped": "work"})
        return
    run.timed_out |= res.stopped == "time"
    if res.ev.key[0] == 0 and (res.moves or label != "best"):
        run.pool.add_state(
            Q,
            res.state,
            res.ev,
            {**m0, "moves": m0.get("moves", 0) + res.moves, "polish_moves": res.moves, "tps_after": res.ev.max_tps},
        )
    polished.append({"from": label, "moves": res.moves, "stopped": res.stopped, "estimate": res.ev.estimate})
