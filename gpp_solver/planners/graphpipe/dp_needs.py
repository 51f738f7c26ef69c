"""What a plan of GraphPipe's stage DP would need where none fits: the least memory per device
(:func:`min_memory`), for the infeasibility message."""

from __future__ import annotations

import numpy as np

from gpp_solver.planners.graphpipe.dp_kernel import run_dp
from gpp_solver.planners.graphpipe.dp_stage import decode, encode
from gpp_solver.planners.graphpipe.dp_stage_tables import devices_by_depth
from gpp_solver.planners.graphpipe.dp_tree import SegDev


def min_memory(dp, b: int) -> float | None:
    """Smallest memory per device with which some plan of ``dp`` (a ``StageDP``) at ``b`` fits in
    ``dp.D`` devices (any TPS),
    found by binary search over every stage's memory figure; ``None`` if none does."""
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
        return None
    lo, hi = 0, len(cands) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(float(cands[mid]) * (1 + 1e-12)):
            hi = mid
        else:
            lo = mid + 1
    return float(cands[lo])
