"""Exact, fast pricing of a partition state for the ``gpp`` planner's local search.

A *state* is a partition of the graph's nodes into stages (``assign[u]`` = stage label) and a
data-parallel degree per stage (``devs[label]``, ``b % d == 0``, ``sum(devs) <= devices``), with
one micro-batch size ``b`` for every stage and 1F1B (``k = 1``).  :meth:`Problem.evaluate` prices
a state exactly as ``plan_build.build_plan`` + ``cost.stage_costs`` would (tested against them):

* validity: the quotient (stage) graph is acyclic — which also makes every stage convex (a path
  leaving a stage and re-entering it is a cycle of the quotient);
* memory: Algorithm 2 with uniform ``b`` and ``k = 1`` gives ``depth * b`` in-flight samples
  (``depth`` = 1 + longest path to a sink stage); the kFkB order caps it at ``n = B / b``
  micro-batches, so ``M(S) = osf * W_S + min(depth, n) * b / d * Act_S``;
* time: ``TPS(S) = (C(S) + comm(S)) / b + A(S) / B`` with the cost model's transfers and
  bandwidths, under a device placement chosen by the evaluator (contiguous ranges in the stage
  graph's topological order, or largest degree first — whichever gives the smaller key).

The key is ``(memory excess, bottleneck-first sorted TPS vector, iteration-time estimate)``,
quantised (1e-9 of the perfect-balance TPS) so float noise never counts as an improvement.
"""


from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass
from typing import Iterator, Sequence

from .cost import CostTables
from .types import Cluster, Graph

logger = logging.getLogger(__name__)

MEM_REL_TOL = 5e-10      # stricter than the validator's 1e-9, so float order never flips a verdict


@dataclass(frozen=True)
class State:
    assign: tuple[int, ...]     # node index (graph order) -> stage label 0..k-1
    devs: tuple[int, ...]       # stage label -> data-parallel degree


@dataclass(frozen=True)
class Eval:
    key: tuple
    tps: tuple[float, ...]      # per stage label
    memory: tuple[float, ...]   # per stage label, bytes per device
    order: tuple[int, ...]      # topological order of the stage labels
    offsets: tuple[int, ...]    # first device of each stage label
    estimate: float             # iteration-time estimate of the cost model

    @property
    def max_tps(self) -> float:
        return max(self.tps)


