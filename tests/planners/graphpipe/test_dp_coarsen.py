"""Long series coarsened into blocks (``index_tree(max_series_children=...)``, ``StageDP.MAX_SEGMENTS``):
the blocks are runs of consecutive operators that share a stage, the plan is valid, and the
planner does not claim the full space's optimum for it."""

from __future__ import annotations

import pytest

from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.plan.validate import validate
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.dp.tree import index_tree, tree_segments
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.sp_tree import decompose
from gpp_solver.types import Status
from gpp_solver.workloads import build_model


@pytest.mark.parametrize("name,kw", [("transformer", {"layers": 12}), ("mmt", {}), ("dlrm", {}), ("candle-uno", {})])
def test_tree_segments_counts_index_tree(name: str, kw: dict) -> None:
    tree = decompose(build_model(name, **kw)).tree
    assert tree_segments(tree) == len(index_tree(tree).seg_lo)


def test_blocks_are_runs_of_operators() -> None:
    graph = build_model("transformer", layers=12)  # one series of 38 operators
    tree = decompose(graph).tree
    full, coarse = index_tree(tree), index_tree(tree, max_series_children=10)
    assert not full.blocks and coarse.blocks
    kind, kids = coarse.nodes[coarse.root[1]]
    assert len(kids) <= 10
    assert coarse.leaf_order == full.leaf_order  # the same operators, in the same order
    ranges = coarse.child_range[coarse.root[1]]
    assert ranges[0][0] == 0 and ranges[-1][1] == len(full.leaf_order)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no gap
    assert sum(hi - lo for lo, hi in ranges if hi - lo > 1) == sum(coarse.blocks)


@pytest.mark.parametrize("devices", [8, 64])
def test_coarsened_plan_is_valid_and_not_called_optimal(devices: int, monkeypatch) -> None:
    graph, cluster = build_model("transformer", layers=24), v100_cluster(devices)
    monkeypatch.setattr(StageDP, "MAX_SEGMENTS", 100)
    monkeypatch.setattr(StageDP, "COARSE_CHILDREN", 12)
    plan = plan_graphpipe(graph, cluster, 16 * devices)
    validate(plan, graph, cluster)
    info = plan.search.extra["coarsened_series"]
    assert info["blocks"] >= 1 and info["largest_block"] >= 2
    assert plan.search.status is not Status.OPTIMAL_WITHIN_SEARCH_SPACE
    assert "coarsened" in plan.search.objective
    # every block's operators share a stage
    dp = StageDP(graph, cluster, 16 * devices)
    stage_of = {v: i for i, s in enumerate(plan.stages) for v in s.nodes}
    ranges = dp.idx.child_range[dp.idx.root[1]]
    for lo, hi in ranges:
        assert len({stage_of[v] for v in dp.idx.leaf_order[lo:hi]}) == 1
    # the full space (not coarsened) is never worse in the DP's own objective
    monkeypatch.undo()
    full = plan_graphpipe(graph, cluster, 16 * devices)
    assert "coarsened_series" not in full.search.extra
    assert full.search.extra["dp_min_time_per_sample"] <= plan.search.extra["dp_min_time_per_sample"] * (1 + 1e-12)


def test_coarsened_depth_bound_follows_memory(monkeypatch) -> None:
    """A coarsened space holds stage graphs ``COARSE_DEPTH`` deep, or twice the fewest stages a
    chain needs to hold the weights when that is more; the bound is never above the tree's own."""
    from dataclasses import replace

    graph = build_model("transformer", layers=48)  # one series of 146 operators
    monkeypatch.setattr(StageDP, "MAX_SEGMENTS", 100)
    monkeypatch.setattr(StageDP, "COARSE_CHILDREN", 60)
    monkeypatch.setattr(StageDP, "COARSE_DEPTH", 8)
    cluster = v100_cluster(64)
    dp = StageDP(graph, cluster, 1024)
    assert dp.coarsened and dp.depth_limited and dp.E == 8
    weights = sum(n.weight_bytes for n in graph.nodes)
    tight = replace(cluster, memory_bytes=cluster.optimizer_state_factor * weights / 9.5)  # 10 stages at least
    dp = StageDP(graph, tight, 1024)
    assert dp.depth_limited and dp.E == 20
    plan = plan_graphpipe(graph, tight, 1024)
    validate(plan, graph, tight)
    assert plan.depth <= 20 and plan.search.extra["coarsened_series"]["max_depth"] == 20
