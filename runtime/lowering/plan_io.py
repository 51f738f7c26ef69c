"""Read a ``gpp-plan/1`` JSON document into frozen records, with the checks the runtime needs.

Only the fields the runtime uses are read (``mini_batch_size``, ``stages[].id/nodes/devices/
micro_batch_size/schedule.order/predicted``, ``edges``); the planner's own validator checks the
rest (memory, convexity against the graph). The document is also read by ``gpp_solver``'s own
plan reader, so unknown fields, wrong types and out-of-range numbers are refused exactly as
``gpp validate`` refuses them (the file itself through ``gpp_solver.formats.jsonio``). Every error is an ``InvalidPlanError`` whose message
names the stage and the field.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from gpp_solver.cost.model import in_flight_from_order
from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.jsonio import read_json
from gpp_solver.formats.plan_json import plan_from_dict


@dataclass(frozen=True)
class StagePlan:
    """One stage: its node ids, ranks (data-parallel replicas), micro-batch size and order."""

    id: int
    nodes: tuple[str, ...]
    devices: tuple[int, ...]
    micro_batch_size: int
    order: tuple[tuple[str, int], ...]
    predicted_time_per_sample: float | None = None

    @property
    def dp(self) -> int:
        return len(self.devices)

    @property
    def replica_batch(self) -> int:
        """Samples one replica computes per micro-batch."""
        return self.micro_batch_size // len(self.devices)


@dataclass(frozen=True)
class Plan:
    """The runtime's view of a plan."""

    mini_batch_size: int
    stages: tuple[StagePlan, ...]
    edges: tuple[tuple[int, int], ...]
    raw: dict = field(compare=False, repr=False, default_factory=dict)
    #: the same document as ``gpp_solver`` reads it (``in_flight_samples`` filled from the order where
    #: a hand-written plan leaves it out): what the runtime validates
    solver: object = field(default=None, compare=False, repr=False)

    def stage(self, sid: int) -> StagePlan:
        return next(s for s in self.stages if s.id == sid)

    def stage_of_rank(self, rank: int) -> StagePlan:
        for s in self.stages:
            if rank in s.devices:
                return s
        raise InvalidPlanError(f"no stage of the plan lists device {rank} in `devices`")

    @property
    def world_size(self) -> int:
        return sum(len(s.devices) for s in self.stages)


