"""The ``gpp`` planner's options: one frozen dataclass, checked by :func:`gpp_solver.planners.registry.parse_options`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpp_solver.cost.micro_batch import powers_of_two_dividing
from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.zero_bubble import check_schedule
from gpp_solver.types import Cluster, Graph, Plan

# The default seeds: GraphPipe's DP and PipeDream-2BW's uniform chains.  PipeDream's and Alpa's DPs
# are left out by default (they would be 60-75% of the seed time at 32 devices): on the paper's
# workloads at 4-32 devices gpp's result is the same without them (benchmarks/gpp_vs_spp.py), since
# its own sequential starts (balanced chains, uniform chains of D / d stages) cover their spaces.
SEED_PLANNERS = ("graphpipe", "pipedream-2bw")
OPTIONAL_SEED_PLANNERS = ("pipedream", "alpa")  # pass seed_planners=... to add them
# ... except on small instances, where their DPs take milliseconds and PipeDream's is exact for the
# bottleneck TPS of a chain: with the default seed list, at most SMALL_GRAPH_NODES nodes and at most
# SMALL_GRAPH_DEVICES devices they are added (a rule on the input's size, so the plan still does
# not depend on the machine's load)
SMALL_GRAPH_NODES = 48
SMALL_GRAPH_DEVICES = 16
SMALL_GRAPH_RESTARTS = 3  # there, too, the extra local-search starts cost milliseconds
DEFAULT_TIME_LIMIT = 10.0  # seconds, seed planners included
MAX_MICRO_BATCHES = 256  # candidate b keep B / b at most this (simulation cost)
DEFAULT_MAX_ITERATIONS = 400
# Local-search work per run, in node-evaluations (states priced x graph nodes; a state costs about
# its node count to price): a count, so the cap does not depend on the machine's speed or load.
# The paper's workloads at 4-32 devices use at most ~0.7M; on 1,000-operator graphs a search from
# a start that does not fit in memory priced 300k+ states (2 minutes) without making it fit.
DEFAULT_MAX_WORK = 20_000_000
WORK_SHARE = 4  # one search prices at most max_work / WORK_SHARE node-evaluations
OBJECTIVES = ("iteration_time", "time_per_sample")


@dataclass(frozen=True)
class GppOptions:
    """What ``plan_gpp`` takes beside ``time_limit`` and ``progress`` (module docstring of
    :mod:`gpp_solver.planners.gpp.planner`)."""

    # CP-SAT's random seed (single-threaded, deterministic time: the result does not depend on load)
    seed: int = 0
    # CP-SAT tightening of the orders: True always, False never, None when the model is small enough
    tighten: bool | None = None
    # candidate micro-batch sizes (default: powers of two dividing B with B / b <= MAX_MICRO_BATCHES, plus the seeds');
    # given, they hold for every plan considered: the seed planners get them, a seed plan outside them is dropped
    micro_batch_sizes: Sequence[int] | None = None
    # the registered planners whose plans seed the search, run in this order
    seed_planners: Sequence[str] = SEED_PLANNERS
    # with the default seed_planners, on small instances (SMALL_GRAPH_NODES, SMALL_GRAPH_DEVICES) also
    # OPTIONAL_SEED_PLANNERS (False: not; gpp under the runtime's overheads runs them once itself)
    optional_seeds: bool = True
    # local-search moves per search at most
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    # local-search work per run in node-evaluations (states priced x graph nodes); None = no cap
    max_work: int | None = DEFAULT_MAX_WORK
    # start states searched per micro-batch size (the best first; the rest for the RESTART_SIZES best sizes);
    # None: SMALL_GRAPH_RESTARTS on small instances (SMALL_GRAPH_NODES, SMALL_GRAPH_DEVICES), else 1
    restarts: int | None = None
    # also run the exact planner (milp) and say "optimal" when the plan's TPS meets its proven optimum
    prove: bool = False
    # what the pick minimises first: the simulated "iteration_time" or the "time_per_sample"
    objective: str = "iteration_time"
    # plans already computed, by planner name (those planners are not run again)
    seed_plans: Mapping[str, Plan] | None = None
    # search again with the iteration-time estimate as the first key (shallower stage graphs)
    polish: bool = True
    # exact iteration-time search (planners/exact): None = on small graphs (exact.planner.GPP_MAX_*),
    # True = up to the exact search's own limits, False = off; objective "iteration_time" only
    exact: bool | None = None
    # micro-batch orders: "auto" (split backward with W actions where faster), "zb" (always), "1f1b" (kFkB)
    schedule: str = "auto"
    # rungs of the memory ladder (planners/gpp/ladder.py): the search run again below the memory of the
    # plan found; None = ladder.default_rungs: LADDER_RUNGS on small instances (SMALL_GRAPH_NODES,
    # SMALL_GRAPH_DEVICES) with a time limit of at least ladder.LADDER_MIN_LIMIT, else 0
    ladder: int | None = None

    def __post_init__(self) -> None:
        check_schedule(self.schedule)
        if self.restarts is not None and (
            isinstance(self.restarts, bool) or not isinstance(self.restarts, int) or self.restarts < 1
        ):
            raise InvalidInputError(f"restarts must be a positive integer or None, got {self.restarts!r}")
        if self.max_work is not None and (
            isinstance(self.max_work, bool) or not isinstance(self.max_work, int) or self.max_work < 1
        ):
            raise InvalidInputError(f"max_work must be a positive integer or None, got {self.max_work!r}")
        if self.ladder is not None and (
            isinstance(self.ladder, bool) or not isinstance(self.ladder, int) or self.ladder < 0
        ):
            raise InvalidInputError(f"ladder must be a non-negative integer or None, got {self.ladder!r}")
        if self.objective not in OBJECTIVES:
            raise InvalidInputError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")


def is_small(graph: Graph, cluster: Cluster) -> bool:
    """At most ``SMALL_GRAPH_NODES`` nodes and ``SMALL_GRAPH_DEVICES`` devices: the instances where the
    optional seeds, the restarts and the memory ladder run by default (a rule on the input's size)."""
    return len(graph.nodes) <= SMALL_GRAPH_NODES and cluster.devices <= SMALL_GRAPH_DEVICES


def candidate_micro_batch_sizes(
    mini_batch_size: int, extra: Sequence[int] = (), max_micro_batches: int = MAX_MICRO_BATCHES
) -> list[int]:
    """The common rule's powers of two dividing ``B`` (:mod:`gpp_solver.cost.micro_batch`) with
    ``B / b <= max_micro_batches``, plus ``extra`` (seeds' sizes)."""
    B = mini_batch_size  # the paper's B
    out = {b for b in powers_of_two_dividing(B) if B // b <= max_micro_batches}
    out.update(x for x in extra if B % x == 0)
    return sorted(out) if out else [B]
