"""The split backward's own cost (the graph's ``split_backward_overhead``, docs/zero-bubble.md):
read and written, priced by docs' rule in ``B`` and ``W`` of orders with ``W`` only, in the
simulator, the validator and the planners' schedule choice."""

from __future__ import annotations

from dataclasses import replace

import pytest

import gpp_solver as gs
from gpp_solver.cost import split_overhead, stage_costs
from gpp_solver.errors import InvalidGraphError
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo

OVH = {"call": 100e-6, "node": 1e-6, "walk": 5e-6}


def _node(i: str, weights: float) -> dict:
    return {
        "id": i,
        "fw_time": [1e-3, 3e-3],
        "bw_time": [2e-3, 6e-3],
        "weight_bytes": weights,
        "activation_bytes": 100,
        "output_bytes": 100,
    }


def _chain(**extra) -> dict:
    """docs' example: x -> a -> b -> c, a and c weighted (x's activations the largest, so that the
    W placement may split the stage of a, b, c within the first stage's memory)."""
    return {
        "format": "gpp-graph/1",
        "micro_batch_sizes": [1, 4],
        "nodes": [{**_node("x", 1e3), "activation_bytes": 1e4}, _node("a", 1e3), _node("b", 0), _node("c", 1e3)],
        "edges": [{"src": "x", "dst": "a"}, {"src": "a", "dst": "b"}, {"src": "b", "dst": "c"}],
        **extra,
    }


def _stage(nodes, b=4, devices=(1,)) -> StageSpec:
    return StageSpec(tuple(nodes), tuple(devices), b)


def test_docs_worked_example():
    g = graph_from_dict(_chain(split_backward_overhead=OVH))
    b_extra, w_extra = split_overhead(g, _stage("abc"))
    assert b_extra == pytest.approx(3 * 5e-6)
    assert w_extra == pytest.approx((100e-6 + 1e-6) + (100e-6 + 3e-6))
    # a first stage: no region, one call over the whole stage, no walk in B
    assert split_overhead(g, _stage("xa")) == pytest.approx((0.0, 100e-6 + 2 * 1e-6))
    # nothing weighted: nothing to split
    assert split_overhead(g, _stage("b")) == (0.0, 0.0)
    # absent: zeros
    assert split_overhead(graph_from_dict(_chain()), _stage("abc")) == (0.0, 0.0)


def test_a_weighted_node_outside_the_region_adds_one_call():
    """m is fed by no other stage: outside the region, its weights' gradients come in one more call
    that walks the nodes outside the region; c depends on a, m and itself."""
    doc = _chain(split_backward_overhead=OVH)
    doc["nodes"] = [_node("x", 1e3), _node("a", 1e3), _node("m", 1e3), _node("c", 1e3)]
    doc["edges"] = [{"src": "x", "dst": "a"}, {"src": "a", "dst": "c"}, {"src": "m", "dst": "c"}]
    g = graph_from_dict(doc)
    b_extra, w_extra = split_overhead(g, _stage("amc"))
    assert b_extra == pytest.approx(3 * 5e-6)
    outside = 100e-6 + 1e-6 * 1  # {m}
    assert w_extra == pytest.approx(outside + (100e-6 + 1e-6 * 1) + (100e-6 + 1e-6 * 3))


def test_round_trip_and_bad_values():
    g = graph_from_dict(_chain(split_backward_overhead=OVH))
    assert g.split_backward_overhead == (100e-6, 1e-6, 5e-6)
    assert graph_to_dict(g)["split_backward_overhead"] == OVH
    assert "split_backward_overhead" not in graph_to_dict(graph_from_dict(_chain()))
    with pytest.raises(InvalidGraphError, match=r"split_backward_overhead must be an object"):
        graph_from_dict(_chain(split_backward_overhead={"call": 1e-4}))
    with pytest.raises(InvalidGraphError, match=r"split_backward_overhead\.node"):
        graph_from_dict(_chain(split_backward_overhead={**OVH, "node": -1.0}))


