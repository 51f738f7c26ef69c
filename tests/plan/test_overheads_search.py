"""The memory a planner is shown under the runtime's overheads (``plan/overheads.py``): above the
device's memory too, since the whole model can be below the planners' own formula (a plan with one
micro-batch a step never holds its gradients beside its activations), so a plan the planner prices
above the limit may fit."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import CLUSTER
from tiny_graphs import node

import gpp_solver as gs
from gpp_solver.plan.overheads import plan_within_overheads
from gpp_solver.planners.registry import get_planner

SIZES = (1, 2, 4, 8)


def _chain() -> gs.Graph:
    """Two layers of equal weights, the second's activations 8x the first's; times grow as b^0.8."""
    nodes = [node("n0", 2.0, w=50.0, a=5.0, o=2.0), node("n1", 3.0, w=50.0, a=40.0, o=10.0)]
    for x in nodes:
        x["fw_time"] = [x["fw_time"][0] * b**0.8 for b in SIZES]
        x["bw_time"] = [2 * t for t in x["fw_time"]]
    doc = {"format": "gpp-graph/1", "name": "chain", "micro_batch_sizes": list(SIZES), "nodes": nodes}
    return gs.graph_from_dict({**doc, "edges": [{"src": "n0", "dst": "n1"}]})


@pytest.fixture
def case():
    graph = _chain()
    cluster = gs.cluster_from_dict({**CLUSTER, "devices": 2, "memory_overheads": True, "memory_bytes": 578.0})
    graphpipe = get_planner("graphpipe")
    return graph, cluster, lambda seen: graphpipe(graph, seen, 8)


def test_more_memory_shown_reaches_a_faster_plan_that_fits(case):
    graph, cluster, run = case
    lowered = plan_within_overheads(run, graph, cluster)
    above = plan_within_overheads(run, graph, cluster, above=3)
    for plan in (lowered, above):
        gs.validate(plan, graph, cluster)
        assert plan.predicted.peak_memory_bytes <= cluster.memory_bytes
    assert above.predicted.iteration_time < lowered.predicted.iteration_time * 0.95
    # the faster plan: the planner's own formula prices it above the device's memory
    own = run(replace(cluster, memory_overheads=False, memory_bytes=1e9))
    assert [s.micro_batch_size for s in own.stages] == [s.micro_batch_size for s in above.stages]
    assert own.predicted.peak_memory_bytes > cluster.memory_bytes
    assert above.predicted.peak_memory_bytes < own.predicted.peak_memory_bytes


def test_no_rounds_above_past_the_deadline(case):
    graph, cluster, run = case
    shown = []

    def recording(seen):
        shown.append(seen.memory_bytes)
        return run(seen)

    plan_within_overheads(recording, graph, cluster, above=3, deadline=0.0)
    assert len(shown) == 1 and shown[0] == cluster.memory_bytes  # the first round only, as the device has it


def test_gpp_is_never_slower_than_the_search_above(case):
    graph, cluster, run = case
    above = plan_within_overheads(run, graph, cluster, above=3)
    plan = gs.solve(graph, cluster, mini_batch_size=8)
    gs.validate(plan, graph, cluster)
    assert plan.predicted.iteration_time <= above.predicted.iteration_time * (1 + 1e-9)
