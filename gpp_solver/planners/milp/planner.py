"""Exact MILP of the whole planning problem for small graphs (PuLP; HiGHS if ``highspy`` is
installed, else CBC).

The search space is ``milp_space.py``'s: convex stages with an acyclic stage graph (any, not only
series-parallel), one micro-batch size ``b`` (one MILP per candidate ``b``), ``d`` devices per
stage with ``b % d == 0``, 1F1B in-flight from the stage depth, contiguous device ranges in the
stage-slot order.  The objective is the cost model's bottleneck time-per-sample, so the answer is
optimal under ``docs/cost-model.md`` for that space (model in ``milp_model.py``).

Statuses: ``optimal-time-per-sample`` only when every per-``b`` MILP was solved to proven
optimality (or proven infeasible) — optimal for the bottleneck TPS, not the iteration time: a plan
of least TPS may be deep and slow per iteration (one measured 2.6x below ``gpp``'s
throughput); ``feasible`` when the cost model disagrees with a proven MILP optimum (solver
tolerance); ``time-limit`` when one stopped early (the best plan found is returned).  No plan in
memory: :class:`InfeasibleError` with the smallest memory per device that admits a plan (a second
MILP minimising peak memory).  Above :data:`MAX_NODE_SLOTS` nodes x stage slots or
:data:`MAX_LAYOUTS` device layouts: :class:`SearchSpaceTooLargeError`.

Measured (HiGHS, one thread, shared 2-core machine): 4-8 nodes on 4 devices solve to proven
optimality in 0.2-1.7 s (every ``b`` of 1, 2, 4, 8); a 12-node DAG on 8 devices with B = 16 does
not finish in 4 s (status ``time-limit``).  Use it as the exact reference on small graphs.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from gpp_solver._backend import load_order as _load_order  # noqa: F401  (OR-Tools before PuLP, see that module)

# isort: split
import pulp

from gpp_solver._backend.highs_worker import highs_available, solve_highs
from gpp_solver._backend.progress import ProgressBar
from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.errors import InfeasibleError, InvalidInputError, SearchSpaceTooLargeError, SolverError
from gpp_solver.formats.cluster import as_cluster
from gpp_solver.formats.graph import as_graph
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.milp.model import MilpModel, build_model
from gpp_solver.planners.milp.options import MilpOptions
from gpp_solver.planners.milp.space import contiguous_ranges, layouts
from gpp_solver.planners.registry import parse_options
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

logger = logging.getLogger(__name__)

MAX_NODE_SLOTS = 256
"""Refuse when ``nodes * stage slots`` exceeds this (slots = min(nodes, devices, max_stages))."""
MAX_LAYOUTS = 4096
"""Refuse when placement matters and there are more device layouts than this for some ``b``."""

OBJECTIVE = (
    "least bottleneck time per sample (cost model) over convex stages with an acyclic stage graph and "
    "one micro-batch size; the iteration time is not optimised"
)


def _solver(name: str | None, time_limit: float | None, msg: bool) -> pulp.LpSolver | dict:
    """HiGHS when ``highspy`` is installed (or asked for) — its options, for
    :func:`gpp_solver._backend.highs_worker.solve_highs` — else CBC; exact gaps, one thread."""
    want = (name or "auto").lower()
    if want not in ("auto", "highs", "cbc"):
        raise InvalidInputError(f"milp: option solver must be 'highs' or 'cbc', got {name!r}")
    if want in ("auto", "highs"):
        if highs_available():
            return dict(
                msg=msg, timeLimit=time_limit, gapRel=1e-9, gapAbs=1e-12, threads=1, mip_feasibility_tolerance=1e-9
            )
        if want == "highs":
            raise InvalidInputError("milp: solver 'highs' needs the highspy package")
    with warnings.catch_warnings():  # PuLP 3.3 flags its bundled CBC as deprecated for PuLP 4
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=msg, timeLimit=time_limit, gapRel=1e-9, gapAbs=1e-12, threads=1)


@dataclass(frozen=True)
class _Solved:
    b: int
    status: str  # the MILP's outcome for this b (its own objective): optimal |
    # time-limit | infeasible | no-better | no-solution; not a plan Status
    objective: float | None  # cost-model units (seconds per sample, or bytes)
    bound: float | None
    stages: tuple[tuple[str, ...], ...] | None
    devices: tuple[int, ...] | None
    seconds: float


def _solve(model: MilpModel, time_limit: float | None, solver: str | None, progress: bool) -> _Solved:
    t0 = time.perf_counter()
    if time_limit is not None and time_limit <= 0:
        return _Solved(model.b, "no-solution", None, None, None, None, 0.0)
    prob = model.problem
    chosen = _solver(solver, time_limit, False)
    try:
        if isinstance(chosen, dict):
            try:
                solve_highs(prob, **chosen)
            except SolverError as exc:
                if solver not in (None, "auto"):
                    raise
                # HiGHS fails on some small models (its own exception); CBC solves the same model exactly
                logger.info("milp b=%d: %s; solving with CBC", model.b, exc)
                left = None if time_limit is None else max(1e-3, time_limit - (time.perf_counter() - t0))
                prob.solve(_solver("cbc", left, False))
        else:
            prob.solve(chosen)
    except (pulp.PulpSolverError, SolverError) as exc:
        raise SolverError(f"milp: the solver failed on b={model.b}: {exc}") from exc
    secs = time.perf_counter() - t0
    sol = prob.sol_status
    if sol == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        status = "infeasible"
    elif sol == pulp.LpSolutionOptimal:
        status = "optimal"
    elif sol == pulp.LpSolutionIntegerFeasible:
        status = "time-limit"
    elif sol == pulp.LpSolutionNoSolutionFound:
        status = "no-solution"
    else:
        raise SolverError(
            f"milp: unexpected solver status {pulp.LpStatus.get(prob.status)} (solution status {sol}) on b={model.b}"
        )
    if progress:
        logger.info("milp b=%d: %s in %.2fs", model.b, status, secs)
    if status in ("infeasible", "no-solution"):
        return _Solved(model.b, status, None, None, None, None, secs)
    stages, devices = model.extract()
    obj = pulp.value(prob.objective) * model.scale
    return _Solved(model.b, status, obj, None, stages, devices, secs)


def _specs(s: _Solved) -> list[StageSpec]:
    assert s.stages is not None and s.devices is not None
    return [StageSpec(nodes=p, devices=r, micro_batch_size=s.b) for p, r in zip(s.stages, contiguous_ranges(s.devices))]


def _check_size(graph: Graph, cluster: Cluster, slots: int, sizes: Sequence[int]) -> None:
    n = len(graph.nodes)
    if n * slots > MAX_NODE_SLOTS:
        raise SearchSpaceTooLargeError(
            f"milp: nodes x stage slots = {n} x {slots} = {n * slots} exceeds the limit {MAX_NODE_SLOTS} "
            "(pass max_stages=... to use fewer slots, or use another planner)"
        )
    if constant_bandwidth(cluster) is None:
        for b in sizes:
            count = sum(1 for _ in zip(range(MAX_LAYOUTS + 1), layouts(b, cluster.devices, slots)))
            if count > MAX_LAYOUTS:
                raise SearchSpaceTooLargeError(
                    f"milp: more than {MAX_LAYOUTS} device layouts for b={b} on {cluster.devices} devices and "
                    f"{slots} stage slots (placement matters on this cluster); pass max_stages=... or fewer "
                    "micro_batch_sizes"
                )


def _min_memory(
    graph: Graph,
    cluster: Cluster,
    B: int,
    sizes: Sequence[int],
    slots: int,
    deadline: float | None,
    solver: str | None,
    progress: bool,
) -> tuple[float, bool]:
    """Smallest peak memory per device over the search space, and whether it is proven."""
    best, proven = math.inf, True
    for i, b in enumerate(sizes):
        left = None if deadline is None else max(0.0, deadline - time.perf_counter()) / (len(sizes) - i)
        s = _solve(build_model(graph, cluster, B, b, slots, objective="memory"), left, solver, progress)
        if s.status != "optimal":
            proven = False
        if s.stages is not None:
            plan = build_plan(
                graph, cluster, _specs(s), B, planner="milp", search=SearchInfo(seconds=0.0, status=Status.INFEASIBLE)
            )
            best = min(best, plan.predicted.peak_memory_bytes)
    return best, proven


def plan_milp(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> Plan:
    """The plan of least bottleneck time-per-sample, proven optimal unless the time limit stops it.

    ``micro_batch_sizes``: candidate ``b`` (default: powers of two dividing ``B``), one MILP each.
    ``max_stages``: at most this many stages (default: min(nodes, devices)).  ``solver``: ``"highs"``
    or ``"cbc"`` (default: HiGHS if installed, else CBC).  ``time_limit`` covers the whole call.
    """
    t0 = time.perf_counter()
    graph, cluster = as_graph(graph), as_cluster(cluster)
    o = parse_options("milp", MilpOptions, options)
    solver, micro_batch_sizes, max_stages = o.solver, o.micro_batch_sizes, o.max_stages
    if time_limit is not None and not time_limit > 0:
        raise InvalidInputError(f"milp: time_limit must be positive, got {time_limit!r}")
    B = mini_batch_size
    sizes = check_micro_batch_sizes(B, micro_batch_sizes)
    slots = min(len(graph.nodes), cluster.devices, max_stages or len(graph.nodes))
    _check_size(graph, cluster, slots, sizes)
    deadline = None if time_limit is None else t0 + time_limit
    results = _solve_every_b(graph, cluster, B, sizes, slots, deadline, solver, progress)
    found = [r for r in results if r.stages is not None]
    unfinished = [r.b for r in results if r.status in ("no-solution", "time-limit")]
    if not found:
        _raise_no_plan(graph, cluster, B, sizes, slots, deadline, solver, progress, unfinished, time_limit)
    b, plan, mismatch = _least_tps_plan(graph, cluster, B, found)
    status = Status.TIME_LIMIT if unfinished else Status.FEASIBLE if mismatch else Status.OPTIMAL_TIME_PER_SAMPLE
    extra = {
        "solver_seconds": {r.b: round(r.seconds, 4) for r in results},
        "per_b_status": {r.b: r.status for r in results},
        "slots": slots,
        "solver": "HiGHS (worker process)" if isinstance(_solver(solver, None, False), dict) else "CBC",
    }
    plan = replace(
        plan,
        search=replace(
            plan.search,
            seconds=time.perf_counter() - t0,
            status=status,
            micro_batch_size=b,
            objective=OBJECTIVE,
            extra={**dict(plan.search.extra), **extra},
        ),
    )
    validate(plan, graph, cluster)
    return plan


def _solve_every_b(
    graph: Graph,
    cluster: Cluster,
    B: int,
    sizes: Sequence[int],
    slots: int,
    deadline: float | None,
    solver: str | None,
    progress: bool,
) -> list[_Solved]:
    """One MILP per ``b``, largest first, each with an even share of the time left; once a plan is
    known, later MILPs only look for better ones (cut off at its TPS)."""
    results: list[_Solved] = []
    best: float | None = None
    bar = ProgressBar(len(sizes), "milp: micro-batch sizes", "MILP", progress)
    for i, b in enumerate(sorted(sizes, reverse=True)):
        bar.set_postfix_str(f"b={b}")
        left = None if deadline is None else max(0.0, deadline - time.perf_counter()) / (len(sizes) - i)
        cutoff = None if best is None else best * (1 + 1e-9)
        r = _solve(build_model(graph, cluster, B, b, slots, cutoff=cutoff), left, solver, progress)
        if r.status == "infeasible" and cutoff is not None:
            r = replace(r, status="no-better")  # proven: nothing with this b beats the best plan so far
        results.append(r)
        if r.stages is not None:
            tps = build_plan(
                graph, cluster, _specs(r), B, planner="milp", search=SearchInfo(seconds=0.0, status=Status.FEASIBLE)
            ).predicted.time_per_sample
            best = tps if best is None else min(best, tps)
        bar.update(1)
    bar.close()
    return results


def _raise_no_plan(
    graph: Graph,
    cluster: Cluster,
    B: int,
    sizes: Sequence[int],
    slots: int,
    deadline: float | None,
    solver: str | None,
    progress: bool,
    unfinished: list[int],
    time_limit: float | None,
) -> NoReturn:
    """No MILP found a plan: the time limit when some did not finish, else the memory a plan needs."""
    if unfinished:
        raise SolverError(
            f"milp: time limit ({time_limit} s) reached before any plan was found or "
            f"infeasibility proven (unfinished b: {unfinished})"
        )
    need, proven = _min_memory(graph, cluster, B, sizes, slots, deadline, solver, progress)
    if math.isinf(need):
        raise InfeasibleError(
            f"milp: no plan fits in {cluster.memory_bytes:.6g} bytes per device; the time "
            "limit stopped the search for the memory a plan would need"
        )
    what = "at least" if proven else "(not proven smallest) a plan exists with"
    raise InfeasibleError(
        f"milp: no plan fits in {cluster.memory_bytes:.6g} bytes per device; it needs {what} "
        f"{need:.6g} bytes per device",
        required_memory_bytes=need,
    )


def _least_tps_plan(graph: Graph, cluster: Cluster, B: int, found: list[_Solved]) -> tuple[int, Plan, list[int]]:
    """The plan of least (TPS, iteration time, ``b``) among the MILPs' answers, its ``b``, and the
    ``b`` whose proven optimum the cost model does not confirm."""
    plans, mismatch = [], []
    for r in found:
        plan = build_plan(
            graph, cluster, _specs(r), B, planner="milp", search=SearchInfo(seconds=0.0, status=Status.FEASIBLE)
        )
        tps = plan.predicted.time_per_sample
        # an incumbent stopped by the time limit may carry slack (objective above its true TPS);
        # a proven optimum must agree with the cost model, else (solver tolerances) it is not proven
        if r.status == "optimal" and (r.objective is None or not math.isclose(tps, r.objective, rel_tol=1e-6)):
            logger.warning(
                "milp b=%d: model objective %.9g differs from the cost model's %.9g; not claiming optimality",
                r.b,
                r.objective,
                tps,
            )
            mismatch.append(r.b)
        plans.append((tps, plan.predicted.iteration_time, r.b, plan))
    _, _, b, plan = min(plans, key=lambda p: p[:3])
    return b, plan, mismatch
