"""Algorithm 1, lines 1-11: the search for the smallest bottleneck TPS, per micro-batch size.

The paper bisects ``[0, MAXTPS]`` until the interval is below ``epsilon``.  The optimum is always
the TPS of one stage the DP can form, so — as Alpa's stage DP does — we enumerate those values
(:meth:`gpp_solver.planners.graphpipe.dp.stage_dp.StageDP.candidates`: every segment at every
degree), sort them and binary-search the sorted list: the search ends *exactly* at the smallest
feasible value, with no epsilon.  Each DP pass tests several targets at once (a k-ary search,
:meth:`gpp_solver.planners.graphpipe.dp.stage_dp.StageDP.batch_size`), which shares the Python
overhead of the recursion; with one target per pass it is the plain binary search.  On large trees
(:meth:`~gpp_solver.planners.graphpipe.dp.stage_dp.StageDP.large`), until a target is proven
feasible the probes gallop up from the lower bound (targets from ``cands[lo]`` to ``2 ** 2 ** g``
times it in the ``g``-th pass) instead of spreading over every candidate: a target's DP only stores
the segments it can use (:meth:`StageDP._dev`), so low targets keep the passes small on long series,
and feasibility is monotone in the target, so the answer is the same (at the deadline, a key with no
feasible target yet gets one last pass at its largest candidate); there the first phase also
saturates depths at each size's cap
(:meth:`~gpp_solver.planners.graphpipe.dp.stage_dp.StageDP.depth_cap`, exact).  On small trees the
first pass spreads over every candidate and, with a deadline, includes the largest.  The result is
optimal within the DP's search space and with respect to its (conservative) stage estimates.

Known bounds narrow the intervals without a probe: targets known feasible (the planner's quick
search bounded to a shallow depth, :func:`search_bounded`) and, for the depth sweep's second
phase, the least TPS at any depth below which no bound is feasible.

Across micro-batch sizes the paper sweeps for throughput (A.2); we search every ``b`` (all of
them batched into the same DP passes, :func:`search_many`; with the depth sweep, :func:`search_depths`)
and the planner (:mod:`gpp_solver.planners.graphpipe.uniform`) picks among the stagings by simulation.

The batched k-ary search over sorted candidate targets behind these entry points is
:func:`search_keys` and its state, :class:`_KeySearch`; the answer at one size is a :class:`TpsSearch`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from gpp_solver.errors import TimeLimitError
from gpp_solver.planners.graphpipe.dp.stage import DPStage
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TpsSearch:
    """Outcome of the search at one micro-batch size."""

    b: int
    tps: float  # the DP's bottleneck target reached (smallest feasible candidate)
    stages: tuple[DPStage, ...]
    probes: int  # DP passes (each tests several targets at once)
    candidates: int
    exact: bool  # False when stopped by the time limit before the interval closed
    depth_bound: int | None = None  # the bound on the stage graph's depth searched under (E: none)
    #: (probe, row) of the DP pass that proved ``tps`` feasible, where its tables were kept (:func:`trace`)
    kept: tuple | None = field(default=None, compare=False, repr=False)


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
    :func:`search_bounded`): the searches start below it, without a probe; called past the
    deadline, no pass runs and every size answers ``[]`` (the caller holds those stagings).
    """
    if feasible and deadline is not None and time.perf_counter() > deadline:
        return {b: [] for b in sizes}  # called out of time: the stagings behind ``feasible`` stand, no pass
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
    tables of the pass that proved it where they were kept (no pass of its own); else from a pass
    saturated at the depth caps, as the search's own passes are (a pass of the DP's whole depth
    holds ``E^3`` entries a segment: 8 GiB at 1,024 devices)."""
    if r.kept is not None and r.kept[0].E in (None, dp.E):  # a pass at any depth (saturated or not)
        return tuple(dp.traceback(*r.kept, prefer_shared))
    return tuple(dp.stages_many([(r.b, r.tps)], prefer_shared=prefer_shared, saturate=1)[0])


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
    answers are the same as a full-depth search's.  When the deadline passes in the preliminary
    search, only its answer of least TPS is traced and returned (``exact=False``), or none when
    ``feasible`` stagings stand (a traceback is a pass of its own)."""
    keys = [(b, dp.E) for b in sizes]
    feasible = feasible or {}
    if not dp.large() or dp.E <= PRE_DEPTH:
        return search_keys(dp, sizes, keys, deadline, on_pass, saturate=saturate, bound=feasible)
    pre = search_keys(
        dp, sizes, [(b, PRE_DEPTH) for b in sizes], deadline, on_pass, E=PRE_DEPTH, bound=feasible, stages=False
    )
    if deadline is not None and time.perf_counter() > deadline and feasible:
        return {}  # the stagings behind ``feasible`` stand (the caller holds them), no traceback
    if deadline is not None and time.perf_counter() > deadline and pre:  # the least-TPS answer stands,
        # traced now (a traceback is a pass of its own: about a second a size on 5,000 operators)
        (b, _), r = min(pre.items(), key=lambda kv: (kv[1].tps, -kv[0][0]))
        st = dp.stages_many([(b, r.tps)], E=PRE_DEPTH)[0]
        return {(b, dp.E): replace(r, stages=tuple(st), exact=False, depth_bound=dp.E)}
    start = {b: r.tps for (b, _), r in pre.items()}
    return search_keys(dp, sizes, keys, deadline, on_pass, saturate=saturate, start=start)


