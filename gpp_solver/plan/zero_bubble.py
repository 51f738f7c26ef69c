"""Weight-gradient placement: stage orders with ``W`` actions (split backward, zero bubble).

A stage's backward splits into ``B`` (the input gradient, which its predecessors wait for) and ``W``
(the weight gradient, which nothing but the stage itself waits for), as Zero Bubble Pipeline
Parallelism (Qi et al., ICLR 2024) does for chains; here for any stage DAG (``docs/zero-bubble.md``).

Every order this module makes keeps each stage's in-flight micro-batches (forwards done minus
weight gradients done, the memory rule of an order with ``W``) at most ``cap[S]``: the peak of the
stage's 1F1B (kFkB) order, or (``Durations.memory_cap``, ZB-H1's rule) the most the stage may hold
without its memory, the gradients ``B`` keeps for the pending ``W`` included, exceeding the largest
stage memory of the kFkB orders.  With ``Durations.fits`` (the memory of a stage's order within
that limit), a stage whose order with ``W`` right after each ``B`` does not fit keeps its kFkB
order, and a candidate with a stage that does not fit is dropped: the plan's peak memory does not
grow.  Candidates:

* **eager** — the kFkB order with ``W j`` right after ``B j``: without the graph's
  ``split_backward_overhead``, never slower than the kFkB order (the simulated start of every
  action is a max-plus expression of the durations and a ``B`` only gets shorter, so no start
  moves later), and it holds the same activations;
* **deferred** — the kFkB order of ``F`` and ``B`` with each ``W`` put off until a forward needs its
  memory, the rest in the cool-down;
* **lagged** — the kFkB order with ``W j - L`` right after ``B j``, ``L`` the micro-batches ZB-H1's
  rule adds to the stage's own peak (the paper's handcrafted ZB-H1 on a chain);
* **greedy** — a list schedule in simulated time: whenever a stage is free it runs, by priority, a
  ready ``B`` (the critical path), a ready ``F`` within ``cap``, else a pending ``W`` (filling the wait);
  and the same with ``F`` before ``B``.

:func:`zero_bubble_orders` simulates all of them and returns the fastest (the eager one on ties).
Stages whose weight-gradient time is zero keep their order without ``W``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gpp_solver.action import Action, Kind
from gpp_solver.cost.memory import order_memory, stage_memory
from gpp_solver.cost.model import StageLike, in_flight_from_order
from gpp_solver.errors import DeadlockError, InvalidInputError, show
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.types import Cluster, Graph, Plan

Orders = Mapping[int, Sequence[Action]]
SCHEDULES = ("1f1b", "zb", "auto")
ZB_KIND = "ZB-H1"  # schedule.kind of the orders with W actions this module makes
INF = math.inf


@dataclass(frozen=True)
class Durations:
    """Per stage: micro-batch size, forward, whole backward, its weight-gradient part, all-reduce."""

    micro_batch: Mapping[int, int]
    forward: Mapping[int, float]
    backward: Mapping[int, float]
    weight: Mapping[int, float]
    allreduce: Mapping[int, float]  # the tail after the last backward: A(S) + O(S)
    edges: tuple[tuple[int, int], ...]
    #: per stage, the most micro-batches it may hold without its memory exceeding the largest stage
    #: memory of the kFkB orders (ZB-H1's rule: the pipeline's peak memory does not grow); absent: its own peak
    memory_cap: Mapping[int, int] | None = None
    #: whether stage ``s``'s memory under an order with ``W`` stays within the limit (the kept
    #: gradients included); absent: every order fits
    fits: Callable[[int, Sequence[Action]], bool] | None = None
    #: per stage, one gradient sum, run inside each weight-gradient action after the first
    #: (``accumulate`` of :func:`simulate_orders`; then ``allreduce`` leaves the sums out)
    accumulate: Mapping[int, float] | None = None
    #: per stage, the duration of ``B`` in an order with ``W`` (``split_input`` of
    #: :func:`simulate_orders`; absent: ``backward - weight``)
    split_input: Mapping[int, float] | None = None

    def input_gradient(self, s: int) -> float:
        """Duration of stage ``s``'s ``B`` in an order with ``W``."""
        if self.split_input is not None and s in self.split_input:
            return self.split_input[s]
        return self.backward[s] - self.weight.get(s, 0.0)

    def makespan(self, orders: Orders) -> float:
        return simulate_orders(
            orders,
            self.micro_batch,
            self.forward,
            self.backward,
            self.allreduce,
            self.edges,
            0,
            record=False,
            weight=self.weight,
            accumulate=self.accumulate,
            split_input=self.split_input,
        )[0]


