"""Algorithm 1, lines 1-11: the search for the smallest bottleneck TPS, per micro-batch size.

The paper bisects ``[0, MAXTPS]`` until the interval is below ``epsilon``.  The optimum is always
the TPS of one stage the DP can form, so — as Alpa's stage DP does — we enumerate those values
(:meth:`gpp_solver.dp.StageDP.candidates`: every segment at every degree), sort them and
binary-search the sorted list: the search ends *exactly* at the smallest feasible value, with no epsilon.  Each DP pass tests
several targets at once (a k-ary search, :meth:`gpp_solver.dp.StageDP.batch_size`), which shares
the Python overhead of the recursion; with one target per pass it is the plain binary search.  The result is optimal within the DP's search
space and with respect to its (conservative) stage estimates.

Across micro-batch sizes the paper sweeps for throughput (A.2); we search every ``b`` (all of
them batched into the same DP passes) and pick the one whose plan has the smallest iteration-time
estimate of the cost model (``score``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from .micro_batch import powers_of_two_dividing
from .dp import DPStage, StageDP

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TpsSearch:
    """Outcome of the search at one micro-batch size."""

    b: int
    tps: float                  # the DP's bottleneck target reached (smallest feasible candidate)
    stages: tuple[DPStage, ...]
    probes: int                 # DP passes (each tests several targets at once)
    candidates: int
    exact: bool                 # False when stopped by the time limit before the interval closed


def search_tps(dp: StageDP, b: int, *, deadline: float | None = None) -> TpsSearch | None:
    """Smallest candidate TPS at ``b`` for which the DP finds a plan; ``None`` if none fits."""
    return search_many(dp, [b], deadline=deadline)[b]


def search_many(dp: StageDP, sizes: Sequence[int], *, deadline: float | None = None,
                on_pass: Callable[[int], None] | None = None) -> dict[int, TpsSearch | None]:
    """:func:`search_tps` for every micro-batch size at once.

    Every DP pass tests several ``(b, target)`` pairs together (a k-ary search per ``b``, all sizes
    batched into one pass), which shares the Python overhead of the recursion.  For each ``b`` the
    interval ``[lo, hi]`` of its sorted candidates always holds the answer: ``cands[hi]`` is
    feasible and everything below ``lo`` is not.  At the deadline each ``b`` keeps its feasible
    ``cands[hi]`` (``exact=False``).
    """
    cands: dict[int, np.ndarray] = {}
    for b in sizes:
        c = dp.candidates(b)
        cands[b] = c[c >= dp.lower_bound(b) * (1 - 1e-12)]
    live = [b for b in sizes if len(cands[b])]
    top = {b: len(cands[b]) for b in live}      # hi == top: no candidate proven feasible yet
    lo = {b: 0 for b in live}
    hi = dict(top)
    passes, exact = 0, True
    budget = dp.batch_size()
    while True:
        active = [b for b in live if lo[b] < hi[b]]
        if not active:
            break
        if passes and deadline is not None and time.perf_counter() > deadline:
            exact = False       # the first pass always runs: it proves the largest candidate feasible
            break
        width = max(1, budget // len(active))
        pairs, owner = [], []
        for b in active:
            n = hi[b] - lo[b]
            picks = sorted({lo[b] + (n * (i + 1)) // (width + 1) for i in range(width)} - {hi[b]}) or [lo[b]]
            if hi[b] == top[b] and picks[-1] != top[b] - 1:
                picks.append(top[b] - 1)    # the first pass also checks that some candidate is feasible
            pairs.extend((b, float(cands[b][i])) for i in picks)
            owner.append((b, picks))
        res = dp.min_devices_pairs(pairs) <= dp.D
        passes += 1
        if on_pass is not None:
            on_pass(len(active))
        at = 0
        for b, picks in owner:
            flags = res[at:at + len(picks)]
            at += len(picks)
            first = next((i for i, f in enumerate(flags) if f), None)
            if first is None:
                lo[b] = picks[-1] + 1
            else:
                hi[b] = picks[first]
                if first > 0:
                    lo[b] = picks[first - 1] + 1
    out: dict[int, TpsSearch | None] = {b: None for b in sizes}
    live = [b for b in live if hi[b] < top[b]]
    if live:
        stages = dp.stages_many([(b, float(cands[b][hi[b]])) for b in live])
        for b, st in zip(live, stages):
            out[b] = TpsSearch(b, float(cands[b][hi[b]]), tuple(st), passes + 1, len(cands[b]),
                               exact or lo[b] == hi[b])
    return out


@dataclass(frozen=True)
class SweepResult:
    best: TpsSearch | None
    score: float
    tried: tuple[int, ...]       # micro-batch sizes searched
    infeasible: tuple[int, ...]
    timed_out: bool
    probes: int
    ranked: tuple[tuple[float, int], ...] = ()   # (score, b) of every feasible size, best first


def sweep(dp: StageDP, micro_batch_sizes: Sequence[int], score: Callable[[TpsSearch], float], *,
          deadline: float | None = None, on_pass: Callable[[int], None] | None = None) -> SweepResult:
    """Search every micro-batch size (batched, :func:`search_many`) and keep the best by ``score``
    (ties: the smaller DP TPS, then the larger ``b``)."""
    results = search_many(dp, micro_batch_sizes, deadline=deadline, on_pass=on_pass)
    best, best_key, best_score = None, None, float("inf")
    ranked: list[tuple[tuple[float, float, int], int]] = []
    infeasible, timed_out, probes = [], False, 0
    for b in micro_batch_sizes:
        res = results[b]
        if res is None:
            infeasible.append(b)
            logger.info("b=%d: no plan fits in memory", b)
            continue
        probes = max(probes, res.probes)
        timed_out |= not res.exact
        sc = score(res)
        logger.info("b=%d: TPS %.6g with %d stages (%d candidates), iteration estimate %.6g",
                    b, res.tps, len(res.stages), res.candidates, sc)
        key = (sc, res.tps, -b)
        ranked.append((key, b))
        if best_key is None or key < best_key:
            best, best_key, best_score = res, key, sc
    ranked.sort()
    return SweepResult(best, best_score, tuple(micro_batch_sizes), tuple(infeasible), timed_out, probes,
                       tuple((k[0], b) for k, b in ranked))


def default_micro_batch_sizes(mini_batch_size: int, limit: Iterable[int] | None = None) -> tuple[int, ...]:
    """Powers of two dividing ``B`` (the paper's micro-batch sizes), optionally intersected."""
    out = powers_of_two_dividing(mini_batch_size)
    if limit is not None:
        allowed = set(limit)
        out = tuple(b for b in out if b in allowed)
    return out


__all__ = ["TpsSearch", "SweepResult", "search_tps", "search_many", "sweep", "default_micro_batch_sizes"]
