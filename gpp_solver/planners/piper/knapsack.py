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

    tps: np.ndarray      # (H, n, L) TPS contribution of each slot (inf where unavailable)
    mem: np.ndarray      # (H, n, L) memory of each slot at the instance's y (inf where unavailable)
    in_s: np.ndarray     # (H, n) bool: node belongs to the stage
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
    best, applied = solve_two(h.tps[rows, cols, f], h.tps[rows, cols, o], np.arange(H), h.mem[rows, cols, f],
                              h.mem[rows, cols, o], h.in_s, h.limit, want_choice=want_choice)
    return best, (np.where(applied, o, f) if want_choice else None)


def solve_two(tps_f: np.ndarray, tps_o: np.ndarray, r: np.ndarray, mem_f: np.ndarray, mem_o: np.ndarray,
              in_s: np.ndarray, limit: float, *, base: np.ndarray | None = None,
              want_choice: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
    """The fast heuristic (at most two slots per node) on ``H`` instances: instance ``h`` has the nodes
    ``in_s[h]``, TPS ``tps_f[r[h]]`` in each node's fastest slot and ``tps_o[r[h]]`` in its other one
    (per stage: the same for every ``y``), memory ``mem_f[h]`` / ``mem_o[h]`` (``inf`` where the
    other slot is unavailable); ``base``: the all-fastest TPS of each instance if known.  Returns the
    best TPS (``inf`` if none) and, optionally, which nodes switch to their other slot (``(H, n)`` bool)."""
    H, n = in_s.shape
    tps_f, tps_o = tps_f[r], tps_o[r]
    with np.errstate(invalid="ignore", divide="ignore"):
        sav = np.where(in_s, mem_f - mem_o, 0.0)
        cand = in_s & np.isfinite(mem_o) & (sav > EPS_BYTES)
        dtps = np.where(cand, tps_o - tps_f, 0.0)
        ratio = np.where(cand, dtps / np.where(cand, sav, 1.0), np.inf)
    order = np.argsort(ratio, axis=1, kind="stable")           # ties: lower node index first
    sav_sorted = np.take_along_axis(np.where(cand, sav, 0.0), order, axis=1)
    cand_sorted = np.take_along_axis(cand, order, axis=1)
    need = np.where(in_s, mem_f, 0.0).sum(axis=1) - limit       # memory to shave off
    left = need[:, None] - np.cumsum(sav_sorted, axis=1)
    done = cand_sorted & (left < EPS_BYTES)
    ok = done.any(axis=1)
    kstar = np.argmax(done, axis=1)
    if base is None:
        base = np.where(in_s, tps_f, 0.0).sum(axis=1)
    dsum = np.cumsum(np.take_along_axis(dtps, order, axis=1), axis=1)
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
