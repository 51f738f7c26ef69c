"""What the uniform-b planner (:mod:`gpp_solver.planners.graphpipe.uniform`) need not search, told by a
lower-bound DP (:class:`StageDP` with ``lower_bound_pricing``) against an incumbent's simulated
iteration time: the micro-batch sizes no staging of which beats a quick seed staging
(:func:`prune_sizes`, on large trees) and, per size, the depth bounds below the least one at which
a staging still could (:func:`least_useful_depths`, the depth sweep)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np

from gpp_solver.binary_search import TpsSearch, search_bounded
from gpp_solver.errors import TimeLimitError
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.staging import build_staging_plan, price_staging
from gpp_solver.sp_tree import SPDecomposition
from gpp_solver.types import Cluster, Graph

logger = logging.getLogger(__name__)

#: the depth bound of the quick search giving :func:`prune_sizes` its seed, and how close to the
#: least TPS at that bound its stagings get (any staging is a valid seed)
SEED_DEPTH, SEED_TOL = 4, 0.02
#: best-first: the quick search runs on this many sizes at a time, those with the least lower bound
#: on an iteration (``B * StageDP.lower_bound``) first, until one has a staging that shallow
SEED_SIZES = 4
#: the pruning pass of the lower-bound DP over every size costs about this share of the quick
#: search's seconds per size (its tables and one pass, against the quick search's several; 0.57 on
#: MMT 25 x 66 at 1,024 devices): when that does not fit before the deadline, nothing is pruned
LB_PASS_SHARE = 0.6


def prune_sizes(
    graph: Graph,
    cluster: Cluster,
    B: int,
    dec: SPDecomposition,
    dp: StageDP,
    sizes: Sequence[int],
    search_k: bool,
    deadline: float | None,
    on_pass,
    schedule: str = "1f1b",
) -> tuple[list[int], list[int], list, StageDP | None, dict[int, TpsSearch]]:
    """The sizes worth searching, on large trees: a quick search bounded to depth ``SEED_DEPTH``
    (small tables) gives stagings, best-first: the ``SEED_SIZES`` sizes with the least lower bound
    (:meth:`StageDP.lower_bound`, ties to the smaller size: fewer samples a micro-batch in flight,
    so a shallow staging fits memory more often) first, the next ones only when none of
    those has a staging that shallow; the best of them by estimate, simulated, is an
    incumbent (the *seed*, kept as a candidate); one pass of the lower-bound DP
    (:func:`least_useful_depths`) at ``incumbent / B``, at any depth, tells the sizes with no
    staging whose exact TPS gets there: every plan of theirs takes longer than the seed (an
    iteration is at least ``B`` times its busiest stage's TPS), so they are not searched.  The
    plan picked is the same (or a better one, the seed).  Returns the sizes kept and pruned, the
    seed ``[(search result, simulated iteration)]``, the lower-bound DP (``[]``/``None``: no pruning)
    and the quick search's answers by size (their targets are feasible: the searches start below).
    When the pruning pass would end past the deadline (``LB_PASS_SHARE``), it is not run: the
    seed stands and no size is pruned, so the time left goes to the search itself."""
    order = sorted(sizes, key=lambda b: (dp.lower_bound(b), b))
    quick: dict[int, TpsSearch] = {}
    t0, tried = time.perf_counter(), 0
    for i in range(0, len(order), SEED_SIZES):
        quick = search_bounded(
            dp, order[i : i + SEED_SIZES], SEED_DEPTH, deadline=deadline, on_pass=on_pass, tol=SEED_TOL
        )
        tried += len(order[i : i + SEED_SIZES])
        if quick or (deadline is not None and time.perf_counter() > deadline):
            break
    if not quick:
        return list(sizes), [], [], None, {}
    per_size = (time.perf_counter() - t0) / tried
    r = min(quick.values(), key=lambda r: (price_staging(graph, cluster, r.stages, r.b, B, dp._costs)[1], r.tps, -r.b))
    inc = build_staging_plan(
        graph, cluster, r.stages, r.b, B, dp, search_k, deadline=deadline, schedule=schedule
    ).predicted.iteration_time
    if deadline is not None and time.perf_counter() + LB_PASS_SHARE * per_size * len(sizes) > deadline:
        logger.debug("no time for the pruning pass over %d sizes: none pruned", len(sizes))
        return list(sizes), [], [(r, inc)], None, quick
    lb = StageDP(
        graph,
        cluster,
        B,
        decomposition=dec,
        degree_options=dp.degree_options,
        shared_sinks=dp.shared_sinks,
        lower_bound_pricing=True,
    )
    t = inc / B * (1 + 1e-9)
    try:  # a size kept at depth <= SEED_DEPTH (a cheap pass) needs no pass at any depth
        shallow = lb.probe([(b, t) for b in sizes], keep=False, E=SEED_DEPTH, deadline=deadline).devices[:, -1]
        rest = [b for b, n in zip(sizes, shallow) if n > dp.D]
        deep = (
            lb.probe([(b, t) for b in rest], keep=False, saturate=1, deadline=deadline).devices[:, -1] if rest else []
        )
    except TimeLimitError:
        return list(sizes), [], [(r, inc)], lb, quick
    out = [b for b, n in zip(rest, deep) if n > dp.D]
    logger.debug("sizes pruned by the seed (b=%d, iteration %.6g): %s", r.b, inc, out)
    return [b for b in sizes if b not in out], out, [(r, inc)], lb, {b: x for b, x in quick.items() if b not in out}


def least_useful_depths(
    graph: Graph,
    cluster: Cluster,
    B: int,
    dec: SPDecomposition,
    dp: StageDP,
    sizes: Sequence[int],
    incumbent: float,
    max_bound: int | None,
    deadline: float | None,
    lb: StageDP | None = None,
) -> dict[int, int]:
    """For each size the least bound on the stage graph's depth at which a staging could still
    beat ``incumbent`` (a simulated iteration time); sizes where none could are left out.

    A plan's iteration takes at least ``B * TPS`` of its busiest stage (every stage is busy that
    long), so a staging that beats the incumbent has every stage's exact TPS below
    ``incumbent / B``.  One pass of the lower-bound DP (:class:`StageDP` with
    ``lower_bound_pricing``: no transfers, the all-reduce at the faster bandwidth, memory as
    always) at that target tells, for every size and depth bound at once, whether any staging of
    the DP's space (at any degrees: the leftover-device pass only raises them) gets there; where
    it does not, searching that depth bound cannot change the pick.  Feasibility only grows with
    the bound, so each size's useful bounds are those from the least feasible one up."""
    if not sizes:
        return {}
    cap = dp.E if max_bound is None else max(1, min(int(max_bound), dp.E))
    lb = lb or StageDP(
        graph,
        cluster,
        B,
        decomposition=dec,
        degree_options=dp.degree_options,
        shared_sinks=dp.shared_sinks,
        lower_bound_pricing=True,
    )
    t = incumbent / B * (1 + 1e-9)
    try:
        devices = lb.probe([(b, t) for b in sizes], keep=False, E=cap, deadline=deadline).devices
    except TimeLimitError:
        return {b: 1 for b in sizes}
    out = {}
    for b, row in zip(sizes, devices):
        ok = np.nonzero(row[1:] <= dp.D)[0]
        if len(ok):
            out[b] = int(ok[0]) + 1
    logger.debug("depth sweep: least useful depth bound per size %s (of %s)", out, list(sizes))
    return out
