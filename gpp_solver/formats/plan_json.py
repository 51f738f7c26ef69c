"""Read and write ``gpp-plan/1`` documents (structure only; ``validate.py`` checks the meaning)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpp_solver.errors import InvalidPlanError
from gpp_solver.plan.action import Action
from gpp_solver.formats.jsonio import integer, number, read_json, require, write_json
from gpp_solver.types import (PLAN_FORMAT, SEARCH_FIELDS, Plan, PlanPrediction, Schedule, SearchInfo, Stage,
                              StagePrediction, Status)

E = InvalidPlanError


def _order(raw: Any, where: str) -> tuple[Action, ...]:
    if not isinstance(raw, list):
        raise E(f"{where}.order must be a list of [\"F\"|\"B\", micro-batch] pairs")
    out = []
    for i, a in enumerate(raw):
        if not (isinstance(a, list) and len(a) == 2 and a[0] in ("F", "B")):
            raise E(f"{where}.order[{i}] must be [\"F\", j] or [\"B\", j], got {a!r}")
        out.append(Action.of(a[0], integer(a[1], f"{where}.order[{i}]", E, minimum=0)))
    return tuple(out)


def _status(raw: Any) -> Status:
    try:
        return Status(raw)
    except (ValueError, TypeError):
        raise E(f"plan: search.status must be one of {', '.join(s.value for s in Status)}, got {raw!r}") from None


def _search(srch: dict[str, Any]) -> SearchInfo:
    objective, ite, mbs, tight = (srch.get(k) for k in SEARCH_FIELDS)
    if objective is not None and not isinstance(objective, str):
        raise E(f"plan: search.objective must be a string, got {objective!r}")
    if tight is not None and not isinstance(tight, dict):
        raise E(f"plan: search.cp_tighten must be a JSON object, got {tight!r}")
    return SearchInfo(
        seconds=number(srch.get("seconds", 0.0), "plan: search.seconds", E),
        status=_status(srch.get("status", Status.UNKNOWN)), epsilon=srch.get("epsilon"),
        extra={k: v for k, v in srch.items() if k not in {"seconds", "status", "epsilon", *SEARCH_FIELDS}},
        objective=objective, iteration_time_estimate=None if ite is None else number(ite, "plan: search.iteration_time_estimate", E),
        micro_batch_size=None if mbs is None else integer(mbs, "plan: search.micro_batch_size", E, minimum=1),
        cp_tighten=tight)


def plan_from_dict(d: Any) -> Plan:
    if not isinstance(d, dict):
        raise E(f"plan must be a JSON object, got {type(d).__name__}")
    fmt = d.get("format", PLAN_FORMAT)
    if fmt != PLAN_FORMAT:
        raise E(f"plan: format must be '{PLAN_FORMAT}', got {fmt!r}")
    B = integer(require(d, "mini_batch_size", "plan", E), "plan: mini_batch_size", E, minimum=1)
    stages_raw = require(d, "stages", "plan", E)
    if not isinstance(stages_raw, list) or not stages_raw:
        raise E("plan: stages must be a non-empty list")
    stages = []
    for i, s in enumerate(stages_raw):
        sid = integer(require(s, "id", f"plan: stage #{i}", E), f"plan: stage #{i}.id", E, minimum=0)
        where = f"stage {sid}"
        nodes = require(s, "nodes", where, E)
        if not isinstance(nodes, list) or not all(isinstance(x, str) for x in nodes):
            raise E(f"{where}.nodes must be a list of node ids")
        devices = require(s, "devices", where, E)
        if not isinstance(devices, list):
            raise E(f"{where}.devices must be a list of device indices")
        sched = require(s, "schedule", where, E)
        pred = s.get("predicted", {}) or {}
        tmpc = s.get("tmpc")
        stages.append(Stage(
            id=sid, nodes=tuple(nodes),
            devices=tuple(integer(x, f"{where}.devices", E, minimum=0) for x in devices),
            micro_batch_size=integer(require(s, "micro_batch_size", where, E), f"{where}.micro_batch_size", E,
                                     minimum=1),
            schedule=Schedule(kind=str(sched.get("kind", "custom")) if isinstance(sched, dict) else "custom",
                              k=integer(sched.get("k", 1), f"{where}.schedule.k", E, minimum=1)
                              if isinstance(sched, dict) else 1,
                              order=_order(require(sched, "order", f"{where}.schedule", E), f"{where}.schedule")),
            in_flight_samples=integer(require(s, "in_flight_samples", where, E), f"{where}.in_flight_samples", E,
                                      minimum=0),
            predicted=StagePrediction(
                time_per_sample=number(pred.get("time_per_sample", 0.0), f"{where}.predicted.time_per_sample", E),
                memory_bytes=number(pred.get("memory_bytes", 0.0), f"{where}.predicted.memory_bytes", E)),
            tensor_parallel=integer(s.get("tensor_parallel", 1), f"{where}.tensor_parallel", E, minimum=1),
            tmpc=dict(tmpc) if isinstance(tmpc, dict) else None,
        ))
    edges_raw = d.get("edges", [])
    if not isinstance(edges_raw, list):
        raise E("plan: edges must be a list of [from, to] stage pairs")
    edges = []
    for i, e in enumerate(edges_raw):
        if not (isinstance(e, list) and len(e) == 2):
            raise E(f"plan: edges[{i}] must be a [from, to] pair, got {e!r}")
        edges.append((integer(e[0], f"plan: edges[{i}]", E, minimum=0), integer(e[1], f"plan: edges[{i}]", E,
                                                                                   minimum=0)))
    p = d.get("predicted", {}) or {}
    srch = d.get("search", {}) or {}
    return Plan(
        planner=str(d.get("planner", "unknown")), graph=str(d.get("graph", "")), mini_batch_size=B,
        stages=tuple(stages), edges=tuple(edges),
        predicted=PlanPrediction(
            time_per_sample=number(p.get("time_per_sample", 0.0), "plan: predicted.time_per_sample", E),
            iteration_time=number(p.get("iteration_time", 0.0), "plan: predicted.iteration_time", E),
            throughput=number(p.get("throughput", 0.0), "plan: predicted.throughput", E),
            peak_memory_bytes=number(p.get("peak_memory_bytes", 0.0), "plan: predicted.peak_memory_bytes", E)),
        search=_search(srch),
    )


def plan_to_dict(p: Plan) -> dict[str, Any]:
    stages = []
    for s in p.stages:
        sd: dict[str, Any] = {
            "id": s.id, "nodes": list(s.nodes), "devices": list(s.devices), "micro_batch_size": s.micro_batch_size,
            "schedule": {"kind": s.schedule.kind, "k": s.schedule.k, "order": [a.to_json() for a in s.schedule.order]},
            "in_flight_samples": s.in_flight_samples,
            "predicted": {"time_per_sample": s.predicted.time_per_sample, "memory_bytes": s.predicted.memory_bytes},
        }
        if s.tensor_parallel != 1:
            sd["tensor_parallel"] = s.tensor_parallel
        if s.tmpc:
            sd["tmpc"] = dict(s.tmpc)
        stages.append(sd)
    search: dict[str, Any] = {"seconds": p.search.seconds, "status": p.search.status.value}
    if p.search.epsilon is not None:
        search["epsilon"] = p.search.epsilon
    for key in ("objective", "iteration_time_estimate", "micro_batch_size"):
        if getattr(p.search, key) is not None:
            search[key] = getattr(p.search, key)
    search.update(p.search.extra)
    if p.search.cp_tighten is not None:
        search["cp_tighten"] = p.search.cp_tighten
    return {
        "format": PLAN_FORMAT, "planner": p.planner, "graph": p.graph, "mini_batch_size": p.mini_batch_size,
        "stages": stages, "edges": [list(e) for e in p.edges],
        "predicted": {"time_per_sample": p.predicted.time_per_sample, "iteration_time": p.predicted.iteration_time,
                      "throughput": p.predicted.throughput, "peak_memory_bytes": p.predicted.peak_memory_bytes},
        "search": search,
    }


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_json(path, "plan", E))


def save_plan(p: Plan, path: str | Path) -> None:
    write_json(plan_to_dict(p), path)
