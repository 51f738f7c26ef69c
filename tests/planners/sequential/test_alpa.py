"""Alpa-style stage DP: group sizes, the exact t_max enumeration against brute force, valid plans."""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import CLUSTER, chain_dict, diamond_dict
from test_pipedream import branchy_dict, compositions, flat_cluster

from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InfeasibleError
from gpp_solver.formats.cluster import cluster_from_dict, v100_cluster
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.plan.build import StageSpec
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.alpa import plan_alpa
from gpp_solver.planners.sequential.alpa_submeshes import group_sizes


def test_group_sizes_follow_the_node_shape():
    assert group_sizes(v100_cluster(16, devices_per_node=4)) == [1, 2, 4, 8, 12, 16]
    assert group_sizes(v100_cluster(4, devices_per_node=8)) == [1, 2, 4]
    assert group_sizes(cluster_from_dict(flat_cluster(6))) == [1, 2, 4, 6]


def test_latency_objective_matches_brute_force_on_a_chain():
    g = graph_from_dict(chain_dict(5, [1.0, 3.0, 0.5, 2.0, 1.5]))
    cl = cluster_from_dict(flat_cluster(4))
    B, b = 8, 2
    n = B // b
    ids = list(g.topo_order)
    best = math.inf
    for cuts in compositions(len(ids)):
        parts = [ids[cuts[i] : cuts[i + 1]] for i in range(len(cuts) - 1)]
        for sizes in itertools.product([1, 2, 4], repeat=len(parts)):
            if sum(sizes) > cl.devices or any(b % s for s in sizes):
                continue
            specs, dev = [], 0
            for p, s in zip(parts, sizes):
                specs.append(StageSpec(tuple(p), tuple(range(dev, dev + s)), b))
                dev += s
            t = [c.per_micro_batch for c in stage_costs(g, cl, specs, B)]
            best = min(best, sum(t) + (n - 1) * max(t))
    plan = plan_alpa(g, cl, B, micro_batch_sizes=[b])
    assert plan.search.extra["alpa_latency"] == pytest.approx(best, rel=1e-9)
    assert plan.search.extra["t_max_epsilon"] == 0.0


@pytest.mark.parametrize("gd", [chain_dict(6), diamond_dict(), branchy_dict()])
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(3)])
def test_plans_are_valid_within_budget_and_deterministic(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    plan = plan_alpa(g, cl, 8)
    validate(plan, g, cl)
    assert plan.devices_used <= cl.devices
    assert plan.predicted.peak_memory_bytes <= cl.memory_bytes
    assert plan.search.status == "feasible"
    allowed = set(group_sizes(cl))
    assert all(len(s.devices) in allowed for s in plan.stages)
    strip = lambda p: {k: v for k, v in plan_to_dict(p).items() if k != "search"}  # noqa: E731
    assert strip(plan_alpa(g, cl, 8)) == strip(plan)


def test_groups_within_a_node_stay_inside_it():
    g = graph_from_dict(chain_dict(6, [1.0, 3.0, 0.5, 2.0, 1.5, 2.5]))
    cl = cluster_from_dict(CLUSTER)  # 2 nodes of 2 devices
    plan = plan_alpa(g, cl, 8)
    for s in plan.stages:
        if len(s.devices) <= 2:
            assert cl.same_node(s.devices)


def test_memory_respected_and_infeasible_reported():
    gd = chain_dict(4)
    for nd in gd["nodes"]:
        nd["weight_bytes"] = 1000.0
    g = graph_from_dict(gd)
    plan = plan_alpa(g, cluster_from_dict(flat_cluster(4, memory=9000.0)), 4)
    assert len(plan.stages) >= 2
    assert all(s.predicted.memory_bytes <= 9000.0 for s in plan.stages)
    with pytest.raises(InfeasibleError) as err:
        plan_alpa(g, cluster_from_dict(flat_cluster(4, memory=3000.0)), 4)
    assert err.value.required_memory_bytes >= 4000.0


def test_tables_too_large_for_the_device_count_are_refused():
    from gpp_solver.errors import SearchSpaceTooLargeError

    g = graph_from_dict(chain_dict(6))
    cl = cluster_from_dict(flat_cluster(4))
    with pytest.raises(SearchSpaceTooLargeError, match="max_table_bytes"):
        plan_alpa(g, cl, 8, max_table_bytes=1000)
    assert plan_alpa(g, cl, 8, max_table_bytes=10**6).search.status == "feasible"
