"""One run of the ``gpp`` planner as its phases (:class:`GppRun`; the algorithm is described in
:mod:`gpp_solver.planners.gpp.planner`): the seed plans, the start states per micro-batch size,
the local search (phase 1), its restarts (phase 2), the polish by iteration-time estimate
(phase 3; these three in :mod:`gpp_solver.planners.gpp.search_phases`), the exact searches, and
the pick, tightening and record."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from gpp_solver.cost.micro_batch import check_micro_batch_sizes, check_mini_batch_size
from gpp_solver.cost.tables import CostTables
from gpp_solver.errors import InfeasibleError, InvalidInputError, TimeLimitError
from gpp_solver.plan.validate import validate
from gpp_solver.plan.zero_bubble import final_record
from gpp_solver.planners.exact.planner import exact_for_gpp
from gpp_solver.planners.gpp.chains import chain_states
from gpp_solver.planners.gpp.options import (
    DEFAULT_TIME_LIMIT,
    OPTIONAL_SEED_PLANNERS,
    SEED_PLANNERS,
    SMALL_GRAPH_DEVICES,
    SMALL_GRAPH_NODES,
    SMALL_GRAPH_RESTARTS,
    GppOptions,
    candidate_micro_batch_sizes,
)
from gpp_solver.planners.gpp.partition_eval import Problem, State, canonical
from gpp_solver.planners.gpp.plans import rebuild_as_gpp, reschedule, states_from_plan, uniform_micro_batch
from gpp_solver.planners.gpp.prove import prove_by_milp as _prove
from gpp_solver.planners.gpp.search_phases import SearchPhases, Start
from gpp_solver.planners.gpp.seeds import run_seed_planners, within_sizes
from gpp_solver.planners.gpp.tighten import tighten_orders
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)


class GppRun(SearchPhases):
    """The state one ``gpp`` run carries from phase to phase; :func:`plan_gpp` calls the phases in
    order: :meth:`run_seeds`, :meth:`find_starts`, :meth:`make_pool`, :meth:`search_sizes`,
    :meth:`restart`, :meth:`polish_best`, :meth:`exact_searches`, :meth:`finish`."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        o: GppOptions,
        time_limit: float | None,
        progress: bool,
    ) -> None:
        self.graph, self.cluster, self.o, self.progress = graph, cluster, o, progress
        self.small = len(graph.nodes) <= SMALL_GRAPH_NODES and cluster.devices <= SMALL_GRAPH_DEVICES  # options.py
        self.seed_planners = o.seed_planners
        if tuple(self.seed_planners) == SEED_PLANNERS and self.small:
            self.seed_planners = SEED_PLANNERS + OPTIONAL_SEED_PLANNERS
        self.restarts = o.restarts if o.restarts is not None else SMALL_GRAPH_RESTARTS if self.small else 1
        self.B = check_mini_batch_size(mini_batch_size)
        if time_limit is not None and not time_limit > 0:
            raise InvalidInputError(f"`time_limit > 0` must hold, but got (time_limit={time_limit})")
        self.log = logger.info if progress else logger.debug
        self.t0 = time.perf_counter()
        self.budget = time_limit if time_limit is not None else DEFAULT_TIME_LIMIT
        self.deadline = self.t0 + self.budget
        self.phases: dict[str, float] = {}  # wall seconds per phase (search.extra["phase_seconds"])
        self.timed_out = False

    def score(self, p: Plan) -> tuple[float, float]:
        it, tps = p.predicted.iteration_time, p.predicted.time_per_sample
        return (it, tps) if self.o.objective == "iteration_time" else (tps, it)

    def lap(self, name: str) -> None:
        self.phases[name] = time.perf_counter() - self.t0 - sum(self.phases.values())

    def past_deadline(self) -> bool:
        return time.perf_counter() > self.deadline

    # ------------------------------------------------------------------ seeds and starts
    def run_seeds(self) -> None:
        """The seed planners' plans and the plans given (``seed_plans``), and the sizes to search."""
        graph, cluster, B, o = self.graph, self.cluster, self.B, self.o
        given = dict(o.seed_plans or {})
        allowed = None if o.micro_batch_sizes is None else check_micro_batch_sizes(B, o.micro_batch_sizes)
        self.allowed = allowed
        seeds, self.seed_info, seeds_cut = run_seed_planners(
            graph,
            cluster,
            B,
            [n for n in self.seed_planners if n not in given],
            self.budget,
            progress=self.progress,
            micro_batch_sizes=allowed,
        )
        for name, p in given.items():
            try:
                validate(p, graph, cluster)
            except InvalidInputError as exc:
                self.seed_info[name] = {"status": f"error: {type(exc).__name__}", "given": True}
                continue
            if p.mini_batch_size != B:
                self.seed_info[name] = {"status": "error: mini_batch_size differs", "given": True}
                continue
            if not within_sizes(p, allowed):
                self.seed_info[name] = {"status": "dropped: micro-batch size not allowed", "given": True}
                continue
            seeds[name] = p
            self.seed_info[name] = {
                "status": p.search.status,
                "given": True,
                "seconds": p.search.seconds,
                "time_per_sample": p.predicted.time_per_sample,
                "iteration_time": p.predicted.iteration_time,
            }
        self.seeds = seeds
        self.lap("seeds")
        extra_b = [b for b in (uniform_micro_batch(p) for p in seeds.values()) if b is not None]
        if allowed is not None:
            self.bs = list(allowed)
        else:
            self.bs = candidate_micro_batch_sizes(B, extra_b)
        self.tables = CostTables(graph)
        self.timed_out = seeds_cut

    def find_starts(self) -> None:
        """Start states per ``b``: own chains + the seed plans' partitions, best first (distinct)."""
        self.starts: dict[int, tuple[Problem, list[Start]]] = {}
        self.by_estimate: dict[int, Start] = {}  # per b: the start with the least estimate
        for b in self.bs:
            self._starts_at(b)
            if self.past_deadline() and (self.by_estimate or self.starts):  # out of time, and a start to search from
                self.timed_out = True
                break
        starts = self.starts
        self.order = sorted(starts, key=lambda b: (starts[b][1][0][2].key[0], starts[b][1][0][2].estimate, b))
        self.lap("starts")

    def _starts_at(self, b: int) -> None:
        P = Problem(self.graph, self.cluster, self.B, b, self.tables)
        seeded = [(name, st) for name, p in self.seeds.items() for st in states_from_plan(P, p)]
        evald: list[Start] = []
        seen: set[State] = set()
        for label, st in chain_states(P):  # generated lazily: out of time, no more own chain states
            if (self.by_estimate or evald or seeded) and self.past_deadline():
                self.timed_out = True
                break
            _consider(P, label, st, seen, evald)
        for label, st in seeded:
            _consider(P, label, st, seen, evald)
        evald.sort(key=lambda x: x[2].key)
        if evald:
            self.starts[b] = (P, evald[: max(1, self.restarts)])
            fits = [x for x in evald if x[2].key[0] == 0]
            if fits:
                self.by_estimate[b] = min(fits, key=lambda x: (x[2].estimate, x[2].key))

    # ------------------------------------------------------------------ exact searches and the answer
    def exact_searches(self) -> tuple[Plan, dict[str, Any]]:
        """The exact iteration-time search on small graphs (``planners/exact``: a better plan joins
        the pool; a finished search proves the least 1F1B iteration time over all convex
        partitions) and, with ``prove``, the MILP; then the best candidate, or why there is none."""
        o, pool = self.o, self.pool
        self.ex = None
        if o.exact is not False and o.objective == "iteration_time":
            self.ex = exact_for_gpp(
                self.graph,
                self.cluster,
                self.B,
                deadline=self.deadline,
                micro_batch_sizes=o.micro_batch_sizes,
                force=bool(o.exact),
                upper_bound=pool.best_iteration_time(),
            )
            self.timed_out |= self.ex.cut
            if self.ex.plan is not None:
                pool.add(
                    reschedule(self.ex.plan, self.graph, self.cluster, self.o.schedule),
                    {"origin": "exact", "micro_batch_size": uniform_micro_batch(self.ex.plan)},
                )
        worst_memory_found = min(self.worst_memory) if self.worst_memory else None
        self.proven = None
        if o.prove:
            self.proven, prove_cut = _prove(
                self.graph, self.cluster, self.B, self.deadline, pool, self.allowed, self.o.schedule
            )
            self.timed_out |= prove_cut
        if not pool and self.timed_out:
            raise TimeLimitError(f"gpp: the time limit ({self.budget:g} s) was reached before any plan was found")
        if not pool:
            need = worst_memory_found
            raise InfeasibleError(
                f"no plan fits in {self.cluster.memory_bytes:.6g} bytes per device on {self.cluster.devices} devices"
                + ("" if need is None else f"; the best partition found needs {need:.6g} bytes per device"),
                required_memory_bytes=need,
            )
        best = pool.best()
        self.lap("exact")
        return best

    def finish(self, plan: Plan, meta: dict[str, Any]) -> Plan:
        """The pick as a gpp plan, its orders tightened, its status and ``search`` record."""
        graph, cluster, o = self.graph, self.cluster, self.o
        if plan.planner != "gpp":
            plan = rebuild_as_gpp(plan, graph, cluster, SearchInfo(0.0, Status.FEASIBLE), self.o.schedule)
        self.timed_out |= self.past_deadline()
        plan, tinfo, guard = tighten_orders(
            plan, graph, cluster, o.tighten, o.seed, self.budget, self.timed_out, self.progress
        )
        self.timed_out |= guard
        self.lap("tighten")
        status = Status.TIME_LIMIT if self.timed_out else Status.FEASIBLE
        if self.proven is not None and plan.predicted.time_per_sample <= self.proven * (1 + 1e-9):
            status = Status.OPTIMAL_TIME_PER_SAMPLE
        ex = self.ex
        # the exact search proves the least iteration time of kFkB orders: no claim over orders with W
        if (
            o.schedule == "1f1b"
            and ex is not None
            and ex.optimum is not None
            and plan.predicted.iteration_time <= ex.optimum * (1 + 1e-9)
        ):
            status = Status.OPTIMAL_ITERATION_TIME
        extra = {
            "exact": dict(ex.info) if ex is not None else {"status": "off"},
            "seed_planner": meta["origin"],
            "micro_batch_size": meta.get("micro_batch_size"),
            "moves": meta.get("moves", 0),
            "polish_moves": meta.get("polish_moves", 0),
            "tps_before": meta.get("tps_before", plan.predicted.time_per_sample),
            "tps_after": plan.predicted.time_per_sample,
            "seeds": self.seed_info,
            "per_micro_batch": self.per_b,
            "cp_tighten": tinfo,
            "max_iterations": o.max_iterations,
            "work": self.work,
            "exact_tps": self.proven,
            "iteration_time_estimate": plan.search.iteration_time_estimate,
            "phase_seconds": {k: round(v, 4) for k, v in self.phases.items()},
            "plans_built": self.pool.built,
        }
        if o.schedule != "1f1b":
            extra["schedule"] = final_record(plan, o.schedule)
        plan = replace(plan, planner="gpp", search=SearchInfo(time.perf_counter() - self.t0, status, None, extra))
        validate(plan, graph, cluster)
        return plan


def _consider(P: Problem, label: str, st: State, seen: set[State], evald: list[Start]) -> None:
    """``st`` as a start at ``P``'s size: evaluated, in canonical form, once (``seen``)."""
    e = P.evaluate(st.assign, st.devs)
    if e is not None:
        c = canonical(st, e)
        if c not in seen:
            seen.add(c)
            evald.append((label, c, P.evaluate(c.assign, c.devs)))
