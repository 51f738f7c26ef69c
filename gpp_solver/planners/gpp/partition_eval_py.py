"""The ``gpp`` evaluator's plain-Python pricing (``Problem._evaluate_py``), for graphs up to
``PY_EVAL_MAX_SIZE`` nodes + edges: on the paper's workloads (33-102 nodes) numpy's per-call
overhead on arrays of a few stages was most of the search time.  The figures are bit-identical to
the vectorised ``Problem._evaluate`` (the same operations in the same order: each sum in the order
``np.bincount`` adds, the element-wise formulas of ``cost.model`` on floats; tests/test_gpp_speed.py
checks it).  It returns the fields of ``partition_eval.Eval`` as a tuple (no import cycle)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

# an evaluation: (key, tps, memory, order, offsets, estimate), the fields of partition_eval.Eval
Priced = tuple


def evaluate_py(self: Any, assign: Sequence[int], devs: Sequence[int]) -> Priced | None:
    """:meth:`_evaluate` in plain Python for small graphs: the same figures, bit for bit (each
    sum in the order ``np.bincount`` adds, element-wise formulas of ``cost.model`` on floats)."""
    k = len(devs)
    quotient: set[int] = set()
    transfers: dict[int, float] = {}  # producer node * k + consumer stage -> largest bytes
    for u, v, nbytes in self._edges:
        su, sv = assign[u], assign[v]
        if su != sv:
            quotient.add(su * k + sv)
            tkey = u * k + sv
            old = transfers.get(tkey)
            if old is None or nbytes > old:
                transfers[tkey] = nbytes
    qs: list[list[int]] = [[] for _ in range(k)]
    indeg = [0] * k
    for key in sorted(quotient):
        qs[key // k].append(key % k)
        indeg[key % k] += 1
    first = [self.N] * k
    C, W, Act = [0.0] * k, [0.0] * k, [0.0] * k
    comp, weight, act = self.comp, self.weight, self.act
    for u, s in enumerate(assign):
        if first[s] == self.N:
            first[s] = u
        C[s] += comp[devs[s]][u]
        W[s] += weight[u]
        Act[s] += act[u]
    heap = [(first[s], s) for s in range(k) if indeg[s] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, s = heapq.heappop(heap)
        order.append(s)
        for t in qs[s]:
            indeg[t] -= 1
            if indeg[t] == 0:
                heapq.heappush(heap, (first[t], t))
    if len(order) < k:
        return None
    depth = [0] * k
    for s in reversed(order):
        depth[s] = 1 + max((depth[t] for t in qs[s]), default=0)
    b, n, osf, cap = self.b, self.num_micro_batches, self.osf, self.cap
    mem = [osf * W[s] + (min(depth[s], n) * b) / devs[s] * Act[s] for s in range(k)]
    over = [m - cap for m in mem if m - cap > 0.0]
    if len(over) <= 1:
        excess = over[0] if over else 0.0
    else:  # numpy's pairwise sum, as _evaluate adds
        excess = float(np.maximum(np.asarray(mem) - cap, 0.0).sum())
    tlist = [(tkey // k, tkey % k, transfers[tkey]) for tkey in sorted(transfers)]
    best: Priced | None = None
    for offsets in self._placements(order, devs):
        e = _price_py(self, devs, order, qs, assign, tlist, C, W, mem, excess, offsets)
        if best is None or e[0] < best[0]:
            best = e
    return best


def _price_py(self: Any, devs, order, qs, assign, tlist, C, W, mem, excess, offsets) -> Priced:
    k = len(devs)
    b, B, lat = self.b, self.B, self.lat
    const = self.const_bw
    if const is None:
        dpn, intra, inter = self.dpn, self.intra, self.inter
        home = []
        for s in range(k):
            lo, hi = offsets[s] // dpn, (offsets[s] + devs[s] - 1) // dpn
            home.append(lo if lo == hi else -1)
    cp, cc = [0.0] * k, [0.0] * k
    for u, sv, nbytes in tlist:
        sp = assign[u]
        if const is None:
            hp = home[sp]
            bw = intra if (hp >= 0 and hp == home[sv]) else inter
        else:
            bw = const
        cp[sp] += lat + nbytes * (b / devs[sp]) / bw
        cc[sv] += lat + nbytes * (b / devs[sv]) / bw
    per, ar, tps = [0.0] * k, [0.0] * k, [0.0] * k
    tail = self.terms.tail  # A(S) + O(S): cost.model.TimeTerms, the scalar form
    for s in range(k):
        d = devs[s]
        bw = const if const is not None else (intra if home[s] >= 0 else inter)
        ar[s] = tail(W[s], d, bw, b)
        per[s] = C[s] + 2.0 * (cp[s] + cc[s])
        tps[s] = per[s] / b + ar[s] / B
    longest = [0.0] * k
    for s in order:
        longest[s] += per[s]
        for t in qs[s]:
            if longest[s] > longest[t]:
                longest[t] = longest[s]
    est = max(longest) + (self.num_micro_batches - 1) * max(per) + max(ar)
    q = self.quantum
    vec = tuple(sorted((int(x / q) for x in tps), reverse=True))
    if self.by_estimate:
        key = (int(excess / (self.cap * 1e-9)), int(est / (q * B)), vec)
    else:
        key = (int(excess / (self.cap * 1e-9)), vec, int(est / (q * B)))
    return (key, tuple(tps), tuple(mem), tuple(order), offsets, est)