def _plans(doc: dict, schedule: str):
    g = graph_from_dict(doc)
    c = gs.cluster_from_dict(
        {
            "format": "gpp-cluster/1",
            "devices": 2,
            "memory_bytes": 1e9,
            "intra_node_bandwidth": 1e9,
            "inter_node_bandwidth": 1e9,
            "latency": 0,
        }
    )
    specs = [_stage("x", devices=(0,)), _stage("abc", devices=(1,))]
    plan = build_plan(g, c, specs, 16, planner="manual", search=SearchInfo(0.0, "feasible"), schedule=schedule)
    return g, c, plan


def test_a_split_order_runs_the_overhead_in_its_b_and_w():
    g, c, plan = _plans(_chain(split_backward_overhead=OVH), "zb")
    gs.validate(plan, g, c)
    split = plan.stages[1]
    assert any(a.kind == "W" for a in split.schedule.order)
    cost = stage_costs(g, c, plan.stages, 16)[1]
    b_extra, w_extra = split_overhead(g, split)
    sim = gs.simulate(plan, g, c)
    durations = {(t.kind): t.end - t.start for t in sim.tasks if t.stage == split.id}
    assert durations["B"] == pytest.approx(cost.backward - cost.compute_bw_weight + b_extra)
    assert durations["W"] == pytest.approx(cost.compute_bw_weight + w_extra)
    assert split.predicted.time_per_sample == pytest.approx(cost.time_per_sample + (b_extra + w_extra) / 4)
    # the same plan priced without the term is refused: its figures are not the cost model's
    with pytest.raises(gs.InvalidPlanError, match="time_per_sample"):
        gs.validate(plan, graph_from_dict(_chain()), c)
    # the kFkB orders of the same partition do not pay it
    _, _, plain = _plans(_chain(split_backward_overhead=OVH), "1f1b")
    _, _, without = _plans(_chain(), "1f1b")
    assert plain.predicted.iteration_time == pytest.approx(without.predicted.iteration_time, rel=1e-12)


def test_auto_keeps_kfkb_orders_when_the_split_costs_more_than_it_saves():
    cheap = _chain(split_backward_overhead={"call": 0.0, "node": 0.0, "walk": 0.0})
    dear = _chain(split_backward_overhead={"call": 5e-3, "node": 1e-3, "walk": 1e-3})
    _, _, fast = _plans(cheap, "auto")
    _, _, slow = _plans(dear, "auto")
    assert fast.search.extra["schedule"]["chosen"] == "zb"
    record = slow.search.extra["schedule"]
    assert record["chosen"] == "1f1b" and record["iteration_time_zb"] > record["iteration_time_1f1b"]
    assert not any(a.kind == "W" for s in slow.stages for a in s.schedule.order)
    _, _, forced = _plans(dear, "zb")
    assert any(a.kind == "W" for s in forced.stages for a in s.schedule.order)
    assert forced.predicted.iteration_time == pytest.approx(record["iteration_time_zb"])


@pytest.mark.parametrize("schedule", ["zb", "auto"])
def test_gpp_honours_the_schedule_when_the_split_is_dear(diamond, cluster_dict, schedule):
    """With a split dearer than its gain, ``auto`` gives kFkB orders and ``zb`` still the split."""
    doc = {**diamond, "split_backward_overhead": {"call": 1.0, "node": 0.1, "walk": 0.1}}
    g = gs.graph_from_dict(doc)
    c = gs.cluster_from_dict(cluster_dict)
    p = gs.solve(g, c, mini_batch_size=8, planner="gpp", schedule=schedule, time_limit=20)
    gs.validate(p, g, c)
    has_w = any(a.kind == "W" for s in p.stages for a in s.schedule.order)
    weighted = any(g.node(v).weight_bytes > 0 for s in p.stages for v in s.nodes)
    if schedule == "auto":
        assert not has_w
    elif weighted:
        assert has_w and p.search.extra["schedule"]["chosen"] == "zb"
    plain = gs.solve(
        replace(g, split_backward_overhead=(0.0, 0.0, 0.0)), c, mini_batch_size=8, planner="gpp", schedule="1f1b"
    )
    if schedule == "auto":
        assert p.predicted.iteration_time <= plain.predicted.iteration_time * (1 + 1e-9)
