"""The stage DP's shared-sink tables (GraphPipe §5, §7.5): a stage that joins the tail of one branch
(or a group of whole branches) of a parallel block with the series children after it.  The mirrored
prefix DPs (:func:`prefix_series`, :func:`prefix_parallel`) price what comes before such a stage;
:func:`attach_values` gives :func:`gpp_solver.planners.graphpipe.dp.kernel.run_dp` its values and
:func:`attach_parts` the traceback its pieces."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpp_solver.planners.graphpipe.dp.tree import INF, AttachSite, TreeIndex


def _head_base(T: int, size: int) -> np.ndarray:
    """Nothing before: the successor (depth ``m``) is itself a source stage, so ``m <= e``."""
    m_idx, e_idx = np.arange(size)[:, None], np.arange(size)[None, :]
    return np.broadcast_to(np.where(m_idx <= e_idx, 0, INF).astype(np.int64), (T, size, size)).copy()


def prefix_series(idx: TreeIndex, t: int, dev: np.ndarray, R: list, E: int, upto: int, sat: bool = False) -> np.ndarray:
    """``pre[:, u, m, e]`` for ``u = 0..upto``: fewest devices staging the first ``u`` children of
    series node ``t`` when the stage after them has depth ``m`` and every stage has depth ``<= e``
    (the mirror image of :func:`~gpp_solver.planners.graphpipe.dp.kernel.run_dp`'s series suffix)."""
    T, size = dev.shape[0], E + 1
    kids, segs = idx.nodes[t][1], idx.seg[t]
    pre = np.empty((T, upto + 1, size, size), dtype=np.int64)
    pre[:, 0] = _head_base(T, size)
    shifted = np.full((T, upto + 1, size, size), INF, dtype=np.int64)  # shifted[:, v, m] = pre[:, v, m+1]
    shifted[:, 0, :-1] = pre[:, 0, 1:]
    if sat:  # before a stage at depth E: depth E
        shifted[:, 0, -1] = pre[:, 0, -1]
    for u in range(1, upto + 1):
        internal = kids[u - 1][0] == "node"
        D = dev[:, segs[0:u, u - 1], 1 : size + 1]  # (T, v, m): stage at depth m+1
        if internal:
            D = D.copy()
            D[:, u - 1] = INF
        best = (D[:, :, :, None] + shifted[:, :u]).min(axis=1)
        if internal:
            Rc = R[kids[u - 1][1]]  # [m, m']
            np.minimum(best, (Rc[:, :, :, None] + pre[:, u - 1][:, None, :, :]).min(axis=2), out=best)
        pre[:, u] = np.minimum(best, INF)
        shifted[:, u, :-1] = pre[:, u, 1:]
        if sat:
            shifted[:, u, -1] = pre[:, u, -1]
    return pre


def prefix_leaf_series(
    idx: TreeIndex, ts: Sequence[int], dev: np.ndarray, E: int, upto: int, sat: bool = False
) -> np.ndarray:
    """:func:`prefix_series` for several series nodes of operators only (no internal child) at
    once: ``pre[:, j, u, m, e]`` for node ``ts[j]``."""
    T, size = dev.shape[0], E + 1
    SEGS = np.stack([idx.seg[t][:upto, :upto] for t in ts])  # (j, v, u)
    n = len(ts)
    pre = np.empty((T, n, upto + 1, size, size), dtype=np.int64)
    pre[:, :, 0] = _head_base(T, size)[:, None]
    shifted = np.full((T, n, upto + 1, size, size), INF, dtype=np.int64)
    shifted[:, :, 0, :-1] = pre[:, :, 0, 1:]
    if sat:
        shifted[:, :, 0, -1] = pre[:, :, 0, -1]
    for u in range(1, upto + 1):
        D = dev[:, SEGS[:, 0:u, u - 1], 1 : size + 1]  # (T, j, v, m)
        pre[:, :, u] = np.minimum((D[..., None] + shifted[:, :, :u]).min(axis=2), INF)
        shifted[:, :, u, :-1] = pre[:, :, u, 1:]
        if sat:
            shifted[:, :, u, -1] = pre[:, :, u, -1]
    return pre


def prefix_parallel(
    idx: TreeIndex, t: int, dev: np.ndarray, R: list, E: int, upto: int, sat: bool = False
) -> list[np.ndarray]:
    """``pre[i][., s, e]`` for ``i = 0..upto``: fewest devices staging the first ``i`` branches of
    parallel node ``t`` in consecutive groups (the mirror image of :func:`~gpp_solver.planners.graphpipe.dp.kernel.run_dp`'s parallel suffix)."""
    T, size = dev.shape[0], E + 1
    kids, segs = idx.nodes[t][1], idx.seg[t]
    s_idx, e_idx = np.arange(size)[:, None], np.arange(size)[None, :]
    lower = ~(e_idx >= np.minimum(s_idx + 1, E) if sat else e_idx >= s_idx + 1)
    pre = [np.zeros((T, size, size), dtype=np.int64)]
    for i in range(1, upto + 1):
        best = np.full((T, size, size), INF, dtype=np.int64)
        internal = kids[i - 1][0] == "node"
        for v in range(i):
            if v == i - 1 and internal:
                continue
            X = dev[:, segs[v, i - 1], 1 : size + 1][:, :, None] + pre[v]
            X[:, lower] = INF
            np.minimum(best, X, out=best)
        if internal:
            np.minimum(best, R[kids[i - 1][1]] + pre[i - 1], out=best)
        pre.append(np.minimum(best, INF))
    return pre


@dataclass
class AttachParts:
    """The tables one site's choices combine (for the values and for the traceback)."""

    others: list[np.ndarray]  # others[i][., m, e]: every branch but i, successor depth m
    heads: list[np.ndarray]  # heads[i][., u, m, e]: branch i's children before u
    prepar: list[np.ndarray]


def attach_parts(
    idx: TreeIndex, site: AttachSite, dev: np.ndarray, R: list, par_suf: np.ndarray, E: int, sat: bool = False
) -> AttachParts:
    T, size = dev.shape[0], E + 1
    kidsP = idx.nodes[site.par][1]
    prepar = prefix_parallel(idx, site.par, dev, R, E, len(kidsP) - 1, sat)
    others, heads = [], []
    batch: dict[int, list[int]] = {}  # branches of operators only, by length: one batched prefix DP
    for i, opts in enumerate(site.tails):
        others.append(np.minimum(prepar[i] + par_suf[:, i + 1], INF))
        hb, cb = kidsP[i]
        if hb == "node" and idx.nodes[cb][0] == "S":
            if all(h == "leaf" for h, _ in idx.nodes[cb][1]):
                batch.setdefault(max(u for u, _ in opts), []).append(i)
                heads.append(None)
            else:
                heads.append(prefix_series(idx, cb, dev, R, E, max(u for u, _ in opts), sat))
        else:
            heads.append(_head_base(T, size)[:, None])
    for upto, members in batch.items():
        pre = prefix_leaf_series(idx, [kidsP[i][1] for i in members], dev, E, upto, sat)
        for j, i in enumerate(members):
            heads[i] = pre[:, j]
    return AttachParts(others, heads, prepar)


def attach_values(
    idx: TreeIndex,
    site: AttachSite,
    dev: np.ndarray,
    suf: np.ndarray,
    R: list,
    par_suf: np.ndarray,
    E: int,
    s_values: Sequence[int],
    sat: bool = False,
) -> np.ndarray:
    """``out[i, s, e]`` (``s`` in ``s_values``, else ``INF``): the least devices over the site's
    shared-sink choices for the series suffix starting at the site's child ``p`` — the shared
    stage (branch tail + series children ``p+1..q``) at depth ``m``, the series rest after ``q``
    below it (``suf[:, q+1][s, m-1]``), the branch's head and every other branch before it
    (successor depth ``m``).  ``suf`` is the series node's suffix table (positions ``> p`` done)."""
    T, size = dev.shape[0], E + 1
    out = np.full((T, size, size), INF, dtype=np.int64)
    sv = np.asarray(list(s_values), dtype=np.int64)
    parts = attach_parts(idx, site, dev, R, par_suf, E, sat)
    for i, opts in enumerate(site.tails):
        us = [u for u, _ in opts]
        qs = [q for q, _ in opts[0][1]]
        G = np.asarray([[g for _, g in qg] for _, qg in opts], dtype=np.int64)  # (u, q)
        rest = np.stack([suf[:, q + 1][:, sv, : size - 1] for q in qs], axis=1)  # (T, q, s, m-1)
        F = np.full((T, len(us), len(sv), size), INF, dtype=np.int64)  # (T, u, s, m)
        F[..., 1:] = (dev[:, G, 1:size][:, :, :, None, :] + rest[:, None]).min(axis=2)
        if sat:  # the rest at depth E: the shared stage at depth E too
            last = np.stack([suf[:, q + 1][:, sv, E] for q in qs], axis=1)  # (T, q, s)
            np.minimum(F[..., E], (dev[:, G, E][:, :, :, None] + last[:, None]).min(axis=2), out=F[..., E])
        HO = np.minimum(parts.heads[i][:, us] + parts.others[i][:, None], INF)  # (T, u, m, e)
        val = (F[:, :, :, :, None] + HO[:, :, None, :, :]).min(axis=(1, 3))  # (T, s, e)
        out[:, sv] = np.minimum(out[:, sv], val)
    if site.groups:
        F, Out = group_parts(site, dev, suf, par_suf, parts.prepar, sv, size, sat)
        step = max(1, (1 << 21) // max(1, T * len(sv) * size * size))  # bound the temporary
        for lo in range(0, len(site.groups), step):
            val = (F[:, lo : lo + step, :, :, None] + Out[:, lo : lo + step, None]).min(axis=(1, 3))  # (T, s, e)
            out[:, sv] = np.minimum(out[:, sv], val)
    return np.minimum(out, INF)


def group_parts(
    site: AttachSite,
    dev: np.ndarray,
    suf: np.ndarray,
    par_suf: np.ndarray,
    prepar: list[np.ndarray],
    sv: np.ndarray,
    size: int,
    sat: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """For the site's whole-branch groups ``(a, c)``: ``F[., grp, s, m]``, the shared stage at depth
    ``m`` with the series rest after it (successor depth ``s``), and ``Out[., grp, m, e]``, the
    branches before ``a`` and after ``c`` with that stage as successor (``m <= e``: nothing before)."""
    T = dev.shape[0]
    qs = [q for q, _ in site.groups[0][2]]
    rest = np.stack([suf[:, q + 1][:, sv, : size - 1] for q in qs], axis=1)  # (T, q, s, m-1)
    G = np.asarray([[g for _, g in qg] for _, _, qg in site.groups], dtype=np.int64)  # (grp, q)
    F = np.full((T, len(G), len(sv), size), INF, dtype=np.int64)
    F[..., 1:] = (dev[:, G, 1:size][:, :, :, None, :] + rest[:, None]).min(axis=2)
    if sat:
        E = size - 1
        last = np.stack([suf[:, q + 1][:, sv, E] for q in qs], axis=1)  # (T, q, s)
        np.minimum(F[..., E], (dev[:, G, E][:, :, :, None] + last[:, None]).min(axis=2), out=F[..., E])
    a = np.asarray([x for x, _, _ in site.groups])
    c = np.asarray([z for _, z, _ in site.groups])
    PP = np.stack(prepar, axis=1)  # (T, i, m, e)
    Out = PP[:, a] + par_suf[:, c + 1] + _head_base(T, size)[:, None]
    return F, np.minimum(Out, INF)
