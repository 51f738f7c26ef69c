"""One run of the ``gpp`` planner as one record (:class:`GppRun`; the algorithm is described in
:mod:`gpp_solver.planners.gpp.planner`): the instance, the options, the clock, and what each phase
leaves for the next.  The phases are functions of it, in order: the seed plans and the start states
per micro-batch size (:mod:`gpp_solver.planners.gpp.starts`), the local searches — phase 1 per
size, phase 2 restarts, phase 3 polish (:mod:`gpp_solver.planners.gpp.searches`) — and the exact
searches, the pick, tightening and record (:mod:`gpp_solver.planners.gpp.answer`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpp_solver.cost.micro_batch import check_mini_batch_size
from gpp_solver.cost.tables import CostTables
from gpp_solver.errors import InvalidInputError
from gpp_solver.planners.exact.planner import ExactOutcome
from gpp_solver.planners.gpp.options import (
    DEFAULT_TIME_LIMIT,
    OPTIONAL_SEED_PLANNERS,
    SEED_PLANNERS,
    SMALL_GRAPH_RESTARTS,
    GppOptions,
    is_small,
)
from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State
from gpp_solver.planners.gpp.pool import Pool
from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)

Start = tuple[str, State, Eval]  # (label, state, its evaluation)


@dataclass
class GppRun:
    """The state one ``gpp`` run carries from phase to phase (mutable: the phases fill it in);
    :meth:`create` checks the input and starts the clock, and :func:`plan_gpp` calls the phases in
    order: ``starts.run_seeds``, ``starts.find_starts``, ``searches.pool_seeds``,
    ``searches.search_sizes``, ``searches.restart``, ``searches.polish_best``,
    ``answer.exact_searches`` (together ``planner.pick``) and ``answer.finish``; then
    ``ladder.descend`` runs ``planner.pick`` (and ``finish`` where it may win) on fresh runs below
    the memory."""

    # the instance and the options
    graph: Graph
    cluster: Cluster
    B: int
    o: GppOptions
    progress: bool
    small: bool  # options.is_small: SMALL_GRAPH_NODES nodes and SMALL_GRAPH_DEVICES devices at most
    seed_planners: Sequence[str]
    restarts: int
    log: Callable[..., None]
    # the clock
    t0: float
    budget: float
    deadline: float
    phases: dict[str, float] = field(default_factory=dict)  # wall seconds per phase (search.extra["phase_seconds"])
    reserve: float = 0.0  # seconds kept for the answer after the searches (:meth:`keep_for_answer`)
    timed_out: bool = False
    # starts.run_seeds: the allowed micro-batch sizes (None: any), the seed plans, the partitions of
    # those that refused the limit (seeds.RELAXED_MEMORY), their records, the sizes to search and
    # the cost tables
    allowed: list[int] | None = None
    seeds: dict[str, Plan] = field(default_factory=dict)
    seed_partitions: dict[str, Plan] = field(default_factory=dict)
    seed_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    bs: list[int] = field(default_factory=list)
    tables: CostTables | None = None
    # starts.find_starts: the start states per size (best first), per size the start with the least
    # estimate, and the sizes in the order phase 1 searches them
    starts: dict[int, tuple[Problem, list[Start]]] = field(default_factory=dict)
    by_estimate: dict[int, Start] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)
    # searches: the candidates (seeds first) and the searches' records
    pool: Pool = field(init=False)
    per_b: dict[int, dict[str, Any]] = field(default_factory=dict)
    work: dict[str, Any] = field(init=False)  # node-evaluations (search.extra["work"])
    best_key: dict[int, tuple] = field(default_factory=dict)
    best_score: dict[int, tuple[float, float]] = field(default_factory=dict)
    worst_memory: list[float] = field(default_factory=list)
    # answer.exact_searches: the exact iteration-time search's outcome and the MILP's proven TPS
    ex: ExactOutcome | None = None
    proven: float | None = None

    def __post_init__(self) -> None:
        o = self.o
        # lazy plans when the score starts with the iteration time, and the restarts (phase 2) need no
        # per-size scores (restarts == 1: the default beyond small instances)
        self.pool = Pool(self.score, lazy=o.objective == "iteration_time" and self.restarts == 1, schedule=o.schedule)
        self.work = {"max_work": o.max_work, "used": 0, "searches": 0, "skipped": 0}

    @classmethod
    def create(
        cls,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        o: GppOptions,
        time_limit: float | None,
        progress: bool,
    ) -> GppRun:
        """A run of ``plan_gpp`` on this input (checked), its clock started."""
        small = is_small(graph, cluster)
        seed_planners = o.seed_planners
        if tuple(seed_planners) == SEED_PLANNERS and small and o.optional_seeds:
            seed_planners = SEED_PLANNERS + OPTIONAL_SEED_PLANNERS
        restarts = o.restarts if o.restarts is not None else SMALL_GRAPH_RESTARTS if small else 1
        B = check_mini_batch_size(mini_batch_size)
        if time_limit is not None and not time_limit > 0:
            raise InvalidInputError(f"`time_limit > 0` must hold, but got (time_limit={time_limit})")
        t0 = time.perf_counter()
        budget = time_limit if time_limit is not None else DEFAULT_TIME_LIMIT
        return cls(
            graph=graph,
            cluster=cluster,
            B=B,
            o=o,
            progress=progress,
            small=small,
            seed_planners=seed_planners,
            restarts=restarts,
            log=logger.info if progress else logger.debug,
            t0=t0,
            budget=budget,
            deadline=t0 + budget,
        )

    def score(self, p: Plan) -> tuple[float, float]:
        it, tps = p.predicted.iteration_time, p.predicted.time_per_sample
        return (it, tps) if self.o.objective == "iteration_time" else (tps, it)

    def lap(self, name: str) -> None:
        self.phases[name] = time.perf_counter() - self.t0 - sum(self.phases.values())

    def past_deadline(self) -> bool:
        return time.perf_counter() > self.deadline

    def keep_for_answer(self, validate_seconds: float) -> None:
        """Stop the searches early enough for the answer: after them the pick is built as a gpp
        plan (a seed plan keeps the orders made for it when it joined the candidates), tightened
        and validated, which take about
        ``ANSWER_VALIDATIONS`` validations of a plan of this graph (measured on the seed plans:
        milliseconds on small graphs, seconds at 10,000 operators), at most ``ANSWER_MAX_SHARE``
        of the time limit.  The deadline every phase checks moves that much earlier."""
        self.reserve = min(ANSWER_MAX_SHARE * self.budget, ANSWER_VALIDATIONS * validate_seconds)
        self.deadline = self.t0 + self.budget - self.reserve


#: the answer after the searches (building the pick, tightening and validating) in validations
#: of a plan of the graph; measured at 10,000 operators: 2.9 s against
#: 0.75 s a validation (GppRun.keep_for_answer)
ANSWER_VALIDATIONS = 4.0
ANSWER_MAX_SHARE = 0.25
