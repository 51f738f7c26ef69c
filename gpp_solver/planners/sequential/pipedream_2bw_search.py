"""PipeDream-2BW's ``(w, d, b)`` space (:mod:`.pipedream_2bw`) searched lazily: the enumeration,
the cheap bounds that order it, and the pricing and simulation of the configurations that can
still win (:class:`LazySearch`, whose docstring says why its answer is that of pricing everything)."""

from __future__ import annotations

import heapq
import time as _time
from typing import Any

import numpy as np

from gpp_solver.cost.model import node_compute
from gpp_solver.plan.build import build_plan
from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core
from gpp_solver.planners.sequential.equal_partition import equal_partition
from gpp_solver.planners.sequential.options import PipeDream2BWOptions
from gpp_solver.planners.sequential.seq_eval import MARGIN, SequentialPricer
from gpp_solver.types import Cluster, Graph, Plan, SearchInfo, Status

#: relative slack of the cheap bounds below the priced one (their sums are in another order)
_CHEAP_SLACK = 1e-9


def enumerate_configurations(
    mini_batch_size: int, devices: int, core_nodes: int, micro_batch_sizes: Any
) -> list[tuple[int, int, int]]:
    """Every ``(b, w, d)``: ``b`` a candidate micro-batch size, ``w`` stages (at most the devices and
    the core nodes), ``d`` replicas dividing ``b`` with ``w * d`` devices at most."""
    configs: list[tuple[int, int, int]] = []
    for b in candidate_micro_batches(mini_batch_size, micro_batch_sizes):
        divisors = [d for d in range(1, b + 1) if b % d == 0]  # d | b: no loop over unusable devices
        for w in range(1, min(devices, core_nodes) + 1):
            for d in divisors:
                if d > devices // w:
                    break
                configs.append((b, w, d))
    return configs


