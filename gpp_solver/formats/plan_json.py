"""Read and write ``gpp-plan/1`` documents (structure only; ``validate.py`` checks the meaning).

A field the format does not define (top level, stage, ``schedule``, ``predicted``) is an error
naming it; extensions go under an ``extra`` object (accepted at the top level and in a stage, not
interpreted).  ``search`` is the planner's record: ``seconds``, ``status``, ``epsilon`` and any
planner-specific fields (kept in ``SearchInfo.extra``; nothing reads them to plan or check).

``optimizer_state_factor`` (optional number >= 0): the cluster's ``optimizer_state_factor`` the
plan's memory figures were computed with. Planners write it; when a document leaves it out the
factor is the cluster's (the one given to ``validate``, or the runtime's ``--cluster``, else 4.0).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpp_solver.action import Action
from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.jsonio import (
    document,
    extra,
    integer,
    known_fields,
    number,
    obj,
    read_json,
    require,
    show,
    write_json,
)
from gpp_solver.limits import MAX_COUNT, MAX_FACTOR
from gpp_solver.types import (
    PLAN_FORMAT,
    SEARCH_FIELDS,
    Plan,
    PlanPrediction,
    Schedule,
    SearchInfo,
    Stage,
    StagePrediction,
    Status,
)

E = InvalidPlanError
_PLAN_FIELDS = frozenset(
    {
        "format",
        "planner",
        "graph",
        "mini_batch_size",
        "optimizer_state_factor",
        "stages",
        "edges",
        "predicted",
        "search",
        "extra",
    }
)
_STAGE_FIELDS = frozenset(
    {
        "id",
        "nodes",
        "devices",
        "micro_batch_size",
        "schedule",
        "in_flight_samples",
        "predicted",
        "tensor_parallel",
        "tmpc",
        "recompute",
        "zero",
        "extra",
    }
)
_SCHEDULE_FIELDS = frozenset({"kind", "k", "order"})
_STAGE_PRED_FIELDS = frozenset({"time_per_sample", "memory_bytes"})
_PLAN_PRED_FIELDS = frozenset({"time_per_sample", "iteration_time", "throughput", "peak_memory_bytes"})


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise E(f"{where} must be a string, got {show(value)}")
    return value


def _predicted(d: dict, fields: frozenset[str], where: str) -> dict[str, float]:
    p = obj(d.get("predicted", {}), f"{where}.predicted", E)
    known_fields(p, fields, f"{where}.predicted", E)
    return {k: number(p.get(k, 0.0), f"{where}.predicted.{k}", E) for k in sorted(fields)}


def _order(raw: Any, where: str) -> tuple[Action, ...]:
    if not isinstance(raw, list):
        raise E(f"{where}.order must be a list of [\"F\"|\"B\"|\"W\", micro-batch] pairs")
    out = []
    for i, a in enumerate(raw):
        if not (isinstance(a, list) and len(a) == 2 and a[0] in ("F", "B", "W")):
            raise E(f"{where}.order[{i}] must be [\"F\", j], [\"B\", j] or [\"W\", j], got {show(a)}")
        out.append(Action.of(a[0], integer(a[1], f"{where}.order[{i}]", E, minimum=0, maximum=MAX_COUNT)))
    return tuple(out)


def _status(raw: Any) -> Status:
    try:
        return Status(raw)
    except (ValueError, TypeError):
        raise E(f"plan: search.status must be one of {', '.join(s.value for s in Status)}, got {raw!r}") from None


def _search(srch: dict[str, Any]) -> SearchInfo:
    objective, ite, mbs, tight = (srch.get(k) for k in SEARCH_FIELDS)
    if objective is not None and not isinstance(objective, str):
        raise E(f"plan: search.objective must be a string, got {show(objective)}")
    if tight is not None and not isinstance(tight, dict):
        raise E(f"plan: search.cp_tighten must be a JSON object, got {show(tight)}")
    return SearchInfo(
        seconds=number(srch.get("seconds", 0.0), "plan: search.seconds", E),
        status=_status(srch.get("status", Status.UNKNOWN)),
        epsilon=None if srch.get("epsilon") is None else number(srch["epsilon"], "plan: search.epsilon", E),
        extra={k: v for k, v in srch.items() if k not in {"seconds", "status", "epsilon", *SEARCH_FIELDS}},
        objective=objective,
        iteration_time_estimate=None if ite is None else number(ite, "plan: search.iteration_time_estimate", E),
        micro_batch_size=None if mbs is None else integer(mbs, "plan: search.micro_batch_size", E, minimum=1),
        cp_tighten=tight,
    )


def _stage(s: Any, i: int) -> Stage:
    """Stage ``#i`` (in document order) of a plan document."""
    sid = integer(require(s, "id", f"plan: stage #{i}", E), f"plan: stage #{i}.id", E, minimum=0, maximum=MAX_COUNT)
    where = f"stage {sid}"
    known_fields(s, _STAGE_FIELDS, where, E)
    extra(s, where, E)
    nodes = require(s, "nodes", where, E)
    if not isinstance(nodes, list) or not all(isinstance(x, str) for x in nodes):
        raise E(f"{where}.nodes must be a list of node ids")
    devices = require(s, "devices", where, E)
    if not isinstance(devices, list):
        raise E(f"{where}.devices must be a list of device indices")
    sched = obj(require(s, "schedule", where, E), f"{where}.schedule", E)
    known_fields(sched, _SCHEDULE_FIELDS, f"{where}.schedule", E)
    pred = _predicted(s, _STAGE_PRED_FIELDS, where)
    tmpc = s.get("tmpc")
    if tmpc is not None:
        tmpc = {
            _string(k, f"{where}.tmpc key"): integer(v, f"{where}.tmpc[{k!r}]", E, minimum=0)
            for k, v in obj(tmpc, f"{where}.tmpc", E).items()
        }
    return Stage(
        id=sid,
        nodes=tuple(nodes),
        devices=tuple(integer(x, f"{where}.devices", E, minimum=0, maximum=MAX_COUNT) for x in devices),
        micro_batch_size=integer(
            require(s, "micro_batch_size", where, E),
            f"{where}.micro_batch_size",
            E,
            minimum=1,
            maximum=MAX_COUNT,
        ),
        schedule=Schedule(
            kind=_string(sched.get("kind", "custom"), f"{where}.schedule.kind"),
            k=integer(sched.get("k", 1), f"{where}.schedule.k", E, minimum=1, maximum=MAX_COUNT),
            order=_order(require(sched, "order", f"{where}.schedule", E), f"{where}.schedule"),
        ),
        in_flight_samples=integer(
            require(s, "in_flight_samples", where, E),
            f"{where}.in_flight_samples",
            E,
            minimum=0,
            maximum=MAX_COUNT,
        ),
        predicted=StagePrediction(**pred),
        tensor_parallel=integer(
            s.get("tensor_parallel", 1), f"{where}.tensor_parallel", E, minimum=1, maximum=MAX_COUNT
        ),
        tmpc=tmpc,
        recompute=_flag(s.get("recompute", False), f"{where}.recompute"),
        zero=_zero(s.get("zero", 0), f"{where}.zero"),
    )


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise E(f"{where} must be true or false, got {value!r}")
    return value


