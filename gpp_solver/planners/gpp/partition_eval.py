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

It exists beside ``cost.stage_costs`` because the local search prices millions of neighbouring
states from a node->stage array (no stage objects, quotient graph and transfers vectorised, two
placements tried per state); its formulas are the cost model's pricing core (``comm_time``,
``TimeTerms.tail``, ``time_per_sample``).  Up to ``PY_EVAL_MAX_SIZE`` nodes + edges it prices in
plain Python instead (:meth:`Problem._evaluate_py`, the same figures bit for bit).

The key is ``(memory excess, bottleneck-first sorted TPS vector, iteration-time estimate)``
(``by_estimate=True``: the estimate before the TPS vector, for the final polish), quantised (1e-9 of the perfect-balance TPS) so float noise never counts as an improvement.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.cost.model import comm_time, memory_per_device, time_per_sample
from gpp_solver.cost.network import constant_bandwidth, node_bandwidth, slowest_bandwidth
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)

MEM_REL_TOL = 5e-10  # stricter than the validator's 1e-9, so float order never flips a verdict
CACHE_ENTRIES_TIMES_NODES = 20_000_000  # evaluation cache: at most this many node labels held (then cleared)
# up to this many nodes + edges a state is priced in plain Python (``Problem._evaluate_py``): on the
# paper's workloads (33-102 nodes) numpy's per-call overhead on arrays of a few stages was most of
# the search time; the figures are bit-identical to the vectorised evaluator (same operations in
# the same order; tests/planners/gpp/test_gpp_speed.py checks it), which prices larger graphs: about
# even at 500-700 nodes + edges (MMT 8x8, Transformer-96), numpy 1.4x faster at 1,800 (MMT 16x16,
# 8 devices), 2.9x at 2,700 (NASNet-A large, 1,024 devices)
PY_EVAL_MAX_SIZE = 1024


@dataclass(frozen=True)
class State:
    assign: tuple[int, ...]  # node index (graph order) -> stage label 0..k-1
    devs: tuple[int, ...]  # stage label -> data-parallel degree


@dataclass(frozen=True)
class Eval:
    key: tuple
    tps: tuple[float, ...]  # per stage label
    memory: tuple[float, ...]  # per stage label, bytes per device
    order: tuple[int, ...]  # topological order of the stage labels
    offsets: tuple[int, ...]  # first device of each stage label
    estimate: float  # iteration-time estimate of the cost model

    @property
    def max_tps(self) -> float:
        return max(self.tps)


