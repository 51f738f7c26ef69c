"""The traceback of GraphPipe's stage DP: from the tables of one DP pass back to the stages (series
and parallel splits, shared-sink stages with their branch heads and the other branches)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpp_solver._backend.trampoline import run
from gpp_solver.planners.graphpipe.dp.shared_sinks import attach_parts
from gpp_solver.planners.graphpipe.dp.stage import DPStage, decode
from gpp_solver.planners.graphpipe.dp.tree import INF, TreeIndex


def trace_stages(
    idx: TreeIndex,
    degrees: Sequence[int],
    tps: np.ndarray,
    D: int,
    b: int,
    t: float,
    dev: np.ndarray,
    Rroot: np.ndarray,
    tables: list,
    R: list,
    prefer_shared: bool,
    E: int,
    sat: bool = False,
) -> list[DPStage]:
    """The stages of one feasible DP pass (target ``t`` at ``b`` within ``D`` devices): ``dev``,
    ``Rroot``, ``tables`` and ``R`` are that pass's arrays (:func:`gpp_solver.planners.graphpipe.dp.kernel.run_dp`
    with ``keep``), ``tps[g, j]`` the segment estimates at ``degrees[j]``.  Where a shared-sink stage and
    separate stages reach the same value, ``prefer_shared`` picks the former.  ``sat``: the pass
    saturated its depths at ``E`` (a stage's depth is then ``min(depth, E)``)."""
    feas = np.nonzero(decode(Rroot[0]) <= D)[0]
    if len(feas) == 0:
        raise ValueError(f"target {t!r} is infeasible at b={b}")
    tb = _Traceback(idx, degrees, tps, dev, tables, R, prefer_shared, E, sat)
    run(tb.walk, idx.root[1], 0, int(feas[0]))
    tb.out.sort(key=lambda st: st.first)
    return tb.out


class _Traceback:
    """One traceback: the pass's tables and the stages emitted so far (``out``).  :meth:`walk` follows
    a tree node's choices; :meth:`series_choice` and :meth:`attach_walk` find the choice worth a
    value in a series (a segment or a child), and at a shared-sink site; :meth:`head_walk` and
    :meth:`others_walk` emit a shared-sink stage's branch head and the other branches.

    The walks recurse once per tree level a stage lies below, so they are generators driven by
    :func:`gpp_solver._backend.trampoline.run` (``yield self.walk(...)`` is the recursive call):
    their depth is bounded by memory, not by Python's recursion limit."""

    def __init__(
        self,
        idx: TreeIndex,
        degrees: Sequence[int],
        tps: np.ndarray,
        dev: np.ndarray,
        tables: list,
        R: list,
        prefer_shared: bool,
        E: int,
        sat: bool,
    ) -> None:
        self.idx, self.tps, self.dev, self.tables, self.R = idx, tps, dev, tables, R
        self.prefer_shared, self.E, self.sat = prefer_shared, E, sat
        self.out: list[DPStage] = []
        self.col = {d: j for j, d in enumerate(degrees)}

    def emit(self, g: int, depth: int) -> None:
        idx, dev, E, tps, col = self.idx, self.dev, self.E, self.tps, self.col
        depth = min(depth, E)
        d = int(decode(dev[g, depth]))
        self.out.append(DPStage(idx.leaves(g), d, depth, float(tps[g, col[d]]), int(idx.seg_lo[g])))

    def walk(self, t_id: int, s: int, e: int, p: int = 0) -> None:
        idx, dev, tables, R, E, sat = self.idx, self.dev, self.tables, self.R, self.E, self.sat
        prefer_shared = self.prefer_shared
        kind, kids = idx.nodes[t_id]
        suf, segs, k = tables[t_id], idx.seg[t_id], len(kids)
        while p < k:
            target = suf[p][s, e]
            assert target < INF
            internal = kids[p][0] == "node"
            found = None
            site = next((x for x in idx.sites.get(t_id, ()) if x.p == p), None) if kind == "S" else None
            if site is not None and prefer_shared:  # fewer stages and transfers at the same value
                qm = yield self.attach_walk(site, suf, s, e, target)
                if qm is not None:
                    p, e = qm[0] + 1, qm[1] - 1
                    continue
            if kind == "S":
                found = self.series_choice(kids, segs, suf, p, s, e, target, internal)
                if found is None and site is not None and not prefer_shared:
                    qm = yield self.attach_walk(site, suf, s, e, target)
                    assert qm is not None
                    p, e = qm[0] + 1, qm[1] - 1
                    continue
                assert found is not None
                q, m = found
                if q == p and internal:
                    yield self.walk(kids[p][1], m, e)
                else:
                    self.emit(int(segs[p, q]), m + 1)
                p, e = q + 1, m
            else:
                qs = np.arange(p + int(internal), k)
                if e >= (min(s + 1, E) if sat else s + 1) and len(qs):
                    vals = dev[segs[p, qs], s + 1] + suf[qs + 1, s, e]
                    hit = np.nonzero(vals == target)[0]
                    if len(hit):
                        found = (int(qs[hit[-1]]), 0)  # the largest q first
                if found is None and internal and R[kids[p][1]][s, e] + suf[p + 1][s, e] == target:
                    found = (p, 0)
                assert found is not None
                q = found[0]
                if q == p and internal:
                    yield self.walk(kids[p][1], s, e)
                else:
                    self.emit(int(segs[p, q]), s + 1)
                p = q + 1

    def series_choice(self, kids, segs, suf, p: int, s: int, e: int, target: int, internal: bool):
        """The first ``(q, m)``, by ``m`` ascending then ``q`` descending, whose series choice is worth
        ``target``: segment ``p..q`` at depth ``m+1``, or child ``p`` solved recursively (``q = p``)."""
        dev, R, E, sat = self.dev, self.R, self.E, self.sat
        ms = np.arange(s, e + 1 if sat and e == E else e)
        if len(ms) == 0:
            return None
        qs = np.arange(p + int(internal), len(kids))
        rest = suf[p + 1 : len(kids) + 1, s][:, ms]  # (q - p, m)
        V = np.full((len(kids) - p, len(ms)), INF, dtype=np.int64)
        if len(qs):
            V[qs - p] = dev[segs[p, qs]][:, np.minimum(ms + 1, E + 1)] + rest[qs - p]
        if internal:
            V[0] = R[kids[p][1]][ms, e] + rest[0]
        hit = V == target
        cols = np.nonzero(hit.any(axis=0))[0]
        if len(cols) == 0:
            return None
        mi = int(cols[0])
        return p + int(np.nonzero(hit[:, mi])[0][-1]), int(ms[mi])

    def attach_walk(self, site, suf, s: int, e: int, target: int) -> tuple[int, int] | None:
        """Find a shared-sink choice worth ``target`` and emit its stages: ``(q, m)``, or ``None``."""
        idx, dev, tables, R, E, sat = self.idx, self.dev, self.tables, self.R, self.E, self.sat
        par_suf = tables[site.par]
        Rb = [None if x is None else x[None] for x in R]
        parts = attach_parts(idx, site, dev[None], Rb, par_suf[None], E, sat)
        ms = np.arange(s + 1, E + 1)  # the shared stage's depth; the rest after it at rs
        rs = ms - 1
        if sat:  # the rest at depth E: the shared stage at E too
            ms, rs = np.append(ms, E), np.append(rs, E)
        for i, opts in enumerate(site.tails):  # first match in (u, q, m) order
            if len(ms) == 0:
                break
            us = [u for u, _ in opts]
            qs = [q for q, _ in opts[0][1]]
            G = np.asarray([[g for _, g in qg] for _, qg in opts], dtype=np.int64)  # (u, q)
            rest = np.stack([suf[q + 1][s, rs] for q in qs])  # (q, m)
            val = (
                dev[G][:, :, ms]
                + rest[None]
                + parts.heads[i][0, us][:, None, ms, e]
                + parts.others[i][0, ms, e][None, None]
            )
            hit = np.argwhere(val == target)
            if len(hit):
                ui, qi, mi = (int(x) for x in hit[0])
                m = int(ms[mi])
                self.emit(int(G[ui, qi]), m)
                yield self.head_walk(site, i, us[ui], m, e, parts.heads[i])
                yield self.others_walk(site, i, i, m, e, parts.prepar)
                return qs[qi], int(rs[mi]) + 1
        mg = np.arange(s + 1, e + 1)
        rg = mg - 1
        if sat and e == E:
            mg, rg = np.append(mg, E), np.append(rg, E)
        if site.groups and len(mg):
            qs = [q for q, _ in site.groups[0][2]]
            G = np.asarray([[g for _, g in qg] for _, _, qg in site.groups], dtype=np.int64)  # (grp, q)
            a = np.asarray([x for x, _, _ in site.groups])
            c = np.asarray([z for _, z, _ in site.groups])
            rest = np.stack([suf[q + 1][s, rg] for q in qs])  # (q, m)
            PP = np.stack([x[0] for x in parts.prepar])  # (i, m, e)
            other = PP[a][:, mg, e] + par_suf[c + 1][:, mg, e]  # (grp, m)
            val = dev[G][:, :, mg] + rest[None] + other[:, None]
            hit = np.argwhere(val == target)
            if len(hit):
                gi, qi, mi = (int(x) for x in hit[0])
                m = int(mg[mi])
                self.emit(int(G[gi, qi]), m)
                yield self.others_walk(site, int(a[gi]), int(c[gi]), m, e, parts.prepar)
                return qs[qi], int(rg[mi]) + 1
        return None

    def head_walk(self, site, i: int, u: int, m: int, e: int, pre: list) -> None:
        idx, dev, R, E, sat = self.idx, self.dev, self.R, self.E, self.sat
        hb, cb = idx.nodes[site.par][1][i]
        if u == 0:
            return
        kids, segs = idx.nodes[cb][1], idx.seg[cb]
        while u > 0:
            target = pre[0, u, m, e]
            internal = kids[u - 1][0] == "node"
            nxt = None
            for v in range(u - 1, -1, -1):
                if v == u - 1 and internal:
                    continue
                g = int(segs[v, u - 1])
                m1 = min(m + 1, E) if sat else m + 1
                rest = pre[0, v, m1, e] if m1 <= E else INF
                if dev[g, m + 1] + rest == target:
                    self.emit(g, m1)
                    nxt = (v, m1)
                    break
            if nxt is None:
                c = kids[u - 1][1]
                m2 = next(x for x in range(E + 1) if R[c][m, x] + pre[0, u - 1, x, e] == target)
                yield self.walk(c, m, m2)
                nxt = (u - 1, m2)
            u, m = nxt

    def others_walk(self, site, a: int, c: int, m: int, e: int, prepar: list) -> None:
        """The branches before ``a`` and after ``c`` (their successor at depth ``m``)."""
        idx, dev, R, E, sat = self.idx, self.dev, self.R, self.E, self.sat
        if c + 1 < len(idx.nodes[site.par][1]):
            yield self.walk(site.par, m, e, c + 1)
        kids, segs = idx.nodes[site.par][1], idx.seg[site.par]
        j = a
        while j > 0:
            target = prepar[j][0, m, e]
            internal = kids[j - 1][0] == "node"
            nxt = None
            for v in range(j - 1, -1, -1):
                if v == j - 1 and internal:
                    continue
                g = int(segs[v, j - 1])
                if e >= (min(m + 1, E) if sat else m + 1) and dev[g, m + 1] + prepar[v][0, m, e] == target:
                    self.emit(g, m + 1)
                    nxt = v
                    break
            if nxt is None:
                c = kids[j - 1][1]
                assert R[c][m, e] + prepar[j - 1][0, m, e] == target
                yield self.walk(c, m, e)
                nxt = j - 1
            j = nxt
