"""Piper's dynamic programme over downsets (Tarnawski et al. 2021, §4 and Appendix D) — a pure
numeric kernel; ``piper.py`` turns graphs into a :class:`PiperInstance` and results into plans.

A *downset* is a set of nodes closed under successors; every contiguous stage is ``D \\ D'`` for
downsets ``D' ⊂ D`` (Fact 4.2).  ``dp[D][k][s]`` is the least bottleneck TPS of a partition of ``D``
on at most ``k`` devices whose data-parallel degrees sum to at most ``s`` (the published code's
"at most" form: the empty set costs 0 everywhere and every table is made monotone in ``k``, ``s``):

    dp[D][k][s] = min over D' ⊂ D, t, d (d | N, d*t <= k, d <= s) of
                  max(dp[D'][k - d*t][s - d], TPS(D \\ D', t, d, s))

with ``TPS`` from ``piper_cost`` and ``s <= min(N, K)``.  The answer is the first ``(k, s)`` (by
``k`` then ``s``) reaching the least ``dp[V][k][s]``, as in the published code.

Speed-ups that change no result: stages whose lowest possible memory (at ``y = 1``) exceeds ``M``
are skipped.  Where the sub-downsets' tables are sparse (few *corners*, points where a table drops
along both ``k`` and ``s``) only the candidate points that can still matter once the table is made
monotone are written (``sparse.py``; the published code likewise writes only where ``dp[D']``
drops), every knapsack instance being solved first.  Otherwise the dense update runs, and knapsack
instances that need the heuristic are solved only where their lower bound (the all-fastest TPS)
could still improve the table.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpp_solver._backend.progress import ProgressBar
from gpp_solver.errors import SearchSpaceTooLargeError, SolverError, TimeLimitError
from gpp_solver.planners.piper.cost import INF, PiperInstance, StageCostKernel, fill_many
from gpp_solver.planners.piper.sparse import Breakpoints, dominators
from gpp_solver.planners.piper.sparse import update as sparse_update

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StageChoice:
    nodes: tuple[int, ...]
    t: int
    d: int
    slots: tuple[int, ...]  # label of the chosen slot of each node (same order as ``nodes``)
    tps: float


@dataclass(frozen=True)
class DPResult:
    value: float  # bottleneck TPS (or memory); inf when nothing fits
    devices: int
    s: int
    stages: tuple[StageChoice, ...]  # pipeline order (first stage first)
    downsets: int
    pairs: int


def enumerate_downsets(n: int, succ: list[int], limit: int) -> list[int]:
    """All successor-closed node sets as bit masks (``succ[v]``: mask of ``v``'s successors),
    sorted by size then value; raises :class:`SearchSpaceTooLargeError` once past ``limit``."""
    pred = [0] * n
    for v in range(n):
        m = succ[v]
        while m:
            low = m & -m
            pred[low.bit_length() - 1] |= 1 << v
            m ^= low
    seen = {0: sum(1 << v for v in range(n) if succ[v] == 0)}  # downset -> nodes that may be added
    stack = [0]
    while stack:
        D = stack.pop()
        add = seen[D]
        m = add
        while m:
            low = m & -m
            m ^= low
            E = D | low
            if E in seen:
                continue
            new_add = add & ~low
            pm = pred[low.bit_length() - 1]
            while pm:
                lp = pm & -pm
                pm ^= lp
                if succ[lp.bit_length() - 1] & ~E == 0:
                    new_add |= lp
            seen[E] = new_add
            if len(seen) > limit:
                raise SearchSpaceTooLargeError(
                    f"search space too large: more than {limit} downsets; raise max_downsets"
                )
            stack.append(E)
    return sorted(seen, key=lambda x: (x.bit_count(), x))


def _bits(masks: list[int], n: int) -> np.ndarray:
    nbytes = max(1, (n + 7) // 8)
    raw = np.frombuffer(b"".join(m.to_bytes(nbytes, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), nbytes), axis=1, bitorder="little")[:, :n].astype(bool)


class _Table:
    """Downsets as bit rows, their sub-downset lists and the dp table."""

    def __init__(self, inst: PiperInstance, downsets: list[int]) -> None:
        self.X = _bits(downsets, inst.n)
        self.packed = np.packbits(self.X, axis=1, bitorder="little")
        self.sizes = self.X.sum(axis=1)
        self.dp = np.full((len(downsets), inst.devices + 1, inst.bound_s + 1), INF)
        self.dp[0] = 0.0

    def subs(self, i: int) -> np.ndarray:
        """Indices of the proper sub-downsets of downset ``i``."""
        head = self.packed[: np.searchsorted(self.sizes, self.sizes[i])]
        return np.flatnonzero(((head & ~self.packed[i]) == 0).all(axis=1))


SPARSE_SHARE = 0.04
"""Use the breakpoints (``sparse.py``) when the sub-downsets' corners are fewer than this share of
their dense tables; both give the same table."""


def _update_dense(acc: np.ndarray, sub_dp: np.ndarray, stage: np.ndarray, dt: int, d: int) -> None:
    """``acc[k][s] = min(acc[k][s], max(sub_dp[r][k-dt][s-d], stage[r][s-d]))`` over rows ``r``, everywhere."""
    K1, S1 = acc.shape
    cand = np.maximum(sub_dp[:, : K1 - dt, : S1 - d], stage[:, None, :])
    np.minimum(acc[dt:, d:], cand.min(axis=0), out=acc[dt:, d:])


def _worth_solving(c, sub_dp: np.ndarray, acc: np.ndarray, dt: int, d: int, ycol: np.ndarray) -> np.ndarray:
    """The deferred knapsack instances ``(row, y)`` of ``c`` whose lower bound (the all-fastest TPS)
    beats the monotone table ``acc`` somewhere (only the hard columns ``s - d`` are compared)."""
    want = np.zeros(c.hard.shape, dtype=bool)
    hr = np.flatnonzero(c.hard.any(axis=1))
    hy = c.hard[hr][:, ycol]  # (H, S1+1-d)
    cols = np.flatnonzero(hy.any(axis=0))
    if len(cols) == 0:
        return want
    lo, hi = cols[0], cols[-1] + 1
    lb = np.where(hy[:, lo:hi], c.tf[hr][:, None], INF)
    better = (np.maximum(sub_dp[hr, : acc.shape[0] - dt, lo:hi], lb[:, None, :]) < acc[dt:, d + lo : d + hi]).any(
        axis=1
    )
    rr, ss = np.nonzero(better)
    want[hr[rr], ycol[lo + ss]] = True
    return want


def run_dp(
    inst: PiperInstance,
    downsets: list[int],
    *,
    objective: str = "tps",
    deadline: float | None = None,
    progress: bool = False,
) -> DPResult:
    """Fill the table over ``downsets`` (sorted by size, the empty set first, the full set last) and
    rebuild the best partition.  ``deadline`` (a ``time.monotonic()`` instant) raises SolverError."""
    tab = _Table(inst, downsets)
    ND = len(downsets)
    ker = StageCostKernel(inst, objective)
    fill = _Fill(inst, tab, ker, objective)
    bar = _progress(ND, progress)
    for i in range(1, ND):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeLimitError(f"time limit reached in Piper's DP after {i} of {ND} downsets")
        fill.row(i)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    full = ND - 1
    best, bk, bs = _first_best(tab.dp[full])
    if not np.isfinite(best):
        return DPResult(INF, 0, 0, (), ND, fill.pairs)
    stages = _reconstruct(inst, ker, tab, full, bk, bs, deadline)
    return DPResult(best, sum(st.t * st.d for st in stages), sum(st.d for st in stages), tuple(stages), ND, fill.pairs)


class _Fill:
    """The table's rows, one downset ``D`` at a time (:meth:`row`): every stage ``D \\ D'`` at every
    degree and device count, sparse (every knapsack now, through the breakpoints) or dense (the
    knapsacks only where their lower bound could improve the table)."""

    def __init__(self, inst: PiperInstance, tab: _Table, ker: StageCostKernel, objective: str) -> None:
        self.inst, self.tab, self.ker = inst, tab, ker
        self.K, self.S1 = inst.devices, inst.bound_s
        X, dp = tab.X, tab.dp
        self.limit = INF if objective == "memory" else inst.memory
        Xf = X.astype(float)
        self.unsup = {o.t: Xf @ (~o.supported).astype(float) for o in inst.degrees}
        # node-additive quantities of every downset; a stage D \ D' gets G[D] - G[D'] (no per-stage sums)
        self.G = {o.t: Xf @ ker.node_columns(o) for o in inst.degrees}
        self.c_in = c_in = np.zeros((inst.n, inst.n))
        np.add.at(c_in, (inst.src, inst.dst), 2 * inst.c)
        self.into = Xf @ c_in.sum(axis=0) - (Xf @ c_in * Xf).sum(axis=1)  # 2c over edges entering each D
        self.pairs = 0
        self.bps = Breakpoints(dp)
        self.bps.add(0, dp[0])
        # every (t, d) as an offset (dt, d), dominators first
        K, S1 = self.K, self.S1
        self.offsets = sorted((d * o.t, d) for o in inst.degrees for d in ker.ds if d * o.t <= K and d <= S1)
        self.combo = {(dt // d, d): c for c, (dt, d) in enumerate(self.offsets)}
        self.preds = dominators(self.offsets)

    def row(self, i: int) -> None:
        """Downset ``i``'s row of the table, made monotone, and its breakpoints."""
        tab, K, S1 = self.tab, self.K, self.S1
        subs = tab.subs(i)
        self.pairs += len(subs)
        acc = tab.dp[i]
        pending: list[tuple] = []
        sparse = self.bps.count(subs) < SPARSE_SHARE * len(subs) * (K + 1) * (S1 + 1)
        staged: dict[int, tuple] = {}
        z = np.where(tab.X[i], 0.0, 1.0) @ self.c_in  # 2c from outside D into each node
        for opt in self.inst.degrees:
            self._degree(i, opt, subs, z, acc, sparse, staged, pending)
        if staged:
            sparse_update(acc, self.bps, subs, self.offsets, self.preds, staged)
        if pending:  # monotone first: the lower-bound test compares against a finished table
            np.minimum.accumulate(acc, axis=0, out=acc)
            np.minimum.accumulate(acc, axis=1, out=acc)
        wants = [_worth_solving(c, sub_dp, acc, dt, d, ycol) for c, sub_dp, dt, d, ycol in pending]
        fill_many([p[0] for p in pending], wants)  # all at once, against the table before any of them
        for (c, sub_dp, dt, d, ycol), want in zip(pending, wants):
            use = want.any(axis=1)
            if use.any():
                _update_dense(acc, sub_dp[use], c.out[use][:, ycol], dt, d)
        np.minimum.accumulate(acc, axis=0, out=acc)
        np.minimum.accumulate(acc, axis=1, out=acc)
        self.bps.add(i, acc)

    def _degree(
        self,
        i: int,
        opt: Any,
        subs: np.ndarray,
        z: np.ndarray,
        acc: np.ndarray,
        sparse: bool,
        staged: dict[int, tuple],
        pending: list[tuple],
    ) -> None:
        """The stages ``D \\ D'`` at tensor-parallel option ``opt``: staged for the sparse update, or
        applied to ``acc`` with their hard knapsacks left ``pending``."""
        tab, ker, G = self.tab, self.ker, self.G
        ok = self.unsup[opt.t][i] - self.unsup[opt.t][subs] < 0.5
        if self.limit < INF:
            ok &= G[opt.t][i, 1] - G[opt.t][subs, 1] <= self.limit * (1 + 1e-9) + 1.0
        rows = subs[ok]
        dlist = [d for d in ker.ds if d * opt.t <= self.K and d <= self.S1]
        if len(rows) == 0 or not dlist:
            return
        X = tab.X
        S = X[i][None] & ~X[rows]
        sub_dp = None if sparse else tab.dp[rows]
        cut = self.into[i] + self.into[rows] - 2 * np.where(X[rows], z, 0.0).sum(axis=1)
        pre = (G[opt.t][i] - G[opt.t][rows], cut)
        # sparse: every knapsack now; dense: only where its lower bound could improve the table
        cs = ker.costs_many(opt, S, dlist, defer=True, pre=pre)
        if sparse:
            fill_many(cs)
        for d, c in zip(dlist, cs):
            dt = d * opt.t
            ycol = -(-np.arange(d, self.S1 + 1) // d)  # y = ceil(s/d) for s = d .. S1
            if sparse:
                staged[self.combo[opt.t, d]] = (np.flatnonzero(ok), c.out[:, ycol])
                continue
            _update_dense(acc, sub_dp, c.out[:, ycol], dt, d)
            if c.hard.any():
                pending.append((c, sub_dp, dt, d, ycol))


def _first_best(table: np.ndarray) -> tuple[float, int, int]:
    """The published scan for the answer: over ``k``, then ``s >= 1``, take ``v`` when ``v + 1e-9 max(1,
    |v|) < best``.  The table is monotone, so along a row ``v + tol(v)`` does not rise: each update is
    found by binary search, and rows whose last value cannot update are skipped."""
    best, bk, bs = INF, 0, 0
    v = table[:, 1:]
    w = v + 1e-9 * np.maximum(1.0, np.abs(v))
    for k in np.flatnonzero(w[:, -1] < INF):
        row, neg = v[k], -w[k]
        while w[k, -1] < best:
            s = int(np.searchsorted(neg, -best, side="right"))  # first s with w < best
            best, bk, bs = float(row[s]), int(k), s + 1
    return best, bk, bs


def _progress(total: int, on: bool) -> ProgressBar:
    return ProgressBar(total - 1, "piper DP", "downset", on)


def _reconstruct(
    inst: PiperInstance, ker: StageCostKernel, tab: _Table, i: int, k: int, s: int, deadline: float | None = None
) -> list[StageChoice]:
    """Walk back from ``dp[i][k][s]``: at each step the first (largest sub-downset, t, d) whose
    ``max(dp[D'][k-dt][s-d], TPS)`` attains the table's value (``TimeLimitError`` past ``deadline``)."""
    X, dp = tab.X, tab.dp
    stages: list[StageChoice] = []
    while i != 0:
        if deadline is not None and time.monotonic() > deadline:
            raise TimeLimitError(
                f"time limit reached in Piper's DP while rebuilding its partition ({len(stages)} stages so far)"
            )
        target = dp[i, k, s]
        thr = target * (1 + 1e-9) + 1e-12
        subs = tab.subs(i)[::-1]
        best = None
        for opt in inst.degrees:
            if opt.t > k or s < 1:
                continue
            # a stage's value is at least dp[D'][k - t][s - 1] (d >= 1): sub-downsets above the accepted
            # value cannot hold the (first) least value, which is at most thr when the rebuild succeeds
            fits = ~(X[i][None] & ~X[subs] & ~opt.supported).any(axis=1) & (dp[subs, k - opt.t, s - 1] <= thr)
            rows = subs[fits]
            if len(rows) == 0:
                continue
            S = X[i][None] & ~X[rows]
            dlist = [d for d in ker.ds if d * opt.t <= k and d <= s]
            cs = ker.costs_many(opt, S, dlist, defer=True)
            cols = [np.zeros(c.hard.shape, dtype=bool) for c in cs]
            for d, col in zip(dlist, cols):
                col[:, math.ceil(s / d)] = True
            fill_many(cs, cols)  # the heuristic at each d's y only
            for d, c in zip(dlist, cs):
                dt, y = d * opt.t, math.ceil(s / d)
                cost = c.out[:, y]
                val = np.maximum(dp[rows, k - dt, s - d], cost)
                j = int(np.argmin(val))
                if best is None or val[j] < best[0]:
                    best = (float(val[j]), int(rows[j]), opt, d, float(cost[j]))
        if best is None or not best[0] <= thr:
            raise SolverError(f"Piper DP reconstruction found no stage for value {target!r}")
        _, j, opt, d, tps = best
        S_row = X[i] & ~X[j]
        nodes = tuple(int(v) for v in np.flatnonzero(S_row))
        stages.append(StageChoice(nodes, opt.t, d, ker.choice(opt, S_row, d, math.ceil(s / d)), tps))
        k, s, i = k - d * opt.t, s - d, j
    return stages
