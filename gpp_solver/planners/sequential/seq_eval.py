"""Cheap exact pricing of sequential-pipeline candidates, so baselines simulate only a few plans.

The sequential baselines (PipeDream, PipeDream-2BW, Alpa) choose among candidate plans (micro-batch
sizes, stage counts, replication degrees) by *simulated* iteration time, and a simulation costs
``O(stages * B / b)`` Python steps.  This module prices a candidate without building it:

- :class:`SequentialPricer` maps a candidate (the pipeline stage of every core node, each stage's
  devices, the micro-batch size) to its stages under the shared cost model (its pricing core:
  ``comm_time``, ``TimeTerms.tail``, ``memory_per_device``), vectorised with numpy — it exists beside
  ``stage_costs`` because it prices thousands of candidates from a node->stage array without building
  any stage, and adds what ``stage_costs`` does not give (1F1B in-flight counts, a simulation bound):
  compute, transfers, all-reduce, the stage graph, the exact 1F1B peak in-flight samples and memory
  (``build_plan`` with ``k = 1`` and one micro-batch size: a stage ``j`` stages above the sinks
  holds ``min(n, j + 1) * b``), and a **lower bound** on the simulated iteration time: for every
  stage ``S``, its first forward cannot start before micro-batch 0 went forward through the
  longest chain of predecessors (``EF``), it runs ``n`` forwards and backwards back to back, and
  after its last backward comes its all-reduce or the last backwards of its predecessors with
  theirs (``BB``): ``T >= EF(S) + n (C + comm)(S) + max(A(S), BB(S))``.
- :func:`select_by_simulation` builds candidates in increasing order of that bound and stops when
  the next bound exceeds the best simulated time found (a small relative margin covers rounding),
  so the best candidate by simulated time is exactly the one an exhaustive loop would find.

The detached nodes (``Input`` sources, dangling sinks) are placed as
:func:`.sequential.attach_detached` places them.
"""

from __future__ import annotations

import logging
import time as _time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.cost.model import comm_time, memory_per_device
from gpp_solver.cost.tables import CostTables
from gpp_solver.cost.time_terms import TimeTerms
from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)

MARGIN = 1e-9  # relative slack of the bound against rounding differences with the simulator


@dataclass(frozen=True)
class Priced:
    """Figures of one candidate (arrays indexed by pipeline stage)."""

    lower_bound: float  # <= the simulated iteration time of the built plan
    memory: np.ndarray  # per-device memory of each stage (shared formula, 1F1B in-flight)
    weights: np.ndarray  # weight bytes of each stage
    per_micro_batch: np.ndarray  # C + comm of each stage


@dataclass(frozen=True)
class _Layout:
    """One device layout (stage ``s`` on ``devices[s]``): what pricing needs of it."""

    stage_bw: np.ndarray  # each stage's group bandwidth (its all-reduce's)
    pair_bw: dict  # stage-pair bandwidths met so far, keyed a * S + c (filled lazily)
    lo: np.ndarray  # each stage's least device
    hi: np.ndarray  # each stage's greatest device


