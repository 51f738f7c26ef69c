"""``plan_gpp``'s candidate plans (:class:`Pool`): seed plans, and search states built into plans
lazily under an iteration-time lower bound."""

from __future__ import annotations

from typing import Any

from gpp_solver.planners.gpp.partition_eval import Eval, Problem, State
from gpp_solver.planners.gpp.plans import build_from_state, iteration_time_lower_bound, uniform_micro_batch
from gpp_solver.types import Plan, SearchInfo, Status

LAZY_BOUND_SLACK = 1e-6  # a lazy candidate's bound B * TPS, lowered by this share (float rounding)


class Pool:
    """The candidate plans, in the order found (the pick takes the first of equal scores).

    With ``lazy`` (objective ``iteration_time``) a search state becomes a plan (``build_from_state``:
    kFkB orders and a simulation, most of a search's cost on long pipelines) only when it may
    matter: every stage runs its ``n`` forwards and backwards one after another and then its
    all-reduce, so the simulated iteration time is at least ``n (F + B) + A = B * TPS`` of its
    slowest stage.  A state whose bound exceeds the best built plan's iteration time can never be
    picked nor tie, so it is never built; every answer (best plan, best own plan, best score) is
    the one the eager pool gives, bit for bit."""

    def __init__(self, score: Any, lazy: bool, schedule: str = "1f1b") -> None:
        self.score, self.lazy, self.schedule = score, lazy, schedule
        self.items: list[list[Any]] = []  # [plan or None, meta, (P, state, ev) or None, bound]
        self.built = 0

    def __len__(self) -> int:
        return len(self.items)

    def add(self, plan: Plan, meta: dict[str, Any]) -> None:
        self.items.append([plan, meta, None, None])

    def add_state(self, P: Problem, state: State, ev: Eval, meta: dict[str, Any]) -> Plan | None:
        """A search state as a candidate: its plan, built now (``None`` when ``lazy``: built when it may matter)."""
        if not self.lazy:
            item = [None, meta, (P, state, ev), None]
            self._build(item)
        else:
            item = [
                None,
                meta,
                (P, state, ev),
                iteration_time_lower_bound(P, state, ev, split=self.schedule != "1f1b") * (1 - LAZY_BOUND_SLACK),
            ]
        self.items.append(item)
        return item[0]

    def _build(self, item: list[Any]) -> Plan:
        if item[0] is None:
            P, state, ev = item[2]
            item[0] = build_from_state(P, state, ev, SearchInfo(0.0, Status.FEASIBLE), self.schedule)
            self.built += 1
        return item[0]

    def _resolve(self, items: list[list[Any]]) -> None:
        """Build the unbuilt ``items`` whose bound does not exceed the best built one's iteration time."""
        while True:
            best = min((it[0].predicted.iteration_time for it in items if it[0] is not None), default=float("inf"))
            todo = [it for it in items if it[0] is None and it[3] <= best]
            if not todo:
                return
            self._build(min(todo, key=lambda it: it[3]))

    def best(self, own: bool = False) -> tuple[Plan, dict[str, Any]] | None:
        """The first candidate of least score (``own``: among gpp's own plans of one micro-batch size)."""
        items = self.items
        if own:
            items = [
                it
                for it in items
                if it[0] is None or (it[0].planner == "gpp" and uniform_micro_batch(it[0]) is not None)
            ]
        self._resolve(items)
        built = [it for it in items if it[0] is not None]
        if not built:
            return None
        it = min(built, key=lambda it: self.score(it[0]))
        return it[0], it[1]

    def best_iteration_time(self) -> float:
        """The least iteration time of any candidate (``inf``: none)."""
        self._resolve(self.items)
        return min((it[0].predicted.iteration_time for it in self.items if it[0] is not None), default=float("inf"))
