"""The GraphPipe planner: SP tree -> binary search on TPS (DP probes) -> plan (GraphPipe §5-§6).

``plan_graphpipe(graph, cluster, mini_batch_size, ...)`` behind the planner protocol of
:mod:`gpp_solver.planners.registry`; ``gpp_solver.solve(graph, budget, planner="graphpipe", ...)`` is
the library's one front door to it.

Steps: decompose the graph into a series-parallel tree (:mod:`gpp_solver.sp_tree`; non-SP graphs
are SP-ized by adding dependencies); for every micro-batch size find the smallest bottleneck TPS
the stage DP reaches (:mod:`gpp_solver.binary_search`, :mod:`gpp_solver.planners.graphpipe.dp.stage_dp`); give every stage a
contiguous device range (:func:`gpp_solver.planners.graphpipe.dp.stage.assign_devices`, then the leftover-device pass); let
``plan_build`` derive stage edges, Algorithm 2 in-flight counts, kFkB orders, the cost model's
exact figures and the simulated iteration time; keep the staging whose plan has the least
*simulated* iteration time (the paper's sweep "to maximize training throughput", A.2; ties: smaller
TPS, then larger ``b``).  Candidates are simulated best iteration *estimate* first, and one whose
lower bound ``B * TPS`` (its busiest stage's work) already exceeds the best simulated iteration is
skipped, so the pick is the best of them all; ``simulate_top=k`` simulates only the best ``k`` by
estimate.  The DP stays exact for each ``b``.

**Depth sweep** (``depth_tradeoff``, on by default; ``False`` keeps Algorithm 1's objective alone:
the least TPS per ``b``): the paper's DP returns, for every target TPS, the fewest in-flight
micro-batches at the source (the stage graph's depth), and its binary search keeps only the least
target.  The sweep also keeps, for every ``b`` and every bound ``e`` on the depth below that
staging's depth (up to ``max_depth_bound``, default 8), the least TPS the DP reaches
(:func:`gpp_solver.binary_search.search_depths`), so a shallower staging at a slightly larger
bottleneck — fewer warm-up/cool-down bubbles, e.g. one data-parallel stage instead of a 4-stage
chain, or 3 stages instead of 4 when a mini-batch holds two micro-batches — can win the simulated
comparison.  This is how the baselines pick too (PipeDream-2BW, for one, keeps the least simulated
iteration time among its configurations).  Sizes whose every plan is provably slower than the
least-TPS search's best staging (``B * StageDP.lower_bound(b)`` above its simulated iteration) are
not swept.  On large trees a quick search bounded to a shallow depth first gives every size a
staging; the best by estimate, simulated, is a *seed* (kept as a candidate), and sizes where the
lower-bound DP finds no staging that could beat it are not searched at all
(``search.extra["micro_batch_sizes_pruned"]``; :func:`gpp_solver.planners.graphpipe.lower_bound_pruning.prune_sizes`).

**Shared sinks** (on by default; ``shared_sinks=False`` for the strict vertex-SP space): GraphPipe's
decompositions share terminals — a series split's halves share the boundary node, a parallel
split's branches share source and sink — so the stage holding a parallel block's sink (MMT's and
CANDLE-Uno's concat, DLRM's interaction) may also hold the last operators of one branch, or a
group of whole branches (the parallel split's group that keeps the sink); §7.5's
plan is of that kind ("one stage necessarily contains the concatenation operator").  The DP adds
those stages (:func:`gpp_solver.planners.graphpipe.dp.tree.add_shared_sinks`); where the optimum is reached both
with and without one, both tracebacks are simulated.  The per-stage micro-batch DP
(``per_stage_micro_batch``) does not have them.

Options: ``mini_batch_size`` (default: 16 samples per device, GraphPipe A.2's MMT setting),
``micro_batch_sizes`` (default: powers of two dividing it), ``search_k`` (each stage's kFkB ``k``
from ``K_OPTIONS`` by A.1's rule ``argmin_k max_y ComputeInFlight``, applied by Algorithm 2 in
``plan_build``; TPS does not depend on ``k`` in the cost model and ``k = 1`` is among the options,
so the DP's memory check at ``k = 1`` stays an upper bound), ``per_stage_micro_batch`` (each
stage its own micro-batch size from ``micro_batch_sizes`` — and with ``search_k`` its own ``k`` — by
the DP of :mod:`gpp_solver.planners.graphpipe.dp.general`, whose state carries the successor side's schedule
configuration; its in-flight figures are Algorithm 2 on the SP stage order, an upper bound of
``plan_build``'s; status ``optimal-within-search-space`` only when the DP's bottleneck equals the
plan's exact TPS, else ``feasible``), ``degree_options``
(data-parallel degrees, default powers of two), ``schedule`` (``"1f1b"``, the default: GraphPipe's
kFkB orders; ``"zb"``: every candidate's orders with the weight gradients split off as ``W`` actions,
:mod:`gpp_solver.plan.zero_bubble`; ``"auto"``: per candidate the faster of the two; the pick among
candidates is by that iteration time, so the staging and ``b`` may change with it),
``time_limit`` (seconds), ``progress`` (``None``:
a tqdm bar on stderr when it is a terminal and the search runs over a second; ``False``: never).

``search.status`` is ``optimal-within-search-space`` when every micro-batch size was searched to
the end and the plan's stages are the DP's min-TPS staging of the chosen ``b`` (its bottleneck
TPS, ``search.extra["dp_time_per_sample"]``, is then the smallest the DP's search space holds at
that ``b``, measured with its conservative stage estimates; the plan's exact TPS is at most that);
``feasible`` when the depth sweep chose a shallower staging with a larger TPS
(``dp_min_time_per_sample`` is that ``b``'s optimum); ``time-limit`` when the search was cut short.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from gpp_solver.cost.micro_batch import check_micro_batch_sizes
from gpp_solver.errors import InvalidInputError
from gpp_solver.plan.validate import validate
from gpp_solver.planners.graphpipe.options import GraphPipeOptions
from gpp_solver.planners.graphpipe.per_stage import plan_per_stage
from gpp_solver.planners.graphpipe.staging import PLANNER
from gpp_solver.planners.graphpipe.uniform import plan_uniform
from gpp_solver.planners.registry import parse_options
from gpp_solver.sp_tree import decompose
from gpp_solver.types import Cluster, Graph, Plan

logger = logging.getLogger(__name__)


def plan_graphpipe(
    graph: Graph,
    cluster: Cluster,
    mini_batch_size: int,
    *,
    time_limit: float | None = None,
    progress: bool | None = None,
    **options: Any,
) -> Plan:
    """Plan ``graph`` on ``cluster`` for mini-batch ``mini_batch_size`` (see the module docstring);
    ``options`` are the fields of :class:`GraphPipeOptions`."""
    t0 = time.perf_counter()
    o = parse_options(PLANNER, GraphPipeOptions, options)
    B = mini_batch_size
    sizes = check_micro_batch_sizes(B, o.micro_batch_sizes)
    if o.degree_options is not None:  # a stage at b takes a degree d with b % d == 0, d <= devices
        sizes = tuple(
            b
            for b in sizes
            if any(isinstance(d, int) and d >= 1 and b % d == 0 and d <= cluster.devices for d in o.degree_options)
        )
        if not sizes:
            raise InvalidInputError(
                f"graphpipe: no micro-batch size of {list(check_micro_batch_sizes(B, o.micro_batch_sizes))} "
                f"is divisible by a data-parallel degree of {list(o.degree_options)} that is at "
                f"most the cluster's {cluster.devices} devices"
            )
    if time_limit is not None and time_limit <= 0:
        raise InvalidInputError(f"time_limit must be positive, got {time_limit!r}")
    deadline = None if time_limit is None else t0 + time_limit
    dec = decompose(graph)
    if dec.forced_cuts:
        logger.info(
            "graph '%s' is not series-parallel: %d series cuts forced, %d dependencies added",
            graph.name,
            len(dec.forced_cuts),
            dec.added_pairs,
        )
    if o.per_stage_micro_batch:
        plan = plan_per_stage(graph, cluster, B, dec, sizes, o.search_k, o.degree_options, deadline, o.schedule)
    else:
        plan = plan_uniform(
            graph,
            cluster,
            B,
            dec,
            sizes,
            deadline=deadline,
            progress=progress,
            search_k=o.search_k,
            degree_options=o.degree_options,
            depth_tradeoff=o.depth_tradeoff,
            simulate_top=o.simulate_top,
            shared_sinks=o.shared_sinks,
            max_depth_bound=o.max_depth_bound,
            schedule=o.schedule,
        )
    plan = replace(plan, search=replace(plan.search, seconds=time.perf_counter() - t0))
    if o.validate_plan:
        validate(plan, graph, cluster)
    return plan