class Problem:
    """Everything the evaluator needs for one graph, cluster, ``B`` and ``b``."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        b: int,
        tables: CostTables | None = None,
        *,
        by_estimate: bool = False,
    ) -> None:
        self.graph, self.cluster, self.B, self.b = graph, cluster, mini_batch_size, b
        self.terms = TimeTerms.of(graph, cluster, mini_batch_size)
        self.by_estimate = by_estimate  # key: iteration-time estimate before the TPS vector
        self.num_micro_batches = mini_batch_size // b
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
        self.degrees = tuple(d for d in range(1, min(self.D, b) + 1) if b % d == 0)  # d | b: never above b
        self.comp = {d: tables.compute_at(b / d).tolist() for d in self.degrees}
        self.topo_rank = {v: i for i, v in enumerate(graph.topo_order)}
        c = cluster
        self.osf, self.lat = c.optimizer_state_factor, c.latency
        self.inter, self.intra = c.inter_node_bandwidth, node_bandwidth(c)
        self.dpn = c.devices_per_node
        self.cap = c.memory_bytes * (1 + MEM_REL_TOL)
        self.const_bw = constant_bandwidth(c)
        self.lb_tps = sum(self.comp[1]) / b / self.D  # perfect balance at b (d = 1 is the cheapest per sample)
        self.quantum = max(self.lb_tps, 1e-300) * 1e-9
        self.evaluations = 0
        self.cache_hits = 0
        self._cache: dict[tuple[tuple[int, ...], tuple[int, ...]], Eval | None] = {}
        self._rb_cache: dict[tuple[tuple[int, ...], int], tuple[int, ...] | None] = {}
        self.rebalance_hits = 0
        self._cache_max = max(1000, CACHE_ENTRIES_TIMES_NODES // max(self.N, 1))
        # arrays for the vectorised evaluator
        self._ar = np.arange(self.N)
        self._comp_by_d = np.zeros((self.degrees[-1] + 1, self.N))  # indexed by degree (not by device count)
        for d in self.degrees:
            self._comp_by_d[d] = tables.compute_at(b / d)
        self._w = np.asarray(self.weight)
        self._a = np.asarray(self.act)
        es = [(u, v, nb) for u in range(self.N) for v, nb in self.succ[u]]
        self._esrc = np.asarray([e[0] for e in es], dtype=np.int64)
        self._edst = np.asarray([e[1] for e in es], dtype=np.int64)
        self._ebytes = np.asarray([e[2] for e in es], dtype=float)
        self._deg = np.asarray(self.degrees, dtype=np.int64)
        self._edges = [(u, v, float(nb)) for u, v, nb in es]  # (producer, consumer, bytes), as the arrays above
        self._py = self.N + len(es) <= PY_EVAL_MAX_SIZE

    # ------------------------------------------------------------------ structure
    def _structure(self, a: np.ndarray, k: int):
        """Quotient successors, a topological order (ties: first node), sink depths and the
        transfers ``(producer stage, consumer stage, bytes)``; ``None`` when the quotient is cyclic."""
        sa, sb = a[self._esrc], a[self._edst]
        m = sa != sb
        sa, sb = sa[m], sb[m]
        qkeys = sorted(set((sa * k + sb).tolist()))
        qs: list[list[int]] = [[] for _ in range(k)]
        indeg = [0] * k
        for key in qkeys:
            qs[key // k].append(key % k)
            indeg[key % k] += 1
        first = np.full(k, self.N, dtype=np.int64)
        np.minimum.at(first, a, self._ar)
        first = first.tolist()
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
        # transfers: one per (producer node, consumer stage), the largest edge
        tk = self._esrc[m] * k + sb
        nb = self._ebytes[m]
        if len(tk):
            srt = np.lexsort((nb, tk))
            tk, nb = tk[srt], nb[srt]
            last = np.r_[tk[1:] != tk[:-1], True]
            tk, nb = tk[last], nb[last]
        t_cons = tk % k
        t_prod = a[tk // k]
        return qs, order, depth, t_prod, t_cons, nb

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, assign: Sequence[int], devs: Sequence[int]) -> Eval | None:
        """Exact cost-model figures of a state, or ``None`` when its stage graph has a cycle (cached:
        the searches from several starts and the restarts meet the same states)."""
        self.evaluations += 1
        ck = (tuple(assign), tuple(devs))
        if ck in self._cache:
            self.cache_hits += 1
            return self._cache[ck]
        out = self._evaluate_py(ck[0], ck[1]) if self._py else self._evaluate(ck[0], ck[1])
        if len(self._cache) >= self._cache_max:
            self._cache.clear()
        self._cache[ck] = out
        return out

    def _evaluate(self, assign: Sequence[int], devs: Sequence[int]) -> Eval | None:
        k = len(devs)
        a = np.asarray(assign, dtype=np.int64)
        st = self._structure(a, k)
        if st is None:
            return None
        qs, order, depth, t_prod, t_cons, nb = st
        dv = np.asarray(devs, dtype=np.int64)
        C = np.bincount(a, weights=self._comp_by_d[dv[a], self._ar], minlength=k)
        W = np.bincount(a, weights=self._w, minlength=k)
        Act = np.bincount(a, weights=self._a, minlength=k)
        b, n = self.b, self.num_micro_batches
        mem = memory_per_device(self.osf, W, np.minimum(np.asarray(depth), n) * b, dv, Act)
        excess = float(np.maximum(mem - self.cap, 0.0).sum())
        best: Eval | None = None
        for offsets in self._placements(order, devs):
            e = self._price(dv, order, qs, t_prod, t_cons, nb, C, W, mem, excess, offsets)
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

    def _price(self, dv, order, qs, t_prod, t_cons, nb, C, W, mem, excess, offsets) -> Eval:
        k = len(dv)
        b, B = self.b, self.B
        if self.const_bw is not None:
            bw_t = self.const_bw
            bw_s = np.full(k, self.const_bw)
        else:
            off = np.asarray(offsets, dtype=np.int64)
            lo, hi = off // self.dpn, (off + dv - 1) // self.dpn
            home = np.where(lo == hi, lo, -1)
            hp, hc = home[t_prod], home[t_cons]
            bw_t = np.where((hp >= 0) & (hp == hc), self.intra, self.inter)
            bw_s = np.where(home >= 0, self.intra, self.inter)
        lat = self.lat
        comm = np.bincount(t_prod, weights=comm_time(nb, b / dv[t_prod], bw_t, lat), minlength=k) + np.bincount(
            t_cons, weights=comm_time(nb, b / dv[t_cons], bw_t, lat), minlength=k
        )
        ar = self.terms.tail(W, dv, bw_s, b)
        per = C + 2.0 * comm
        tps = time_per_sample(per, b, ar, B)
        perl = per.tolist()
        longest = [0.0] * k
        for s in order:
            longest[s] += perl[s]
            for t in qs[s]:
                if longest[s] > longest[t]:
                    longest[t] = longest[s]
        est = max(longest) + (self.num_micro_batches - 1) * float(per.max()) + float(ar.max())
        q = self.quantum
        vec = tuple(sorted((tps / q).astype(np.int64).tolist(), reverse=True))
        if self.by_estimate:
            key = (int(excess / (self.cap * 1e-9)), int(est / (q * B)), vec)
        else:
            key = (int(excess / (self.cap * 1e-9)), vec, int(est / (q * B)))
        return Eval(key, tuple(tps.tolist()), tuple(mem.tolist()), tuple(order), offsets, est)

    # ------------------------------------------------------------------ evaluation in plain Python
    def _evaluate_py(self, assign: Sequence[int], devs: Sequence[int]) -> Eval | None:
        """:meth:`_evaluate` in plain Python, for graphs up to ``PY_EVAL_MAX_SIZE`` nodes + edges: the
        same figures, bit for bit (each sum in the order ``np.bincount`` adds, the element-wise
        formulas of ``cost.model`` on floats; tests/planners/gpp/test_gpp_speed.py checks it)."""
        k = len(devs)
        quotient: set[int] = set()
        transfers: dict[int, float] = {}  # producer node * k + consumer stage -> largest bytes
        for u, v, nbytes in self._edges:
            su, sv = assign[u], assign[v]
            if su != sv:
                quotient.add(su * k + sv)
                tkey = u * k + sv
                old = transfers.get(tkey)
                if old is None or nbytes > old:
                    transfers[tkey] = nbytes
        qs: list[list[int]] = [[] for _ in range(k)]
        indeg = [0] * k
        for key in sorted(quotient):
            qs[key // k].append(key % k)
            indeg[key % k] += 1
        first = [self.N] * k
        C, W, Act = [0.0] * k, [0.0] * k, [0.0] * k
        weight, act, N = self.weight, self.act, self.N
        rows = [self.comp[d] for d in devs]  # each stage's compute row, at its degree
        for u, s in enumerate(assign):
            if first[s] == N:
                first[s] = u
            C[s] += rows[s][u]
            W[s] += weight[u]
            Act[s] += act[u]
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
        b, n, osf, cap = self.b, self.num_micro_batches, self.osf, self.cap
        mem = [osf * W[s] + (min(depth[s], n) * b) / devs[s] * Act[s] for s in range(k)]
        over = [m - cap for m in mem if m - cap > 0.0]
        if len(over) <= 1:
            excess = over[0] if over else 0.0
        else:  # numpy's pairwise sum, as _evaluate adds
            excess = float(np.maximum(np.asarray(mem) - cap, 0.0).sum())
        tlist = [(tkey // k, tkey % k, transfers[tkey]) for tkey in sorted(transfers)]
        best: Eval | None = None
        for offsets in self._placements(order, devs):
            e = self._price_py(devs, order, qs, assign, tlist, C, W, mem, excess, offsets)
            if best is None or e.key < best.key:
                best = e
        return best

    def _price_py(self, devs, order, qs, assign, tlist, C, W, mem, excess, offsets) -> Eval:
        """:meth:`_price` in plain Python (the figures of :meth:`_evaluate_py`)."""
        k = len(devs)
        b, B, lat = self.b, self.B, self.lat
        const = self.const_bw
        if const is None:
            dpn, intra, inter = self.dpn, self.intra, self.inter
            home = []
            for s in range(k):
                lo, hi = offsets[s] // dpn, (offsets[s] + devs[s] - 1) // dpn
                home.append(lo if lo == hi else -1)
        cp, cc = [0.0] * k, [0.0] * k
        for u, sv, nbytes in tlist:
            sp = assign[u]
            if const is None:
                hp = home[sp]
                bw = intra if (hp >= 0 and hp == home[sv]) else inter
            else:
                bw = const
            cp[sp] += lat + nbytes * (b / devs[sp]) / bw
            cc[sv] += lat + nbytes * (b / devs[sv]) / bw
        per, ar, tps = [0.0] * k, [0.0] * k, [0.0] * k
        tail = self.terms.tail  # A(S) + O(S): cost.model.TimeTerms, the scalar form
        for s in range(k):
            d = devs[s]
            bw = const if const is not None else (intra if home[s] >= 0 else inter)
            ar[s] = tail(W[s], d, bw, b)
            per[s] = C[s] + 2.0 * (cp[s] + cc[s])
            tps[s] = per[s] / b + ar[s] / B
        longest = [0.0] * k
        for s in order:
            longest[s] += per[s]
            for t in qs[s]:
                if longest[s] > longest[t]:
                    longest[t] = longest[s]
        est = max(longest) + (self.num_micro_batches - 1) * max(per) + max(ar)
        q = self.quantum
        vec = tuple(sorted((int(x / q) for x in tps), reverse=True))
        if self.by_estimate:
            key = (int(excess / (self.cap * 1e-9)), int(est / (q * B)), vec)
        else:
            key = (int(excess / (self.cap * 1e-9)), vec, int(est / (q * B)))
        return Eval(key, tuple(tps), tuple(mem), tuple(order), offsets, est)

    # ------------------------------------------------------------------ devices
    def rebalance(self, assign: Sequence[int], k: int) -> tuple[int, ...] | None:
        """Data-parallel degrees minimising the bottleneck TPS for a fixed partition (min-max over
        thresholds; transfers priced at the slower bandwidth unless it is constant, the all-reduce
        at the intra-node one when an aligned group fits a node).  ``None`` when the stage graph
        is cyclic.  Cached (the searches meet the same merged partitions again and again)."""
        ck = (tuple(assign), k)
        if ck in self._rb_cache:
            self.rebalance_hits += 1
            return self._rb_cache[ck]
        out = self._rebalance(ck[0], k)
        if len(self._rb_cache) >= self._cache_max:
            self._rb_cache.clear()
        self._rb_cache[ck] = out
        return out

    def share_rebalance_cache(self, other: Problem) -> None:
        """Use ``other``'s rebalance cache (same graph, cluster, ``B`` and ``b``; the key order
        ``by_estimate`` plays no part in :meth:`rebalance`)."""
        if (other.graph, other.cluster, other.B, other.b) != (self.graph, self.cluster, self.B, self.b):
            raise ValueError("share_rebalance_cache: another instance or micro-batch size")
        self._rb_cache = other._rb_cache

    def _rebalance(self, assign: Sequence[int], k: int) -> tuple[int, ...] | None:
        a = np.asarray(assign, dtype=np.int64)
        st = self._structure(a, k)
        if st is None:
            return None
        _, _, depth, t_prod, t_cons, nb = st
        deg = self._deg
        nd = len(deg)
        # per-stage sums for every degree at once: one bincount over (degree, stage) cells (a
        # k x N one-hot matrix product cost O(|deg| N k): seconds over a search on 1,000 stages)
        cell = (np.arange(nd, dtype=np.int64)[:, None] * k + a[None, :]).ravel()
        C = np.bincount(cell, weights=self._comp_by_d[deg].ravel(), minlength=nd * k).reshape(nd, k)  # |deg| x k
        W = np.bincount(a, weights=self._w, minlength=k)
        Act = np.bincount(a, weights=self._a, minlength=k)
        xb = np.bincount(t_prod, weights=nb, minlength=k) + np.bincount(t_cons, weights=nb, minlength=k)
        xn = np.bincount(t_prod, minlength=k) + np.bincount(t_cons, minlength=k)
        bw_comm = slowest_bandwidth(self.cluster)
        degf = deg.astype(float)[:, None]
        comm = comm_time(xb[None, :], self.b / degf, bw_comm, self.lat, xn[None, :])
        if self.const_bw is not None:
            bw_ar = np.full(len(deg), self.const_bw)
        else:
            bw_ar = np.where((deg <= self.dpn) & (self.dpn % deg == 0), self.intra, self.inter)
        ar = self.terms.tail(W[None, :], degf, bw_ar[:, None], self.b)
        T = time_per_sample(C + 2 * comm, self.b, ar, self.B).T  # k x |deg|
        in_flight = np.minimum(np.asarray(depth), self.num_micro_batches) * self.b
        mem = memory_per_device(self.osf, W[:, None], in_flight[:, None], degf.T, Act[:, None])
        ok = mem <= self.cap
        T = np.where(ok, T, np.inf)
        if not ok.any(axis=1).all():
            return self._fallback(ok)

        def need(t: float) -> np.ndarray:
            fits = T <= t
            return np.where(fits.any(axis=1), deg[fits.argmax(axis=1)], 1 << 30)

        cands = np.unique(T[np.isfinite(T)])
        lo, hi = 0, len(cands) - 1
        if need(cands[hi]).sum() > self.D:
            return self._fallback(ok)
        while lo < hi:
            mid = (lo + hi) // 2
            if need(cands[mid]).sum() <= self.D:
                hi = mid
            else:
                lo = mid + 1
        devs = need(cands[hi]).tolist()
        # spare devices: keep raising the slowest stage while a larger degree fits and helps
        pos = {d: i for i, d in enumerate(self.degrees)}
        free = self.D - sum(devs)
        while free > 0:
            cur = [T[s, pos[devs[s]]] for s in range(k)]
            s = max(range(k), key=lambda x: (cur[x], -x))
            ups = [j for j, d in enumerate(self.degrees) if d > devs[s] and d - devs[s] <= free and T[s, j] < cur[s]]
            if not ups:
                break
            free -= self.degrees[ups[0]] - devs[s]
            devs[s] = self.degrees[ups[0]]
        return tuple(devs)

    def _fallback(self, ok: np.ndarray) -> tuple[int, ...] | None:
        """The fewest devices each stage fits in memory with (may still not fit in all)."""
        devs = [self.degrees[int(r.argmax())] if r.any() else self.degrees[-1] for r in ok]
        return tuple(devs) if sum(devs) <= self.D else None


def canonical(state: State, ev: Eval) -> State:
    """Relabel stages in the evaluated topological order (deterministic labels)."""
    relabel = {s: i for i, s in enumerate(ev.order)}
    return State(tuple(relabel[s] for s in state.assign), tuple(state.devs[s] for s in ev.order))
