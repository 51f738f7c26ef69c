"""Algorithm 1, lines 1-11: the search for the smallest bottleneck TPS, per micro-batch size.

The paper bisects ``[0, MAXTPS]`` until the interval is below ``epsilon``.  The optimum is always
the TPS of one stage the DP can form, so — as Alpa's stage DP does — we enumerate those values
(:meth:`gpp_solver.dp.StageDP.candidates`: every segment at every degree), sort them and
binary-search the sorted list: the search ends *exactly* at the smallest feasible value, after
``ceil(log2(#candidates))`` DP runs, with no epsilon.  The result is optimal within the DP's search
space and with respect to its (conservative) stage estimates.

Across micro-batch sizes the paper sweeps for throughput (A.2); we pick the ``b`` whose plan has
the smallest iteration-time estimate of the cost model (``score``), skipping a ``b`` when the
lower bound ``B * TPS_lower(b)`` of its estimate cannot beat the best one found so far.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .dp import DPStage, StageDP

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TpsSearch:
    """Outcome of the search at one micro-batch size."""

    b: int
    tps: float                  # the DP's bottleneck target reached (smallest feasible candidate)
    stages: tuple[DPStage, ...]
    probes: int                 # DP runs
    candidates: int
    exact: bool                 # False when stopped by the time limit before the interval closed


def search_tps(dp: StageDP, b: int, *, deadline: float | None = None) -> TpsSearch | None:
    """Smallest candidate TPS at ``b`` for which the DP finds a plan; ``None`` if none fits."""
    cands = dp.candidates(b)
    lb = dp.lower_bound(b)
    cands = cands[cands >= lb * (1 - 1e-12)]
    if len(cands) == 0 or not dp.feasible(b, float(cands[-1])):
        return None
    lo, hi, probes, exact = 0, len(cands) - 1, 1, True
    while lo < hi:
        if deadline is not None and time.perf_counter() > deadline:
            exact = False
            break
        mid = (lo + hi) // 2
        probes += 1
        if dp.feasible(b, float(cands[mid])):
            hi = mid
        else:
            lo = mid + 1
    t = float(cands[hi])
    return TpsSearch(b, t, tuple(dp.stages(b, t)), probes, len(cands), exact)


@dataclass(frozen=True)
class SweepResult:
    best: TpsSearch | None
    score: float
    tried: tuple[int, ...]       # micro-batch sizes searched
    skipped: tuple[int, ...]     # pruned by the lower bound
    infeasible: tuple[int, ...]
    timed_out: bool
    probes: int


def sweep(dp: StageDP, micro_batch_sizes: Sequence[int], score: Callable[[TpsSearch], float], *,
          deadline: float | None = None, on_step: Callable[[int], None] | None = None) -> SweepResult:
    """Search every micro-batch size (most promising first) and keep the best by ``score``.

    At least one size is always searched to the end, whatever the deadline.
    """
    bounds = {b: dp.B * dp.lower_bound(b) for b in micro_batch_sizes}
    order = sorted(micro_batch_sizes, key=lambda b: (bounds[b], -b))
    best, best_score = None, float("inf")
    tried, skipped, infeasible = [], [], []
    timed_out, probes = False, 0
    for b in order:
        if on_step:
            on_step(b)
        if bounds[b] >= best_score:
            skipped.append(b)
            continue
        if deadline is not None and best is not None and time.perf_counter() > deadline:
            timed_out = True
            skipped.append(b)
            continue
        res = search_tps(dp, b, deadline=deadline if best is not None else None)
        tried.append(b)
        if res is None:
            infeasible.append(b)
            logger.info("b=%d: no plan fits in memory", b)
            continue
        probes += res.probes
        timed_out |= not res.exact
        sc = score(res)
        logger.info("b=%d: TPS %.6g with %d stages (%d DP runs over %d candidates), iteration estimate %.6g",
                    b, res.tps, len(res.stages), res.probes, res.candidates, sc)
        if sc < best_score or (sc == best_score and best is not None and res.tps < best.tps):
            best, best_score = res, sc
    return SweepResult(best, best_score, tuple(tried), tuple(skipped), tuple(infeasible), timed_out, probes)


def default_micro_batch_sizes(mini_batch_size: int, limit: Iterable[int] | None = None) -> tuple[int, ...]:
    """Powers of two dividing ``B`` (the paper's micro-batch sizes), optionally intersected."""
    out, b = [], 1
    while b <= mini_batch_size:
        if mini_batch_size % b == 0:
            out.append(b)
        b *= 2
    if limit is not None:
        allowed = set(limit)
        out = [b for b in out if b in allowed]
    return tuple(out)


__all__ = ["TpsSearch", "SweepResult", "search_tps", "sweep", "default_micro_batch_sizes"]