#: The greedy list schedules are tried only up to this many actions in the plan (F and B, before W are
#: added): they cost about a second each at 6,000 actions on 194 stages; eager, deferred and lagged
#: placements are always tried.
GREEDY_MAX_ACTIONS = 2048


def eager_w(order: Sequence[Action]) -> tuple[Action, ...]:
    """``order`` with ``W j`` right after every ``B j``."""
    out: list[Action] = []
    for a in order:
        out.append(a)
        if a.kind == Kind.B:
            out.append(Action(Kind.W, a.micro_batch))
    return tuple(out)


def deferred_w(order: Sequence[Action], cap: int) -> tuple[Action, ...]:
    """``order``'s ``F``/``B`` sequence with each ``W`` as late as a forward's memory allows
    (at most ``cap`` micro-batches between their ``F`` and ``W``), the rest at the end."""
    out: list[Action] = []
    f_done = w_done = b_done = 0
    for a in order:
        if a.kind == Kind.F:
            while f_done - w_done >= cap and w_done < b_done:
                out.append(Action(Kind.W, w_done))
                w_done += 1
            f_done += 1
        elif a.kind == Kind.B:
            b_done += 1
        out.append(a)
    out.extend(Action(Kind.W, j) for j in range(w_done, b_done))
    return tuple(out)


def lagged_w(order: Sequence[Action], lag: int) -> tuple[Action, ...]:
    """``order`` with ``W j - lag`` right after every ``B j`` and the last ``lag`` ``W`` at the end
    (the paper's handcrafted ZB-H1 for a chain: stage ``i`` of ``p`` lags by ``i``)."""
    out: list[Action] = []
    nw = nb = 0
    for a in order:
        out.append(a)
        if a.kind == Kind.B:
            nb += 1
            if nb > lag:
                out.append(Action(Kind.W, nw))
                nw += 1
    out.extend(Action(Kind.W, j) for j in range(nw, nb))
    return tuple(out)


