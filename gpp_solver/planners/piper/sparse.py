"""The breakpoint update of Piper's DP (``dp.py``): writes into ``dp[D]`` only the candidate points that
can still matter once the table is made monotone in ``k`` and ``s``.

A finished table ``dp[D']`` is kept as its *corners* (points that drop along both ``k`` and ``s``),
by column ``f = s`` and then ``k``, with ``m`` = the smaller of the values just below (``k - 1``) and
just left (``s - 1``); its *k-drops* (with ``b`` = the value just below) are read from the table.  For one stage
``D \\ D'`` on ``(t, d)`` (offset ``(dt, d)``) with cost ``T(f)`` (by the column ``f = s - d`` of
``dp[D']``, constant over each ``y = ceil(s / d)``) the candidate is ``w = max(dp[D'][k][f], T(f))``
written at ``(k + dt, f + d)``.  A corner's candidate is needed only if

* ``w < m``: else the same ``(t, d)`` gives at most ``w`` one step below or left (the left one only
  while ``T`` does not drop at ``f``; columns where it drops use every k-drop with ``b`` instead), and
* ``w < U(f)``, ``U`` = the least ``T'(f)`` over the other ``(t', d')`` with ``d't' <= dt`` and
  ``d' <= d``: else that one gives at most ``w`` at a smaller offset.

In a column the corners' values fall with ``k``, so the needed ones are a slice: those with
``T < v < U`` and the first with ``v <= T`` (if ``T < m`` there).  The slices are found by binary
search in the columns' runs of corners (all triples at once), so the work grows with the (row,
(t, d), column) triples where ``T < U`` and the points written, not with every corner of every row
for every ``(t, d)``.  The written set has the same monotone closure as writing everywhere.
"""

from __future__ import annotations

import numpy as np

from gpp_solver.planners.piper.cost import INF

CHUNK = 1 << 22
"""Most (t, d) x row x column cells handled at once (memory bound of one step)."""


class _Store:
    """Growing point arrays (``names``: int64 or float columns)."""

    def __init__(self, **dtypes) -> None:
        self.cols = {name: np.zeros(1024, dtype=dt) for name, dt in dtypes.items()}
        self.n = 0

    def append(self, **vals) -> None:
        lo = self.n
        hi = lo + len(next(iter(vals.values())))
        for name, a in self.cols.items():
            if hi > len(a):
                a = self.cols[name] = np.resize(a, max(hi, 2 * len(a)))
            a[lo:hi] = vals[name]
        self.n = hi

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["cols"][name]
        except KeyError:
            raise AttributeError(name) from None


