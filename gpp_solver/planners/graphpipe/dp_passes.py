"""The stage DP's work per target TPS (:class:`DPPasses`, the part of
:class:`gpp_solver.planners.graphpipe.dp.StageDP` that runs passes): batched passes of the numeric
kernel (:func:`gpp_solver.planners.graphpipe.dp_kernel.run_dp`) over ``(b, t)`` pairs, grouped by
micro-batch size or halved to bound their tables, bounded in depth or saturated at each pair's
depth cap, over the stage-value tables of the segments the targets can use; and the answers read
off them: the fewest devices per depth bound, and the stages (the traceback)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from gpp_solver.planners.graphpipe.dp_kernel import check_deadline, run_dp
from gpp_solver.planners.graphpipe.dp_stage import DPProbe, DPStage, SizeTables, decode, encode
from gpp_solver.planners.graphpipe.dp_stage_tables import devices_for_segments, segment_fits
from gpp_solver.planners.graphpipe.dp_traceback import trace_stages
from gpp_solver.planners.graphpipe.dp_tree import BIG_DEPTH, INF, SegDev, TreeIndex

logger = logging.getLogger(__name__)


class DPPasses:
    """:class:`~gpp_solver.planners.graphpipe.dp.StageDP`'s methods per target TPS.  They read the
    DP's tree, bounds and per-size tables (below, set by ``StageDP``) and keep two caches per size:
    :meth:`depth_cap`'s steps and the stage-value tables' :func:`segment_fits`."""

    #: largest (segments x depths) table a traceback under a depth cap may rebuild without the cap
    RETRACE_BYTES = 256 << 20
    #: a pass's work per target, segments x (depth bound + 2)^2, from which :meth:`large` holds
    LARGE_TABLE = 1 << 20
    #: entries of one pass's stage-value table above which :meth:`probe` halves its targets
    PASS_ENTRIES = 1 << 24

    idx: TreeIndex
    D: int
    E: int
    depth_limited: bool
    _caps: dict[int, tuple[np.ndarray, np.ndarray]]
    _fits: dict[int, tuple]
    tables: Callable[[int], SizeTables]

    def depth_cap(self, b: int, floor: int = 1, t: float | None = None) -> int:
        """A depth ``C <= E`` at which the DP at ``b`` may saturate its depths (count every stage
        deeper than ``C`` as depth ``C``) and still find the fewest devices at any depth, exactly:
        depth enters a stage's figures only through memory, ``osf * W + min(depth, n) * b / d * A``,
        so segment ``g`` at degree ``d`` fits at depth ``m`` iff ``m <= maxdepth[g, d]``, and
        every finite ``maxdepth`` is below ``n = B / b`` (``max_depths``): beyond the largest
        finite one, ``M``, no stage's devices change with its depth.  ``C = max(M + 1, floor)``
        (at most ``E``; ``floor`` keeps the depths a caller still asks about exact).

        With a target ``t`` only the (segment, degree) pairs meeting it count (the others never
        serve a stage at ``t``), and only their ``maxdepth`` below ``E`` (one of ``E`` or more
        fits at every depth a staging on ``D`` devices reaches): exact for that target, and
        where memory never binds at ``t`` the cap is ``floor``."""
        if self.depth_limited:  # saturating would admit the stagings deeper than E
            return self.E
        if t is not None:
            keys, reach = self._cap_steps(b)
            k = int(np.searchsorted(keys, t, side="right"))
            return min(self.E, max(int(reach[k - 1]) + 1 if k else 1, int(floor)))
        md = self.tables(b).maxdepth
        fin = md[md < BIG_DEPTH]
        return min(self.E, max(int(fin.max()) + 1 if fin.size else 1, int(floor)))

    def _cap_steps(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """The (segment, degree) pairs at ``b`` whose memory binds below depth ``E``: their TPS
        sorted, and the running maximum of their ``maxdepth`` in that order (:meth:`depth_cap`)."""
        got = self._caps.get(b)
        if got is None:
            tb = self.tables(b)
            sel = tb.maxdepth < self.E
            order = np.argsort(tb.tps[sel], kind="stable")
            got = (tb.tps[sel][order], np.maximum.accumulate(tb.maxdepth[sel][order]) if order.size else order)
            self._caps[b] = got
        return got

    def _dev(
        self, pairs: Sequence[tuple[int, float]], E: int, sat: bool = False, deadline: float | None = None
    ) -> SegDev:
        """The DP's encoded stage values ``encode(dev[i, g, depth])`` for ``pairs[i] = (b, t)``,
        stored only for the segments some pair's target can use (the others are ``INF`` at every
        depth and every degree, so leaving them out changes no DP value): a target near the
        optimum leaves most long segments out, which keeps the table small on long series."""
        by_b, use, _ = self._usable(pairs)
        nseg = len(self.idx.seg_lo)
        used = np.nonzero(use)[0]
        gmap = np.full(nseg + 1, len(used), dtype=np.int64)
        gmap[used] = np.arange(len(used))
        arr = np.empty((len(pairs), len(used) + 1, E + 2), dtype=np.int64)
        arr[:, -1] = INF
        for b, rows in by_b.items():
            check_deadline(deadline)
            tb = self.tables(b)
            enc = encode(np.asarray(tb.degrees, dtype=np.int64))
            ts = [pairs[i][1] for i in rows]
            if self._fits.get(b, (None,))[0] != E and len(tb.maxdepth) * (E + 2) <= 1 << 22:
                self._fits[b] = (E, segment_fits(tb.maxdepth, E))  # one bound per size, 4 MB at most
            fits = self._fits[b][1] if self._fits.get(b, (None,))[0] == E else None
            if rows[-1] - rows[0] == len(rows) - 1:  # consecutive rows: fill the slice in place
                devices_for_segments(
                    tb.tps, tb.maxdepth, enc, ts, used, E, out=arr[rows[0] : rows[-1] + 1, :-1], fits=fits
                )
            else:
                arr[rows, :-1] = devices_for_segments(tb.tps, tb.maxdepth, enc, ts, used, E, fits=fits)
        if sat:  # depth E + 1 counts as depth E
            arr[:, :-1, E + 1] = arr[:, :-1, E]
        return SegDev(arr, gmap)

    def batch_size(self) -> int:
        """How many targets one DP pass should test: enough to amortise the Python overhead of
        the recursion on small tables, few enough that array work stays modest on large ones."""
        size = self.E + 1
        work = sum(len(kids) ** 2 for _, kids in self.idx.nodes) * size * size
        return int(max(1, min(32, 4e5 // max(work, 1))))

    def min_devices_by_depth(self, pairs: Sequence[tuple[int, float]]) -> np.ndarray:
        """``out[i, e]``: fewest devices for ``pairs[i] = (b, t)`` with the stage graph's depth at
        most ``e`` (``e = 0..E``; column ``E`` is :meth:`min_devices`), one batched DP pass."""
        return self.probe(pairs, keep=False).devices

    def probe(
        self,
        pairs: Sequence[tuple[int, float]],
        keep: bool = True,
        E: int | None = None,
        saturate: int | None = None,
        deadline: float | None = None,
    ) -> DPProbe:
        """One batched DP pass over ``(b, t)`` pairs; with ``keep`` it also holds the tables that
        :meth:`traceback` needs, so a search need not run the pass again for its answer.  With
        ``E`` below the DP's own bound the pass only considers stage graphs of depth ``<= E``: the
        answers for those depths are the same (a stage's depth never exceeds its source's), and
        the tables are much smaller.  ``deadline``: :class:`TimeLimitError` when it passes during the pass."""
        E = self.E if E is None or E >= self.E else max(1, int(E))
        if saturate is not None and E == self.E:
            caps: dict[int, list[int]] = {}
            for i, (b, t) in enumerate(pairs):
                caps.setdefault(self.depth_cap(b, saturate, t), []).append(i)
            if any(C < E for C in caps):
                return self._probe_saturated(pairs, keep, caps, deadline)
        groups = self._split(pairs, E)
        if len(groups) > 1:  # one pass per micro-batch size, or per half of the targets (_split)
            subs = [(self.probe([pairs[i] for i in rows], keep, E, deadline=deadline), rows) for rows in groups]
            devices = np.empty((len(pairs), E + 1), dtype=np.int64)
            where = {}
            for sub, rows in subs:
                devices[rows] = sub.devices
                where.update({i: (sub, r) for r, i in enumerate(rows)})
            return DPProbe(tuple(pairs), devices, ("split", where) if keep else None, E)
        dev = self._dev(pairs, E, deadline=deadline)
        Rroot, tables, R = run_dp(self.idx, dev, E, keep=keep, deadline=deadline)
        return DPProbe(tuple(pairs), decode(Rroot[:, 0, :]), (dev, Rroot, tables, R) if keep else None, E)

    def _usable(self, pairs: Sequence[tuple[int, float]]) -> tuple[dict[int, list[int]], np.ndarray, int]:
        """``pairs``' rows by micro-batch size, the segments some pair's target can use (a target
        below a segment's ``best`` leaves it ``INF`` everywhere), and the sum over rows of the
        segments each row's own size and target could use (by size, at its largest target)."""
        by_b: dict[int, list[int]] = {}
        for i, (b, _) in enumerate(pairs):
            by_b.setdefault(b, []).append(i)
        use = np.zeros(len(self.idx.seg_lo), dtype=bool)
        own = 0
        for b, rows in by_b.items():
            u = self.tables(b).best <= max(pairs[i][1] for i in rows)
            own += len(rows) * int(u.sum())
            use |= u
        return by_b, use, own

    def _probe_saturated(
        self, pairs: Sequence[tuple[int, float]], keep: bool, caps: dict[int, list[int]], deadline: float | None = None
    ) -> DPProbe:
        """:meth:`probe` with each pair's depths saturated at its :meth:`depth_cap` (at its size and target) (one
        pass per cap).  Column ``E`` of ``devices`` (any depth) is exact, as are the columns below
        each cap; the columns from a cap to ``E - 1`` repeat the any-depth answer."""
        devices = np.empty((len(pairs), self.E + 1), dtype=np.int64)
        where = {}
        for C, rows in caps.items():
            sub = [pairs[i] for i in rows]
            if C >= self.E:
                pr = self.probe(sub, keep, deadline=deadline)
            else:
                dev = self._dev(sub, C, sat=True, deadline=deadline)
                Rroot, tables, R = run_dp(self.idx, dev, C, keep=keep, sat=True, deadline=deadline)
                pr = DPProbe(tuple(sub), decode(Rroot[:, 0, :]), (dev, Rroot, tables, R) if keep else None, C, True)
            devices[rows, : pr.devices.shape[1]] = pr.devices
            devices[rows, pr.devices.shape[1] :] = pr.devices[:, -1:]
            where.update({i: (pr, r) for r, i in enumerate(rows)})
        return DPProbe(tuple(pairs), devices, ("split", where) if keep else None, None)

    def _split(self, pairs: Sequence[tuple[int, float]], E: int) -> list[list[int]]:
        """The rows of ``pairs`` by micro-batch size when passes of their own store much less than
        one batched pass (whose table holds, for every target, the union of the segments the
        sizes' targets can use: a small ``b`` with its large targets would widen every row);
        else one group, or its halves when that one pass's stage-value table would hold more than
        ``PASS_ENTRIES`` entries.  The answers do not depend on the grouping."""
        by_b, use, own = self._usable(pairs)
        whole = len(pairs) * int(use.sum())
        if len(by_b) > 1 and whole * (E + 2) >= (1 << 20) and own * 2 <= whole:
            return list(by_b.values())
        if len(pairs) > 1 and len(pairs) * (int(use.sum()) + 1) * (E + 2) > self.PASS_ENTRIES:
            half = len(pairs) // 2  # bound the pass's tables: halves of the targets
            return [list(range(half)), list(range(half, len(pairs)))]
        return [list(range(len(pairs)))]

    def large(self) -> bool:
        """Whether a pass is large per target: segments x (depth bound + 2)^2 (its kernel's tables
        per segment are depth^2) of at least :data:`LARGE_TABLE`.  Only then do the searches gallop,
        cap depths and prune sizes by a seed staging (:mod:`gpp_solver.binary_search`); below it the
        extra passes cost more Python overhead than they save."""
        return len(self.idx.seg_lo) * (self.E + 2) ** 2 >= self.LARGE_TABLE

    def keep_tables(self) -> bool:
        """Whether a search may hold every probe's tables for its tracebacks (a few MB at most)."""
        size = self.E + 1
        per_target = sum(len(kids) + 1 for _, kids in self.idx.nodes) * size * size * 8
        return per_target * self.batch_size() <= 4 << 20

    def traceback(self, probe: DPProbe, i: int, prefer_shared: bool = True) -> list[DPStage]:
        """The stages of ``probe``'s ``i``-th pair (it must be feasible).  Where a shared-sink stage
        and separate stages reach the same value, ``prefer_shared`` picks the former."""
        assert probe.kept is not None, "probe ran without keep=True"
        if isinstance(probe.kept[0], str):  # a probe split by micro-batch size
            sub, r = probe.kept[1][i]
            return self.traceback(sub, r, prefer_shared)
        dev, Rroot, tables, R = probe.kept
        b, t = probe.pairs[i]
        tb = self.tables(b)
        E = self.E if probe.E is None else probe.E
        st = trace_stages(
            self.idx,
            tb.degrees,
            tb.tps,
            self.D,
            b,
            t,
            dev[i],
            Rroot[i],
            [x[i] for x in tables],
            [x[i] for x in R],
            prefer_shared,
            E,
            probe.sat,
        )
        if probe.sat and max(s.depth for s in st) >= E:
            # the staging reaches the cap: trace it from a pass without saturation, so that ties
            # break as they always did (same stages), unless that pass's table is too large; the
            # saturated traceback is a staging of the same value (devices, stages) at target t
            if int((tb.best <= t).sum()) * (self.E + 2) * 8 <= self.RETRACE_BYTES:
                return self.traceback(self.probe([(b, t)]), 0, prefer_shared)
            logger.info("b=%d: staging traced under the depth cap %d (a table without it is too large)", b, E)
        return st

    def min_devices_any_tps(self, b: int) -> int | None:
        """Fewest devices for a plan at ``b`` that fits in memory, ignoring TPS (None: never fits)."""
        r = self.min_devices(b, float("inf"))
        return None if r >= INF else r

    def min_devices(self, b: int, t: float) -> int:
        """Fewest devices with which every stage meets TPS ``t`` and memory (``INF`` if none)."""
        R, _, _ = run_dp(self.idx, self._dev([(b, float(t))], self.E), self.E)
        return int(decode(R[0, 0, self.E]))

    def feasible(self, b: int, t: float) -> bool:
        return self.min_devices(b, t) <= self.D

    def stages(self, b: int, t: float) -> list[DPStage]:
        """The stages of a plan meeting ``t`` with at most ``D`` devices (traceback of the DP)."""
        return self.stages_many([(b, t)])[0]

    def stages_many(
        self,
        pairs: Sequence[tuple[int, float]],
        prefer_shared: bool = True,
        E: int | None = None,
        saturate: int | None = None,
    ) -> list[list[DPStage]]:
        """Tracebacks for several ``(b, t)`` pairs from one batched DP pass (bounded to depth
        ``E``, or saturated, see :meth:`probe`)."""
        pr = self.probe(pairs, E=E, saturate=saturate)
        return [self.traceback(pr, i, prefer_shared) for i in range(len(pairs))]