class SequentialPricer:
    """Prices candidates of one graph, cluster and mini-batch size (module docstring)."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        core_order: Sequence[str],
        inputs: Sequence[str],
        sinks: Sequence[str],
    ) -> None:
        self.graph, self.cluster, self.B = graph, cluster, mini_batch_size
        self.terms = TimeTerms.of(graph, cluster, mini_batch_size)
        idx = graph.index
        self.core_idx = np.asarray([idx[v] for v in core_order], dtype=np.int64)
        self.n_nodes = len(graph.nodes)
        core_set = set(core_order)
        # attach rules: an input joins the earliest stage of its core consumers (default 0), a
        # sink the latest stage of its placed producers (default the last stage)
        self.inputs = [
            (idx[v], np.asarray([idx[s] for s in graph.succs(v) if s in core_set], dtype=np.int64)) for v in inputs
        ]
        placed = core_set | set(inputs)
        self.sinks = []
        for v in sinks:
            self.sinks.append((idx[v], np.asarray([idx[p] for p in graph.preds(v) if p in placed], dtype=np.int64)))
            placed.add(v)
        pairs = graph.edge_bytes_map
        self.src = np.asarray([idx[u] for u, _ in pairs], dtype=np.int64)
        self.dst = np.asarray([idx[v] for _, v in pairs], dtype=np.int64)
        self.ebytes = np.asarray(list(pairs.values()), dtype=np.float64)
        self.tables = CostTables(graph)
        self._bw: dict[tuple[int, ...], float] = {}
        self._layouts: dict[tuple[tuple[int, ...], ...], _Layout] = {}
        # the pair bandwidths by Cluster.bandwidth's own rule, vectorised: intra-node when the
        # least and the greatest device of the two stages share a node (two or more devices)
        self._node_rule = (
            type(cluster).bandwidth is Cluster.bandwidth
            and cluster.devices_per_node is not None
            and cluster.intra_node_bandwidth is not None
        )

    # ---------------------------------------------------------------------------------------
    def fw_bw_at(self, x: float) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward time of every node (graph order) at ``x`` samples."""
        return self.tables.fw_bw_at(x)

    def stage_bandwidths(self, devices: Sequence[tuple[int, ...]]) -> np.ndarray:
        """The bandwidth of each stage's device group (its all-reduce's), as :meth:`price` uses."""
        return self._layout(devices).stage_bw

    def _layout(self, devices: Sequence[tuple[int, ...]]) -> _Layout:
        """One device layout's figures (cached: a planner prices many partitions on one layout)."""
        lay = tuple(tuple(dv) for dv in devices)
        out = self._layouts.get(lay)
        if out is None:
            if len(self._layouts) >= 4096:
                self._layouts.clear()
            out = self._layouts[lay] = _Layout(
                np.asarray([self._bandwidth(dv) for dv in lay], dtype=np.float64),
                {},
                np.asarray([min(dv) for dv in lay], dtype=np.int64),
                np.asarray([max(dv) for dv in lay], dtype=np.int64),
            )
        return out

    def _bandwidth(self, devices: tuple[int, ...]) -> float:
        bw = self._bw.get(devices)
        if bw is None:
            bw = self._bw[devices] = self.cluster.bandwidth(devices)
        return bw

    def stage_of(self, core_stage: np.ndarray, n_stages: int) -> np.ndarray:
        """Pipeline stage of every node (graph order), detached nodes attached."""
        st = np.zeros(self.n_nodes, dtype=np.int64)
        st[self.core_idx] = core_stage
        for v, cons in self.inputs:
            st[v] = st[cons].min() if cons.size else 0
        for v, prods in self.sinks:
            st[v] = st[prods].max() if prods.size else n_stages - 1
        return st

    # ---------------------------------------------------------------------------------------
    def _transfers(self, st: np.ndarray, S: int):
        """Transfers across stage boundaries — one per (producer, consumer stage), of the largest
        bytes: producer stage, consumer stage, bytes, ``a * S + c`` keys — and the sorted stage
        edges (``keys``, sources, targets); ``None`` when nothing crosses."""
        su_e, sv_e = st[self.src], st[self.dst]
        cross = su_e != sv_e
        if not cross.any():
            return None
        u, sv, nb = self.src[cross], sv_e[cross], self.ebytes[cross]
        key = u * S + sv
        order = np.argsort(key, kind="stable")
        key, nb = key[order], nb[order]
        first = np.r_[True, key[1:] != key[:-1]]
        starts = np.nonzero(first)[0]
        nb = np.maximum.reduceat(nb, starts)
        key = key[starts]
        pu, pv = st[key // S], key % S
        pk = pu * S + pv
        sp = np.unique(pk)  # stage edges a -> c, by a then c
        ea, ec = sp // S, sp % S
        if bool((ea >= ec).any()):
            j = int(np.argmax(ea >= ec))
            raise AssertionError(f"stage edge {int(ea[j])}->{int(ec[j])} goes backwards in the pipeline order")
        return pu, pv, nb, pk, sp, ea.tolist(), ec.tolist()

    def _memory(
        self, st: np.ndarray, S: int, d: np.ndarray, b: int, edges_a: list[int], edges_c: list[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per-device memory and weights of each stage.  1F1B in-flight: (longest path to a sink
        + 1) micro-batches, at most n; edges in decreasing target order finish a stage's depth
        before it is read."""
        t = self.tables
        W = np.bincount(st, weights=t.weight, minlength=S)
        act = np.bincount(st, weights=t.activation, minlength=S)
        depl = [0] * S
        for i in np.argsort(np.asarray(edges_c, dtype=np.int64), kind="stable")[::-1].tolist():
            a, c = edges_a[i], edges_c[i]
            depl[a] = max(depl[a], depl[c] + 1)
        depth = np.asarray(depl, dtype=np.int64)
        in_flight = np.minimum(self.B // b, depth + 1) * b
        return memory_per_device(self.cluster.optimizer_state_factor, W, in_flight, d, act), W

    def memory(
        self, core_stage: np.ndarray, devices: Sequence[tuple[int, ...]], b: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """``price(...).memory`` and ``.weights``, the same figures, without the time figures (cheaper)."""
        S = len(devices)
        st = self.stage_of(core_stage, S)
        d = np.asarray([len(dv) for dv in devices], dtype=np.float64)
        tr = self._transfers(st, S)
        return self._memory(st, S, d, b, [], []) if tr is None else self._memory(st, S, d, b, tr[5], tr[6])

    def price(self, core_stage: np.ndarray, devices: Sequence[tuple[int, ...]], b: int) -> Priced:
        """Figures of the candidate whose core node ``i`` (``core_order``) is in stage
        ``core_stage[i]`` (pipeline order, 0-based), stage ``s`` on ``devices[s]``, micro-batch ``b``."""
        S = len(devices)
        n = self.B // b
        st = self.stage_of(core_stage, S)
        d = np.asarray([len(dv) for dv in devices], dtype=np.float64)
        x = b / d
        cf = np.zeros(S)
        cb = np.zeros(S)
        for xv in np.unique(x):
            f, g = self.fw_bw_at(float(xv))
            m = x[st] == xv
            cf += np.bincount(st[m], weights=f[m], minlength=S)
            cb += np.bincount(st[m], weights=g[m], minlength=S)
        comm = np.zeros(S)
        lay = self._layout(devices)
        edges_a: list[int] = []
        edges_c: list[int] = []
        tr = self._transfers(st, S)
        if tr is not None:
            pu, pv, nb, pk, sp, edges_a, edges_c = tr
            if self._node_rule:  # Cluster.bandwidth's rule on each pair's device range
                lo, hi = lay.lo, lay.hi
                ea, ec = sp // S, sp % S
                dpn = self.cluster.devices_per_node
                same = np.minimum(lo[ea], lo[ec]) // dpn == np.maximum(hi[ea], hi[ec]) // dpn
                bw_sp = np.where(same, self.cluster.intra_node_bandwidth, self.cluster.inter_node_bandwidth)
            else:
                bw_sp = []
                for k, a, c in zip(sp.tolist(), edges_a, edges_c):
                    bw_ = lay.pair_bw.get(k)
                    if bw_ is None:
                        bw_ = lay.pair_bw[k] = self._bandwidth(tuple(devices[a]) + tuple(devices[c]))
                    bw_sp.append(bw_)
            bw = np.asarray(bw_sp, dtype=np.float64)[np.searchsorted(sp, pk)]
            lat = self.cluster.latency
            comm += np.bincount(pu, weights=comm_time(nb, x[pu], bw, lat), minlength=S)
            comm += np.bincount(pv, weights=comm_time(nb, x[pv], bw, lat), minlength=S)
        memory, W = self._memory(st, S, d, b, edges_a, edges_c)
        # A(S) + O(S) in the array form: the scalar form's operations, element-wise
        ar = self.terms.tail(W, d, lay.stage_bw, b)
        fwd, bwd = cf + comm, cb + comm
        # the longest-path recurrences over the stage edges, on Python floats (the same IEEE
        # operations as on numpy scalars): edges in increasing source order finish every stage's
        # in-edges before its out-edges are used (sources precede targets); max is exact, so the
        # order within a stage's in-edges does not change the result
        fl, bl, al = fwd.tolist(), bwd.tolist(), ar.tolist()
        efl = [0.0] * S
        bbl = [0.0] * S
        for a, c in zip(edges_a, edges_c):
            efl[c] = max(efl[c], efl[a] + fl[a])
            bbl[c] = max(bbl[c], bl[a] + max(al[a], bbl[a]))
        ef, bb = np.asarray(efl), np.asarray(bbl)
        lower = float(np.max(ef + n * (fwd + bwd) + np.maximum(ar, bb)))
        return Priced(lower, memory, W, fwd + bwd)


def select_by_simulation(
    lower_bounds: Sequence[float], build: Callable[[int], Plan | None], deadline: float | None = None
) -> tuple[dict[int, Plan], bool]:
    """Build candidates in increasing ``lower_bounds`` order until the next bound exceeds the best
    simulated iteration time among the built plans (``build`` returns ``None`` for a candidate it
    rejects, e.g. over memory).  Returns ``{candidate: plan}`` of every plan built (the caller
    picks among them with its own rule, in its own order) and whether the search ran to its proof
    (``False`` when ``deadline`` stopped it after at least one plan was accepted)."""
    built: dict[int, Plan] = {}
    best = float("inf")
    for i in np.argsort(np.asarray(lower_bounds, dtype=np.float64), kind="stable").tolist():
        if lower_bounds[i] > best * (1.0 + MARGIN):
            break
        if deadline is not None and best < float("inf") and _time.perf_counter() > deadline:
            return built, False
        plan = build(i)
        if plan is not None:
            built[i] = plan
            best = min(best, plan.predicted.iteration_time)
    return built, True
