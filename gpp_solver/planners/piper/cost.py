"""Piper's stage cost ``TPS(S, t, d, s)`` (Tarnawski et al. 2021, §4) for many stages at once.

A :class:`PiperInstance` is Piper's input in arrays: edges with bytes ``c`` per micro-batch and,
for every tensor-parallel degree ``t``, each node's TMPC options (:class:`DegreeOptions`, padded to
``L`` slots).  A node's TPS contribution in slot ``l`` of a stage ``S`` with data-parallel degree
``d`` is, as in the published code (``getAllTPSsForIdealPair``),

    (e_v / d + R (d-1) w / d / N) / bandwidth + p / d,

``e_v`` = sum over its edges that cross the stage boundary of ``2 (c + sync)`` (sync: the TMPC's
``c^fw`` keyed by the in-edge's tail, ``c^bw`` keyed by the out-edge's head), ``R`` the resync
factor (4 in Piper's own model).  Memory at ``y = ceil(s/d)`` is ``sum_v a y + b``; the TMPCs are
chosen by the knapsack heuristic (``piper_knapsack``).  With ``objective="memory"`` the cost is the
stage's lowest possible memory instead (every node on its lowest-memory TMPC).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpp_solver.planners.piper.knapsack import EPS_BYTES, HardInstances, solve_hard, solve_two

INF = np.inf


@dataclass(frozen=True)
class DegreeOptions:
    """The TMPC options of every node for one tensor-parallel degree ``t`` (``L`` padded slots)."""

    t: int
    p: np.ndarray  # (n, L) compute time per micro-batch (incl. tensor-parallel communication)
    w: np.ndarray  # (n, L) weight bytes per device (data-parallel resync)
    a: np.ndarray  # (n, L) memory per in-flight micro-batch
    b: np.ndarray  # (n, L) constant memory
    avail: np.ndarray  # (n, L) bool
    label: np.ndarray  # (n, L) int: what the slot stands for (index into node.tmpc, -1 = base config)
    sfw: np.ndarray  # (E, L) sync bytes of edge j paid by its head node in slot l
    sbw: np.ndarray  # (E, L) sync bytes of edge j paid by its tail node in slot l

    @property
    def supported(self) -> np.ndarray:
        return self.avail.any(axis=1)


@dataclass(frozen=True)
class PiperInstance:
    n: int
    src: np.ndarray  # (E,) edge tails (node indices)
    dst: np.ndarray  # (E,) edge heads
    c: np.ndarray  # (E,) bytes per micro-batch carried by each edge
    degrees: tuple[DegreeOptions, ...]
    devices: int  # K
    memory: float  # M
    bandwidth: float
    micro_batches: int  # N
    resync_factor: float = 4.0

    @property
    def bound_s(self) -> int:
        return min(self.micro_batches, self.devices)


@dataclass
class StageCosts:
    """Costs of stages ``S[r]`` at ``y = 0 .. Y-1`` (``out``, ``y = 0`` unused).  Instances that
    need the heuristic may be deferred: ``inf`` in ``out``, listed in ``hard``, bounded below by
    ``tf`` (the all-fastest TPS) until :meth:`fill` solves them."""

    kernel: StageCostKernel
    opt: DegreeOptions
    S: np.ndarray
    d: int
    out: np.ndarray
    hard: np.ndarray
    tf: np.ndarray | None = None
    cut: np.ndarray | None = None
    mem_f: np.ndarray | None = None
    tps_full: np.ndarray | None = None
    fast: np.ndarray | None = None  # (P, n) fastest slot of each node (with ``tps_full``)

    def fill(self, mask: np.ndarray | None = None) -> None:
        fill_many([self], None if mask is None else [mask])


def fill_many(costs: list[StageCosts], masks: list[np.ndarray] | None = None) -> None:
    """:meth:`StageCosts.fill` of several (``masks``: the instances to solve, default all): the
    two-slot heuristic with sync costs runs once per degree for all of them."""
    batch: dict[int, list] = {}
    for j, sc in enumerate(costs):
        mask = sc.hard if masks is None else masks[j] & sc.hard
        if not mask.any():
            continue
        r, yi = np.nonzero(mask)
        k, opt = sc.kernel, sc.opt
        if sc.tps_full is None and opt.p.shape[1] <= 2:
            vals = k.sep_hard(opt, sc.S, sc.d, r, yi, sc.tf - sc.cut, sc.mem_f)
        elif opt.p.shape[1] <= 2:
            batch.setdefault(opt.t, []).append((sc, r, yi))
            continue
        else:
            vals, _ = k.hard_values(opt, sc.S, sc.d, r, yi, sc.tps_full)
        sc.out[r, yi] = vals + sc.cut[r]
        sc.hard[r, yi] = False
    for group in batch.values():
        k, opt = group[0][0].kernel, group[0][0].opt
        used = [np.unique(r, return_inverse=True) for _, r, _ in group]  # stages with some instance
        rows = k.two_rows(
            opt,
            np.concatenate([sc.tps_full[u] for (sc, _, _), (u, _) in zip(group, used)]),
            np.concatenate([sc.fast[u] for (sc, _, _), (u, _) in zip(group, used)]),
        )
        off = np.cumsum([0] + [len(u) for u, _ in used])
        r = np.concatenate([inv + o for (_, inv), o in zip(used, off)])
        yi = np.concatenate([y for _, _, y in group])
        S = np.concatenate([sc.S[rr] for sc, rr, _ in group])
        base = np.concatenate([sc.tf[rr] for sc, rr, _ in group])
        vals, _ = k.two_values(opt, rows, r, yi, S, base)
        ends = np.cumsum([len(rr) for _, rr, _ in group])
        for (sc, rr, y), lo, hi in zip(group, ends - [len(g[1]) for g in group], ends):
            sc.out[rr, y] = vals[lo:hi] + sc.cut[rr]
            sc.hard[rr, y] = False


class StageCostKernel:
    """Stage costs for all stages ``D \\ D'`` of one downset ``D`` at once (rows of ``S``)."""

    def __init__(self, inst: PiperInstance, objective: str = "tps") -> None:
        self.inst, self.objective = inst, objective
        self.S1 = inst.bound_s
        self.ds = [d for d in range(1, inst.devices + 1) if inst.micro_batches % d == 0]
        E = len(inst.c)
        ys = np.arange(self.S1 + 2, dtype=float)
        self.sep, self.win, self.wout, self.lowmem, self._tables, self._columns = {}, {}, {}, {}, {}, {}
        for opt in inst.degrees:
            self.sep[opt.t] = not (opt.sfw.any() or opt.sbw.any())
            L = opt.p.shape[1]
            win, wout = np.zeros((L, E, inst.n)), np.zeros((L, E, inst.n))
            for l in range(L):
                win[l, np.arange(E), inst.dst] = 2 * (inst.c + opt.sfw[:, l])
                wout[l, np.arange(E), inst.src] = 2 * (inst.c + opt.sbw[:, l])
            self.win[opt.t], self.wout[opt.t] = win, wout
            with np.errstate(invalid="ignore"):
                mem = np.where(opt.avail[None], opt.a[None] * ys[:, None, None] + opt.b[None], INF)
            self.lowmem[opt.t] = mem.min(axis=2).T  # (n, Y): lowest memory of each node at y

    # -- per-node pieces ------------------------------------------------------------------------
    def node_bytes(self, opt: DegreeOptions, S: np.ndarray) -> np.ndarray:
        """(P, n, L): boundary bytes each node pays in each slot."""
        Sf = S.astype(float)
        in_cut = Sf[:, self.inst.dst] * (1.0 - Sf[:, self.inst.src])
        out_cut = Sf[:, self.inst.src] * (1.0 - Sf[:, self.inst.dst])
        win, wout = self.win[opt.t], self.wout[opt.t]
        return np.stack([in_cut @ win[l] + out_cut @ wout[l] for l in range(win.shape[0])], axis=2)

    def node_tps(self, opt: DegreeOptions, e: np.ndarray, d: int) -> np.ndarray:
        inst = self.inst
        comm = e / d + inst.resync_factor * (d - 1) * opt.w / d / inst.micro_batches
        with np.errstate(invalid="ignore"):
            return np.where(opt.avail, comm / inst.bandwidth + opt.p / d, INF)

    def cut_bytes(self, S: np.ndarray) -> np.ndarray:
        """(P,) bytes ``2 c`` summed over the edges crossing each stage's boundary."""
        inst = self.inst
        return (S[:, inst.dst] ^ S[:, inst.src]) @ (2 * inst.c)

    # -- stage costs ----------------------------------------------------------------------------
    def costs(self, opt: DegreeOptions, S: np.ndarray, d: int, *, defer: bool = False) -> StageCosts:
        return self.costs_many(opt, S, [d], defer=defer)[0]

    def node_columns(self, opt: DegreeOptions) -> np.ndarray:
        """(n, Q) node-additive columns: lowest memory at ``y = 0 .. S1+1``, then for each ``d`` in
        ``self.ds`` the fastest slot's TPS share (without boundary bytes), ``a`` and ``b``."""
        if opt.t in self._columns:
            return self._columns[opt.t]
        rows = np.arange(self.inst.n)
        cols = [self.lowmem[opt.t]]
        for d in self.ds:
            q = self.node_tps(opt, np.zeros_like(opt.p), d)
            f = np.argmin(q, axis=1)
            cols.append(np.stack([q[rows, f], opt.a[rows, f], opt.b[rows, f]], axis=1))
        out = np.concatenate(cols, axis=1)
        out[~opt.supported] = 0.0  # stages with such nodes are rejected in costs_many
        self._columns[opt.t] = out
        return out

    def costs_many(
        self,
        opt: DegreeOptions,
        S: np.ndarray,
        ds: list[int],
        *,
        defer: bool = False,
        pre: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> list[StageCosts]:
        """:class:`StageCosts` of the stages ``S`` (rows) for each data-parallel degree in ``ds``.
        ``pre`` = (``S @ node_columns(opt)``, ``cut_bytes(S)``) when the caller has them already."""
        inst = self.inst
        P, n = S.shape
        if pre is None:
            pre = (S.astype(float) @ self.node_columns(opt), self.cut_bytes(S))
        col_sums, cut_raw = pre
        mem_low_all = col_sums[:, : self.S1 + 2]
        if self.objective == "memory":
            out = []
            bad = (S & ~opt.supported).any(axis=1)
            for d in ds:
                m = mem_low_all[:, : self.S1 // d + 2].copy()
                m[:, 0] = INF
                m[bad] = INF
                out.append(StageCosts(self, opt, S, d, m, np.zeros(m.shape, dtype=bool)))
            return out
        sums = None
        if self.sep[opt.t]:
            # slots differ only in node-local terms: the fastest slot does not depend on the stage
            sums = {d: col_sums[:, self.S1 + 2 + 3 * k : self.S1 + 5 + 3 * k] for k, d in enumerate(self.ds)}
        else:
            e_bytes = self.node_bytes(opt, S)  # the same for every d
        bad = (S & ~opt.supported).any(axis=1)
        result = []
        for d in ds:
            Y = self.S1 // d + 2
            ys = np.arange(Y, dtype=float)
            mem_low = mem_low_all[:, :Y]
            if sums is not None:
                cut = cut_raw / d / inst.bandwidth
                tf, af, bf = sums[d][:, 0] + cut, sums[d][:, 1], sums[d][:, 2]
                tps_full = fast = None
            else:
                tps_full = self.node_tps(opt, e_bytes, d)  # (P, n, L)
                fast = np.argmin(tps_full, axis=2)
                nodes = np.arange(n)[None, :]
                tf = np.where(S, tps_full[np.arange(P)[:, None], nodes, fast], 0.0).sum(axis=1)
                af = np.where(S, opt.a[nodes, fast], 0.0).sum(axis=1)
                bf = np.where(S, opt.b[nodes, fast], 0.0).sum(axis=1)
                cut = np.zeros(P)
            mem_f = af[:, None] * ys[None] + bf[:, None]
            M = inst.memory
            out = np.where(mem_f <= M, tf[:, None], INF)
            hard = (mem_f > M) & (mem_low <= M)
            hard[:, 0] = False
            out[:, 0] = INF
            out[bad] = INF
            hard[bad] = False
            c = StageCosts(self, opt, S, d, out, hard, tf, cut, mem_f, tps_full, fast)
            if not defer:
                c.fill()
            result.append(c)
        return result

    def _sep_tables(self, opt: DegreeOptions, d: int):
        """Per ``y``: nodes sorted by the bang-per-buck ratio of their one memory-saving switch (no
        sync costs and <= 2 slots: the ratio and so the order are the same for every stage)."""
        key = (opt.t, d)
        if key not in self._tables:
            n = self.inst.n
            Y = self.S1 // d + 2
            q = self.node_tps(opt, np.zeros_like(opt.p), d)
            f = np.argmin(q, axis=1)
            o = 1 - f if opt.p.shape[1] == 2 else f
            rows = np.arange(n)
            ys = np.arange(Y, dtype=float)[:, None]
            with np.errstate(invalid="ignore"):
                mem_f = opt.a[rows, f] * ys + opt.b[rows, f]
                mem_o = np.where(opt.avail[rows, o], opt.a[rows, o] * ys + opt.b[rows, o], INF)
                sav = mem_f - mem_o  # (Y, n)
                cand = opt.avail[rows, f] & np.isfinite(mem_o) & (sav > EPS_BYTES)
                dq = np.where(opt.avail[rows, o], q[rows, o] - q[rows, f], 0.0)
                ratio = np.where(cand, dq / np.where(cand, sav, 1.0), INF)
            order = np.argsort(ratio, axis=1, kind="stable")  # ties: lower node first

            def take(arr: np.ndarray, order: np.ndarray = order) -> np.ndarray:
                return np.take_along_axis(arr, order, axis=1)

            self._tables[key] = (
                order,
                take(np.where(cand, sav, 0.0)),
                take(np.where(cand, np.broadcast_to(dq, sav.shape), 0.0)),
                take(cand),
            )
        return self._tables[key]

    def sep_hard(self, opt, S, d, r, yi, tf, mem_f) -> np.ndarray:
        """The fast heuristic for stages ``S[r]`` at ``y = yi`` via the shared per-``y`` order."""
        order, savS, dqS, candS = self._sep_tables(opt, d)
        idx = order[yi]  # (H, n)
        member = S[r[:, None], idx] & candS[yi]
        cums = np.cumsum(np.where(member, savS[yi], 0.0), axis=1)
        need = mem_f[r, yi] - self.inst.memory
        done = member & (need[:, None] - cums < EPS_BYTES)
        ok = done.any(axis=1)
        k = np.argmax(done, axis=1)
        extra = np.cumsum(np.where(member, dqS[yi], 0.0), axis=1)[np.arange(len(r)), k]
        return np.where(ok, tf[r] + extra, INF)

    def hard_values(
        self,
        opt: DegreeOptions,
        S: np.ndarray,
        d: int,
        r: np.ndarray,
        yi: np.ndarray,
        tps_full: np.ndarray | None,
        want_choice: bool = False,
    ):
        """The heuristic on stages ``S[r]`` at ``y = yi`` (general form).  Without sync costs
        (``tps_full`` None) the boundary bytes are the same in every slot of a node and are left out
        (the caller adds them): they do not change the choice."""
        if opt.p.shape[1] <= 2:  # the fast heuristic: slots and TPS per stage, memory per (stage, y)
            tps, ri = (
                (self.node_tps(opt, np.zeros_like(opt.p), d)[None], np.zeros_like(r))
                if tps_full is None
                else (tps_full, r)
            )
            rows = self.two_rows(opt, tps, np.argmin(tps, axis=2))
            return self.two_values(opt, rows, ri, yi, S[r], None, want_choice)
        tps = (
            np.broadcast_to(self.node_tps(opt, np.zeros_like(opt.p), d), (len(r),) + opt.p.shape)
            if tps_full is None
            else tps_full[r]
        )
        y = yi.astype(float)[:, None, None]
        with np.errstate(invalid="ignore"):
            mem = np.where(opt.avail[None], opt.a[None] * y + opt.b[None], INF)
        f = np.argmin(tps, axis=2)
        return solve_hard(
            HardInstances(tps=tps, mem=mem, in_s=S[r], fastest=f, limit=self.inst.memory), want_choice=want_choice
        )

    def two_rows(self, opt: DegreeOptions, tps: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per stage (rows of ``tps``, ``(P, n, L)``, ``L <= 2``; ``f`` its argmin over slots): fastest
        and other slot, their TPS, ``a``, ``b`` and whether the other slot exists (each ``(P, n)``)."""
        o = 1 - f if tps.shape[2] == 2 else f
        P, n, _ = tps.shape
        rows, nodes = np.arange(P)[:, None], np.arange(n)[None, :]
        return (
            f,
            o,
            tps[rows, nodes, f],
            tps[rows, nodes, o],
            opt.a[nodes, f],
            opt.b[nodes, f],
            opt.a[nodes, o],
            opt.b[nodes, o],
            opt.avail[nodes, f],
            opt.avail[nodes, o],
        )

    def two_values(
        self,
        opt: DegreeOptions,
        rows: tuple[np.ndarray, ...],
        r: np.ndarray,
        yi: np.ndarray,
        in_s: np.ndarray,
        base: np.ndarray | None,
        want_choice: bool = False,
    ):
        """The fast heuristic on stages ``r`` (of :meth:`two_rows`' ``rows``) at ``y = yi`` (``in_s``:
        each instance's nodes).  Only the memory to shave off is summed over every node (the same
        sum as the published form's, bit for bit); the rest runs on the nodes of some stage."""
        f, o, tps_f, tps_o, af, bf, ao, bo, okf, oko = rows
        if len(r) == 0:
            return np.zeros(0), (np.zeros(in_s.shape, dtype=int) if want_choice else None)
        y = yi.astype(float)[:, None]
        cols = np.flatnonzero(in_s.any(axis=0))
        s_c = in_s[:, cols]
        with np.errstate(invalid="ignore"):
            mem_f = af[r] * y + bf[r]  # a stage's nodes have their fastest slot
            need = np.where(in_s, mem_f, 0.0).sum(axis=1) - self.inst.memory
            sav = np.where(s_c, mem_f[:, cols] - (ao[:, cols][r] * y + bo[:, cols][r]), 0.0)
            cand = s_c & oko[:, cols][r] & (sav > EPS_BYTES)
        if base is None:
            base = np.where(in_s, tps_f[r], 0.0).sum(axis=1)
        best, applied = solve_two((tps_o - tps_f)[:, cols], r, need, sav, cand, base, want_choice=want_choice)
        if not want_choice:
            return best, None
        switch = np.zeros(in_s.shape, dtype=bool)
        switch[:, cols] = applied
        return best, np.where(switch, o[r], f[r])

    def choice(self, opt: DegreeOptions, S_row: np.ndarray, d: int, y: int) -> tuple[int, ...]:
        """Labels of the slots the heuristic picks for the nodes of one stage at ``y``."""
        S = S_row[None]
        tps = None if self.sep[opt.t] else self.node_tps(opt, self.node_bytes(opt, S), d)
        f = np.argmin(self.node_tps(opt, np.zeros_like(opt.p), d) if tps is None else tps[0], axis=-1)
        nodes = np.flatnonzero(S_row)
        if self.objective == "memory":
            with np.errstate(invalid="ignore"):
                slots = np.argmin(np.where(opt.avail, opt.a * y + opt.b, INF), axis=1)
        else:
            rows = np.arange(self.inst.n)
            slots = f
            if float((opt.a[rows, f] * y + opt.b[rows, f])[nodes].sum()) > self.inst.memory:
                _, ch = self.hard_values(opt, S, d, np.array([0]), np.array([y]), tps, True)
                slots = ch[0]
        return tuple(int(opt.label[v, slots[v]]) for v in nodes)