class Breakpoints:
    """Corners and k-drops of every finished table ``dp[j]`` (monotone in ``k`` and ``s``)."""

    def __init__(self, tables: np.ndarray) -> None:
        self.tables = tables  # (n, K + 1, columns), filled in order
        n_tables, K1, columns = tables.shape
        self.F = columns
        self.corners = _Store(k=np.int64, f=np.int64, kf=np.int64, v=float, m=float)
        self.kfirst = np.full((n_tables, columns), K1, dtype=np.int64)  # k of a column's first corner
        self.vlast = np.full((n_tables, columns), INF)  # value of its last corner
        self.mfirst = np.full((n_tables, columns), -INF)  # m of its first corner
        self.cptr = np.zeros((n_tables, columns + 1), dtype=np.int64)  # corners of (table, column)

    def add(self, j: int, table: np.ndarray) -> None:
        """Tables are added in order ``j = 0, 1, ...``."""
        below = np.empty_like(table)
        below[0] = INF
        below[1:] = table[:-1]
        left = np.empty_like(table)
        left[:, 0] = INF
        left[:, 1:] = table[:, :-1]
        corner = (table < below) & (table < left)
        fc, kc = np.nonzero(corner.T)  # by column, then k
        v = table[kc, fc]
        cnt = corner.sum(axis=0)
        self.cptr[j] = self.corners.n + np.concatenate(([0], np.cumsum(cnt)))
        has = cnt > 0
        self.kfirst[j, has] = kc[self.cptr[j, :-1][has] - self.corners.n]
        self.vlast[j, has] = v[self.cptr[j, 1:][has] - 1 - self.corners.n]
        m = np.minimum(below[kc, fc], left[kc, fc])
        self.mfirst[j, has] = m[self.cptr[j, :-1][has] - self.corners.n]
        self.corners.append(k=kc, f=fc, kf=kc * self.F + fc, v=v, m=m)

    def count(self, rows: np.ndarray) -> int:
        return int((self.cptr[rows, -1] - self.cptr[rows, 0]).sum())

    def column_drops(self, rows: np.ndarray, o: np.ndarray, col: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(owner, k, value, b)`` of the k-drops of column ``col[i]`` of table ``rows[o[i]]``."""
        v = self.tables[rows[o], :, col]  # (len(o), K + 1)
        b = np.empty_like(v)
        b[:, 0] = INF
        b[:, 1:] = v[:, :-1]
        own, k = np.nonzero(v < b)
        return own, k, v[own, k], b[own, k]

    def first_at_most(self, tables: np.ndarray, f: np.ndarray, x: np.ndarray, strict: bool) -> np.ndarray:
        """Index (into ``corners``) of the first corner of column ``f`` of table ``tables[i]`` whose
        value is ``<= x[i]`` (``< x[i]`` if ``strict``); the column's end when there is none.  A
        binary search in every column's run of corners at once (values fall along a run)."""
        lo = self.cptr[tables, f]
        hi = self.cptr[tables, f + 1]
        v = self.corners.v
        live = np.flatnonzero(lo < hi)
        while len(live):
            a, b = lo[live], hi[live]
            mid = (a + b) >> 1
            right = v[mid] >= x[live] if strict else v[mid] > x[live]  # the answer lies past mid
            lo[live] = np.where(right, mid + 1, a)
            hi[live] = np.where(right, b, mid)
            live = live[lo[live] < hi[live]]
        return lo


def dominators(offsets: list[tuple[int, int]]) -> list[np.ndarray]:
    """For each ``(dt, d)``, its immediate dominators: other offsets ``<=`` in both coordinates with
    none strictly between (the rest follow by transitivity)."""
    a = np.array(offsets, dtype=np.int64).reshape(-1, 2)
    dom = (a[None, :, 0] <= a[:, None, 0]) & (a[None, :, 1] <= a[:, None, 1])
    np.fill_diagonal(dom, False)
    through = (dom.astype(np.int64) @ dom.astype(np.int64)) > 0  # dominated via another one
    return [np.flatnonzero(dom[c] & ~through[c]) for c in range(len(a))]


def update(
    acc: np.ndarray,
    bps: Breakpoints,
    subs: np.ndarray,
    offsets: list[tuple[int, int]],
    preds: list[np.ndarray],
    staged: dict[int, tuple[np.ndarray, np.ndarray]],
) -> None:
    """``acc[k + dt][f + d] = min(acc, max(dp[subs[r]][k][f], T))`` over every ``(t, d)`` (index
    ``c`` into ``offsets``), written only where needed (see the module docstring); the caller makes
    ``acc`` monotone afterwards.  ``staged[c] = (positions in subs, T)`` with ``T[p][f]`` the stage
    cost by column ``f = 0 .. S1 - d``; a missing ``c`` or row costs ``inf``.  ``preds``: from
    :func:`dominators`, listed so that every offset comes after its dominators."""
    C, (K1, F) = len(offsets), acc.shape
    if not staged:
        return
    used = np.unique(np.concatenate([pos for pos, _ in staged.values()]))
    if len(used) < len(subs):  # sub-downsets with no stage cost at all write nothing and bound nothing
        subs = subs[used]
        staged = {c: (np.searchsorted(used, pos), cost) for c, (pos, cost) in staged.items()}
    step = max(1, CHUNK // (C * F))
    for lo in range(0, len(subs), step):
        rows = subs[lo : lo + step]
        R = len(rows)
        vlast, kfirst, mfirst = bps.vlast[rows], bps.kfirst[rows], bps.mfirst[rows]
        W = np.empty((C, R, F))  # min(T, U) of each (t, d)
        trip, drops = [], []
        for c, (dt, d) in enumerate(offsets):  # one (t, d) at a time: its arrays stay in cache
            T = W[c]
            T.fill(INF)
            if c in staged:
                pos, cost = staged[c]
                m = (pos >= lo) & (pos < lo + R)
                T[pos[m] - lo, : cost.shape[1]] = cost[m]
            U = np.full((R, F), INF)
            for p in preds[c]:
                np.minimum(U, W[p], out=U)
            n = F - d
            if c in staged and dt < K1:
                Tn, Un = T[:, :n], U[:, :n]
                alive = Tn < Un
                # columns with some corner below U, the first in reach, and T below the first's m (else
                # every corner has v <= T and the first one, the only candidate, has m <= T)
                r, f = np.nonzero(alive & (vlast[:, :n] < Un) & (Tn < mfirst[:, :n]) & (kfirst[:, :n] < K1 - dt))
                trip.append((np.full(len(r), c), r, f, Tn[r, f], Un[r, f]))
                # columns where T drops: every k-drop there, with the value below as m
                dr, df = np.nonzero(alive[:, 1:] & (Tn[:, 1:] < Tn[:, :-1]))
                if len(dr):
                    drops.append((np.full(len(dr), c), dr, df + 1, Tn[dr, df + 1], Un[dr, df + 1]))
            np.minimum(T, U, out=T)
        if trip:
            _write(
                acc,
                bps,
                rows,
                offsets,
                *(np.concatenate(x) for x in zip(*trip)),
                drops=[np.concatenate(x) for x in zip(*drops)] if drops else None,
            )


def _write(
    acc: np.ndarray,
    bps: Breakpoints,
    rows: np.ndarray,
    offsets: list[tuple[int, int]],
    c: np.ndarray,
    r: np.ndarray,
    f: np.ndarray,
    t: np.ndarray,
    u: np.ndarray,
    drops=None,
) -> None:
    """Write the needed points of the triples ``(c, r, f)`` with cost ``t`` and bound ``u``, and of
    the k-drops of the ``drops`` triples (the same fields)."""
    K1, F = acc.shape
    off = np.array([dt * F + d for dt, d in offsets], dtype=np.int64)  # flat shift of each (t, d)
    tables = rows[r]
    p = bps.first_at_most(tables, f, t, strict=False)  # first corner with v <= T
    q = bps.first_at_most(tables, f, u, strict=True)  # first corner with v < U
    cr = bps.corners
    kf = cr.kf  # flat position of each corner
    cnt = p - q  # T < v < U: the corner's own value
    idx = np.arange(int(cnt.sum())) + np.repeat(q - (np.cumsum(cnt) - cnt), cnt)
    ats, vals = [kf[idx] + np.repeat(off[c], cnt)], [cr.v[idx]]
    end = bps.cptr[tables, f + 1]
    pp = np.minimum(p, max(cr.n - 1, 0))
    hit = (p < end) & (t < cr.m[pp])  # the first with v <= T, if T < m
    ats.append(kf[pp[hit]] + off[c[hit]])
    vals.append(t[hit])
    if drops is not None:
        dc, dr, df, dtv, du = drops
        o, k, v, b = bps.column_drops(rows, dr, df)
        w = np.maximum(v, dtv[o])
        ok = w < np.minimum(b, du[o])
        ats.append(k[ok] * F + df[o[ok]] + off[dc[o[ok]]])
        vals.append(w[ok])
    at, v = np.concatenate(ats), np.concatenate(vals)
    keep = at < K1 * F  # (k + dt) * F + f + d with f + d < F: in the table iff k + dt < K1
    np.minimum.at(acc.reshape(-1), at[keep], v[keep])
