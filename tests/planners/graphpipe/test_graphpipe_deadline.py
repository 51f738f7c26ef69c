"""GraphPipe's planner honours its deadline after the search too: past it, no further candidate is
simulated and the plan says ``time-limit``."""

from gpp_solver.planners.graphpipe.planner import plan_graphpipe
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