def _covering(j: int, b_self: int, b_other: int) -> range:
    return range((j * b_self) // b_other, ((j + 1) * b_self - 1) // b_other + 1)


def _neighbours(stages: Sequence[int], edges: Sequence[tuple[int, int]]) -> tuple[dict[int, list[int]], ...]:
    """``(preds, succs)``: each stage's predecessor and successor stages along ``edges``."""
    preds: dict[int, list[int]] = {s: [] for s in stages}
    succs: dict[int, list[int]] = {s: [] for s in stages}
    for a, b in edges:
        succs[a].append(b)
        preds[b].append(a)
    return preds, succs


def greedy_w(
    d: Durations, n: Mapping[int, int], cap: Mapping[int, int], split: Mapping[int, bool], b_first: bool = True
) -> dict[int, tuple[Action, ...]]:
    """The list schedule of the module docstring: the stage that can act earliest acts next (ties:
    lower id); at that time it runs a ready ``B`` (``b_first``) or ``F`` within ``cap``, then the
    other, else its oldest pending ``W``.  A stage without ``split`` runs each ``W`` with its ``B``."""
    return _ListSchedule(d, n, cap, split).run(b_first)


class _ListSchedule:
    """:func:`greedy_w`'s state: what each stage has run and when it is free; the stages' earliest
    next actions in a heap (stale entries skipped), so each step costs the stages it touches."""

    def __init__(self, d: Durations, n: Mapping[int, int], cap: Mapping[int, int], split: Mapping[int, bool]):
        self.stages = sorted(n)
        preds, succs = _neighbours(self.stages, d.edges)
        self.n, self.cap = n, cap
        self.fin: dict[tuple[int, str], dict[int, float]] = {(s, k): {} for s in self.stages for k in "FB"}
        mb = d.micro_batch
        # per stage and kind: (finish times of the neighbour, micro-batch sizes when they differ)
        self.deps = {
            (s, k): [(self.fin[(p, k)], None if mb[s] == mb[p] else (mb[s], mb[p])) for p in ps]
            for s in self.stages
            for k, ps in (("F", preds[s]), ("B", succs[s]))
        }
        self.touch = {s: (s, *preds[s], *succs[s]) for s in self.stages}
        self.nf = dict.fromkeys(self.stages, 0)
        self.nb = dict.fromkeys(self.stages, 0)
        self.nw = dict.fromkeys(self.stages, 0)
        self.free = dict.fromkeys(self.stages, 0.0)
        self.split = split
        self.w_len = {s: d.weight.get(s, 0.0) if split[s] else 0.0 for s in self.stages}
        self.b_len = {s: d.input_gradient(s) if split[s] else d.backward[s] for s in self.stages}
        self.f_len = d.forward

    def ready(self, s: int, kind: str, j: int) -> float:
        t = self.free[s] if kind == "F" else max(self.free[s], self.fin[(s, "F")][j])
        for got, sizes in self.deps[(s, kind)]:
            for q in (j,) if sizes is None else _covering(j, *sizes):
                v = got.get(q)
                if v is None:
                    return INF
                if v > t:
                    t = v
        return t

    def options(self, s: int) -> tuple[float, float, float]:
        """Earliest start of the next B, F, W of stage s (INF: not possible yet)."""
        nf, nb, nw = self.nf[s], self.nb[s], self.nw[s]
        tb = self.ready(s, "B", nb) if nb < nf else INF
        tf = self.ready(s, "F", nf) if nf < self.n[s] and nf - nw < self.cap[s] else INF
        tw = self.free[s] if nw < nb else INF
        return tb, tf, tw

    def run(self, b_first: bool) -> dict[int, tuple[Action, ...]]:
        stages, split = self.stages, self.split
        rank = {s: i for i, s in enumerate(stages)}
        cache = {s: self.options(s) for s in stages}
        heap = [(min(cache[s]), rank[s], s) for s in stages]
        heapq.heapify(heap)
        out: dict[int, list[Action]] = {s: [] for s in stages}
        total = sum(3 * self.n[s] if split[s] else 2 * self.n[s] for s in stages)
        for _ in range(total):
            while heap and heap[0][0] != min(cache[heap[0][2]]):  # a stale entry
                heapq.heappop(heap)
            if not heap or heap[0][0] == INF:
                raise DeadlockError("zero-bubble placement found no stage able to act")
            now, _, s = heap[0]
            tb, tf, _ = cache[s]
            first, second = (("B", tb), ("F", tf)) if b_first else (("F", tf), ("B", tb))
            kind = first[0] if first[1] <= now else second[0] if second[1] <= now else "W"
            self.free[s] = self._act(s, kind, now, out[s])
            for x in self.touch[s]:
                old = min(cache[x])
                cache[x] = self.options(x)
                if min(cache[x]) != old or x == s:
                    heapq.heappush(heap, (min(cache[x]), rank[x], x))
        return {s: tuple(o) for s, o in out.items()}

    def _act(self, s: int, kind: str, now: float, out: list[Action]) -> float:
        """Run stage ``s``'s next ``kind`` at ``now``; when it ends."""
        if kind == "F":
            j = self.nf[s]
            end = now + self.f_len[s]
            self.fin[(s, "F")][j] = end
            self.nf[s] += 1
            out.append(Action(Kind.F, j))
        elif kind == "B":
            j = self.nb[s]
            end = now + self.b_len[s]
            self.fin[(s, "B")][j] = end
            self.nb[s] += 1
            out.append(Action(Kind.B, j))
            if not self.split[s]:  # the whole backward: its W is part of it
                self.nw[s] += 1
                end += self.w_len[s]
        else:
            j = self.nw[s]
            end = now + self.w_len[s]
            self.nw[s] += 1
            out.append(Action(Kind.W, j))
        return end


def zero_bubble_orders(orders: Orders, d: Durations) -> tuple[dict[int, tuple[Action, ...]], float]:
    """The fastest ``W`` placement for the kFkB ``orders`` (module docstring) and its makespan.

    Stages with a weight-gradient time of zero keep their orders; the others' in-flight peak stays
    that of their given order."""
    n = {s: sum(1 for a in o if a[0] == "F") for s, o in orders.items()}
    cap = {s: max(1, in_flight_from_order(o, 1)) for s, o in orders.items()}
    fits = d.fits or (lambda s, o: True)
    split = {s: d.weight.get(s, 0.0) > 0 and fits(s, eager_w(o)) for s, o in orders.items()}
    eager = {s: eager_w(o) if split[s] else tuple(o) for s, o in orders.items()}
    best, best_t = eager, d.makespan(eager)
    cands = [{s: deferred_w(o, cap[s]) if split[s] else tuple(o) for s, o in orders.items()}]
    caps = [cap]
    if d.memory_cap is not None:
        wide = {s: max(cap[s], min(n[s], d.memory_cap.get(s, cap[s]))) for s in orders}
        if wide != cap:
            caps.append(wide)
    if len(caps) > 1:
        cands.append({s: lagged_w(o, caps[1][s] - cap[s]) if split[s] else tuple(o) for s, o in orders.items()})
    actions = sum(len(o) for o in orders.values())
    for c in caps if actions <= GREEDY_MAX_ACTIONS else ():  # the list schedule's cost grows with actions x stages
        for b_first in (True, False):
            try:
                cands.append(greedy_w(d, n, c, split, b_first))
            except DeadlockError:  # pragma: no cover - the precedences are acyclic (docs/zero-bubble.md)
                continue
    for c in cands:
        if not all(fits(s, o) for s, o in c.items() if split[s]):
            continue
        try:
            t = d.makespan(c)
        except DeadlockError:
            continue
        if t < best_t:
            best, best_t = c, t
    return dict(best), best_t


def check_schedule(schedule: object) -> str:
    """``schedule`` itself when it is one of :data:`SCHEDULES`, else :class:`InvalidInputError`."""
    if schedule not in SCHEDULES:
        raise InvalidInputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {show(schedule)}")
    return schedule  # type: ignore[return-value]


def schedule_record(requested: str, chosen: str, t_1f1b: float | None, t_zb: float | None) -> dict[str, object]:
    """What a plan's ``search.extra["schedule"]`` says: the schedule asked for, the one its orders
    use (``"zb"``: they hold ``W`` actions), and the simulated iteration time of the partition under
    each (seconds)."""
    return {"requested": requested, "chosen": chosen, "iteration_time_1f1b": t_1f1b, "iteration_time_zb": t_zb}


def apply_schedule(
    schedule: str,
    orders: Orders,
    makespan: float,
    kind: str,
    d: Durations,
) -> tuple[dict[int, tuple[Action, ...]], float, str, dict[str, object]]:
    """``(orders, makespan, schedule kind, record)`` for ``schedule`` ``"zb"`` or ``"auto"`` from the
    kFkB ``orders`` of ``kind`` and their ``makespan``: ``zb`` takes the W placement whenever a stage
    has a weight gradient to split off, ``auto`` only when it is strictly faster."""
    zb, t_zb = zero_bubble_orders(orders, d)
    has_w = any(a[0] == "W" for o in zb.values() for a in o)
    take = has_w and (schedule == "zb" or t_zb < makespan * (1 - 1e-12))
    record = schedule_record(schedule, "zb" if take else "1f1b", makespan, t_zb)
    if not take:
        return dict(orders), makespan, kind, record
    return zb, t_zb, ZB_KIND, record


def final_record(plan: Plan, requested: str) -> dict[str, object]:
    """The ``search.extra["schedule"]`` of a finished plan: the record ``build_plan`` left on it
    (the partition's iteration time under each schedule) with ``chosen`` and ``iteration_time``
    read from the plan itself (a later step such as CP-SAT may have changed its orders)."""
    old = plan.search.extra.get("schedule") or {}
    chosen = "zb" if any(a[0] == "W" for s in plan.stages for a in s.schedule.order) else "1f1b"
    return {
        **schedule_record(requested, chosen, old.get("iteration_time_1f1b"), old.get("iteration_time_zb")),
        "iteration_time": plan.predicted.iteration_time,
    }


def _memory_limit(
    graph: Graph, cluster: Cluster, specs: Sequence[StageLike], orders: Orders
) -> tuple[dict[int, float], float]:
    """Each stage's memory under ``orders`` and the limit of the W placement: the largest of them,
    at most the cluster's memory."""
    mem = {i: order_memory(graph, cluster, s, orders[i], specs) for i, s in enumerate(specs)}
    return mem, min(max(mem.values()), cluster.memory_bytes) * (1 + 1e-12)


def memory_caps(
    graph: Graph, cluster: Cluster, specs: Sequence[StageLike], orders: Orders, mini_batch_size: int
) -> dict[int, int]:
    """Per stage ``i`` (``specs[i]``, ``orders[i]``): the most micro-batches ``K`` it may hold with
    its memory at most the largest stage memory of ``orders`` and within the cluster's memory, its
    pending weight gradients counted at their bound ``K`` (at least its own peak under ``orders``)."""
    _, limit = _memory_limit(graph, cluster, specs, orders)
    out = {}
    for i, s in enumerate(specs):
        n = mini_batch_size // s.micro_batch_size

        def mem(k: int, s: StageLike = s) -> float:
            return stage_memory(graph, cluster, s, k * s.micro_batch_size, specs, k * s.micro_batch_size)

        base = mem(0)
        per = mem(1) - base
        k = n if per <= 0 else int(min(n, max(0.0, (limit - base) / per)))
        while k > 0 and mem(k) > limit:
            k -= 1
        out[i] = max(k, in_flight_from_order(orders[i], 1))
    return out


def memory_fits(
    graph: Graph, cluster: Cluster, specs: Sequence[StageLike], orders: Orders
) -> Callable[[int, Sequence[Action]], bool]:
    """``Durations.fits``: whether stage ``i``'s memory under an order (its kept gradients
    included) is at most the largest stage memory of the kFkB ``orders`` and the cluster's."""
    _, limit = _memory_limit(graph, cluster, specs, orders)

    def fits(i: int, order: Sequence[Action]) -> bool:
        return order_memory(graph, cluster, specs[i], order, specs) <= limit

    return fits
