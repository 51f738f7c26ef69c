"""Algorithm 1, lines 1-11: the search for the smallest bottleneck TPS, per micro-batch size.

The paper bisects ``[0, MAXTPS]`` until the interval is below ``epsilon``.  The optimum is always
the TPS of one stage the DP can form, so — as Alpa's stage DP does — we enumerate those values
(:meth:`gpp_solver.planners.graphpipe.dp.StageDP.candidates`: every segment at every degree), sort them and
binary-search the sorted list: the search ends *exactly* at the smallest feasible value, with no epsilon.  Each DP pass tests
several targets at once (a k-ary search, :meth:`gpp_solver.planners.graphpipe.dp.StageDP.batch_size`), which shares
the Python overhead of the recursion; with one target per pass it is the plain binary search.  On
large trees (:meth:`~gpp_solver.planners.graphpipe.dp.StageDP.large`), until
a target is proven feasible the probes gallop up from the lower bound (targets from ``cands[lo]`` to
``2 ** 2 ** g`` times it in the ``g``-th pass) instead of spreading over every candidate: a
target's DP only stores the segments it can use (:meth:`StageDP._dev`), so low targets keep the
passes small on long series, and feasibility is monotone in the target, so the answer is the same
(at the deadline, a key with no feasible target yet gets one last pass at its largest candidate);
there the first phase also saturates depths at each size's cap
(:meth:`~gpp_solver.planners.graphpipe.dp.StageDP.depth_cap`, exact).  On small trees the first
pass spreads over every candidate and, with a deadline, includes the largest.  The result is optimal within the DP's search
space and with respect to its (conservative) stage estimates.

Known bounds narrow the intervals without a probe: targets known feasible (the planner's quick
search bounded to a shallow depth, :func:`search_bounded`) and, for the depth sweep's second
phase, the least TPS at any depth below which no bound is feasible.

Across micro-batch sizes the paper sweeps for throughput (A.2); we search every ``b`` (all of
them batched into the same DP passes, :func:`search_many`; with the depth sweep, :func:`search_depths`)
and the planner (:mod:`gpp_solver.planners.graphpipe.uniform`) picks among the stagings by simulation.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from gpp_solver.errors import TimeLimitError
from gpp_solver.planners.graphpipe.dp import StageDP
from gpp_solver.planners.graphpipe.dp_stage import DPStage
from gpp_solver.planners.graphpipe.key_search import TpsSearch, search_keys

logger = logging.getLogger(__name__)


def search_tps(dp: StageDP, b: int, *, deadline: float | None = None) -> TpsSearch | None:
    """Smallest candidate TPS at ``b`` for which the DP finds a plan; ``None`` if none fits."""
    return search_many(dp, [b], deadline=deadline)[b]


def search_many(
    dp: StageDP, sizes: Sequence[int], *, deadline: float | None = None, on_pass: Callable[[int], None] | None = None
) -> dict[int, TpsSearch | None]:
    """:func:`search_tps` for every micro-batch size at once.

    Every DP pass tests several ``(b, target)`` pairs together (a k-ary search per ``b``, all sizes
    batched into one pass), which shares the Python overhead of the recursion.  For each ``b`` the
    interval ``[lo, hi]`` of its sorted candidates always holds the answer: ``cands[hi]`` is
    feasible and everything below ``lo`` is not.  At the deadline each ``b`` keeps its feasible
    ``cands[hi]`` (``exact=False``).
    """
    found = _first_phase(dp, sizes, deadline, on_pass, saturate=1)
    return {b: found.get((b, dp.E)) for b in sizes}


def search_depths(
    dp: StageDP,
    sizes: Sequence[int],
    *,
    deadline: float | None = None,
    on_pass: Callable[[int], None] | None = None,
    deepen: Callable[[dict[int, TpsSearch]], Iterable[int]] | None = None,
    max_bound: int | None = None,
    feasible: dict[int, tuple[float, int]] | None = None,
) -> dict[int, list[TpsSearch]]:
    """For every ``b``: the smallest DP target TPS at every bound on the stage graph's depth.

    The paper's DP gives, for every target, the fewest in-flight micro-batches at the source (the
    depth); its binary search keeps only the smallest target.  This keeps the whole staircase: a
    shallower stage graph fills and drains faster, so at a slightly larger bottleneck it can finish an iteration
    sooner (a 4-stage chain against pure data parallelism).  The DP's root table already holds the
    fewest devices for every depth bound ``e`` (``R[0, e]``), so one search per ``(b, e)`` shares
    every DP pass with the others, and each pass's answers narrow all depth bounds of its ``b``.
    Returns, per ``b``, the Pareto points only (each strictly smaller TPS than every shallower one),
    shallowest first; the last is :func:`search_many`'s answer.  ``[]`` when nothing fits.

    Two phases: :func:`search_many` first (the least TPS at ``b`` and the depth ``e0`` of its
    staging, the smallest depth that reaches it); every bound ``e >= e0`` has that same answer, so
    only ``e < e0`` is searched next, by DP passes bounded to depth ``max e0 - 1`` (small tables).
    ``deepen(first)``, given the first phase's answers ``{b: TpsSearch}``, may name the sizes worth
    the second phase (the others keep their one point), or map each such size to the least depth
    bound worth searching there; by default every size and bound.  ``max_bound``
    limits the second phase to depth bounds ``e <= max_bound`` (the passes' tables grow with the
    square of the bound: a chain of 100 operators on 32 devices has stagings 32 deep).
    ``feasible``: per size a target and the depth of a staging meeting it (e.g. from
    :func:`search_bounded`): the searches start below it, without a probe.
    """
    # depths saturate (StageDP.depth_cap) no lower than the second phase's bounds + 2, so a staging
    # whose depth the cap hides is deeper than every bound searched next
    floor = dp.E + 1 if max_bound is None else int(max_bound) + 2
    first = _first_phase(dp, sizes, deadline, on_pass, saturate=floor, feasible=feasible)
    if deadline is not None and time.perf_counter() > deadline:  # no second phase: its points are unproven
        return {b: [] if (b, dp.E) not in first else [replace(first[(b, dp.E)], exact=False)] for b in sizes}
    e0 = {b: max(s.depth for s in r.stages) for (b, _), r in first.items()}
    asked = {b: 1 for b in e0} if deepen is None else deepen({b: first[(b, dp.E)] for b in e0})
    if not isinstance(asked, dict):
        asked = {b: 1 for b in asked}
    cap = dp.E if max_bound is None else max(1, int(max_bound))
    keys = [(b, e) for b in sorted(set(asked) & set(e0)) for e in range(max(1, int(asked[b])), min(e0[b] - 1, cap) + 1)]
    found = {}
    if keys:
        try:
            found = search_keys(
                dp,
                sorted({b for b, _ in keys}),
                keys,
                deadline,
                on_pass,
                E=max(e for _, e in keys),
                must_answer=False,
                bound=feasible,
                floor={b: first[(b, dp.E)].tps for b in e0},
            )
        except TimeLimitError:  # inside the second phase's first pass: the first phase's points stand
            return {b: [] if (b, dp.E) not in first else [replace(first[(b, dp.E)], exact=False)] for b in sizes}
    out: dict[int, list[TpsSearch]] = {}
    for b in sizes:
        pts: list[TpsSearch] = []
        for e in range(1, e0.get(b, 0)):
            r = found.get((b, e))
            if r is not None and (not pts or r.tps < pts[-1].tps):
                pts.append(r)
        if b in e0:
            r = first[(b, dp.E)]
            if not pts or r.tps < pts[-1].tps:
                more = max((x.probes for x in found.values()), default=0)  # the second phase's passes
                pts.append(replace(r, depth_bound=e0[b], probes=r.probes + more))
        out[b] = pts
    return out


def search_bounded(
    dp: StageDP,
    sizes: Sequence[int],
    e: int,
    *,
    deadline: float | None = None,
    on_pass: Callable[[int], None] | None = None,
    tol: float = 0.0,
) -> dict[int, TpsSearch]:
    """For every size a staging at most ``e`` deep (passes bounded to depth ``e``: small tables)
    whose TPS is within a factor ``1 + tol`` of the least such; sizes with none are left out.
    Past the deadline: ``{}`` (nothing traced)."""
    e = max(1, min(int(e), dp.E))
    try:
        found = search_keys(
            dp, sizes, [(b, e) for b in sizes], deadline, on_pass, E=e, must_answer=False, stages=False, tol=tol
        )
    except TimeLimitError:
        return {}
    if any(not r.exact for r in found.values()) or (deadline is not None and time.perf_counter() > deadline):
        return {}
    st = dp.stages_many([(b, r.tps) for (b, _), r in found.items()], E=e)
    return {b: replace(r, stages=tuple(x)) for ((b, _), r), x in zip(found.items(), st)}


def trace(dp: StageDP, r: TpsSearch, prefer_shared: bool = True) -> tuple[DPStage, ...]:
    """The stages of ``r``'s target traced at any depth (:meth:`StageDP.stages_many`), from the
    tables of the pass that proved it where they were kept (no pass of its own)."""
    if r.kept is not None and r.kept[0].E in (None, dp.E):  # a pass at any depth (saturated or not)
        return tuple(dp.traceback(*r.kept, prefer_shared))
    return tuple(dp.stages_many([(r.b, r.tps)], prefer_shared=prefer_shared)[0])


#: the depth bound of the first phase's preliminary search on large trees (:func:`_first_phase`)
PRE_DEPTH = 16


def _first_phase(
    dp: StageDP,
    sizes: Sequence[int],
    deadline: float | None,
    on_pass: Callable[[int], None] | None,
    saturate: int | None = None,
    feasible: dict[int, tuple[float, int]] | None = None,
) -> dict[tuple[int, int], TpsSearch]:
    """The least TPS at every size, at any depth (keys ``(b, dp.E)``).

    On large trees (:meth:`StageDP.large`) whose depth bound ``E`` exceeds :data:`PRE_DEPTH`, a
    preliminary search runs bounded to depth ``PRE_DEPTH``: its passes hold ``(PRE_DEPTH + 1)^2``
    entries per segment instead of ``(E + 1)^2``.  A staging of depth ``<= PRE_DEPTH`` is a
    staging, so its answer ``t'`` is feasible at any depth; the full-depth search then opens with
    one pass at ``t'`` and the candidate just below it for every size: where the latter is
    infeasible the answer is ``t'``, proven, and its stages are the full-depth DP's traceback (the
    same as without the preliminary search); elsewhere it goes on below ``t'`` as usual.  The
    answers are the same as a full-depth search's."""
    keys = [(b, dp.E) for b in sizes]
    feasible = feasible or {}
    if not dp.large() or dp.E <= PRE_DEPTH:
        return search_keys(dp, sizes, keys, deadline, on_pass, saturate=saturate, bound=feasible)
    pre = search_keys(
        dp, sizes, [(b, PRE_DEPTH) for b in sizes], deadline, on_pass, E=PRE_DEPTH, bound=feasible, stages=False
    )
    if deadline is not None and time.perf_counter() > deadline and pre:  # its answers stand, traced now
        st = dp.stages_many([(b, r.tps) for (b, _), r in pre.items()], E=PRE_DEPTH)
        return {
            (b, dp.E): replace(r, stages=tuple(x), exact=False, depth_bound=dp.E)
            for ((b, _), r), x in zip(pre.items(), st)
        }
    start = {b: r.tps for (b, _), r in pre.items()}
    return search_keys(dp, sizes, keys, deadline, on_pass, saturate=saturate, start=start)


__all__ = ["TpsSearch", "search_tps", "search_many", "search_depths", "search_bounded", "trace"]
