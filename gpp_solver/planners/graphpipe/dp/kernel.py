"""Numeric kernel of GraphPipe's stage DP (Algorithm 1, lines 23-48) for one micro-batch size.

Everything here is arrays; :mod:`gpp_solver.planners.graphpipe.dp.stage_dp` does the orchestration (which micro-batch size,
which target, building stages).  The search space is the SP tree's (:mod:`gpp_solver.sp_tree`):

* a **segment** is a contiguous range ``[i..j]`` of the children of one internal tree node; its
  operators are a contiguous range of the tree's leaf order (a topological order), so compute,
  weights and activations are prefix-sum differences;
* a stage is a segment; a tree node is either one stage (the *base case*) or split: a ``Series``
  node into consecutive segments (each a multi-child stage or one child solved recursively), a
  ``Parallel`` node into consecutive groups of branches likewise (Algorithm 1's series and parallel
  decompositions, generalised from binary splits to every split point);
* with one micro-batch size ``b`` and 1F1B (``k = 1``), Table 2 gives ``i_x = max_y i_y + b``, so a
  stage's in-flight samples are ``depth * b`` where ``depth`` is 1 + the longest path to a sink.

**Shared sinks** (:func:`add_shared_sinks`, GraphPipe's shared terminals): at a series node whose
child ``p`` is a parallel node, a stage may join the tail of one branch (its last series children),
or a group of whole consecutive branches (the parallel split's group that keeps the shared sink),
with the series children ``p+1..q``; the other branches (consecutive groups on either side of that
branch or group) and the branch's head then have that stage as their successor
(:func:`attach_values`, mirrored prefix DPs :func:`prefix_series` / :func:`prefix_parallel`).  Such a stage is two leaf
ranges (``seg_lo2``/``seg_hi2``); its transfers are counted from its node set like any segment's.

**DP value.**  For a target TPS ``t`` and a tree node ``T``: ``R_T[s, e]`` = the fewest devices
with which ``T``'s operators can be staged so that every stage has ``TPS <= t``, fits in memory,
the stages after ``T`` have depth ``s`` (``0`` = none) and ``T``'s source stages have depth
``<= e``.  This is the paper's DP with its value and its device argument swapped (the paper fixes
``d`` and minimises the source's in-flight count; here the in-flight bound ``e`` is fixed and the
devices minimised) — the same Pareto set of (devices, in-flight), without a factor ``|V_D|`` in the
state.  Series: ``Suf[p][s, e] = min_{q, m} Seg[p..q][m, e] + Suf[q+1][s, m]``;
Parallel: ``Par[p][s, e] = min_q Grp[p..q][s, e] + Par[q+1][s, e]`` (both branch groups see the
same successor, the larger in-flight count wins through the common bound ``e``).

**Stage estimate** (an upper bound of the cost model's exact figure, which ``plan_build`` computes
once the plan exists): compute ``sum f_v(b/d) + g_v(b/d)``; incoming transfers exact (one per
outside producer, its largest edge); outgoing transfers one per *edge* leaving the segment (the
cost model counts one per (producer, consumer stage) ≤ that); transfer bandwidth the intra-node
one only when the whole cluster is one node, else ``min(intra, inter)``; the all-reduce uses the
intra-node bandwidth only when the replicas are guaranteed one node (power-of-two ``d`` dividing
``devices_per_node``: device ranges are then aligned, see :func:`gpp_solver.planners.graphpipe.dp.stage.assign_devices`).
Memory: ``osf * W + min(depth, n) * b / d * A`` (the plan's 1F1B order never holds more than ``n``
micro-batches).
"""

from __future__ import annotations

import time

import numpy as np

from gpp_solver.errors import TimeLimitError
from gpp_solver.planners.graphpipe.dp.shared_sinks import attach_values
from gpp_solver.planners.graphpipe.dp.tree import INF, SegDev, TreeIndex, node_groups