def _zero(value: Any, where: str) -> int:
    """A stage's ZeRO stage: 0 or 1 (2, sharded gradients, is not supported)."""
    if isinstance(value, bool) or value not in (0, 1):
        raise E(
            f"{where} must be 0 (no sharding) or 1 (optimizer state sharded over the stage's replicas), got "
            f"{value!r}" + (" (ZeRO-2, sharded gradients, is not supported)" if value == 2 else "")
        )
    return int(value)


def _edges(d: dict) -> list[tuple[int, int]]:
    """The plan document's stage ``edges``: ``[from, to]`` pairs of stage ids."""
    edges_raw = d.get("edges", [])
    if not isinstance(edges_raw, list):
        raise E("plan: edges must be a list of [from, to] stage pairs")
    edges = []
    for i, e in enumerate(edges_raw):
        if not (isinstance(e, list) and len(e) == 2):
            raise E(f"plan: edges[{i}] must be a [from, to] pair, got {e!r}")
        edges.append(
            (
                integer(e[0], f"plan: edges[{i}]", E, minimum=0, maximum=MAX_COUNT),
                integer(e[1], f"plan: edges[{i}]", E, minimum=0, maximum=MAX_COUNT),
            )
        )
    return edges


def plan_from_dict(d: Any) -> Plan:
    document(d, "plan", _PLAN_FIELDS, PLAN_FORMAT, E)
    extra(d, "plan", E)
    B = integer(require(d, "mini_batch_size", "plan", E), "plan: mini_batch_size", E, minimum=1, maximum=MAX_COUNT)
    stages_raw = require(d, "stages", "plan", E)
    if not isinstance(stages_raw, list) or not stages_raw:
        raise E("plan: stages must be a non-empty list")
    stages = [_stage(s, i) for i, s in enumerate(stages_raw)]
    edges = _edges(d)
    srch = obj(d.get("search", {}), "plan: search", E)
    osf = d.get("optimizer_state_factor")
    return Plan(
        planner=_string(d.get("planner", "unknown"), "plan: planner"),
        graph=_string(d.get("graph", ""), "plan: graph"),
        mini_batch_size=B,
        stages=tuple(stages),
        edges=tuple(edges),
        predicted=PlanPrediction(**_predicted(d, _PLAN_PRED_FIELDS, "plan")),
        search=_search(srch),
        optimizer_state_factor=None
        if osf is None
        else number(osf, "plan: optimizer_state_factor", E, maximum=MAX_FACTOR),
    )


