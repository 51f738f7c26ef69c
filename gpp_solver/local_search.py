"""Local search over convex partitions for one micro-batch size (the engine of ``gpp_planner``).

A *state* is a partition of the graph's nodes into stages (``assign[u]`` = stage label) and a
data-parallel degree per stage (``devs[label]``, ``b % d == 0``, ``sum(devs) <= devices``), with
one micro-batch size ``b`` for every stage and 1F1B (``k = 1``).  :meth:`Problem.evaluate` prices
a state exactly as ``plan_build.build_plan`` + ``cost.stage_costs`` would:

* validity: the quotient (stage) graph is acyclic — which also makes every stage convex (a path
  leaving a stage and re-entering it is a cycle of the quotient);
* memory: Algorithm 2 with uniform ``b`` and ``k = 1`` gives ``depth * b`` in-flight samples
  (``depth`` = 1 + longest path to a sink stage); the kFkB order caps it at ``n = B / b``
  micro-batches, so ``M(S) = osf * W_S + min(depth, n) * b / d * Act_S``;
* time: ``TPS(S) = (C(S) + comm(S)) / b + A(S) / B`` with the cost model's transfers and
  bandwidths, under a device placement chosen by the evaluator (contiguous ranges in the stage
  graph's topological order, or largest degree first — whichever gives the smaller key).

The search key is ``(memory excess, bottleneck-first sorted TPS vector, iteration-time
estimate)``, quantised so float noise never counts as an improvement.  Moves are generated in a
fixed order (see :func:`neighbours`) and the search takes the best improving move of the most
loaded stage that has one: deterministic for a fixed iteration cap; the wall clock is only a
safety stop.
"""

from __future__ import annotations

import heapq
import logging
import time
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


# ---------------------------------------------------------------------------------- moves
def _members(assign: Sequence[int], k: int) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in range(k)]
    for u, s in enumerate(assign):
        out[s].append(u)
    return out


def _merge(state: State, t: int, u: int, d_u: int) -> tuple[tuple[int, ...], list[int]]:
    """Stage ``t`` folded into ``u`` (which gets ``d_u`` devices); labels above ``t`` shift down."""
    assign = tuple((u if s == t else s) - (1 if (u if s == t else s) > t else 0) for s in state.assign)
    devs = list(state.devs)
    devs[u] = d_u
    del devs[t]
    return assign, devs


def _largest_degree(P: Problem, limit: int) -> int:
    return max(d for d in P.degrees if d <= limit)


def _branch_order(P: Problem, nodes: Sequence[int]) -> list[int]:
    """A topological order of ``nodes`` that finishes one branch before starting the next (DFS-like)."""
    inside = set(nodes)
    indeg = {u: 0 for u in nodes}
    for u in nodes:
        for v, _ in P.succ[u]:
            if v in inside:
                indeg[v] += 1
    stack = sorted((u for u in nodes if indeg[u] == 0), reverse=True)
    out = []
    while stack:
        u = stack.pop()
        out.append(u)
        ready = []
        for v, _ in P.succ[u]:
            if v in inside:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        stack.extend(sorted(ready, reverse=True))
    return out


def _split_devices(P: Problem, part1: Sequence[int], part2: Sequence[int], avail: int) -> tuple[int, int] | None:
    """Degrees ``(d1, d2)``, ``d1 + d2 <= avail``, balancing the two parts' compute."""
    best = None
    for d1 in P.degrees:
        c1 = sum(P.comp[d1][u] for u in part1)
        for d2 in P.degrees:
            if d1 + d2 > avail:
                break
            c2 = sum(P.comp[d2][u] for u in part2)
            score = (max(c1, c2), d1 + d2)
            if best is None or score < best[0]:
                best = (score, (d1, d2))
    return None if best is None else best[1]