def check_deadline(deadline: float | None) -> None:
    """Raise :class:`TimeLimitError` once ``deadline`` (a ``time.perf_counter()`` instant) has passed."""
    if deadline is not None and time.perf_counter() > deadline:
        raise TimeLimitError("time limit reached inside a pass of GraphPipe's stage DP")


def run_dp(
    idx: TreeIndex, dev: np.ndarray, E: int, keep: bool = False, sat: bool = False, deadline: float | None = None
):
    """The DP over the tree for a batch of targets (one per leading index of ``dev``).

    Returns ``(R_root, tables, R)``: ``R_root[i, s, e]`` as in the module docstring for target
    ``i`` (values ``>= INF`` mean impossible; only the row ``s = 0`` when the root is internal:
    nothing follows the root), with ``keep`` every node's suffix tables
    ``tables[t][i, p]`` for the traceback, and every internal node's ``R``.  Batching targets shares
    the Python overhead of the recursion, which dominates on small trees; so does solving each
    group of like tree nodes (:func:`node_groups`) at once.  Past ``deadline`` (a
    ``time.perf_counter()`` instant, checked before each group) it raises :class:`TimeLimitError`.

    With ``sat`` the depths saturate at ``E`` (a stage after one at depth ``E`` has depth ``E``
    too; ``dev[..., E + 1]`` must equal ``dev[..., E]``): exact when no stage's figures change
    beyond depth ``E`` (:meth:`gpp_solver.planners.graphpipe.dp.stage_dp.StageDP.depth_cap`), and column ``E``
    then means any depth.
    """
    if not isinstance(dev, SegDev):
        dev = SegDev(dev)
    T = dev.shape[0]
    step = targets_per_chunk(idx, E)
    if T > step:  # each target's answers are its own: chunks keep the temporaries in cache
        parts = [
            _run_dp(idx, SegDev(dev.arr[i : i + step], dev.gmap, dev.seg_axis), E, keep, sat, deadline)
            for i in range(0, T, step)
        ]
        cat = lambda xs: np.concatenate(xs, axis=0)  # noqa: E731
        return (
            cat([p[0] for p in parts]),
            [cat([p[1][t] for p in parts]) for t in range(len(parts[0][1]))],
            [cat([p[2][t] for p in parts]) for t in range(len(parts[0][2]))],
        )
    return _run_dp(idx, dev, E, keep, sat, deadline)


#: bytes of the largest temporary array of a pass (over its targets) above which :func:`run_dp`
#: runs its targets in chunks: a batch whose temporaries leave the cache runs slower than its
#: targets one by one (MMT 16 x 16 at depth bound 16: 0.72 s for 11 targets at once, 0.3 s in chunks)
CHUNK_BYTES = 6 << 20