class Problem:
    """Everything the evaluator needs for one graph, cluster, ``B`` and ``b``."""

    def __init__(self, graph: Graph, cluster: Cluster, mini_batch_size: int, b: int,
                 tables: CostTables | None = None) -> None:
        self.graph, self.cluster, self.B, self.b = graph, cluster, mini_batch_size, b
        self.n_micro = mini_batch_size // b
        self.N = len(graph.nodes)
        self.D = cluster.devices
        idx = graph.index
        self.succ: list[list[tuple[int, float]]] = [[] for _ in range(self.N)]
        self.adj: list[list[int]] = [[] for _ in range(self.N)]
        for (u, v), nbytes in sorted(graph.edge_bytes_map.items(), key=lambda kv: (idx[kv[0][0]], idx[kv[0][1]])):
            self.succ[idx[u]].append((idx[v], nbytes))
            self.adj[idx[u]].append(idx[v])
            self.adj[idx[v]].append(idx[u])
        self.adj = [sorted(set(a)) for a in self.adj]
        tables = tables or CostTables(graph)
        self.weight = tables.weight.tolist()
        self.act = tables.activation.tolist()
        self.degrees = tuple(d for d in range(1, self.D + 1) if b % d == 0)
        self.comp = {d: tables.compute_at(b / d).tolist() for d in self.degrees}
        self.topo_rank = {v: i for i, v in enumerate(graph.topo_order)}
        c = cluster
        self.osf, self.lat = c.optimizer_state_factor, c.latency
        self.inter = c.inter_node_bandwidth
        self.intra = c.intra_node_bandwidth if c.intra_node_bandwidth is not None else c.inter_node_bandwidth
        self.dpn = c.devices_per_node
        self.cap = c.memory_bytes * (1 + MEM_REL_TOL)
        flat = self.dpn is None or self.intra == self.inter
        self.const_bw = self.inter if flat else (self.intra if self.D <= self.dpn else None)
        self.lb_tps = sum(self.comp[1]) / b / self.D     # perfect balance at b (d = 1 is the cheapest per sample)
        self.quantum = max(self.lb_tps, 1e-300) * 1e-9
        self.evaluations = 0

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, assign: Sequence[int], devs: Sequence[int]) -> Eval | None:
        """Exact cost-model figures of a state, or ``None`` when its stage graph has a cycle."""
        self.evaluations += 1
        k = len(devs)
        first = [-1] * k
        W = [0.0] * k
        Act = [0.0] * k
        C = [0.0] * k
        comp, wt, act = self.comp, self.weight, self.act
        for u in range(self.N):
            s = assign[u]
            if first[s] < 0:
                first[s] = u
            W[s] += wt[u]
            Act[s] += act[u]
            C[s] += comp[devs[s]][u]
        qs: list[set[int]] = [set() for _ in range(k)]
        tr: dict[tuple[int, int], float] = {}
        for u in range(self.N):
            su = assign[u]
            for v, nb in self.succ[u]:
                sv = assign[v]
                if sv != su:
                    qs[su].add(sv)
                    key = (u, sv)
                    if nb > tr.get(key, -1.0):
                        tr[key] = nb
        indeg = [0] * k
        for s in range(k):
            for t in qs[s]:
                indeg[t] += 1
        heap = [(first[s], s) for s in range(k) if indeg[s] == 0]
        heapq.heapify(heap)
        order: list[int] = []
        while heap:
            _, s = heapq.heappop(heap)
            order.append(s)
            for t in qs[s]:
                indeg[t] -= 1
                if indeg[t] == 0:
                    heapq.heappush(heap, (first[t], t))
        if len(order) < k:
            return None
        depth = [0] * k
        for s in reversed(order):
            depth[s] = 1 + max((depth[t] for t in qs[s]), default=0)
        b, n = self.b, self.n_micro
        mem = [self.osf * W[s] + min(depth[s], n) * b / devs[s] * Act[s] for s in range(k)]
        excess = sum(max(0.0, m - self.cap) for m in mem)
        best: Eval | None = None
        for offsets in self._placements(order, devs):
            e = self._price(assign, devs, order, qs, tr, C, W, mem, excess, offsets)
            if best is None or e.key < best.key:
                best = e
        return best

    def _placements(self, order: Sequence[int], devs: Sequence[int]) -> Iterator[tuple[int, ...]]:
        """Contiguous device ranges in topological order; then (when placement matters) largest first."""
        k = len(devs)
        modes = [list(order)]
        if self.const_bw is None:
            pos = {s: i for i, s in enumerate(order)}
            aligned = sorted(order, key=lambda s: (-devs[s], pos[s]))
            if aligned != modes[0]:
                modes.append(aligned)
        for mode in modes:
            off = [0] * k
            o = 0
            for s in mode:
                off[s] = o
                o += devs[s]
            yield tuple(off)

    def _price(self, assign, devs, order, qs, tr, C, W, mem, excess, offsets) -> Eval:
        k = len(devs)
        b, B = self.b, self.B
        if self.const_bw is not None:
            home = None
            bw_pair = None
        else:
            dpn = self.dpn
            home = [offsets[s] // dpn if offsets[s] // dpn == (offsets[s] + devs[s] - 1) // dpn else -1
                    for s in range(k)]
        comm = [0.0] * k
        lat = self.lat
        for (u, sv), nb in tr.items():
            su = assign[u]
            if home is None:
                bw = self.const_bw
            else:
                bw = self.intra if home[su] >= 0 and home[su] == home[sv] else self.inter
            comm[su] += lat + nb * (b / devs[su]) / bw
            comm[sv] += lat + nb * (b / devs[sv]) / bw
        tps = [0.0] * k
        per = [0.0] * k
        ar_max = 0.0
        for s in range(k):
            d = devs[s]
            if d > 1:
                bw = self.const_bw if home is None else (self.intra if home[s] >= 0 else self.inter)
                a = 2.0 * (d - 1) / d * W[s] / bw
            else:
                a = 0.0
            per[s] = C[s] + 2.0 * comm[s]
            tps[s] = per[s] / b + a / B
            ar_max = max(ar_max, a)
        longest = [0.0] * k
        for s in order:
            longest[s] += per[s]
            for t in qs[s]:
                if longest[s] > longest[t]:
                    longest[t] = longest[s]
        # longest[t] above holds max over preds before t's own time is added (t comes later in order)
        est = max(longest) + (self.n_micro - 1) * max(per) + ar_max
        q = self.quantum
        key = (int(excess / (self.cap * 1e-9)), tuple(sorted((int(x / q) for x in tps), reverse=True)),
               int(est / (q * B)))
        return Eval(key, tuple(tps), tuple(mem), tuple(order), offsets, est)

    # ------------------------------------------------------------------ devices
    def stage_devices_ranges(self, ev: Eval, devs: Sequence[int]) -> list[tuple[int, ...]]:
        return [tuple(range(ev.offsets[s], ev.offsets[s] + devs[s])) for s in range(len(devs))]

    def rebalance(self, assign: Sequence[int], k: int) -> tuple[int, ...] | None:
        """Data-parallel degrees minimising the bottleneck TPS for a fixed partition (min-max over
        thresholds; transfers priced at the inter-node bandwidth unless it is constant, the
        all-reduce at the intra-node one when an aligned group fits a node).  ``None`` when the
        stage graph is cyclic."""
        members: list[list[int]] = [[] for _ in range(k)]
        for u, s in enumerate(assign):
            members[s].append(u)
        qs: list[set[int]] = [set() for _ in range(k)]
        tr: dict[tuple[int, int], float] = {}
        for u in range(self.N):
            su = assign[u]
            for v, nb in self.succ[u]:
                sv = assign[v]
                if sv != su:
                    qs[su].add(sv)
                    if nb > tr.get((u, sv), -1.0):
                        tr[(u, sv)] = nb
        depth = _depths(qs, k)
        if depth is None:
            return None
        xfer = [[] for _ in range(k)]
        for (u, sv), nb in tr.items():
            xfer[assign[u]].append(nb)
            xfer[sv].append(nb)
        bw_comm = self.const_bw if self.const_bw is not None else min(self.intra, self.inter)
        table: list[list[tuple[float, int]]] = []
        for s in range(k):
            W = sum(self.weight[u] for u in members[s])
            Act = sum(self.act[u] for u in members[s])
            opts = []
            for d in self.degrees:
                if self.osf * W + min(depth[s], self.n_micro) * self.b / d * Act > self.cap:
                    continue
                c = sum(self.comp[d][u] for u in members[s])
                comm = sum(self.lat + nb * (self.b / d) / bw_comm for nb in xfer[s])
                if d > 1:
                    if self.const_bw is not None:
                        bw = self.const_bw
                    else:
                        bw = self.intra if (d <= self.dpn and self.dpn % d == 0) else self.inter
                    a = 2.0 * (d - 1) / d * W / bw
                else:
                    a = 0.0
                opts.append(((c + 2 * comm) / self.b + a / self.B, d))
            if not opts:
                opts = [(float("inf"), max(self.degrees))]
            table.append(opts)
        cands = sorted({t for opts in table for t, _ in opts})
        lo, hi = 0, len(cands) - 1

        def need(t: float) -> list[int] | None:
            out = []
            for opts in table:
                ds = [d for x, d in opts if x <= t]
                if not ds:
                    return None
                out.append(min(ds))
            return out

        if need(cands[hi]) is None or sum(need(cands[hi])) > self.D:
            # fall back: the cheapest-in-devices option of each stage
            devs = [min(d for _, d in opts) for opts in table]
            return tuple(devs) if sum(devs) <= self.D else None
        while lo < hi:
            mid = (lo + hi) // 2
            r = need(cands[mid])
            if r is not None and sum(r) <= self.D:
                hi = mid
            else:
                lo = mid + 1
        devs = need(cands[hi])
        assert devs is not None
        # spare devices: keep raising the slowest stage while a larger degree fits and helps
        free = self.D - sum(devs)
        while free > 0:
            ranked = sorted(range(k), key=lambda s: -dict((d, x) for x, d in table[s])[devs[s]])
            moved = False
            for s in ranked[:1]:
                cur = dict((d, x) for x, d in table[s])
                ups = [d for d in sorted(cur) if d > devs[s] and d - devs[s] <= free and cur[d] < cur[devs[s]]]
                if ups:
                    free -= ups[0] - devs[s]
                    devs[s] = ups[0]
                    moved = True
            if not moved:
                break
        return tuple(devs)


def _depths(qs: Sequence[set[int]], k: int) -> list[int] | None:
    indeg = [0] * k
    for s in range(k):
        for t in qs[s]:
            indeg[t] += 1
    stack = [s for s in range(k) if indeg[s] == 0]
    order = []
    while stack:
        s = stack.pop()
        order.append(s)
        for t in qs[s]:
            indeg[t] -= 1
            if indeg[t] == 0:
                stack.append(t)
    if len(order) < k:
        return None
    depth = [0] * k
    for s in reversed(order):
        depth[s] = 1 + max((depth[t] for t in qs[s]), default=0)
    return depth


def canonical(state: State, ev: Eval) -> State:
    """Relabel stages in the evaluated topological order (deterministic labels)."""
    relabel = {s: i for i, s in enumerate(ev.order)}
    return State(tuple(relabel[s] for s in state.assign), tuple(state.devs[s] for s in ev.order))