class LazySearch:
    """PipeDream-2BW's space searched lazily.

    **Lazy pricing.**  Every configuration is enumerated, but priced (:mod:`.seq_eval`: memory
    with two weight versions, a lower bound ``L`` on the simulated iteration time) only when it
    might be needed.  Two cheap bounds stand below ``L`` (``n = B // b`` micro-batches, ``c_s``
    the forward + backward time of stage ``s``'s core nodes at ``b / d`` samples, ``a`` the
    negative part of the detached nodes' times, 0 for real profiles; ``L >= n (fwd + bwd)(s)``
    and ``fwd + bwd >= c_s + a`` since transfers, all-reduce and the first forward's wait are
    non-negative):

    - ``L0 = max(n (sum_s c_s / w + a), P)``, from the graph's total alone (the largest stage is at
      least the mean one) and ``P``, the longest path of forward + backward times at ``b / d``
      through the operator graph when no time is negative: the first micro-batch's forward runs
      through the stages that hold the path in order, each stage's forward lasting at least its
      operators' sum, then its backward back through them (``P`` bounds the *simulated* time,
      not ``L``: see below);
    - ``L1 = max_s (n (c_s + a) + A_s)``, from the equal-compute cuts of ``(w, b / d)``, with
      ``A_s`` the all-reduce of stage ``s``'s core weights among its ``d`` replicas (``L`` adds
      ``max(all-reduce, backward wait) >= `` the all-reduce of all its weights, and the all-reduce
      grows with the weights, which are non-negative; with a negative weight ``A_s = 0``);

    each less a slack of ``1e-9 n sum |f| + |g|`` for its sums being rounded in another order.
    A heap holds every configuration at its best known bound, and is popped in increasing
    ``(bound, priced, index)`` order: a configuration at ``L0`` gets its cuts and ``L1`` (or is set
    aside unpriced when its stages' core nodes alone need more than the cap:
    ``(osf + 1) W + b / d * act``, one micro-batch in flight), one at ``L1`` is priced (a
    memory-infeasible one leaves), one at ``L`` is built and simulated, as
    :func:`.seq_eval.select_by_simulation` does, until the popped bound exceeds the best simulated
    time by the relative ``MARGIN``.

    A priced configuration waits in the heap at ``max(L, P)``.

    **Same answer as pricing everything.**  Every bound in the heap is at most its
    configuration's simulated iteration time (``L0``, ``L1`` and ``L`` are at most ``L``; ``P``
    bounds the simulation directly), and the search stops when the least bound left exceeds the
    best simulated time so far by ``MARGIN``: every configuration not built is slower than the
    best one built.  The pick is the argmin of ``(iteration_time, w * d, w, b)`` over the plans
    built (unique per configuration), so it is the argmin over the whole space — what the
    exhaustive ``select_by_simulation`` (which builds every configuration with
    ``L <= best * (1 + MARGIN)``, the argmin among them) returns; the lazy search builds at most
    those.  When no configuration fits, nothing stops the search early, every configuration is
    priced (those set aside too) and ``least_need`` is exact.

    **Time limit.**  After the deadline the search stops as soon as one plan is accepted (then
    ``search.status`` is ``time-limit`` and the plan the best built so far); if none was built
    yet, the priced memory-feasible configurations are built in increasing ``L`` (pricing goes
    on only while there are none), as the exhaustive loop built those it had enumerated.
    """

    def __init__(
        self, graph: Graph, cluster: Cluster, mini_batch_size: int, o: PipeDream2BWOptions, deadline: float | None
    ) -> None:
        self.graph, self.cluster, self.B, self.deadline = graph, cluster, mini_batch_size, deadline
        self.balance = o.balance
        self.core, self.inputs, self.sinks = pipedream_core(graph)
        core_set = set(self.core)
        self.order = [v for v in graph.topo_order if v in core_set]
        self.cap = cluster.memory_bytes
        self.pricer = SequentialPricer(graph, cluster, mini_batch_size, self.order, self.inputs, self.sinks)
        idx = graph.index
        self.core_idx = np.asarray([idx[v] for v in self.order], dtype=np.int64)
        self.det_idx = np.asarray([idx[v] for v in list(self.inputs) + list(self.sinks)], dtype=np.int64)
        self.topo = [idx[v] for v in graph.topo_order]
        self.topo_preds = [[idx[p] for p in graph.preds(v)] for v in graph.topo_order]
        self.sums_at: dict[float, tuple[np.ndarray, float, float, float]] = {}
        self.path_at: dict[float, float] = {}
        self.weights_at: dict[float, list[float]] = {}
        self.cuts_at: dict[tuple[float, int], list[int]] = {}
        self.layouts: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        # memory: a stage needs at least (osf + 1) W + b / d * act of its core nodes (one micro-batch
        # in flight; detached nodes only add), so a configuration over the cap by that is set aside
        # unpriced (and priced only if nothing fits, for ``least_need``)
        t = self.pricer.tables
        self.osf = cluster.optimizer_state_factor
        self.core_weight, self.core_act = t.weight[self.core_idx], t.activation[self.core_idx]
        self.mem_filter = bool(np.all(t.weight >= 0.0) and np.all(t.activation >= 0.0) and self.osf >= 0.0)
        self.ar_filter = bool(np.all(t.weight >= 0.0))
        self.configs = enumerate_configurations(mini_batch_size, cluster.devices, len(self.order), o.micro_batch_sizes)
        self.heap = self._opening_heap()
        self.level = [0] * len(self.configs)  # 0: at L0, 1: at L1, 2: priced (at L), 3: built
        self.ready: list[tuple[float, int, int]] = []  # the priced ones, for the time limit's last resort
        self.aside: list[int] = []
        self.built: dict[int, Plan] = {}
        self.best_time = float("inf")
        self.least_need = float("inf")
        self.priced = self.within = self.memory_checked = 0
        self.complete = True

    # ---- bounds and the pieces of a configuration, each cached
    def sums(self, x: float) -> tuple[np.ndarray, float, float, float]:
        """Core nodes' f + g at ``x``, their total, the detached nodes' negative part, the slack."""
        r = self.sums_at.get(x)
        if r is None:
            f, g = self.pricer.fw_bw_at(x)
            fg = (f + g)[self.core_idx]
            neg = float(np.minimum(f[self.det_idx], 0.0).sum() + np.minimum(g[self.det_idx], 0.0).sum())
            absum = float(np.abs(f).sum() + np.abs(g).sum())
            r = self.sums_at[x] = (fg, float(fg.sum()), neg, _CHEAP_SLACK * absum)
        return r

    def longest_path(self, x: float) -> float:
        """``P``: the longest path of f + g at ``x`` through the operator graph, less its slack (0
        when some time is negative)."""
        r = self.path_at.get(x)
        if r is None:
            f, g = self.pricer.fw_bw_at(x)
            r = 0.0
            if bool(np.all(f >= 0.0) and np.all(g >= 0.0)):
                fg = (f + g).tolist()
                end = [0.0] * len(fg)
                for v, ps in zip(self.topo, self.topo_preds):
                    end[v] = fg[v] + max((end[p] for p in ps), default=0.0)
                r = max(end) * (1.0 - _CHEAP_SLACK)
            self.path_at[x] = r
        return r

    def _opening_heap(self) -> list[tuple[float, int, int]]:
        """Every configuration at ``L0``."""
        heap: list[tuple[float, int, int]] = []
        for i, (b, w, d) in enumerate(self.configs):
            _, total, neg, slack = self.sums(b / d)
            n = self.B // b
            heap.append((max(n * (total / w + neg) - n * slack, self.longest_path(b / d)), 0, i))
        heapq.heapify(heap)
        return heap

    def cuts_of(self, b: int, w: int, d: int) -> list[int]:
        x = b / d if self.balance == "compute" else 0.0
        cuts = self.cuts_at.get((x, w))
        if cuts is None:
            weights = self.weights_at.get(x)
            if weights is None:
                graph, sizes = self.graph, self.graph.micro_batch_sizes
                weights = self.weights_at[x] = (
                    [
                        node_compute(
                            graph.node(v).fw_time, graph.node(v).bw_time, sizes, x, self.pricer.terms.node_overhead
                        )
                        for v in self.order
                    ]
                    if self.balance == "compute"
                    else [1.0] * len(self.order)
                )
            cuts = self.cuts_at[x, w] = equal_partition(weights, w)
        return cuts

    def layout(self, w: int, d: int) -> list[tuple[int, ...]]:
        """Stage ``s`` on devices ``[s d, (s + 1) d)``."""
        lay = self.layouts.get((w, d))
        if lay is None:
            lay = self.layouts[w, d] = [tuple(range(s * d, (s + 1) * d)) for s in range(w)]
        return lay

    def build(self, i: int) -> Plan | None:
        """Configuration ``i``'s plan, or ``None`` when it does not fit with two weight versions."""
        b, w, d = self.configs[i]
        cuts, order, graph = self.cuts_of(b, w, d), self.order, self.graph
        rows = [(order[cuts[s] : cuts[s + 1]], tuple(range(s * d, (s + 1) * d)), b) for s in range(w)]
        plan = build_plan(
            graph,
            self.cluster,
            attach_detached(graph, rows, self.inputs, self.sinks),
            self.B,
            planner="pipedream-2bw",
            search=SearchInfo(0.0, Status.OPTIMAL_WITHIN_SEARCH_SPACE),
        )
        need = max(st.predicted.memory_bytes + sum(graph.node(v).weight_bytes for v in st.nodes) for st in plan.stages)
        return plan if need <= self.cap else None

    def price_need(self, i: int) -> tuple[float | None, float]:
        """Configuration ``i``'s memory need (two weight versions) and, when it fits, its bound
        ``L`` (``None`` when over the cap: the time figures are not computed)."""
        b, w, d = self.configs[i]
        cuts = self.cuts_of(b, w, d)
        stage = np.repeat(np.arange(w), np.diff(cuts))
        mem, W = self.pricer.memory(stage, self.layout(w, d), b)
        self.memory_checked += 1
        need = float(np.max(mem + W))
        self.least_need = min(self.least_need, need)
        if need > self.cap * (1 + MARGIN):
            return None, need
        self.priced += 1
        return self.pricer.price(stage, self.layout(w, d), b).lower_bound, need

    def price_set_aside(self) -> None:
        for i in self.aside:
            self.price_need(i)

    # ---- the search
    def run(self) -> None:
        """Pop the heap until the least bound left exceeds the best simulated time by ``MARGIN``."""
        heap, level = self.heap, self.level
        while heap:
            bound, _, i = heap[0]
            if bound > self.best_time * (1.0 + MARGIN):
                break  # every configuration left has L >= bound
            if self.deadline is not None and _time.perf_counter() > self.deadline:
                self.complete = False
                if self.best_time < float("inf"):
                    break
                if self._build_ready():
                    continue
            heapq.heappop(heap)
            if level[i] == 3:
                continue
            if level[i] == 0:
                self._to_l1(i, bound)
            elif level[i] == 1:
                self._to_priced(i)
            else:  # the next configuration by (L, index): build it
                level[i] = 3
                self._accept(i, self.build(i))

    def _accept(self, i: int, plan: Plan | None) -> None:
        if plan is not None:
            self.built[i] = plan
            self.best_time = min(self.best_time, plan.predicted.iteration_time)

    def _build_ready(self) -> bool:
        """Past the deadline with no plan: build the priced configuration of least bound now (its
        entry in the heap is skipped when popped); False when none is priced yet."""
        ready = self.ready
        while ready and self.level[ready[0][2]] == 3:
            heapq.heappop(ready)  # built already
        if not ready:
            return False
        e = heapq.heappop(ready)
        self.level[e[2]] = 3
        self._accept(e[2], self.build(e[2]))
        return True

    def _to_l1(self, i: int, bound: float) -> None:
        """``L0`` -> ``L1``, or set aside for memory."""
        b, w, d = self.configs[i]
        cuts = self.cuts_of(b, w, d)
        if self.mem_filter:
            starts = cuts[:-1]
            wc = np.add.reduceat(self.core_weight, starts)
            ac = np.add.reduceat(self.core_act, starts)
            if float(np.max((self.osf + 1.0) * wc + b / d * ac)) * (1.0 - _CHEAP_SLACK) > self.cap * (1 + MARGIN):
                self.aside.append(i)
                return
        fg, _, neg, slack = self.sums(b / d)
        n = self.B // b
        per = n * (np.add.reduceat(fg, cuts[:-1]) + neg)
        if self.ar_filter and d > 1:
            ar = self.pricer.terms.tail(
                np.add.reduceat(self.core_weight, cuts[:-1]),
                np.full(w, float(d)),
                self.pricer.stage_bandwidths(self.layout(w, d)),
                b,
            )
            l1 = float(np.max(per + ar)) - _CHEAP_SLACK * float(np.max(ar))
        else:
            l1 = float(np.max(per))
        self.level[i] = 1
        heapq.heappush(self.heap, (max(bound, l1 - n * slack), 0, i))

    def _to_priced(self, i: int) -> None:
        """``L1`` -> ``L`` (priced), or out for memory."""
        b, _, d = self.configs[i]
        lower, _ = self.price_need(i)
        self.level[i] = 2
        if lower is None:
            return
        self.within += 1
        entry = (max(lower, self.longest_path(b / d)), 1, i)
        heapq.heappush(self.heap, entry)
        heapq.heappush(self.ready, entry)

    def pick(self) -> Plan | None:
        """The argmin of ``(iteration_time, w * d, w, b)`` over the plans built: the exhaustive loop's
        rule, in its order."""
        best: Plan | None = None
        best_key = None
        for i in sorted(self.built):
            b, w, d = self.configs[i]
            plan = self.built[i]
            key = (plan.predicted.iteration_time, w * d, w, b)
            if best_key is None or key < best_key:
                best, best_key = plan, key
        return best
