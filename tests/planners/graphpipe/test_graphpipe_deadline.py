"""GraphPipe's planner honours its deadline after the search too: past it, no further candidate is
simulated and the plan says ``time-limit``; with no plan, the error's memory figure stops near it."""

from dataclasses import replace

from gpp_solver.planners.graphpipe.dp.needs import infeasible_error
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.sp_tree import decompose
from gpp_solver.types import Cluster, Status
from gpp_solver.workloads import build_model


def test_past_deadline_no_more_simulations():
    g = build_model("mmt", branches=2, layers=2)
    c = Cluster(
        devices=8,
        memory_bytes=16 * 2**30,
        devices_per_node=4,
        intra_node_bandwidth=50e9,
        inter_node_bandwidth=12.5e9,
        latency=1e-5,
    )
    full = plan_graphpipe(g, c, 128, depth_tradeoff=False)
    assert len(full.search.extra["simulated_candidates"]) > 1
    assert full.search.status == Status.OPTIMAL_WITHIN_SEARCH_SPACE
    cut = plan_graphpipe(g, c, 128, depth_tradeoff=False, time_limit=1e-9)
    assert cut.search.status == Status.TIME_LIMIT
    sims = cut.search.extra["simulated_candidates"]
    assert sum("simulated_iteration_time" in s for s in sims) == 1  # the first one only
    assert all(s.get("not_simulated_time_limit") for s in sims[1:])
    assert "optimistic_transfer_proposals" not in cut.search.extra


def test_no_plan_figure_holds_the_deadline_and_says_at_most():
    """Where no plan fits, the error's memory figure takes DP passes per micro-batch size (a minute
    and a half on 10,000 operators); near the deadline it stops at a memory shown to hold a plan
    and says "at most", and that memory does give a plan."""
    g = build_model("transformer", layers=4)
    c = Cluster(devices=4, memory_bytes=1e15, inter_node_bandwidth=12.5e9)
    roomy = plan_graphpipe(g, c, 64).predicted.peak_memory_bytes
    tight = replace(c, memory_bytes=roomy / 100)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    dp = StageDP(g, tight, 64, decomposition=decompose(g))
    least = infeasible_error(dp, sizes, tight)
    assert "at most" not in str(least) and least.required_memory_bytes is not None
    cut = infeasible_error(dp, sizes, tight, deadline=0.0)  # past it from the start: one size searched
    need = cut.required_memory_bytes
    assert "at most" in str(cut) and f"{need:.6g}" in str(cut) and need >= least.required_memory_bytes
    assert plan_graphpipe(g, replace(c, memory_bytes=need * (1 + 1e-9)), 64).predicted.peak_memory_bytes <= need * (
        1 + 1e-9
    )
