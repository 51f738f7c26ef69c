"""What a plan of GraphPipe's stage DP would need where none fits: the least memory per device
(:func:`min_memory`), and the infeasibility error that says so (:func:`infeasible_error`).

Each figure takes DP passes (a binary search over the stages' memory figures, per micro-batch
size: seconds a pass on 10,000 operators), so both take the planner's deadline: past it a search
stops at the least memory it has shown to hold a plan, and the error says "at most" (a memory
that suffices, not the least)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from gpp_solver.errors import InfeasibleError
from gpp_solver.planners.graphpipe.dp.kernel import run_dp
from gpp_solver.planners.graphpipe.dp.stage import decode, encode
from gpp_solver.planners.graphpipe.dp.stage_tables import devices_by_depth
from gpp_solver.planners.graphpipe.dp.tree import SegDev
from gpp_solver.types import Cluster


def min_memory(dp, b: int, deadline: float | None = None) -> tuple[float | None, bool]:
    """Smallest memory per device with which some plan of ``dp`` (a ``StageDP``) at ``b`` fits in
    ``dp.D`` devices (any TPS), found by binary search over every stage's memory figure; ``None``
    if none does; and whether it is the least (past ``deadline`` the search stops at the least
    memory it has shown to suffice)."""
    tb = dp.tables(b)
    degs = np.asarray(tb.degrees, dtype=float)
    n = dp.B // b
    depth = np.minimum(np.arange(1, dp.E + 1), n).astype(float)
    osf = dp.cluster.optimizer_state_factor
    cands = osf * dp.W[:, None, None] + depth[None, None, :] * b / degs[None, :, None] * dp.A[:, None, None]
    cands = np.unique(cands)

    def ok(mem: float) -> bool:
        md = dp._max_depths(b, tb.degrees, mem)
        dev = SegDev(encode(devices_by_depth(tb.tps, md, tb.degrees, np.array([np.inf]), dp.E)))
        return decode(run_dp(dp.idx, dev, dp.E)[0][0, 0, dp.E]) <= dp.D

    if not ok(float(cands[-1]) * (1 + 1e-12)):
        return None, True
    lo, hi = 0, len(cands) - 1
    took = 0.0  # the last pass's seconds: a pass that would end past the deadline is not started
    while lo < hi:
        if deadline is not None and time.perf_counter() + took > deadline:
            return float(cands[hi]), False
        mid, t0 = (lo + hi) // 2, time.perf_counter()
        if ok(float(cands[mid]) * (1 + 1e-12)):
            hi = mid
        else:
            lo = mid + 1
        took = time.perf_counter() - t0
    return float(cands[lo]), True


def infeasible_error(dp, sizes: Sequence[int], cluster: Cluster, deadline: float | None = None) -> InfeasibleError:
    """No micro-batch size fits *within GraphPipe's search space*: say how much memory (or how many
    devices) would.

    The search space is series-parallel-tree partitions (:mod:`gpp_solver.sp_tree`; non-SP graphs
    are SP-ized, which forbids some convex partitions), one micro-batch size for all stages from
    ``sizes``, 1F1B in-flight counts, power-of-two data-parallel degrees (``degree_options``).  A
    plan outside it may still fit: the exact MILP (:mod:`gpp_solver.planners.milp.planner`) finds plans in
    memory-tight cases where this planner reports infeasible (``benchmarks/optimality_gap.py
    --tight``).  So ``required_memory_bytes`` is the smallest memory per device with which *this
    search space* holds a plan on these devices, not the least any plan needs; near ``deadline``,
    the least over the sizes searched by then (a size is not started that would end past it), and
    where a search stopped or a size was left, the message says "at most" (or, with no size
    holding a plan by then, gives no figure).
    """
    mems, least, took = [], True, None  # took: the longest a size took (its tables and passes)
    for b in sizes:
        if took is not None and deadline is not None and time.perf_counter() + took > deadline:
            least = False  # this size and the rest not searched
            break
        t0 = time.perf_counter()
        m, exact = min_memory(dp, b, deadline)
        took = max(took or 0.0, time.perf_counter() - t0)
        if m is not None:
            mems.append(m)
            least &= exact
    need_mem = min(mems) if mems else None
    past = deadline is not None and time.perf_counter() > deadline  # a DP pass a size: not past the limit
    devs = [] if past else [d for d in (dp.min_devices_any_tps(b) for b in sizes) if d is not None]
    need_dev = min(devs) if devs else None
    space = (
        f"GraphPipe's search space (series-parallel-tree partitions"
        f"{f', long series coarsened into blocks, at most {dp.E} stages deep' if dp.coarsened else ''}"
        f"{' with shared sinks' if dp.shared_sinks else ''}, one micro-batch size per plan "
        f"from {list(sizes)}, 1F1B, data-parallel degrees {list(dp.degree_options)})"
    )
    parts = [
        f"no plan within {space} fits in {cluster.memory_bytes:.6g} bytes per device on "
        f"{cluster.devices} devices; plans outside this search space (e.g. found by the exact MILP "
        f"planner) may still fit"
    ]
    if need_mem is not None and least:
        parts.append(
            f"the smallest memory per device with which this search space holds a plan is {need_mem:.6g} bytes"
        )
    elif need_mem is not None:
        parts.append(
            f"the smallest memory per device with which this search space holds a plan is at most {need_mem:.6g} "
            "bytes (its search stopped at the time limit)"
        )
    elif least:
        parts.append("no stage split of this search space fits at any memory these devices can hold")
    else:
        parts.append("the time limit was reached before a memory with which it holds a plan was found")
    if need_dev is not None and need_dev > cluster.devices:
        parts.append(f"or {need_dev} devices")
    return InfeasibleError(
        "; ".join(parts),
        required_memory_bytes=need_mem,
        required_devices=need_dev if need_dev is not None and need_dev > cluster.devices else None,
    )
