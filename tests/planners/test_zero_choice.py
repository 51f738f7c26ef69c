"""Sharding the optimizer state (ZeRO-1) as the planners' choice (``solve(..., zero=...)``,
``gpp plan --zero``): where no plan fits without it, ``gpp`` and ``graphpipe`` return one whose
data-parallel stage shards; never a slower plan than without; ``on`` and ``off`` hold; bad values
and other planners refused."""

from __future__ import annotations

import json

import pytest
from four_layers import GRAPH
from four_layers import cluster as _cluster

import gpp_solver as gs
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.formats.summary import describe_plan

# four layers of 1e5 weight bytes (4e5 with Adam's state) and 1e5 activation bytes per sample, a
# mini-batch of 8 in micro-batches of 4 on 2 devices: without levers the least a plan needs is
# 2.4e6 bytes a device; data parallelism with the state sharded holds 3 * 4e5 + 4 / 2 * 4e5 = 2.0e6


def _solve(planner: str, memory: float, **kw) -> gs.Plan:
    """The plan, without recomputation (it has its own tests): it would fit too."""
    kw.setdefault("recompute", "off")
    return gs.solve(
        GRAPH, _cluster(memory), mini_batch_size=8, planner=planner, time_limit=5, micro_batch_sizes=[4], **kw
    )


@pytest.mark.parametrize("planner", ["gpp", "graphpipe"])
def test_where_nothing_fits_without_it_a_plan_shards(planner):
    with pytest.raises(InfeasibleError, match="2.4e"):
        _solve(planner, 2.0e6, zero="off")
    plan = _solve(planner, 2.0e6)
    assert [(len(s.devices), s.zero) for s in plan.stages] == [(2, 1)]  # the shape: one stage, two replicas
    assert plan.stages[0].predicted.memory_bytes == pytest.approx(2.0e6)
    record = plan.search.extra["zero"]
    assert record["choice"] == "auto" and record["stages"] == [0] and record["without_iteration_time"] is None
    assert plan.search.status == gs.Status.FEASIBLE
    assert describe_plan(plan).endswith("optimizer state sharded (ZeRO-1) on stage 0")
    gs.validate(plan, gs.graph_from_dict(GRAPH), gs.cluster_from_dict(_cluster(2.0e6)))
    with pytest.raises(InfeasibleError, match="with the optimizer state sharded: no plan fits either"):
        _solve(planner, 1.6e6)


@pytest.mark.parametrize("planner", ["gpp", "graphpipe"])
def test_never_slower_than_without(planner):
    for memory in (2.0e6, 2.4e6, 2.6e6, 3.3e6, 1e9):
        try:
            off = _solve(planner, memory, zero="off").predicted.iteration_time
        except InfeasibleError:
            off = float("inf")
        assert _solve(planner, memory).predicted.iteration_time <= off * (1 + 1e-12), memory


def test_on_shards_every_replicated_stage_and_off_none():
    on = _solve("gpp", 2.0e6, zero="on")
    assert [s.zero for s in on.stages if len(s.devices) > 1] == [1] and on.search.extra["zero"]["choice"] == "on"
    off = _solve("gpp", 1e9, zero="off")
    assert not any(s.zero for s in off.stages) and "zero" not in off.search.extra
    auto = _solve("gpp", 1e9)  # memory does not bind: sharding is not tried
    assert not any(s.zero for s in auto.stages) and "zero" not in auto.search.extra


def test_bad_values_and_other_planners_are_refused():
    with pytest.raises(InvalidInputError, match="zero must be one of 'auto', 'on', 'off', got 1"):
        _solve("gpp", 1e9, zero=1)
    with pytest.raises(InvalidInputError, match="zero: only for the planners gpp, graphpipe"):
        gs.solve(GRAPH, _cluster(1e9), mini_batch_size=8, planner="pipedream", zero="on")


def test_the_cli_flag(tmp_path, capsys):
    from gpp_solver.cli import main

    g, c, out = tmp_path / "g.json", tmp_path / "c.json", tmp_path / "p.json"
    g.write_text(json.dumps(GRAPH))
    c.write_text(json.dumps(_cluster(2.0e6)))
    args = ["plan", str(g), "--cluster", str(c), "--batch", "8", "--micro-batch-sizes", "4", "--time-limit", "5"]
    args += ["--quiet", "--recompute", "off"]
    assert main([*args, "--zero", "off", "-o", str(out)]) == 1
    assert main([*args, "-o", str(out)]) == 0
    assert "optimizer state sharded (ZeRO-1) on stage 0" in capsys.readouterr().out
    assert [s.get("zero", 0) for s in json.loads(out.read_text())["stages"]] == [1]
    assert main(["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "alpa", "--zero", "on"]) == 2
    assert "zero: only for the planners gpp, graphpipe" in capsys.readouterr().err
