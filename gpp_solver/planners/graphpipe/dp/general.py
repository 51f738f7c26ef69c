"""GraphPipe's stage DP with per-stage micro-batch sizes and kFkB ``k`` (§5 "DP subproblem", §6).

The uniform-``b`` kernel (:mod:`gpp_solver.planners.graphpipe.dp.kernel`) carries only a stage *depth*, which is exact
for one micro-batch size and 1F1B.  With a micro-batch size ``b`` and a ``k`` per stage, Table 2
(:func:`gpp_solver.plan.schedule.compute_in_flight`) needs the successor side's schedule configuration
— the paper's ``c_b = (i_b, b_b, k_b)`` — and a DP subproblem returns its source stage's
configuration ``(i_f, b_f, k_f)``.  This module does that over the same SP tree and segments.

**In-flight semantics (what the DP and its brute-force test compute).**  Algorithm 2 on the
*SP stage order*: stage ``x`` precedes ``y`` when some operator of ``x`` precedes some operator of
``y`` in the (SP-ized) order of the tree; ``i_x = k_x b_x`` for a stage with no successor, else
``max_y ComputeInFlight(k_x, b_x, k_y, b_y, i_y)`` over every later stage ``y``.  Table 2 is
``i_y + delta(c_x, c_y)`` with ``delta`` satisfying the triangle inequality
``delta(x, z) <= delta(x, y) + delta(y, z)`` (checked for every configuration in the tests), and
``ComputeInFlight >= k_x b_x``; so the maximum over every later stage equals the maximum over the
*immediate* successors of the order (its Hasse diagram, which is what the SP tree hands a subtree:
the source stages of the block after it), and it is an **upper bound** of what ``plan_build``
computes on the real stage graph (whose edges, skip edges included, all lie in the order).  The
plan's memory is therefore never above the DP's figure; it equals it when the stage graph's order is
the SP order (no SP-ized dependency, no missing skip in the order).

**State.**  A successor side with several stages (a parallel block follows) of different
configurations is not summarised by one ``(i, b, k)``: Algorithm 2 takes the max over successors
of ``i_y + delta(c_x, c_y)``, which depends on each ``c_y``.  The summary used here is exact:
``G[c] = `` the in-flight count a predecessor stage of configuration ``c`` would get,
for every configuration ``c`` (a vector; merging parallel branches is an element-wise max, "no
successor" is ``G[c] = k b``).  For tree node ``T`` and successor summary ``G``, the DP returns the
Pareto set of ``(devices, source summary)`` over stagings of ``T`` meeting the target TPS and memory
(a smaller summary is never worse for the stages before: Table 2 is monotone in ``i_y``).

**Stage figures** (as :mod:`gpp_solver.planners.graphpipe.dp.stage_dp`): TPS is the uniform DP's upper-bound estimate at the
stage's own ``b`` and ``d`` (``TPS(S) = (C+comm)/b_S + A/B``); memory ``osf*W + peak/d * A`` with
``peak = clamp(ceil(i/b), 1, B/b) * b`` — exactly the peak of the kFkB order ``plan_build`` derives
from ``i``.  Search space: SP-tree segments, ``b`` from ``micro_batch_sizes`` (``B % b == 0``), ``k``
from ``k_options``, degrees with ``b % d == 0``.  The bottleneck TPS is found by binary search over
the sorted distinct stage TPS values (as :mod:`gpp_solver.binary_search`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.errors import TimeLimitError
from gpp_solver.plan.schedule import compute_in_flight
from gpp_solver.planners.graphpipe.dp.kernel import check_deadline
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.sp_tree import SPDecomposition
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)

__all__ = ["GeneralStage", "GeneralSearch", "GeneralStageDP", "in_flight_delta"]


def in_flight_delta(kx: int, bx: int, ky: int, by: int) -> int:
    """Table 2 as ``ComputeInFlight(kx, bx, ky, by, iy) - iy`` (it does not depend on ``iy``)."""
    return compute_in_flight(kx, bx, ky, by, 0)


@dataclass(frozen=True)
class GeneralStage:
    """One stage chosen by the DP: operators, degree, micro-batch size, ``k``, the DP's in-flight
    bound (samples, Table 2 on the SP stage order) and TPS estimate (an upper bound of the exact)."""

    nodes: tuple[str, ...]
    degree: int
    micro_batch_size: int
    k: int
    in_flight_bound: int
    tps_estimate: float
    first: int  # position of its first operator in the tree's leaf order


@dataclass(frozen=True)
class GeneralSearch:
    tps: float  # smallest candidate target the DP meets
    stages: tuple[GeneralStage, ...]
    probes: int
    candidates: int
    exact: bool  # False when the deadline stopped the bisection


class GeneralStageDP:
    """The DP for one graph, cluster and mini-batch size, per-stage ``b`` and ``k``."""

    def __init__(
        self,
        graph: Graph,
        cluster: Cluster,
        mini_batch_size: int,
        *,
        micro_batch_sizes: Sequence[int],
        k_options: Sequence[int] = (1,),
        decomposition: SPDecomposition | None = None,
        degree_options: Sequence[int] | None = None,
        max_devices: int | None = None,
    ) -> None:
        self.base = StageDP(
            graph,
            cluster,
            mini_batch_size,
            decomposition=decomposition,
            degree_options=degree_options,
            max_devices=max_devices,
            shared_sinks=False,
        )
        self.B, self.D = mini_batch_size, self.base.D
        self.idx = self.base.idx
        self.sizes = tuple(sorted(set(micro_batch_sizes)))
        self.configs = tuple((b, k) for b in self.sizes for k in sorted(set(k_options)))
        C = len(self.configs)
        #: delta[x][y]: Table 2's increment for a stage of configuration x before one of y
        self.delta = [[in_flight_delta(kx, bx, ky, by) for (by, ky) in self.configs] for (bx, kx) in self.configs]
        self.sink = tuple(k * b for b, k in self.configs)
        self.W = [float(x) for x in self.base.W]
        self.A = [float(x) for x in self.base.A]
        self.osf = cluster.optimizer_state_factor
        self.memory = cluster.memory_bytes
        self._tps = {b: self.base.tables(b) for b in self.sizes}
        self._C = C

    # ------------------------------------------------------------------ candidates
    def candidates(self) -> np.ndarray:
        """Sorted distinct stage TPS estimates over every segment, size and degree."""
        return np.unique(np.concatenate([tb.tps.ravel() for tb in self._tps.values()]))

    # ------------------------------------------------------------------ one pass
    def pareto(
        self, t: float, memory: float | None = None, deadline: float | None = None
    ) -> list[tuple[int, tuple, object]]:
        """Pareto set ``(devices, source summary, trace)`` of the whole graph at target ``t``
        (devices ``<= D``); empty when no staging meets ``t`` and memory.  :class:`TimeLimitError`
        when ``deadline`` passes (checked at every child of every tree node solved)."""
        mem = self.memory if memory is None else memory
        key = (float(t), float(mem))
        last = getattr(self, "_last_feasible", None)  # a search's answer is its latest feasible pass:
        if last is not None and last[0] == key:  # stages() and stage_sets() reuse it
            return last[1]
        out = _ParetoPass(self, t, mem, deadline).node(self.idx.root[1], self.sink)
        if out:
            self._last_feasible = (key, out)
        return out

    def feasible(self, t: float, memory: float | None = None, deadline: float | None = None) -> bool:
        return bool(self.pareto(t, memory, deadline))

    def stages(self, t: float) -> list[GeneralStage]:
        """The stages of a plan meeting ``t`` with the fewest devices (first such in a fixed order)."""
        sets = self.stage_sets(t)
        if not sets:
            raise ValueError(f"target {t!r} is infeasible")
        return sets[0]

    def stage_sets(self, t: float) -> list[list[GeneralStage]]:
        """Every staging of the root's Pareto set at ``t`` (fewest devices first)."""
        out = []
        for _, _, trace in self.pareto(t):
            out.append(self._unwind(trace))
        return out

    def _unwind(self, trace) -> list[GeneralStage]:
        out: list[GeneralStage] = []
        stack = [trace]
        while stack:
            tr = stack.pop()
            if tr is None:
                continue
            if tr[0] == "stage":
                _, g, ci, d, i = tr
                b, k = self.configs[ci]
                lo, hi = int(self.idx.seg_lo[g]), int(self.idx.seg_hi[g])
                tb = self._tps[b]
                out.append(
                    GeneralStage(
                        tuple(self.idx.leaf_order[lo:hi]), d, b, k, i, float(tb.tps[g, tb.degrees.index(d)]), lo
                    )
                )
            else:
                stack.extend(tr)
        out.sort(key=lambda s: s.first)
        return out

    # ------------------------------------------------------------------ searches
    def search(self, *, deadline: float | None = None) -> GeneralSearch | None:
        """Smallest candidate TPS the DP meets (binary search on sorted candidates); ``None`` when no
        staging fits in memory at any TPS.  :class:`TimeLimitError` when ``deadline`` passes before
        the first pass finished (no staging known yet)."""
        cands = self.candidates()
        if not len(cands) or not self.feasible(float(cands[-1]), deadline=deadline):
            return None
        lo, hi, probes, exact = 0, len(cands) - 1, 1, True
        while lo < hi:
            if deadline is not None and time.perf_counter() > deadline:
                exact = False
                break
            mid = (lo + hi) // 2
            probes += 1
            try:
                fits = self.feasible(float(cands[mid]), deadline=deadline)
            except TimeLimitError:
                exact = False
                break
            if fits:
                hi = mid
            else:
                lo = mid + 1
        t = float(cands[hi])
        return GeneralSearch(t, tuple(self.stages(t)), probes + 1, len(cands), exact)

    def min_memory(self, *, deadline: float | None = None) -> float | None:
        """Smallest memory per device with which some staging fits in ``D`` devices (any TPS), by
        binary search over every stage memory figure; ``None`` when the deadline stops it first."""
        vals = []
        for b in self.sizes:
            degs = np.asarray(self._tps[b].degrees, dtype=float)
            peaks = b * np.arange(1, self.B // b + 1, dtype=float)
            W, A = np.asarray(self.W), np.asarray(self.A)
            vals.append(
                (self.osf * W[:, None, None] + peaks[None, None, :] / degs[None, :, None] * A[:, None, None]).ravel()
            )
        cands = np.unique(np.concatenate(vals))
        lo, hi = 0, len(cands) - 1
        try:
            if not self.feasible(math.inf, float(cands[hi]) * (1 + 1e-12), deadline):
                return None
        except TimeLimitError:
            return None
        while lo < hi:
            if deadline is not None and time.perf_counter() > deadline:
                return None
            mid = (lo + hi) // 2
            try:
                fits = self.feasible(math.inf, float(cands[mid]) * (1 + 1e-12), deadline)
            except TimeLimitError:
                return None
            if fits:
                hi = mid
            else:
                lo = mid + 1
        return float(cands[lo])


def _pareto(entries: list) -> list:
    """Entries ``(devices, summary, trace)`` not dominated (fewer-or-equal devices and an
    element-wise smaller-or-equal summary); order: devices, then summary, deterministic."""
    entries.sort(key=lambda e: (e[0], e[1]))
    kept: list = []
    for e in entries:
        dv, G = e[0], e[1]
        if any(k[0] <= dv and all(a <= c for a, c in zip(k[1], G)) for k in kept):
            continue
        kept.append(e)
    return kept


class _ParetoPass:
    """One pass of :meth:`GeneralStageDP.pareto` at target ``t`` and memory ``mem``: the Pareto sets
    of every tree node (memoised per in-flight summary ``G``) and the stage options of every
    segment."""

    def __init__(self, dp: GeneralStageDP, t: float, mem: float, deadline: float | None) -> None:
        self.dp, self.mem, self.deadline = dp, mem, deadline
        self.ok = {b: (tb.tps <= t, tb.degrees) for b, tb in dp._tps.items()}
        self.stage_memo: dict[tuple[int, int, int], tuple] = {}
        self.memo: dict[tuple[int, tuple], list] = {}

    def stage_options(self, g: int, G: tuple) -> list:
        """Segment ``g`` as one stage under summary ``G``: per configuration its first degree meeting
        the target and the memory (devices, new summary, trace)."""
        dp, mem, stage_memo, D, C = self.dp, self.mem, self.stage_memo, self.dp.D, self.dp._C
        out = []
        for ci, (b, _k) in enumerate(dp.configs):
            i = G[ci]
            n = dp.B // b
            peak = max(1, min(n, -(-i // b))) * b
            key = (g, ci, i)
            hit = stage_memo.get(key)
            if hit is None:
                okb, degs = self.ok[b]
                hit = ()
                for j, d in enumerate(degs):
                    if okb[g, j] and dp.osf * dp.W[g] + peak / d * dp.A[g] <= mem:
                        row = dp.delta
                        summ = tuple(i + row[cx][ci] for cx in range(C))
                        hit = (d, summ, ("stage", g, ci, d, i))
                        break
                stage_memo[key] = hit
            if hit and hit[0] <= D:
                out.append(hit)
        return out

    def node(self, t_id: int, G: tuple) -> list:
        key = (t_id, G)
        got = self.memo.get(key)
        if got is not None:
            return got
        kind, kids = self.dp.idx.nodes[t_id]
        res = self._series(t_id, kids, G) if kind == "S" else self._parallel(t_id, kids, G)
        self.memo[key] = res
        return res

    def _options(self, t_id: int, kids: list, p: int, q: int, G: tuple) -> list:
        """Children ``p..q`` as one stage, or child ``p`` solved recursively (``q == p``, a tree node)."""
        if q == p and kids[p][0] == "node":
            return self.node(kids[p][1], G)
        return self.stage_options(int(self.dp.idx.seg[t_id][p, q]), G)

    def _series(self, t_id: int, kids: list, G: tuple) -> list:
        D, k = self.dp.D, len(kids)
        suf: list[list] = [[] for _ in range(k + 1)]
        suf[k] = [(0, G, None)]
        for p in range(k - 1, -1, -1):
            check_deadline(self.deadline)
            cand = []
            for q in range(p, k):
                for dv2, G2, tr2 in suf[q + 1]:
                    for dv1, G1, tr1 in self._options(t_id, kids, p, q, G2):
                        if dv1 + dv2 <= D:
                            cand.append((dv1 + dv2, G1, (tr1, tr2)))
            suf[p] = _pareto(cand)
        return suf[0]

    def _parallel(self, t_id: int, kids: list, G: tuple) -> list:
        D, k = self.dp.D, len(kids)
        par: list[list] = [[] for _ in range(k + 1)]
        par[k] = [(0, None, None)]
        for p in range(k - 1, -1, -1):
            check_deadline(self.deadline)
            cand = []
            for q in range(p, k):
                opts = self._options(t_id, kids, p, q, G)
                for dv2, G2, tr2 in par[q + 1]:
                    for dv1, G1, tr1 in opts:
                        if dv1 + dv2 <= D:
                            merged = G1 if G2 is None else tuple(map(max, G1, G2))
                            cand.append((dv1 + dv2, merged, (tr1, tr2)))
            par[p] = _pareto(cand)
        return par[0]