def _int(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidPlanError(f"{what} must be an integer >= {minimum}, but got {value!r}")
    return value


def parse_plan(doc: dict) -> Plan:
    """Check and convert a plan document (already parsed JSON)."""
    if not isinstance(doc, dict) or doc.get("format") != "gpp-plan/1":
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise InvalidPlanError(f'plan `format` must be "gpp-plan/1", but got {got!r}')
    big_b = _int(doc.get("mini_batch_size"), "`mini_batch_size`", 1)
    raw_stages = doc.get("stages")
    if not isinstance(raw_stages, list) or not raw_stages:
        raise InvalidPlanError("plan `stages` must be a non-empty list")
    stages = []
    for i, st in enumerate(raw_stages):
        stages.append(_parse_stage(st, i, big_b))
    ids = [s.id for s in stages]
    if len(set(ids)) != len(ids):
        raise InvalidPlanError(f"stage ids must be unique, but got {ids}")
    seen_dev: dict[int, int] = {}
    seen_node: dict[str, int] = {}
    for s in stages:
        for dv in s.devices:
            if dv in seen_dev:
                raise InvalidPlanError(f"device {dv} is listed by stages {seen_dev[dv]} and {s.id}")
            seen_dev[dv] = s.id
        for n in s.nodes:
            if n in seen_node:
                raise InvalidPlanError(f"node {n!r} is listed by stages {seen_node[n]} and {s.id}")
            seen_node[n] = s.id
    if sorted(seen_dev) != list(range(len(seen_dev))):
        raise InvalidPlanError(f"stage devices must be 0..{len(seen_dev) - 1}, but got {sorted(seen_dev)}")
    edges = []
    for e in doc.get("edges", []):
        if (not isinstance(e, (list, tuple)) or len(e) != 2 or e[0] not in ids or e[1] not in ids
                or e[0] == e[1]):
            raise InvalidPlanError(f"plan edge {e!r} must be [from stage id, to stage id] of two stages")
        edges.append((int(e[0]), int(e[1])))
    return Plan(mini_batch_size=big_b, stages=tuple(stages), edges=tuple(edges), raw=doc,
                solver=_solver_plan(doc, stages))


def _solver_plan(doc: dict, stages: list[StagePlan]):
    """The gpp-plan/1 contract exactly as ``gpp_solver`` reads it (unknown fields, types, ranges):
    one reader for both sides. A hand-written plan may leave ``in_flight_samples`` out; the peak
    of its own order is used (as the validator computes it)."""
    filled = copy.deepcopy(doc)
    for raw, st in zip(filled["stages"], stages):
        raw.setdefault("in_flight_samples", in_flight_from_order(st.order, st.micro_batch_size))
    return plan_from_dict(filled)


def _parse_stage(st: dict, index: int, big_b: int) -> StagePlan:
    where = f"stages[{index}]"
    if not isinstance(st, dict):
        raise InvalidPlanError(f"{where} must be an object")
    sid = _int(st.get("id", index), f"{where}.id")
    nodes = st.get("nodes")
    if not isinstance(nodes, list) or not nodes or not all(isinstance(n, str) for n in nodes):
        raise InvalidPlanError(f"{where}.nodes must be a non-empty list of node ids")
    devices = st.get("devices")
    if not isinstance(devices, list) or not devices:
        raise InvalidPlanError(f"{where}.devices must be a non-empty list of device indices")
    devices = [_int(d, f"{where}.devices[]") for d in devices]
    b = _int(st.get("micro_batch_size"), f"{where}.micro_batch_size", 1)
    t = st.get("tensor_parallel", 1)
    if t != 1:
        raise InvalidPlanError(f"{where}.tensor_parallel = {t!r}: the runtime supports only 1")
    d = len(devices)
    if big_b % b != 0:
        raise InvalidPlanError(f"`B % b == 0` must hold, but got (B={big_b}, b={b}) in stage {sid}")
    if b % d != 0:
        raise InvalidPlanError(f"`b % d == 0` must hold, but got (b={b}, d={d}) in stage {sid}")
    order = _parse_order(st.get("schedule", {}).get("order") if isinstance(st.get("schedule"), dict)
                         else None, sid, big_b // b)
    pred = st.get("predicted") or {}
    tps = pred.get("time_per_sample") if isinstance(pred, dict) else None
    return StagePlan(id=sid, nodes=tuple(nodes), devices=tuple(devices), micro_batch_size=b,
                     order=order, predicted_time_per_sample=float(tps) if tps is not None else None)


def _parse_order(order, sid: int, n: int) -> tuple[tuple[str, int], ...]:
    """Check C4: every F j and B j once for j < n; F j before F j+1, B j before B j+1, F j before B j."""
    if not isinstance(order, list):
        raise InvalidPlanError(f"stage {sid}: schedule.order must be a list of [\"F\"|\"B\", j]")
    out = []
    next_f = next_b = 0
    for item in order:
        if (not isinstance(item, (list, tuple)) or len(item) != 2 or item[0] not in ("F", "B")
                or isinstance(item[1], bool) or not isinstance(item[1], int)):
            raise InvalidPlanError(f"stage {sid}: schedule.order item {item!r} must be [\"F\"|\"B\", j]")
        kind, j = item[0], item[1]
        if kind == "F":
            if j != next_f:
                raise InvalidPlanError(f"stage {sid}: order has F{j} where F{next_f} must come next (C4)")
            next_f += 1
        else:
            if j != next_b:
                raise InvalidPlanError(f"stage {sid}: order has B{j} where B{next_b} must come next (C4)")
            if j >= next_f:
                raise InvalidPlanError(f"stage {sid}: order has B{j} before F{j} (C4)")
            next_b += 1
        out.append((kind, j))
    if next_f != n or next_b != n:
        raise InvalidPlanError(
            f"stage {sid}: order must hold F and B of all {n} micro-batches (B / b), "
            f"but has {next_f} F and {next_b} B")
    return tuple(out)


def load_plan(path: str) -> Plan:
    """Read and check a plan JSON file (JSON only, never pickle)."""
    return parse_plan(read_json(path, "plan", InvalidPlanError))
