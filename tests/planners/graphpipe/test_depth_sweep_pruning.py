"""The depth sweep's pruning (``lower_bound_pruning.least_useful_depths``): the lower-bound DP leaves out the
(micro-batch size, depth bound) pairs whose every staging has a stage slower than the incumbent's
iteration time allows, so the planner's pick is the same as with every pair searched."""

from __future__ import annotations

import pytest

from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.planners.graphpipe import lower_bound_pruning, uniform
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.workloads import build_model

CASES = [
    ("mmt", 8, 128),
    ("transformer", 16, 256),
    ("dlrm", 8, 512),
    ("candle-uno", 4, 4096),
    ("transformer", 64, 1024),
]


@pytest.mark.parametrize("name,devices,B", CASES)
def test_pruned_sweep_picks_the_same_plan(name: str, devices: int, B: int, monkeypatch) -> None:
    graph, cluster = build_model(name), v100_cluster(devices)
    asked = []
    real = uniform.least_useful_depths

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        asked.append((list(args[5]), out))
        return out

    monkeypatch.setattr(uniform, "least_useful_depths", spy)
    got = plan_graphpipe(graph, cluster, B)
    monkeypatch.setattr(uniform, "least_useful_depths", lambda *a, **k: {b: 1 for b in a[5]})
    want = plan_graphpipe(graph, cluster, B)
    assert got.predicted.iteration_time == want.predicted.iteration_time
    assert [s.nodes for s in got.stages] == [s.nodes for s in want.stages]
    assert [s.devices for s in got.stages] == [s.devices for s in want.stages]
    assert got.search.status == want.search.status


def test_lower_bound_pricing_is_below_the_dp_estimate() -> None:
    """Every segment's lower-bound figure is at most the conservative DP's (no transfers, a faster
    all-reduce) and strictly lower where the segment has transfers."""
    graph, cluster = build_model("mmt"), v100_cluster(16)
    dp = StageDP(graph, cluster, 256)
    lb = StageDP(graph, cluster, 256, lower_bound_pricing=True)
    for b in (1, 4, 16):
        a, c = dp.tables(b).tps, lb.tables(b).tps
        assert (c <= a).all()
        has_comm = dp.comm.count > 0
        assert (c[has_comm] < a[has_comm]).all()
        assert (dp.tables(b).maxdepth == lb.tables(b).maxdepth).all()


def test_pruning_leaves_out_hopeless_pairs() -> None:
    """On a deep chain with many devices, most sizes' shallow bounds cannot beat the incumbent."""
    graph, cluster = build_model("transformer", layers=24), v100_cluster(64)
    B = 1024
    dp = StageDP(graph, cluster, B)
    sizes = [1, 2, 4, 8, 16, 32, 64]
    plan = plan_graphpipe(graph, cluster, B)
    out = lower_bound_pruning.least_useful_depths(
        graph, cluster, B, dp.decomposition, dp, sizes, plan.predicted.iteration_time, 8, None
    )
    assert sum(max(0, 9 - out.get(b, 9)) for b in sizes) < 8 * len(sizes)