def _json_safe(v: Any) -> Any:
    """The search record with non-finite floats as strings ("inf"): JSON has no such numbers."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_safe(x) for x in v]
    return v


def plan_to_dict(p: Plan) -> dict[str, Any]:
    stages = []
    for s in p.stages:
        sd: dict[str, Any] = {
            "id": s.id,
            "nodes": list(s.nodes),
            "devices": list(s.devices),
            "micro_batch_size": s.micro_batch_size,
            "schedule": {"kind": s.schedule.kind, "k": s.schedule.k, "order": [a.to_json() for a in s.schedule.order]},
            "in_flight_samples": s.in_flight_samples,
            "predicted": {"time_per_sample": s.predicted.time_per_sample, "memory_bytes": s.predicted.memory_bytes},
        }
        if s.tensor_parallel != 1:
            sd["tensor_parallel"] = s.tensor_parallel
        if s.tmpc:
            sd["tmpc"] = dict(s.tmpc)
        if s.recompute:
            sd["recompute"] = True
        if s.zero:
            sd["zero"] = s.zero
        stages.append(sd)
    search: dict[str, Any] = {"seconds": p.search.seconds, "status": p.search.status.value}
    if p.search.epsilon is not None:
        search["epsilon"] = p.search.epsilon
    for key in ("objective", "iteration_time_estimate", "micro_batch_size"):
        if getattr(p.search, key) is not None:
            search[key] = getattr(p.search, key)
    search.update(_json_safe(dict(p.search.extra)))
    if p.search.cp_tighten is not None:
        search["cp_tighten"] = _json_safe(p.search.cp_tighten)
    head: dict[str, Any] = {
        "format": PLAN_FORMAT,
        "planner": p.planner,
        "graph": p.graph,
        "mini_batch_size": p.mini_batch_size,
    }
    if p.optimizer_state_factor is not None:
        head["optimizer_state_factor"] = p.optimizer_state_factor
    return {
        **head,
        "stages": stages,
        "edges": [list(e) for e in p.edges],
        "predicted": {
            "time_per_sample": p.predicted.time_per_sample,
            "iteration_time": p.predicted.iteration_time,
            "throughput": p.predicted.throughput,
            "peak_memory_bytes": p.predicted.peak_memory_bytes,
        },
        "search": search,
    }


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(read_json(path, "plan", E))


def save_plan(p: Plan, path: str | Path) -> None:
    write_json(plan_to_dict(p), path)