def neighbours(P: Problem, state: State, s: int) -> Iterator[tuple[str, State]]:
    """Candidate moves that change stage ``s`` (the loaded one), in a fixed order."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    members = _members(assign, k)
    free = P.D - sum(devs)
    # 1. boundary nodes of s to an adjacent stage; 2. boundary nodes of neighbours into s
    if len(members[s]) > 1:
        for u in members[s]:
            for t in sorted({assign[w] for w in P.adj[u]} - {s}):
                a = list(assign)
                a[u] = t
                yield "move", State(tuple(a), devs)
    for u in range(P.N):
        t = assign[u]
        if t != s and len(members[t]) > 1 and any(assign[w] == s for w in P.adj[u]):
            a = list(assign)
            a[u] = s
            yield "pull", State(tuple(a), devs)
    # 3. more (or fewer) devices for s, from the free pool or from one other stage
    for d in P.degrees:
        if d == devs[s]:
            continue
        need = d - devs[s]
        if need <= free:
            yield "devices", State(assign, devs[:s] + (d,) + devs[s + 1:])
            continue
        for t in range(k):
            if t == s:
                continue
            give = [x for x in P.degrees if x < devs[t] and devs[t] - x >= need - free]
            if give:
                dv = list(devs)
                dv[s], dv[t] = d, give[-1]
                yield "devices", State(assign, tuple(dv))
    # 4. split s in two along a topological order (prefix / suffix), devices shared or from the pool
    if len(members[s]) > 1:
        avail = devs[s] + free
        orders = [sorted(members[s], key=lambda u: P.topo_rank[P.graph.ids[u]])]
        br = _branch_order(P, members[s])
        if br != orders[0]:
            orders.append(br)
        for order in orders:
            for c in range(1, len(order)):
                p1, p2 = order[:c], order[c:]
                dd = _split_devices(P, p1, p2, avail)
                if dd is None:
                    continue
                a = list(assign)
                for u in p2:
                    a[u] = k
                dv = list(devs) + [dd[1]]
                dv[s] = dd[0]
                yield "split", State(tuple(a), tuple(dv))
    # 5. merge two adjacent stages; the freed devices go to s (or everything is re-split)
    pairs = sorted({(min(assign[u], assign[v]), max(assign[u], assign[v]))
                    for u in range(P.N) for v, _ in P.succ[u] if assign[u] != assign[v]})
    for t, u in pairs:
        for src, dst in ((t, u), (u, t)):
            d_dst = _largest_degree(P, max(devs[dst], devs[src]))
            a, dv = _merge(state, src, dst, d_dst)
            merged = dst - (1 if dst > src else 0)
            tgt = merged if s in (src, dst) else s - (1 if s > src else 0)
            dv[tgt] = _largest_degree(P, dv[tgt] + P.D - sum(dv))
            yield "merge", State(a, tuple(dv))
            rb = P.rebalance(a, k - 1)
            if rb is not None:
                yield "merge+rebalance", State(a, rb)


def _down_sets(P: Problem, nodes: Sequence[int], cap: int) -> list[list[int]] | None:
    """Every non-trivial down-closed subset of ``nodes`` (w.r.t. edges inside it); ``None`` above ``cap``."""
    order = sorted(nodes, key=lambda u: P.topo_rank[P.graph.ids[u]])
    inside = set(order)
    preds: dict[int, list[int]] = {u: [] for u in order}
    for u in order:
        for v, _ in P.succ[u]:
            if v in inside:
                preds[v].append(u)
    out: list[list[int]] = []
    chosen: set[int] = set()

    def rec(i: int) -> bool:
        if i == len(order):
            if 0 < len(chosen) < len(order):
                out.append(sorted(chosen))
            return len(out) <= cap
        u = order[i]
        if not rec(i + 1):
            return False
        if all(p in chosen for p in preds[u]):
            chosen.add(u)
            ok = rec(i + 1)
            chosen.discard(u)
            return ok
        return True

    return out if rec(0) else None


def repartitions(P: Problem, state: State, s: int, *, cap: int = 512) -> Iterator[tuple[str, State]]:
    """Exact re-partition of stage ``s`` with each adjacent stage: every down-set split of their
    union (up to ``cap`` per pair), devices re-shared between the two parts."""
    assign, devs = state.assign, state.devs
    k = len(devs)
    members = _members(assign, k)
    free = P.D - sum(devs)
    nbrs = sorted({assign[w] for u in members[s] for w in P.adj[u]} - {s})
    for t in nbrs:
        union = members[s] + members[t]
        splits = _down_sets(P, union, cap)
        if splits is None:
            continue
        lo, hi = min(s, t), max(s, t)
        for x in splits:
            xs = set(x)
            y = [u for u in union if u not in xs]
            dd = _split_devices(P, x, y, devs[s] + devs[t] + free)
            if dd is None:
                continue
            a = list(assign)
            for u in x:
                a[u] = lo
            for u in y:
                a[u] = hi
            dv = list(devs)
            dv[lo], dv[hi] = dd
            yield "repartition", State(tuple(a), tuple(dv))


@dataclass
class SearchResult:
    state: State
    ev: Eval
    moves: int
    iterations: int
    stopped: str                # "converged", "iterations" or "time"
    move_counts: dict[str, int]


def search(P: Problem, state: State, *, max_iterations: int = 300, tiers: int = 2,
           deadline: float | None = None, exact: bool = True) -> SearchResult:
    """Best-improvement local search from ``state`` (see the module docstring)."""
    ev = P.evaluate(state.assign, state.devs)
    if ev is None:
        raise ValueError("the start state's stage graph has a cycle")
    state = canonical(state, ev)
    ev = P.evaluate(state.assign, state.devs)
    counts: dict[str, int] = {}
    moves = iterations = 0
    stopped = "iterations"
    while iterations < max_iterations:
        iterations += 1
        if deadline is not None and time.perf_counter() > deadline:
            stopped = "time"
            break
        k = len(state.devs)
        ranked = sorted(range(k), key=lambda s: (-max(0.0, ev.memory[s] - P.cap), -ev.tps[s], s))
        found = None
        rb = P.rebalance(state.assign, k)
        if rb is not None and rb != state.devs:
            e = P.evaluate(state.assign, rb)
            if e is not None and e.key < ev.key:
                found = ("rebalance", State(state.assign, rb), e)
        for s in ranked[:tiers]:
            if found is not None:
                break
            best = None
            for label, cand in neighbours(P, state, s):
                e = P.evaluate(cand.assign, cand.devs)
                if e is not None and e.key < ev.key and (best is None or e.key < best[2].key):
                    best = (label, cand, e)
                if deadline is not None and P.evaluations % 64 == 0 and time.perf_counter() > deadline:
                    break
            found = best
        if found is None and exact:
            best = None
            for label, cand in repartitions(P, state, ranked[0]):
                e = P.evaluate(cand.assign, cand.devs)
                if e is not None and e.key < ev.key and (best is None or e.key < best[2].key):
                    best = (label, cand, e)
            found = best
        if found is None:
            stopped = "converged"
            break
        label, cand, e = found
        state = canonical(cand, e)
        ev = P.evaluate(state.assign, state.devs)
        moves += 1
        counts[label] = counts.get(label, 0) + 1
    return SearchResult(state, ev, moves, iterations, stopped, counts)


# ---------------------------------------------------------------------------------- seeds
def topological_orders(P: Problem) -> list[list[int]]:
    """The graph's own topological order and a branch-by-branch one."""
    idx = P.graph.index
    a = [idx[v] for v in P.graph.topo_order]
    b = _branch_order(P, list(range(P.N)))
    return [a] if a == b else [a, b]


