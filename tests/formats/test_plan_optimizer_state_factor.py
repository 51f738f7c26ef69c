"""A plan records the cluster's ``optimizer_state_factor`` its memory figures were priced with:
planners write it, the reader keeps it (optional, absent = the cluster's), and ``validate``
refuses the plan against a cluster with another factor."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from tiny_graphs import chain_dict

from gpp_solver import solve
from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import plan_from_dict, plan_to_dict
from gpp_solver.plan.validate import validate
from gpp_solver.types import Cluster


def _solved(factor: float):
    graph = graph_from_dict(chain_dict(4))
    cluster = Cluster(devices=2, memory_bytes=1e12, inter_node_bandwidth=1e9, optimizer_state_factor=factor)
    return graph, cluster, solve(graph, cluster, mini_batch_size=8, planner="pipedream")


@pytest.mark.parametrize("factor", [2.0, 4.0, 6.5])
def test_planners_record_the_clusters_factor_and_it_round_trips(factor):
    graph, cluster, plan = _solved(factor)
    assert plan.optimizer_state_factor == factor
    doc = json.loads(json.dumps(plan_to_dict(plan)))
    assert doc["optimizer_state_factor"] == factor
    assert plan_from_dict(doc) == plan
    validate(plan_from_dict(doc), graph, cluster)


def test_absent_factor_reads_as_none_and_validates_with_the_clusters():
    graph, cluster, plan = _solved(4.0)
    doc = plan_to_dict(plan)
    del doc["optimizer_state_factor"]
    read = plan_from_dict(doc)
    assert read.optimizer_state_factor is None
    assert "optimizer_state_factor" not in plan_to_dict(read)
    validate(read, graph, cluster)


def test_validate_refuses_a_plan_made_for_another_factor():
    graph, cluster, plan = _solved(2.0)
    with pytest.raises(InvalidPlanError, match="optimizer_state_factor 2 but the cluster's is 4"):
        validate(plan, graph, replace(cluster, optimizer_state_factor=4.0))


@pytest.mark.parametrize("value", [-1.0, "4", True, 1e300])
def test_a_bad_factor_is_named(value):
    _, _, plan = _solved(4.0)
    doc = plan_to_dict(plan)
    doc["optimizer_state_factor"] = value
    with pytest.raises(InvalidPlanError, match="optimizer_state_factor"):
        plan_from_dict(doc)
