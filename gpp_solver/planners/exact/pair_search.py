"""One (partition, ``b``) pair of the exact search (:mod:`.search`): its lower-bound tables and the
depth-first search over its stages' degrees.

Stages are assigned in topological order, so a stage's ``head`` (the longest forward path above
it) and ``tail`` (what the stages above it still run after its last backward: their last backward
and all-reduce) are known exactly from its assigned predecessors; a branch is cut by the bound
``head + n (F + B) + max(A, tail)``, by the devices the remaining stages need at least, and by
memory.  Every surviving leaf is priced by the cost model
(``cost.stage_costs``) and simulated with Algorithm 2's in-flight counts and kFkB orders.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import DeadlockError
from gpp_solver.plan.build import StageSpec
from gpp_solver.plan.schedule import kfkb_order, schedule_stage_graph, warmup_micro_batches
from gpp_solver.plan.simulate import simulate_orders, sums_in_backwards
from gpp_solver.planners.milp.space import contiguous_ranges
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    """One point of the space: stage node sets in placement order, ``b``, per-stage degrees."""

    stages: tuple[tuple[str, ...], ...]
    micro_batch_size: int
    devices: tuple[int, ...]

    def specs(self) -> list[StageSpec]:
        return [
            StageSpec(nodes=p, devices=r, micro_batch_size=self.micro_batch_size, k=1)
            for p, r in zip(self.stages, contiguous_ranges(self.devices))
        ]


@dataclass(frozen=True)
class PairBounds:
    """Per (partition, b) lower-bound tables for degree ``opts[i]`` of stage ``s``: ``work[s][i]`` =
    ``n (F + B)``, ``ar[s][i]`` = ``A``, ``fwd`` / ``bwd`` one forward / backward; ``mem`` exact."""

    part: int
    b: int
    opts: tuple[int, ...]
    work: list[list[float]]
    ar: list[list[float]]
    fwd: list[list[float]]
    bwd: list[list[float]]
    mem: list[list[float]]
    bound: float


def search_pair(
    graph: Graph,
    cluster: Cluster,
    B: int,
    q: PairBounds,
    part: tuple[tuple[str, ...], ...],
    structure: tuple,
    usable: int,
    limit: float,
    state: dict,
    tick,
) -> None:
    """Depth-first search over the stages' degrees of one (partition, b) pair."""
    edges, succ = structure
    k, b, n = len(part), q.b, B // q.b
    preds: list[list[int]] = [[] for _ in range(k)]
    for a, c in edges:
        preds[c].append(a)
    bsz = {s: b for s in range(k)}
    orders: dict[int, tuple[tuple[str, int], ...]] = {}  # Algorithm 2 + kFkB, as build_plan, on first use
    choices = []
    for s in range(k):
        js = [j for j in range(len(q.opts)) if q.mem[s][j] <= limit]
        choices.append(sorted(js, key=lambda j: (q.work[s][j] + q.ar[s][j], q.opts[j])))
    need_after = [0] * (k + 1)  # devices the stages s.. need at least
    for s in reversed(range(k)):
        need_after[s] = need_after[s + 1] + min(q.opts[j] for j in choices[s])
    pick = [0] * k
    head, tail = [0.0] * k, [0.0] * k

    def leaf() -> None:
        counts = tuple(q.opts[j] for j in pick)
        cand = Candidate(part, b, counts)
        costs = stage_costs(graph, cluster, cand.specs(), B)
        if max(n * (c.forward + c.backward) + c.tail for c in costs) >= state["time"]:
            return
        state["simulated"] += 1
        if not orders:
            inflight = schedule_stage_graph({s: succ[s] for s in range(k)}, bsz)
            orders.update({s: kfkb_order(n, warmup_micro_batches(inflight[s][1], b, n)) for s in range(k)})
        tails, sums = sums_in_backwards(costs, B)  # the gradient sums inside the backwards, as build_plan
        try:
            makespan, _ = simulate_orders(
                orders,
                bsz,
                {s: c.forward for s, c in enumerate(costs)},
                {s: c.backward for s, c in enumerate(costs)},
                dict(enumerate(tails)),
                edges,
                B,
                accumulate=dict(enumerate(sums)),
            )
        except DeadlockError:  # not expected for uniform b and k = 1; such a plan leaves the space
            logger.debug("exact: 1F1B orders deadlock for %s", cand)
            return
        if makespan < state["time"]:
            state["best"], state["time"] = cand, makespan

    def rec(s: int, used: int, bound: float) -> None:
        tick()
        if s == k:
            leaf()
            return
        h = max((head[p] + q.fwd[p][pick[p]] for p in preds[s]), default=0.0)
        t = max((q.bwd[p][pick[p]] + max(q.ar[p][pick[p]], tail[p]) for p in preds[s]), default=0.0)
        for j in choices[s]:
            d = q.opts[j]
            if used + d + need_after[s + 1] > usable:
                continue
            bnd = max(bound, h + q.work[s][j] + max(q.ar[s][j], t))
            if bnd >= state["time"]:
                continue
            pick[s], head[s], tail[s] = j, h, t
            rec(s + 1, used + d, bnd)

    rec(0, 0, 0.0)
