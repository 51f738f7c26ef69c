"""Run several planners on one graph and cluster and tabulate them side by side."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpp_solver._backend.progress import note
from gpp_solver.cost.micro_batch import check_mini_batch_size
from gpp_solver.errors import GppError, InfeasibleError, SearchSpaceTooLargeError, TimeLimitError, check_types
from gpp_solver.plan.simulate import simulate
from gpp_solver.plan.validate import validate
from gpp_solver.planners.registry import REGISTRY, get_planner
from gpp_solver.types import Cluster, Graph, Plan, Status

logger = logging.getLogger(__name__)

DEFAULT_PLANNERS = ("gpp", "graphpipe", "pipedream", "pipedream-2bw", "piper", "alpa")


@dataclass(frozen=True)
class CompareRow:
    planner: str
    status: str  # the plan's Status, or the error that stopped the planner
    search_seconds: float
    time_per_sample: float | None = None
    iteration_time: float | None = None
    throughput: float | None = None
    peak_memory_bytes: float | None = None
    stages: int | None = None
    depth: int | None = None
    devices_used: int | None = None
    micro_batch_size: int | None = None
    note: str = ""


def row_from_plan(plan: Plan, graph: Graph, cluster: Cluster, seconds: float, name: str | None = None) -> CompareRow:
    sim = simulate(plan, graph, cluster)
    mbs = sorted({s.micro_batch_size for s in plan.stages})
    return CompareRow(
        planner=name or plan.planner,
        status=plan.search.status,
        search_seconds=seconds,
        time_per_sample=plan.predicted.time_per_sample,
        iteration_time=sim.iteration_time,
        throughput=sim.throughput,
        peak_memory_bytes=sim.peak_memory_bytes,
        stages=len(plan.stages),
        depth=plan.depth,
        devices_used=plan.devices_used,
        micro_batch_size=mbs[0] if len(mbs) == 1 else None,
        note="" if len(mbs) == 1 else f"micro-batch sizes {mbs}",
    )


def compare(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    planners: Sequence[str] | None = None,
    *,
    time_limit: float | None = None,
    progress: bool = False,
    **options: Any,
) -> tuple[list[CompareRow], dict[str, Plan]]:
    """One row per planner (search seconds, status, TPS, simulated iteration time, throughput, memory, shape).

    A planner that finds no plan or refuses the instance gives a row with that status and no figures;
    every returned plan is validated.  ``progress`` is passed on to every planner, and each
    planner's start and outcome are reported (:func:`gpp_solver._backend.progress.note`).
    """
    check_types(graph=(graph, Graph), cluster=(cluster, Cluster))
    check_mini_batch_size(mini_batch_size)
    names = list(planners) if planners else [p for p in DEFAULT_PLANNERS if p in REGISTRY]
    rows: list[CompareRow] = []
    plans: dict[str, Plan] = {}
    for k, name in enumerate(names, 1):
        fn = get_planner(name)
        note(progress, "compare: running %s (%d of %d)", name, k, len(names))
        t0 = time.perf_counter()
        try:
            plan = fn(graph, cluster, mini_batch_size, time_limit=time_limit, progress=progress, **options)
        except InfeasibleError as exc:
            rows.append(CompareRow(name, Status.INFEASIBLE, time.perf_counter() - t0, note=str(exc)))
            continue
        except SearchSpaceTooLargeError as exc:
            rows.append(CompareRow(name, Status.SEARCH_SPACE_TOO_LARGE, time.perf_counter() - t0, note=str(exc)))
            continue
        except TimeLimitError as exc:
            rows.append(CompareRow(name, Status.TIME_LIMIT, time.perf_counter() - t0, note=str(exc)))
            continue
        except GppError as exc:
            rows.append(CompareRow(name, "error", time.perf_counter() - t0, note=str(exc)))
            continue
        seconds = time.perf_counter() - t0
        validate(plan, graph, cluster)
        plans[name] = plan
        rows.append(row_from_plan(plan, graph, cluster, seconds, name))
        note(progress, "compare: %s: %s in %.2f s", name, rows[-1].status, seconds)
    return rows, plans


def _fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def rows_to_markdown(rows: Sequence[CompareRow]) -> str:
    head = (
        "| planner | status | search s | TPS s | sim. iteration s | throughput samples/s | peak memory GiB "
        "| stages | depth | devices | micro-batch |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        mem = None if r.peak_memory_bytes is None else r.peak_memory_bytes / 2**30
        lines.append(
            f"| {r.planner} | {r.status} | {r.search_seconds:.3f} | {_fmt(r.time_per_sample, '.4g')} | "
            f"{_fmt(r.iteration_time, '.4g')} | {_fmt(r.throughput, '.4g')} | {_fmt(mem, '.3f')} | "
            f"{_fmt(r.stages, 'd')} | {_fmt(r.depth, 'd')} | {_fmt(r.devices_used, 'd')} | "
            f"{_fmt(r.micro_batch_size, 'd')} |"
        )
    return "\n".join(lines)


def rows_to_json(rows: Sequence[CompareRow]) -> str:
    return json.dumps([asdict(r) for r in rows], indent=1)
