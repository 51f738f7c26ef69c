"""Exact search for the least simulated iteration time over the MILP's search space.

The space is :mod:`gpp_solver.planners.milp.space`'s — every partition into convex stages with an
acyclic stage graph (:func:`~gpp_solver.planners.milp.space.ordered_partitions`), one micro-batch
size ``b`` for all stages, ``d`` devices per stage with ``b % d == 0`` and at most the cluster's
devices in all, contiguous device ranges in the stage order, 1F1B (``k = 1``) — but the objective is
the **simulated iteration time** of the plan ``plan.build.build_plan`` makes of a candidate (Algorithm
2's in-flight counts, GraphPipe's kFkB orders, ``plan.simulate.simulate_orders``).

Search: a stage's busy time ``n (F + B) + A`` is ``B * TPS(S)`` and no schedule finishes before it;
sharper, the stage's first forward waits for the longest forward path above it (``head``) and
after its last backward every stage above it still runs its last backward and its all-reduce
(``tail``), so the makespan is at least ``head(S) + n (F + B) + max(A, tail(S))``.  For every
(partition, ``b``) pair the bound with each stage's best memory-feasible degree orders the pairs;
the search stops when the bound reaches the incumbent.  Inside a pair (:mod:`.pair_search`) a
depth-first search over the stages' degrees (stages in topological order, so ``head`` and ``tail``
are known exactly from the assigned predecessors) prunes with the same bound, the devices the
remaining stages need at least, and memory.  Every surviving leaf is priced by the cost model (``cost.stage_costs``) and simulated.
Where placement can change a bandwidth the bounds use the fastest link (still valid); the leaf
uses the real ranges.

Devices beyond ``nodes * max(b)`` cannot be used by any plan of the space, so the search caps the
device count there (exact).  Above :data:`MAX_NODES` nodes, :data:`MAX_DEVICES` usable devices or
:data:`MAX_PARTITIONS` ordered partitions it raises :class:`SearchSpaceTooLargeError`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.cost.model import interp_time, stage_transfers
from gpp_solver.cost.network import constant_bandwidth, link_bandwidths
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.errors import SearchSpaceTooLargeError
from gpp_solver.plan.build import stage_graph_edges
from gpp_solver.planners.exact.pair_search import Candidate, PairBounds, search_pair
from gpp_solver.planners.milp.space import (
    MEMORY_REL_TOL,
    device_options,
    in_flight_samples,
    ordered_partitions,
)
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)

MAX_NODES = 14
"""Refuse graphs with more nodes than this."""
MAX_DEVICES = 16
"""Refuse when more devices than this are usable (``min(devices, nodes * max(b))``)."""
MAX_PARTITIONS = 50_000
"""Refuse when the graph has more ordered convex partitions (into at most ``min(nodes, devices)``
stages) than this."""


@dataclass(frozen=True)
class ExactResult:
    """Outcome of :func:`search_exact`.

    ``best``: the least-time candidate found strictly below ``upper_bound`` (``None`` if none);
    ``finished``: the enumeration completed, so no candidate of the space that fits in memory beats
    ``iteration_time`` (``upper_bound`` when ``best`` is ``None``); ``required_memory``: when nothing
    fits and the search finished, the least per-device memory with which some candidate fits.
    """

    best: Candidate | None
    iteration_time: float
    finished: bool
    partitions: int
    pairs: int
    pairs_searched: int
    simulated: int
    seconds: float
    usable_devices: int
    required_memory: float | None = None


class _Timeout(Exception):
    pass


def _check_size(graph: Graph, usable: int) -> None:
    n = len(graph.nodes)
    if n > MAX_NODES:
        raise SearchSpaceTooLargeError(
            f"exact: the graph has {n} nodes, more than the limit {MAX_NODES}; use gpp or graphpipe"
        )
    if usable > MAX_DEVICES:
        raise SearchSpaceTooLargeError(
            f"exact: {usable} usable devices, more than the limit {MAX_DEVICES}; use gpp or graphpipe"
        )


def search_exact(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    deadline: float | None = None,
    micro_batch_sizes: Sequence[int] | None = None,
    max_stages: int | None = None,
    upper_bound: float = math.inf,
) -> ExactResult:
    """The candidate of least simulated iteration time (module docstring), or the proof that none
    beats ``upper_bound``.  ``deadline`` (``time.perf_counter()`` value) stops it with
    ``finished=False``."""
    search = _ExactSearch(graph, cluster, mini_batch_size, deadline, micro_batch_sizes, max_stages, upper_bound)
    try:
        search.enumerate_partitions()
        search.bound_pairs()
        search.search_pairs()
    except _Timeout:
        return search.result(False)
    return search.result(True)


class _ExactSearch:
    """The phases of :func:`search_exact`: the ordered partitions, a lower bound per (partition,
    ``b``) pair, and the pairs searched in increasing bound until the best simulated time beats it."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        deadline: float | None,
        micro_batch_sizes: Sequence[int] | None,
        max_stages: int | None,
        upper_bound: float,
    ) -> None:
        self.t0 = time.perf_counter()
        self.graph, self.cluster, self.B, self.deadline, self.upper_bound = (
            graph,
            cluster,
            mini_batch_size,
            deadline,
            upper_bound,
        )
        self.sizes = check_micro_batch_sizes(mini_batch_size, micro_batch_sizes)
        n_nodes = len(graph.nodes)
        self.usable = min(cluster.devices, n_nodes * max(self.sizes))
        _check_size(graph, self.usable)
        self.const_bw = constant_bandwidth(cluster)
        self.fastest = self.const_bw if self.const_bw is not None else link_bandwidths(cluster)[1]
        self.terms = TimeTerms.of(graph, cluster, mini_batch_size)
        self.limit = cluster.memory_bytes * (1 + MEMORY_REL_TOL)
        self.slots = min(self.usable, n_nodes, max_stages or n_nodes)
        self.state = {"best": None, "time": upper_bound, "simulated": 0, "searched": 0}
        self.parts: list[tuple[tuple[str, ...], ...]] = []
        self.pairs: list[PairBounds] = []
        self.structure: list[tuple] = []
        self.mem_need = math.inf
        self.opts_of = {b: device_options(b, self.usable) for b in self.sizes}
        # per (stage nodes, b): compute C(d), forward compute per degree, weight, activation bytes
        self.stage_tab: dict[tuple[tuple[str, ...], int], tuple[list[float], list[float], float, float]] = {}

    def tick(self) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise _Timeout

    def result(self, finished: bool) -> ExactResult:
        state = self.state
        need = self.mem_need if finished and state["best"] is None and math.isinf(self.upper_bound) else None
        return ExactResult(
            state["best"],
            state["time"],
            finished,
            len(self.parts),
            len(self.pairs),
            state["searched"],
            state["simulated"],
            time.perf_counter() - self.t0,
            self.usable,
            None if need is None or math.isinf(need) else need,
        )

    def enumerate_partitions(self) -> None:
        for p in ordered_partitions(self.graph, self.slots, every_order=self.const_bw is None):
            self.tick()
            self.parts.append(p)
            if len(self.parts) > MAX_PARTITIONS:
                raise SearchSpaceTooLargeError(
                    f"exact: more than {MAX_PARTITIONS} ordered convex partitions into at most {self.slots} stages; "
                    "pass max_stages=... or use gpp"
                )

    def tab(self, nodes: tuple[str, ...], b: int) -> tuple[list[float], list[float], float, float]:
        r = self.stage_tab.get((nodes, b))
        if r is None:
            graph, gs = self.graph, self.graph.micro_batch_sizes
            cs, fs = [], []
            for d in self.opts_of[b]:
                cf = cb = 0.0
                for v in nodes:
                    nd = graph.node(v)
                    cf += interp_time(nd.fw_time, gs, b / d)
                    cb += interp_time(nd.bw_time, gs, b / d)
                cf += len(nodes) * self.terms.op_fw
                cb += len(nodes) * self.terms.op_bw
                cs.append(cf + cb)
                fs.append(cf)
            r = self.stage_tab[(nodes, b)] = (
                cs,
                fs,
                sum(graph.node(v).weight_bytes for v in nodes),
                sum(graph.node(v).activation_bytes for v in nodes),
            )
        return r

    def bound_pairs(self) -> None:
        """Every (partition, ``b``) pair within memory with its lower bound, sorted by it."""
        graph = self.graph
        for i, p in enumerate(self.parts):
            self.tick()
            stage_of = {v: s for s, nodes in enumerate(p) for v in nodes}
            edges = stage_graph_edges(graph, stage_of)
            succ: list[list[int]] = [[] for _ in p]
            for a, c in edges:
                succ[a].append(c)
            depth = [0] * len(p)
            for s in reversed(range(len(p))):  # parts are in topological order
                depth[s] = max((depth[t] + 1 for t in succ[s]), default=0)
            tr = stage_transfers(graph, stage_of)
            self.structure.append((edges, succ))
            # one transfer half costs latency + bytes * (b/d) / bandwidth (the fastest link here)
            n_tr = [len(tr.get(s, ())) for s in range(len(p))]
            bytes_tr = [sum(nb for _, nb in tr.get(s, ())) for s in range(len(p))]
            for b in self.sizes:
                self._bound_pair(i, p, b, edges, depth, n_tr, bytes_tr)
        self.pairs.sort(key=lambda q: (q.bound, q.b, q.part))

    def _bound_pair(
        self,
        i: int,
        p: tuple[tuple[str, ...], ...],
        b: int,
        edges: Sequence[tuple[int, int]],
        depth: list[int],
        n_tr: list[int],
        bytes_tr: list[float],
    ) -> None:
        """Partition ``i`` at ``b``: its tables and lower bound, or its memory need when it does not fit."""
        B, usable, limit, fastest = self.B, self.usable, self.limit, self.fastest
        lat, osf = self.cluster.latency, self.cluster.optimizer_state_factor
        n, opts = B // b, self.opts_of[b]
        work, ar, fwd, bwd, mem = [], [], [], [], []
        for s, nodes in enumerate(p):
            cs, fs, weight, act = self.tab(nodes, b)
            held = in_flight_samples(depth[s], b, B)
            halves = [n_tr[s] * lat + bytes_tr[s] * (b / d) / fastest for d in opts]
            work.append([n * (cs[j] + 2 * halves[j]) for j in range(len(opts))])
            ar.append([self.terms.tail(weight, d, fastest, b) for d in opts])
            fwd.append([fs[j] + halves[j] for j in range(len(opts))])
            bwd.append([cs[j] - fs[j] + halves[j] for j in range(len(opts))])
            mem.append([osf * weight + held / d * act for d in opts])
        fits = [[j for j in range(len(opts)) if mem[s][j] <= limit] for s in range(len(p))]
        if any(not f for f in fits) or sum(opts[f[0]] for f in fits) > usable:
            self.mem_need = min(self.mem_need, _least_peak_memory(mem, opts, usable))
            return
        head, tail = [0.0] * len(p), [0.0] * len(p)
        for a, c in edges:  # sorted by source, sources in topological order
            head[c] = max(head[c], head[a] + min(fwd[a][j] for j in fits[a]))
            tail[c] = max(tail[c], min(bwd[a][j] + max(ar[a][j], tail[a]) for j in fits[a]))
        bound = max(head[s] + min(work[s][j] + max(ar[s][j], tail[s]) for j in fits[s]) for s in range(len(p)))
        self.pairs.append(PairBounds(i, b, opts, work, ar, fwd, bwd, mem, bound))

    def search_pairs(self) -> None:
        for q in self.pairs:
            self.tick()
            if q.bound >= self.state["time"]:
                break
            self.state["searched"] += 1
            search_pair(
                self.graph,
                self.cluster,
                self.B,
                q,
                self.parts[q.part],
                self.structure[q.part],
                self.usable,
                self.limit,
                self.state,
                self.tick,
            )


def _least_peak_memory(mem: list[list[float]], opts: Sequence[int], devices: int) -> float:
    """Least ``max_s mem[s][d_s]`` over degrees with ``sum d_s <= devices`` (memory falls with ``d``)."""
    for T in sorted({m for row in mem for m in row}):
        total = 0
        for row in mem:
            js = [j for j in range(len(opts)) if row[j] <= T]
            if not js:
                break
            total += min(opts[j] for j in js)
        else:
            if total <= devices:
                return T
    return math.inf