#: the most bytes of DP tables the opening pass after the preliminary search keeps for its tracebacks
KEEP_OPENING = 256 << 20


def search_keys(
    dp: StageDP,
    sizes: Sequence[int],
    keys: Sequence[tuple[int, int]],
    deadline: float | None,
    on_pass: Callable[[int], None] | None,
    E: int | None = None,
    must_answer: bool = True,
    saturate: int | None = None,
    start: dict[int, float] | None = None,
    bound: dict[int, tuple[float, int]] | None = None,
    floor: dict[int, float] | None = None,
    stages: bool = True,
    tol: float = 0.0,
) -> dict[tuple[int, int], TpsSearch]:
    """The batched k-ary search behind :func:`search_many` and :func:`search_depths`.

    A key ``(b, e)`` asks for the smallest candidate target ``t`` at ``b`` whose DP reaches a plan
    on at most ``D`` devices with stage-graph depth at most ``e`` (the root entry ``R[0, e]``; it
    is monotone in ``t``).  Keys of one ``b`` share their probes: every probe of a pass answers all
    depth bounds of its ``b`` at once.  ``E``: run the passes bounded to that depth (every key's
    ``e`` must be at most ``E``).

    Deadline: sizes whose tables would not be built by then (the last size's time per degree
    predicts it) are left out, no key of theirs answered.
    With ``must_answer`` the first passes probe one size each, at its largest candidate (feasible
    if any is), the first of them run to its end so that an answer exists; every later pass (every
    pass without ``must_answer``) stops inside when the deadline passes: the earlier passes'
    answers stand (``exact=False``; a size not reached has none), or :class:`TimeLimitError` when
    there are none.

    ``start``: per size a candidate target known feasible (:func:`_first_phase`): the first pass
    probes it and the candidate below it for every such size (run to its end), and the search
    goes on from there; its tables are kept for the tracebacks (the answer is often ``start``).
    Where those tables would exceed :data:`KEEP_OPENING`, ``start`` stands feasible without a
    probe and the first pass tests the candidates below only (a pass at the larger targets costs most).
    ``bound``: per size a target and the depth of a staging meeting it: the intervals of the
    keys bounded no lower than that depth start below it, without a probe; ``floor``: per size a
    target below which no key is feasible (the least at any depth): the intervals start there.  ``stages=False``: the
    answers' ``stages`` are left empty (no tracebacks).  ``tol``: a key stops once its feasible
    target is within that factor of every target not yet proven infeasible (an answer, not the least).
    """
    search = _KeySearch(dp, sizes, keys, deadline, on_pass, E, must_answer, saturate, stages, tol)
    search.narrow(start or {}, bound or {}, floor or {})
    search.run()
    return search.answers()


