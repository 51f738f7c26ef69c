"""PipeDream-2BW baseline: equal partitions, (w, d, b) enumeration, two weight versions in memory."""

from __future__ import annotations

import pytest

from conftest import CLUSTER, chain_dict, diamond_dict
from gpp_solver.planners.sequential.pipedream_2bw import equal_partition, plan_pipedream_2bw
from gpp_solver.formats.cluster import cluster_from_dict
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.types import SearchInfo
from gpp_solver.plan.validate import validate
from test_pipedream import branchy_dict, flat_cluster


def test_equal_partition_balances_and_keeps_every_part_non_empty():
    assert equal_partition([1, 1, 1, 1], 2) == [0, 2, 4]
    assert equal_partition([3, 1, 1, 1], 2) == [0, 1, 4]
    cuts = equal_partition([5, 0, 0, 0], 4)
    assert cuts == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidInputError):
        equal_partition([1, 2], 3)


@pytest.mark.parametrize("gd", [chain_dict(6), diamond_dict(), branchy_dict()])
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(3)])
def test_plans_are_valid_within_budget_and_deterministic(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    plan = plan_pipedream_2bw(g, cl, 8)
    validate(plan, g, cl)
    w, d = plan.search.extra["w"], plan.search.extra["d"]
    assert len(plan.stages) == w and all(len(s.devices) == d for s in plan.stages)
    assert w * d <= cl.devices
    assert plan.search.status == "optimal-within-search-space"
    assert plan.search.objective.startswith("least simulated iteration time")
    assert plan.search.extra["weight_versions_bytes"] <= cl.memory_bytes
    strip = lambda p: {k: v for k, v in plan_to_dict(p).items() if k != "search"}  # noqa: E731
    assert strip(plan_pipedream_2bw(g, cl, 8)) == strip(plan)


def test_best_configuration_is_the_fastest_of_the_space():
    g = graph_from_dict(chain_dict(4, [1.0, 2.0, 3.0, 4.0]))
    cl = cluster_from_dict(flat_cluster(4))
    plan = plan_pipedream_2bw(g, cl, 8, micro_batch_sizes=[2])
    order = list(g.topo_order)
    for w in range(1, 5):
        for d in (1, 2):
            if w * d > 4:
                continue
            x = 2 / d
            cuts = equal_partition([sum(t) for t in ((g.node(v).fw_time[0] if x <= 1 else g.node(v).fw_time[1],
                                                       g.node(v).bw_time[0] if x <= 1 else g.node(v).bw_time[1])
                                                      for v in order)], w)
            specs = [StageSpec(tuple(order[cuts[i]:cuts[i + 1]]), tuple(range(i * d, (i + 1) * d)), 2) for i in range(w)]
            other = build_plan(g, cl, specs, 8, planner="x", search=SearchInfo(0.0, "feasible"))
            assert plan.predicted.iteration_time <= other.predicted.iteration_time + 1e-12


def test_two_weight_versions_are_charged():
    gd = chain_dict(2)
    for n in gd["nodes"]:
        n["weight_bytes"] = 1000.0
    g = graph_from_dict(gd)
    # one node: 4000 (osf * W) + activations fits 4500 under the shared formula, but not 5000 with 2BW's copy
    cl = cluster_from_dict(flat_cluster(2, memory=4500.0))
    with pytest.raises(InfeasibleError) as err:
        plan_pipedream_2bw(g, cl, 2)
    assert err.value.required_memory_bytes >= 5000.0
    ok = cluster_from_dict(flat_cluster(2, memory=5200.0))
    plan = plan_pipedream_2bw(g, ok, 2)
    assert plan.search.extra["w"] == 2                  # one node per stage: 5000 + activations
    assert plan.predicted.peak_memory_bytes + 1000.0 <= 5200.0