def targets_per_chunk(idx: TreeIndex, E: int) -> int:
    """How many targets one chunk of :func:`run_dp` holds: its largest temporary, ``targets x
    (like nodes x children) x (E + 1)^2`` entries, at most :data:`CHUNK_BYTES` (at least one)."""
    widest = max((len(group) * len(idx.nodes[group[0]][1]) for group in node_groups(idx)), default=1)
    return max(1, CHUNK_BYTES // (widest * (E + 1) ** 2 * 8))


# complexity: the DP's hot loop, inlined: a call per cell costs 20-30% of the search
def _run_dp(idx: TreeIndex, dev: SegDev, E: int, keep: bool, sat: bool, deadline: float | None):  # noqa: C901, PLR0912, PLR0915
    T = dev.shape[0]
    assert dev.seg_axis == 1
    arr = dev.arr
    size = E + 1
    s_idx = np.arange(size)[:, None]
    e_idx = np.arange(size)[None, :]
    empty_series = np.where(e_idx >= s_idx, 0, INF).astype(np.int64)
    lower = ~(e_idx >= np.minimum(s_idx + 1, E) if sat else e_idx >= s_idx + 1)  # a stage at depth s+1 needs e >= s+1
    n = len(idx.nodes)
    R: list[np.ndarray] = [None] * n  # type: ignore[list-item]
    tables: list[np.ndarray] = [None] * n  # type: ignore[list-item]
    site_pars = {st.par for sts in idx.sites.values() for st in sts}
    par_suf: dict[int, np.ndarray] = {}
    for group in node_groups(idx):
        check_deadline(deadline)
        kind, kids0 = idx.nodes[group[0]]
        k, g = len(kids0), len(group)
        segs = np.stack([idx.seg[t] for t in group])  # (g, k, k)
        rows = dev.gmap[segs]  # their rows in dev.arr
        # per p, 1 + the last q whose segment p..q some target can use (0: none)
        anyq = (rows != dev.arr.shape[1] - 1).any(axis=0)  # (k, k)
        last = np.where(anyq.any(axis=1), k - np.argmax(anyq[:, ::-1], axis=1), 0).tolist()
        # nothing follows the root: its rows s > 0 are never read, so only s = 0 is computed
        S = 1 if group == [idx.root[1]] else size
        suf = np.empty((T, g, k + 1, S, size), dtype=np.int64)
        for p in range(k - 1, -1, -1):
            check_deadline(deadline)  # a group of long series takes minutes on a deep, wide tree
            child_internal = kids0[p][0] == "node"
            q0 = p + 1 if child_internal else p
            out = suf[:, :, p]
            Rc = np.stack([R[idx.nodes[t][1][p][1]] for t in group], axis=1) if child_internal else None
            # segments p..q no target can use are INF throughout: stop at the last one some can
            qe = max(q0, last[p])
            if kind == "S":
                if p == k - 1:
                    suf[:, :, k] = empty_series[:S]
                if q0 < qe:
                    D = arr[:, rows[:, p, q0:qe], 1 : size + 1]  # D[i, j, q, m] = dev at depth m+1
                    X = (D[:, :, :, None, :] + suf[:, :, q0 + 1 : qe + 1]).min(axis=2)  # X[i, j, s, m]
                    np.minimum.accumulate(X, axis=3, out=X)
                    out[..., 0] = INF
                    out[..., 1:] = X[..., :-1]  # m <= e-1
                    if sat:  # after depth E: depth E
                        np.minimum(out[..., E], X[..., E], out=out[..., E])
                else:
                    out[...] = INF
                if child_internal:
                    Y = (suf[:, :, p + 1][..., None] + Rc[:, :, None]).min(axis=3)
                    np.minimum(out, Y, out=out)
            else:
                if p == k - 1:
                    suf[:, :, k] = 0
                if q0 < qe:
                    D = arr[:, rows[:, p, q0:qe], 1 : S + 1]  # D[i, j, q, s] = dev at depth s+1
                    X = (D[..., None] + suf[:, :, q0 + 1 : qe + 1]).min(axis=2)
                    X[:, :, lower[:S]] = INF
                    out[...] = X
                else:
                    out[...] = INF
                if child_internal:
                    Y = Rc[:, :, :S] + suf[:, :, p + 1]
                    np.minimum(out, Y, out=out)
            if kind == "S" and idx.sites:
                for j, t in enumerate(group):
                    for site in idx.sites.get(t, ()):
                        if site.p == p:
                            sv = [0] if t == idx.root[1] else range(size)
                            A = attach_values(idx, site, dev, suf[:, j], R, par_suf[site.par], E, sv, sat)
                            np.minimum(suf[:, j, p], A[:, :S], out=suf[:, j, p])
        Rg = np.minimum(suf[:, :, 0], INF)
        for j, t in enumerate(group):
            R[t] = Rg[:, j]
            if t in site_pars:
                par_suf[t] = suf[:, j]
            if keep:
                tables[t] = suf[:, j]
    return R[idx.root[1]], (tables if keep else []), R