def _linear_partition(w: Sequence[float], k: int) -> list[int]:
    """Cut points of at most ``k`` contiguous segments minimising the largest sum (bisection + greedy)."""
    def cuts(t: float) -> list[int] | None:
        out, acc = [], 0.0
        for i, x in enumerate(w):
            if acc + x > t and acc > 0:
                out.append(i)
                acc = 0.0
            acc += x
        return out if len(out) + 1 <= k else None
    lo, hi = max(w), sum(w)
    for _ in range(60):
        mid = (lo + hi) / 2
        if cuts(mid) is None:
            lo = mid
        else:
            hi = mid
    return cuts(hi) or []


def chain_states(P: Problem) -> Iterator[tuple[str, State]]:
    """Sequential partitions of topological orders (every prefix cut is convex) with re-split devices."""
    seen = set()
    for oi, order in enumerate(topological_orders(P)):
        w = [P.comp[1][u] for u in order]
        for k in range(1, min(P.D, P.N) + 1):
            cuts = _linear_partition(w, k)
            key = tuple(cuts)
            if (oi, key) in seen:
                continue
            seen.add((oi, key))
            a = [0] * P.N
            stage, bounds = 0, set(cuts)
            for i, u in enumerate(order):
                if i in bounds:
                    stage += 1
                a[u] = stage
            devs = P.rebalance(a, stage + 1)
            if devs is not None:
                yield f"chain{oi}", State(tuple(a), devs)
