"""Phases 1-3 of a ``gpp`` run (:class:`SearchPhases`, mixed into
:class:`gpp_solver.planners.gpp.run.GppRun`): the pool of candidate plans, one local search per
micro-batch size from its best start under the work budget (phase 1), restarts from the other
starts of the most promising sizes (phase 2) and the polish by iteration-time estimate (phase 3),
each with its record per size."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gpp_solver._backend.progress import ProgressBar, note
from gpp_solver.cost.tables import CostTables
from gpp_solver.planners.gpp.local_search import SearchResult, search
from gpp_solver.planners.gpp.options import WORK_SHARE, GppOptions
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State
from gpp_solver.planners.gpp.plans import reschedule, states_from_plan, uniform_micro_batch
from gpp_solver.planners.gpp.pool import Pool
from gpp_solver.types import Cluster, Graph, Plan

RESTART_SIZES = 2  # phase 2 restarts the search for this many best micro-batch sizes
POLISH_SIZES = 2  # phase 3 also polishes the best-estimate start of this many sizes

Start = tuple[str, State, Eval]  # (label, state, its evaluation)


class SearchPhases:
    """:class:`~gpp_solver.planners.gpp.run.GppRun`'s local-search phases, in order:
    :meth:`make_pool`, :meth:`search_sizes`, :meth:`restart`, :meth:`polish_best`.  They read the
    run's instance, options, clock and starts (below, set by ``GppRun``), and leave the candidates
    (``pool``) and the searches' records (``per_b``, ``work``, ``worst_memory``) for the rest of
    the run."""

    graph: Graph
    cluster: Cluster
    B: int
    o: GppOptions
    progress: bool
    deadline: float
    restarts: int
    timed_out: bool
    tables: CostTables
    seeds: dict[str, Plan]
    starts: dict[int, tuple[Problem, list[Start]]]
    by_estimate: dict[int, Start]
    order: list[int]
    log: Callable[..., None]
    score: Callable[[Plan], tuple[float, float]]
    lap: Callable[[str], None]
    past_deadline: Callable[[], bool]

    def make_pool(self) -> None:
        """The candidates (the seeds first) and the searches' records."""
        o = self.o
        # lazy plans when the score starts with the iteration time, and the restarts (phase 2) need no
        # per-size scores (restarts == 1: the default beyond small instances)
        self.pool = Pool(self.score, lazy=o.objective == "iteration_time" and self.restarts == 1, schedule=o.schedule)
        for name, p in self.seeds.items():
            self.pool.add(
                reschedule(p, self.graph, self.cluster, o.schedule),
                {"origin": name, "micro_batch_size": uniform_micro_batch(p)},
            )
        self.per_b: dict[int, dict[str, Any]] = {}
        self.work = {"max_work": o.max_work, "used": 0, "searches": 0, "skipped": 0}  # node-evaluations
        self.best_key: dict[int, tuple] = {}
        self.best_score: dict[int, tuple[float, float]] = {}
        self.worst_memory: list[float] = []

    def cap(self, repair: bool) -> int | None:
        """States the next search may price (``None``: no cap; 0: nothing left); a search from a
        start over memory while a plan is in hand (``repair``) gets a ``WORK_SHARE``-th of a share."""
        max_work = self.o.max_work
        if max_work is None:
            return None
        share = max_work // WORK_SHARE
        return min(max_work - self.work["used"], share // WORK_SHARE if repair else share) // len(self.graph.nodes)

    def run_search(self, Q: Problem, st: State, e0: Eval | None = None) -> SearchResult | None:
        m = self.cap(e0 is not None and e0.key[0] > 0 and bool(self.pool))
        if m is not None and m <= 0:
            self.work["skipped"] += 1
            return None
        res = search(Q, st, max_iterations=self.o.max_iterations, deadline=self.deadline, max_evaluations=m)
        self.work["used"] += res.evaluations * len(self.graph.nodes)
        self.work["searches"] += 1
        return res

    def run_b(self, b: int, chosen: list[Start]) -> bool:
        """Search from each chosen start at ``b``; keep the best result (and its start) as candidates.
        False when the clock stopped it."""
        P = self.starts[b][0]
        found: list[tuple[SearchResult, str, Eval, State]] = []
        for label, st, e0 in chosen:
            if self.past_deadline() and self.pool:  # out of time: keep at least one plan
                return False
            res = self.run_search(P, st, e0)
            if res is None:
                self.per_b.setdefault(b, {})["skipped"] = "work"
                break
            found.append((res, label, e0, st))
        if not found:
            return True
        info = self.per_b.setdefault(b, {"restarts": 0, "iterations": 0})
        info["restarts"] += len(found)
        info["iterations"] += sum(f[0].iterations for f in found)
        info["evaluations"] = P.evaluations
        if any(f[0].stopped == "time" for f in found):
            info["stopped"] = "time"
        best = min(found, key=lambda f: f[0].ev.key)
        finished = all(f[0].stopped != "time" for f in found)
        if b in self.best_key and self.best_key[b] <= best[0].ev.key:
            return finished
        return self._record_b(b, P, best, info) or finished

    def _record_b(self, b: int, P: Problem, best: tuple[SearchResult, str, Eval, State], info: dict) -> bool:
        """The best search at ``b`` so far: its record, and its plan and start's as candidates.  True
        when it is over memory (then nothing joins the candidates)."""
        res, label, e0, st = best
        self.best_key[b] = res.ev.key
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
            self.worst_memory.append(max(res.ev.memory))
            info["infeasible"] = True
            return True
        meta = {
            "origin": label,
            "micro_batch_size": b,
            "tps_before": e0.max_tps,
            "tps_after": res.ev.max_tps,
            "moves": res.moves,
        }
        pool = self.pool
        for s_, e_, m_ in ((res.state, res.ev, meta), (st, e0, {**meta, "moves": 0, "tps_after": e0.max_tps})):
            if e_.key[0] == 0:
                pool.add_state(P, s_, e_, m_)
                if not pool.lazy:
                    plan = pool.items[-1][0]
                    self.best_score[b] = min(self.best_score.get(b, self.score(plan)), self.score(plan))
        self.log(
            "gpp: b=%d start %s TPS %.6g -> %.6g (%d moves, %s)",
            b,
            label,
            e0.max_tps,
            res.ev.max_tps,
            res.moves,
            res.stopped,
        )
        return False

    def search_sizes(self) -> None:
        """Phase 1: one search per micro-batch size from its best start (skipping hopeless sizes)."""
        order, starts, pool = self.order, self.starts, self.pool
        note(
            self.progress,
            "gpp: local search over all convex partitions, %d micro-batch sizes (%.1f s left)",
            len(order),
            self.deadline - time.perf_counter(),
        )
        bar = ProgressBar(len(order), "gpp: local search", "micro-batch size", self.progress)
        for b in order:
            bar.set_postfix_str(f"b={b}")
            bar.update(1)
            P, start_list = starts[b]
            best_pm = pool.best()
            best_now = None if best_pm is None else self.score(best_pm[0])
            if (
                best_now is not None
                and (self.B * P.lb_tps if self.o.objective == "iteration_time" else P.lb_tps) >= best_now[0]
            ):
                self.per_b[b] = {"skipped": "bound"}
                continue
            if not self.run_b(b, start_list[:1]):
                self.timed_out = True
                self.per_b.setdefault(b, {})["stopped"] = "time"
        bar.close()
        self.lap("search")

    def restart(self) -> None:
        """Phase 2: the other starts, for the most promising sizes."""
        best_score = self.best_score
        for b in sorted(best_score, key=lambda x: (best_score[x], x))[:RESTART_SIZES]:
            if not self.run_b(b, self.starts[b][1][1:]):
                self.timed_out = True
        self.lap("restarts")

    def polish_best(self) -> None:
        """Phase 3: search with the iteration-time estimate as first key (favours shallower stage
        graphs) from the best plan of our own and from the least-estimate starts of the
        ``POLISH_SIZES`` sizes whose starts promise the least estimate."""
        if self.o.polish and self.o.objective == "iteration_time" and time.perf_counter() < self.deadline:
            polish_problems: dict[int, Problem] = {}  # one per b: its evaluation cache serves each start
            for b, label, st0, m0 in self._polish_starts():
                if self.past_deadline():
                    self.timed_out = True
                    break
                if b not in polish_problems:
                    polish_problems[b] = Problem(self.graph, self.cluster, self.B, b, self.tables, by_estimate=True)
                    if b in self.starts:  # rebalance does not depend on the key: share its cache
                        polish_problems[b].share_rebalance_cache(self.starts[b][0])
                self._polish_from(polish_problems[b], b, label, st0, m0)
        self.lap("polish")

    def _polish_starts(self) -> list[tuple[int, str, State, dict[str, Any]]]:
        todo: list[tuple[int, str, State, dict[str, Any]]] = []
        own = self.pool.best(own=True)
        if own:
            p0, m0 = own
            b0 = uniform_micro_batch(p0)
            todo.append((b0, "best", states_from_plan(self.starts[b0][0], p0)[0], m0))
        by_estimate = self.by_estimate
        for b in sorted(by_estimate, key=lambda x: (by_estimate[x][2].estimate, x))[:POLISH_SIZES]:
            label, st, e0 = by_estimate[b]
            todo.append((b, label, st, {"origin": label, "micro_batch_size": b, "tps_before": e0.max_tps, "moves": 0}))
        return todo

    def _polish_from(self, Q: Problem, b: int, label: str, st0: State, m0: dict[str, Any]) -> None:
        res = self.run_search(Q, st0)
        polished = self.per_b.setdefault(b, {}).setdefault("polish", [])
        if res is None:
            polished.append({"from": label, "skipped": "work"})
            return
        self.timed_out |= res.stopped == "time"
        if res.ev.key[0] == 0 and (res.moves or label != "best"):
            self.pool.add_state(
                Q,
                res.state,
                res.ev,
                {**m0, "moves": m0.get("moves", 0) + res.moves, "polish_moves": res.moves, "tps_after": res.ev.max_tps},
            )
        polished.append({"from": label, "moves": res.moves, "stopped": res.stopped, "estimate": res.ev.estimate})