class _KeySearch:
    """The state of :func:`search_keys`: per key ``k`` the candidate interval ``[lo[k], hi[k]]``
    (``hi[k] == top[k]``: nothing proven feasible yet), the passes run, and the tables of the
    probes that proved the answers feasible."""

    def __init__(
        self,
        dp: StageDP,
        sizes: Sequence[int],
        keys: Sequence[tuple[int, int]],
        deadline: float | None,
        on_pass: Callable[[int], None] | None,
        E: int | None,
        must_answer: bool,
        saturate: int | None,
        stages: bool,
        tol: float,
    ) -> None:
        self.dp, self.deadline, self.on_pass, self.E = dp, deadline, on_pass, E
        self.must_answer, self.stages, self.tol = must_answer, stages, tol
        self.cands = self._candidates(sizes)
        self.cut = len(self.cands) < len(sizes)
        self.keys = [k for k in keys if k[0] in self.cands and len(self.cands[k[0]])]
        self.top = {k: len(self.cands[k[0]]) for k in self.keys}  # hi == top: no candidate proven feasible yet
        self.lo = {k: 0 for k in self.keys}
        self.hi = dict(self.top)
        self.of_b: dict[int, list[tuple[int, int]]] = {}
        for k in self.keys:
            self.of_b.setdefault(k[0], []).append(k)
        self.passes, self.exact, self.last_resort, self.stopped = 0, not self.cut, False, False
        self.gallops = {k: 0 for k in self.keys}
        self.gallop = dp.large()
        self.saturate = saturate if self.gallop else None
        self.budget = dp.batch_size()
        # with a deadline, sizes whose largest candidate is probed first (one pass each, the first run
        # to its end): an answer exists whatever the deadline; on large trees that pass is the most
        # expensive one of all (every segment usable), so there the search gallops up from the lower
        # bound instead and, at the deadline without any answer, spends one last pass at the top
        self.tops = list(self.of_b) if must_answer and deadline is not None and not self.gallop else []
        self.opening: dict[int, set[int]] = {}
        self.keep_open = True
        self.keep = False
        self.found_at: dict[tuple[int, int], tuple] = {}  # (b, index) -> (probe, row) that proved it feasible

    def _candidates(self, sizes: Sequence[int]) -> dict[int, np.ndarray]:
        """Each size's sorted candidate targets from its lower bound on; sizes whose tables would not
        be built by the deadline (the last size's time per degree predicts it) are left out."""
        dp, deadline = self.dp, self.deadline
        cands: dict[int, np.ndarray] = {}
        per_degree = 0.0  # seconds per degree of the last size's tables (their cost grows with the degrees)
        for b in sizes:
            t0 = time.perf_counter()
            if cands and deadline is not None and t0 + per_degree * len(dp.degrees(b)) > deadline:
                break  # this size's tables would not be built by the deadline
            c = dp.candidates(b)
            per_degree = (time.perf_counter() - t0) / max(1, len(dp.degrees(b)))
            cands[b] = c[c >= dp.lower_bound(b) * (1 - 1e-12)]
        return cands

    def narrow(self, start: dict[int, float], bound: dict[int, tuple[float, int]], floor: dict[int, float]) -> None:
        """The known bounds (``start``, ``bound``, ``floor`` of :func:`search_keys`) on the intervals."""
        dp, cands, of_b, lo, hi, top = self.dp, self.cands, self.of_b, self.lo, self.hi, self.top
        per_pair = sum(len(kids) + 1 for _, kids in dp.idx.nodes) * (dp.E + 1) ** 2 * 8  # bytes of kept tables
        self.keep_open = 2 * len(start) * per_pair <= KEEP_OPENING
        for b, t in start.items():
            if b in of_b:
                i = int(np.searchsorted(cands[b], t))
                if i < len(cands[b]) and cands[b][i] == t:
                    if self.keep_open:
                        self.opening[b] = {i - 1, i} - {-1}
                    else:  # too large to keep: ``t`` stands feasible unprobed, the opening tests below it
                        for k in of_b[b]:
                            hi[k] = min(hi[k], i)
                        if i:
                            self.opening[b] = {i - 1}
        if self.opening:
            self.tops = []
        for b, (t, depth) in bound.items():
            i = int(np.searchsorted(cands[b], t, side="right")) if b in of_b else 0  # cands[i - 1] <= t: feasible
            for k in of_b.get(b, []) if i else ():
                if k[1] >= depth and i <= top[k]:
                    hi[k] = min(hi[k], i - 1)
        for b, t in floor.items():
            i = int(np.searchsorted(cands[b], t, side="left")) if b in of_b else 0  # every target below: infeasible
            for k in of_b.get(b, []):
                lo[k] = max(lo[k], min(i, hi[k]))
        self.keep = dp.keep_tables()

    def _answered(self) -> bool:
        return any(self.hi[k] < self.top[k] for k in self.keys)

    def run(self) -> None:
        """Passes until every interval is closed, or the deadline says stop."""
        while True:
            self._close_within_tol()
            active = [k for k in self.keys if self.lo[k] < self.hi[k]]
            if not active:
                break
            if (self.passes or self.stopped) and self.deadline is not None and time.perf_counter() > self.deadline:
                self.exact = False
                if self.last_resort or not self.must_answer or self._answered():
                    break
                active = self._spend_last_pass(active)
            guard = (
                not self.passes and (bool(self.tops) or (bool(self.opening) and self.keep_open))
            ) or self.last_resort  # run to their end
            opened = bool(self.opening) and self.keep_open
            pairs = self._pairs(active)
            try:
                probe = self.dp.probe(
                    [(b, float(self.cands[b][i])) for b, i in pairs],
                    keep=(self.keep or opened) and self.stages,
                    E=self.E,
                    saturate=self.saturate,
                    deadline=None if guard else self.deadline,
                )
            except TimeLimitError:
                self.exact = False
                answered = self._answered()
                if self.must_answer and not answered and not self.last_resort:
                    self.stopped = True  # the next round spends the last pass
                    continue
                if not answered:
                    raise
                break
            self._record(pairs, probe, len(active))

    def _close_within_tol(self) -> None:
        """With ``tol``: a key whose known feasible target is close enough stands at it."""
        if not self.tol:
            return
        for k in self.keys:
            lo, hi, c = self.lo[k], self.hi[k], self.cands[k[0]]
            if hi < self.top[k] and lo < hi and c[hi] <= c[lo] * (1 + self.tol):
                self.lo[k] = hi

    def _spend_last_pass(self, active: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """No answer at all yet: one last pass at the largest candidate of one size leaves one."""
        self.last_resort = True
        b0 = active[0][0]
        active = [k for k in active if k[0] == b0]
        for k in active:
            self.lo[k] = self.top[k] - 1
        return active

    def _pairs(self, active: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The ``(b, candidate index)`` pairs of the next pass."""
        width = max(1, self.budget // len(active))
        probes: dict[int, set[int]] = {}
        if self.opening:  # every size at its known feasible target and the candidate below it
            probes.update(self.opening)
            self.opening = {}
        elif self.tops:  # one size at a time: its largest candidate, a feasible answer if it has one
            b0 = self.tops.pop(0)
            probes[b0] = {self.top[k] - 1 for k in self.of_b[b0]}
        for k in active if not probes else ():
            probes.setdefault(k[0], set()).update(self._picks(k, width))
        return [(b, i) for b in probes for i in sorted(probes[b])]

    def _picks(self, k: tuple[int, int], width: int) -> set[int]:
        lo, hi, top = self.lo[k], self.hi[k], self.top[k]
        if hi == top and self.gallop:  # nothing proven feasible yet: gallop up from lo (module docstring)
            c = self.cands[k[0]]
            span = 2.0 ** (2 ** min(self.gallops[k], 9))
            vals = float(c[lo]) * span ** ((np.arange(width) + 1) / width)
            self.gallops[k] += 1
            return set(np.minimum(np.searchsorted(c, vals), top - 1).tolist()) | {lo}
        n = hi - lo
        return {lo + (n * (i + 1)) // (width + 1) for i in range(width)} - {hi} or {lo}

    def _record(self, pairs: list[tuple[int, int]], probe: Any, n_active: int) -> None:
        """A pass's answers narrow the intervals of every key of their sizes."""
        res = probe.devices <= self.dp.D  # (pairs, E+1)
        self.passes += 1
        if self.on_pass is not None:
            self.on_pass(n_active)
        lo, hi = self.lo, self.hi
        for row_i, ((b, i), row) in enumerate(zip(pairs, res)):
            for k in self.of_b[b]:
                if row[k[1]]:
                    if i < hi[k]:
                        hi[k] = i
                        if probe.kept is not None:
                            self.found_at[(b, i)] = (probe, row_i)
                elif i >= lo[k]:
                    lo[k] = i + 1
        want = {(k[0], hi[k]) for k in self.keys}  # drop the tables no key's answer refers to any more
        self.found_at = {bi: v for bi, v in self.found_at.items() if bi in want}

    def answers(self) -> dict[tuple[int, int], TpsSearch]:
        """Each answered key's least feasible target and its stages (unless ``stages=False``)."""
        dp, cands, hi, found_at = self.dp, self.cands, self.hi, self.found_at
        live = [k for k in self.keys if hi[k] < self.top[k]]
        out: dict[tuple[int, int], TpsSearch] = {}
        if not live:
            return out
        uniq = sorted({(k[0], hi[k]) for k in live})
        # the probes that proved the answers feasible hold their tables where kept; else one pass more
        st = {bi: dp.traceback(*found_at[bi]) for bi in uniq if bi in found_at} if self.stages else {}
        rest = [bi for bi in uniq if bi not in found_at] if self.stages else []
        if rest:
            st.update(
                zip(rest, dp.stages_many([(b, float(cands[b][i])) for b, i in rest], E=self.E, saturate=self.saturate))
            )
        for k in live:
            b = k[0]
            out[k] = TpsSearch(
                b,
                float(cands[b][hi[k]]),
                tuple(st.get((b, hi[k]), ())),
                self.passes + bool(rest),
                len(cands[b]),
                (self.exact or self.lo[k] == hi[k]) and not self.cut,
                depth_bound=k[1],
                kept=found_at.get((b, hi[k])),
            )
        return out


__all__ = ["TpsSearch", "search_tps", "search_many", "search_depths", "search_bounded", "trace"]
