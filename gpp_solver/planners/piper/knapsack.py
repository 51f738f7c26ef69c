"""Piper's knapsack subproblem (Tarnawski et al. 2021, §4): one TMPC per node of a stage so that the
stage's memory ``sum_v a_v * y + b_v`` stays under the limit ``M`` while the sum of the nodes' TPS
contributions is as small as possible (``y = ceil(s / d)``).

Piper's bang-per-buck heuristic, as its published code runs it (``KNAPSACK_FAST_HEURISTIC``):

1. pick every node's fastest TMPC (the first one on ties); if that fits, done;
2. if even every node's lowest-memory TMPC does not fit: infeasible (``+inf``);
3. otherwise list every switch "node ``i`` -> TMPC ``l``" that saves memory (> 1e-9 bytes) against the
   fastest choice, sort by (TPS increase / memory saved, ``i``), and apply them in that order until the
   memory fits.  (With at most two TMPCs per node, which the published code requires for this mode,
   each node has at most one switch.)

For nodes with more than two TMPCs the published slower heuristic runs instead (repeatedly apply the
switch with the least TPS increase per byte saved, the saving truncated to what is still needed).

Everything here is vectorised over many (stage, y) instances at once; arrays are padded to ``L``
TMPC slots per node with ``avail`` marking the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

EPS_BYTES = 1e-9


@dataclass(frozen=True)
class HardInstances:
    """``H`` knapsack instances that neither the all-fastest nor the all-lowest-memory rule decides."""

    tps: np.ndarray  # (H, n, L) TPS contribution of each slot (inf where unavailable)
    mem: np.ndarray  # (H, n, L) memory of each slot at the instance's y (inf where unavailable)
    in_s: np.ndarray  # (H, n) bool: node belongs to the stage
    fastest: np.ndarray  # (H, n) int: fastest slot of each node
    limit: float


def solve_hard(h: HardInstances, *, want_choice: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """Best TPS of each hard instance (``inf`` if the heuristic finds nothing) and, optionally, the
    chosen slot of every node (``(H, n)``)."""
    H, n, L = h.tps.shape
    if H == 0:
        return np.zeros(0), (np.zeros((0, n), dtype=int) if want_choice else None)
    if L > 2:
        return _solve_general(h, want_choice)
    rows = np.arange(H)[:, None]
    cols = np.arange(n)[None, :]
    f = h.fastest
    o = 1 - f if L == 2 else f
    tps_f, mem_f, mem_o = h.tps[rows, cols, f], h.mem[rows, cols, f], h.mem[rows, cols, o]
    with np.errstate(invalid="ignore"):
        sav = np.where(h.in_s, mem_f - mem_o, 0.0)
        cand = h.in_s & np.isfinite(mem_o) & (sav > EPS_BYTES)
        dtps = h.tps[rows, cols, o] - tps_f
    need = np.where(h.in_s, mem_f, 0.0).sum(axis=1) - h.limit
    base = np.where(h.in_s, tps_f, 0.0).sum(axis=1)
    best, applied = solve_two(dtps, np.arange(H), need, sav, cand, base, want_choice=want_choice)
    return best, (np.where(applied, o, f) if want_choice else None)


def solve_two(
    dtps: np.ndarray,
    r: np.ndarray,
    need: np.ndarray,
    sav: np.ndarray,
    cand: np.ndarray,
    base: np.ndarray,
    *,
    want_choice: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The fast heuristic (at most two slots per node) on ``H`` instances: ``need[h]`` bytes to shave
    off the all-fastest choice (TPS ``base[h]``); switching node ``i`` to its other slot saves
    ``sav[h, i]`` bytes (used where ``cand[h, i]``: the node is in the stage, its other slot exists
    and saves more than ``EPS_BYTES``) and costs ``dtps[r[h], i]`` (per stage: the same for every
    ``y``).  The columns may be any superset of the stages' nodes.  Returns the best TPS (``inf`` if
    none) and, optionally, which nodes switch (``(H, n)`` bool)."""
    H, n = sav.shape
    d = dtps[r]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(cand, d / sav, np.inf)  # the candidates first, then the rest
    order = np.argsort(ratio, axis=1, kind="stable")  # ties: lower node index first
    cand_sorted = np.take_along_axis(cand, order, axis=1)
    # past the candidates (a prefix of the order) nothing counts, whatever sav and d hold there
    with np.errstate(invalid="ignore"):
        left = need[:, None] - np.cumsum(np.take_along_axis(sav, order, axis=1), axis=1)
        done = cand_sorted & (left < EPS_BYTES)
        ok = done.any(axis=1)
        kstar = np.argmax(done, axis=1)
        dsum = np.cumsum(np.take_along_axis(d, order, axis=1), axis=1)
        best = np.where(ok, base + dsum[np.arange(H), kstar], np.inf)
    applied = None
    if want_choice:
        applied = np.zeros((H, n), dtype=bool)
        pos = np.arange(n)[None, :] <= kstar[:, None]
        np.put_along_axis(applied, order, pos & cand_sorted & ok[:, None], axis=1)
    return best, applied


def _solve_general(h: HardInstances, want_choice: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The published slower heuristic, one instance at a time (inputs with > 2 TMPCs per node)."""
    H, n, L = h.tps.shape
    best = np.full(H, np.inf)
    choice = np.array(h.fastest, copy=True)
    for k in range(H):
        cur = np.array(h.fastest[k], copy=True)
        nodes = np.flatnonzero(h.in_s[k])
        tps, mem = h.tps[k], h.mem[k]
        need = float(mem[nodes, cur[nodes]].sum()) - h.limit
        failed = False
        while need > EPS_BYTES:
            best_ratio, bi, bl = np.inf, -1, -1
            for i in nodes:
                for l in range(L):
                    saving = mem[i, cur[i]] - mem[i, l]
                    if np.isfinite(mem[i, l]) and saving > EPS_BYTES:
                        r = (tps[i, l] - tps[i, cur[i]]) / min(saving, need)
                        if r < best_ratio:
                            best_ratio, bi, bl = r, i, l
            if bi < 0:
                failed = True
                break
            need -= mem[bi, cur[bi]] - mem[bi, bl]
            cur[bi] = bl
        if not failed:
            best[k] = float(tps[nodes, cur[nodes]].sum())
            choice[k] = cur
    return best, (choice if want_choice else None)
