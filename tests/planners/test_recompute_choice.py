"""Recomputation as the planners' choice (``solve(..., recompute=...)``, ``gpp plan --recompute``):
where no plan fits without it, ``gpp`` and ``graphpipe`` return one with it; never a slower plan
than without; ``on`` and ``off`` hold; bad values and other planners refused."""

from __future__ import annotations

import json

import pytest
from four_layers import GRAPH
from four_layers import cluster as _cluster

import gpp_solver as gs
from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.formats.summary import describe_plan

# four layers, each 1e5 weight bytes (4e5 with Adam's state) and 1e5 activation bytes per sample:
# with micro-batches of 4 and a mini-batch of 8 the least a plan needs without recomputation is
# 2.4e6 bytes a device (data parallelism, or two stages of two whose first holds both
# micro-batches); two stages whose first recomputes need 1.6e6


def _solve(planner: str, memory: float, **kw) -> gs.Plan:
    """The plan, the optimizer state never sharded (``zero`` has its own tests): it would fit too."""
    kw.setdefault("zero", "off")
    return gs.solve(
        GRAPH, _cluster(memory), mini_batch_size=8, planner=planner, time_limit=5, micro_batch_sizes=[4], **kw
    )


@pytest.mark.parametrize("planner", ["gpp", "graphpipe"])
def test_where_nothing_fits_without_it_a_plan_recomputes(planner):
    with pytest.raises(InfeasibleError):
        _solve(planner, 2.0e6, recompute="off")
    plan = _solve(planner, 2.0e6)
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape
    assert [s.recompute for s in plan.stages] == [True, False]  # the first holds two micro-batches
    assert [s.nodes for s in plan.stages] == [("l0", "l1"), ("l2", "l3")]
    assert [s.predicted.memory_bytes for s in plan.stages] == pytest.approx([1.6e6, 1.6e6])
    record = plan.search.extra["recompute"]
    assert record["choice"] == "auto" and record["stages"] == [0] and record["without_iteration_time"] is None
    assert plan.search.status == gs.Status.FEASIBLE
    assert describe_plan(plan).endswith("recompute stage 0")
    gs.validate(plan, gs.graph_from_dict(GRAPH), gs.cluster_from_dict(_cluster(2.0e6)))


@pytest.mark.parametrize("planner", ["gpp", "graphpipe"])
def test_never_slower_than_without(planner):
    for memory in (2.4e6, 2.6e6, 3.3e6, 1e9):
        off, auto = _solve(planner, memory, recompute="off"), _solve(planner, memory)
        assert auto.predicted.iteration_time <= off.predicted.iteration_time * (1 + 1e-12), memory


def test_on_recomputes_every_stage_and_off_none():
    on = _solve("gpp", 1e9, recompute="on")
    assert on.stages and all(s.recompute for s in on.stages)
    assert on.search.extra["recompute"]["choice"] == "on"
    off = _solve("gpp", 1e9, recompute="off")
    assert not any(s.recompute for s in off.stages) and "recompute" not in off.search.extra
    # recomputing is slower where memory does not bind: "auto" does not try it there
    assert on.predicted.iteration_time > off.predicted.iteration_time
    auto = _solve("gpp", 1e9)
    assert not any(s.recompute for s in auto.stages) and "recompute" not in auto.search.extra


def test_bad_values_and_other_planners_are_refused():
    with pytest.raises(InvalidInputError, match="recompute must be one of 'auto', 'on', 'off', got 'yes'"):
        _solve("gpp", 1e9, recompute="yes")
    with pytest.raises(InvalidInputError, match="no_such_option"):  # a bad option is not taken for "no plan"
        _solve("gpp", 1e9, recompute="on", no_such_option=1)
    with pytest.raises(InvalidInputError, match="recompute: only for the planners gpp, graphpipe"):
        gs.solve(GRAPH, _cluster(1e9), mini_batch_size=8, planner="alpa", recompute="on")


def test_the_cli_flag(tmp_path, capsys):
    from gpp_solver.cli import main

    g, c, out = tmp_path / "g.json", tmp_path / "c.json", tmp_path / "p.json"
    g.write_text(json.dumps(GRAPH))
    c.write_text(json.dumps(_cluster(2.0e6)))
    args = ["plan", str(g), "--cluster", str(c), "--batch", "8", "--micro-batch-sizes", "4", "--time-limit", "5"]
    args += ["--quiet", "--zero", "off"]
    assert main([*args, "--recompute", "off", "-o", str(out)]) == 1
    assert main([*args, "-o", str(out)]) == 0
    assert "recompute stage 0" in capsys.readouterr().out
    assert [s.get("recompute", False) for s in json.loads(out.read_text())["stages"]] == [True, False]
    assert main([*args[:-2], "--planner", "alpa", "--recompute", "on"]) == 2
    assert "recompute: only for the planners gpp, graphpipe" in capsys.readouterr().err
