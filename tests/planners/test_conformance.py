"""One conformance suite every registered planner must pass: valid plans, the budget respected,
memory respected, deterministic, honest status."""

from __future__ import annotations

import copy

import pytest
from tiny_graphs import chain_dict, diamond_dict, node

import gpp_solver as gs
from gpp_solver.errors import InfeasibleError, InvalidInputError, SearchSpaceTooLargeError
from gpp_solver.planners.registry import REGISTRY, get_planner

#: what a planner may report (optimal-* names its objective; the legacy "optimal" is never written)
HONEST = {"optimal-time-per-sample", "optimal-iteration-time", "optimal-within-search-space", "feasible", "time-limit"}


def two_branch() -> dict:
    nodes = [node("in", 0.2), node("a1", 2.0), node("a2", 1.5), node("b1", 1.0), node("b2", 1.0), node("out", 0.5)]
    edges = [("in", "a1"), ("a1", "a2"), ("in", "b1"), ("b1", "b2"), ("a2", "out"), ("b2", "out")]
    return {
        "format": "gpp-graph/1",
        "name": "two-branch",
        "micro_batch_sizes": [1, 2],
        "nodes": nodes,
        "edges": [{"src": u, "dst": v} for u, v in edges],
    }


GRAPHS = {"chain": chain_dict(4, [1.0, 2.0, 1.0, 3.0]), "diamond": diamond_dict(), "two-branch": two_branch()}
CLUSTER = {
    "format": "gpp-cluster/1",
    "devices": 4,
    "memory_bytes": 1e6,
    "devices_per_node": 2,
    "intra_node_bandwidth": 1000.0,
    "inter_node_bandwidth": 100.0,
    "latency": 0.001,
}


def planner_or_skip(name: str):
    try:
        return get_planner(name)
    except InvalidInputError:
        pytest.skip(f"planner {name!r} is not installed")


@pytest.mark.parametrize("name", sorted(REGISTRY))
@pytest.mark.parametrize("gname", sorted(GRAPHS))
def test_valid_deterministic_honest(name, gname):
    fn = planner_or_skip(name)
    g = gs.graph_from_dict(copy.deepcopy(GRAPHS[gname]))
    c = gs.cluster_from_dict(CLUSTER)
    try:
        p1 = fn(g, c, 8, time_limit=20)
    except SearchSpaceTooLargeError:
        pytest.skip("instance above this planner's limit")
    gs.validate(p1, g, c)
    assert p1.devices_used <= c.devices
    assert all(s.predicted.memory_bytes <= c.memory_bytes for s in p1.stages)
    assert p1.search.status in HONEST
    if p1.search.status == "optimal-within-search-space":  # says for what
        assert p1.search.objective
    assert p1.planner == name
    p2 = fn(g, c, 8, time_limit=20)

    def strip(p):
        return {**gs.plan_to_dict(p), "search": None}

    assert strip(p1) == strip(p2)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_memory_respected_or_infeasible(name):
    fn = planner_or_skip(name)
    g = gs.graph_from_dict(two_branch())
    # weights alone (4 x 100 bytes per node) do not fit one device with everything on it
    c = gs.cluster_from_dict({**CLUSTER, "memory_bytes": 1300.0})
    try:
        p = fn(g, c, 8, time_limit=20)
    except InfeasibleError as exc:
        assert exc.required_memory_bytes is None or exc.required_memory_bytes > c.memory_bytes
        return
    except SearchSpaceTooLargeError:
        pytest.skip("instance above this planner's limit")
    gs.validate(p, g, c)
    assert max(s.predicted.memory_bytes for s in p.stages) <= 1300.0


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_nothing_fits_is_infeasible(name):
    fn = planner_or_skip(name)
    g = gs.graph_from_dict(two_branch())
    c = gs.cluster_from_dict({**CLUSTER, "memory_bytes": 10.0})  # less than one node's weights
    with pytest.raises(InfeasibleError) as e:
        fn(g, c, 8, time_limit=20)
    if e.value.required_memory_bytes is not None:
        assert e.value.required_memory_bytes > 10.0


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_an_unknown_option_is_refused_by_name(name):
    """A misspelt option must not be ignored (the plan would not be what was asked for)."""
    planner_or_skip(name)
    with pytest.raises(InvalidInputError, match="no option .micro_batch_size_s.; its options: "):
        gs.solve(GRAPHS["diamond"], CLUSTER, mini_batch_size=4, planner=name, micro_batch_size_s=[2])
