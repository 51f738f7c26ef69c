"""The memory of a stage whose order holds ``W`` (``docs/zero-bubble.md``, *Memory rule*): the
gradients ``B`` keeps for ``W`` are priced, by hand on a small graph, in the validator, the
simulator, the W placement, the CP-SAT memory bound and the planners; orders without ``W`` are
priced as before."""

from __future__ import annotations

import pytest

import gpp_solver as gs
from gpp_solver.action import parse_order
from gpp_solver.cost import kept_gradient_bytes, memory_per_device, order_memory, pending_weight_samples, stage_memory
from gpp_solver.cp_schedule import max_in_flight_micro_batches
from gpp_solver.errors import InvalidPlanError
from gpp_solver.plan.build import StageSpec, build_plan

INFO = gs.SearchInfo(0.0, "feasible")
# src (stage 0) -> a -> b -> c, and e -> c: e reads only the model's input, not the received value
NODES = {  # weight_bytes, activation_bytes, output_bytes
    "src": (100, 10, 5),
    "a": (200, 30, 8),  # weighted, downstream of the received value: kept max(8, 30) = 30
    "b": (0, 10, 40),  # no weights: nothing kept
    "c": (50, 4, 20),  # weighted, downstream: kept max(20, 4) = 20
    "e": (70, 6, 6),  # weighted but not downstream of a received value: its W runs a whole backward
}
KEPT = 30 + 20
EAGER_LATE = "F0 F1 B0 F2 W0 B1 W1 B2 W2"  # 3 micro-batches in flight, 1 pending W
ALL_LATE = "F0 F1 B0 B1 F2 B2 W0 W1 W2"  # 3 in flight, 3 pending W


def _graph() -> gs.Graph:
    return gs.graph_from_dict(
        {
            "format": "gpp-graph/1",
            "name": "kept",
            "micro_batch_sizes": [1, 2],
            "nodes": [
                {
                    "id": v,
                    "fw_time": [1.0, 2.0],
                    "bw_time": [2.0, 4.0],
                    "weight_bytes": w,
                    "activation_bytes": act,
                    "output_bytes": out,
                }
                for v, (w, act, out) in NODES.items()
            ],
            "edges": [{"src": s, "dst": d} for s, d in [("src", "a"), ("a", "b"), ("b", "c"), ("e", "c")]],
        }
    )


def _cluster(memory: float = 1e9, overheads: bool = False) -> gs.Cluster:
    return gs.cluster_from_dict(
        {
            "format": "gpp-cluster/1",
            "devices": 4,
            "memory_bytes": memory,
            "inter_node_bandwidth": 1e3,
            "latency": 0.0,
            "optimizer_state_factor": 4.0,
            "memory_overheads": overheads,
        }
    )


def _specs(order1: str | None, devices: tuple[int, ...] = (1,)) -> list[StageSpec]:
    return [
        StageSpec(("src",), (0,), 2, order=parse_order("F0 F1 F2 B0 B1 B2") if order1 else None),
        StageSpec(("a", "b", "c", "e"), devices, 2, order=parse_order(order1) if order1 else None),
    ]


def test_pending_and_kept_by_hand():
    assert pending_weight_samples(parse_order(EAGER_LATE), 2) == 2
    assert pending_weight_samples(parse_order(ALL_LATE), 2) == 6
    assert pending_weight_samples(parse_order("F0 F1 B0 F2 B1 B2"), 2) == 0  # no W: the whole backward at B
    g = _graph()
    s0, s1 = _specs(EAGER_LATE)
    assert kept_gradient_bytes(g, s1) == KEPT
    assert kept_gradient_bytes(g, s0) == 0  # fed by the model's inputs alone


def test_stage_memory_by_hand():
    """M = osf * W + in_flight / d * act + pending / d * kept: 4 * 320 + 6 * 50 + 2 * 50 = 1680."""
    g, c = _graph(), _cluster()
    s1 = _specs(EAGER_LATE)[1]
    assert order_memory(g, c, s1, parse_order(EAGER_LATE)) == 1280 + 300 + 100
    assert order_memory(g, c, s1, parse_order(ALL_LATE)) == 1280 + 300 + 300
    # without W exactly the 1F1B formula (2 micro-batches in flight)
    assert order_memory(g, c, s1, parse_order("F0 F1 B0 F2 B1 B2")) == memory_per_device(4.0, 320, 4, 1, 50) == 1480
    two = _specs(EAGER_LATE, devices=(1, 2))[1]  # two replicas: activations and kept gradients halved
    assert order_memory(g, c, two, parse_order(EAGER_LATE)) == 1280 + 150 + 50
    # with the runtime's overheads the kept gradients join the activations (the backward phase)
    co = _cluster(overheads=True)
    specs = _specs(EAGER_LATE)
    with_w = order_memory(g, co, specs[1], parse_order(EAGER_LATE), specs)
    assert with_w == pytest.approx(stage_memory(g, co, specs[1], 6, specs) + 2 * KEPT)


def test_validator_and_simulator_price_the_kept_gradients():
    """A memory of 1600 bytes holds the stage under the in-flight rule alone (1580) but not with
    the kept gradients (1680): the validator refuses, the simulator reports 1680."""
    g = _graph()
    plan = build_plan(g, _cluster(), _specs(EAGER_LATE), 6, planner="m", search=INFO)
    assert plan.stages[1].predicted.memory_bytes == 1680
    assert gs.simulate(plan, g, _cluster()).stages[1].memory_bytes == 1680
    gs.validate(plan, g, _cluster(1680))
    with pytest.raises(InvalidPlanError, match="stage 1 needs 1680 bytes"):
        gs.validate(plan, g, _cluster(1600))


def test_cp_memory_bound_counts_pending_w():
    """K_S of a stage with W: its micro-batches in flight and as many kept gradients must fit
    (1280 + 2 * (100 + 100) = 1680 for two micro-batches of 2); a stage without W: 1280 + 2 * 100."""
    g = _graph()
    zb = build_plan(g, _cluster(), _specs(EAGER_LATE), 6, planner="m", search=INFO)
    plain = build_plan(g, _cluster(), _specs("F0 F1 B0 F2 B1 B2"), 6, planner="m", search=INFO)
    tight = _cluster(1679)
    assert max_in_flight_micro_batches(plain, g, tight)[1] == 3  # 1280 + 300 = 1580
    assert max_in_flight_micro_batches(zb, g, tight)[1] == 1  # 1280 + 2 * 200 = 1680 > 1679
    assert max_in_flight_micro_batches(zb, g, _cluster(1680))[1] == 2


def test_w_placement_keeps_the_peak_within_the_limit():
    """With the peak set by stage 1's own 1F1B memory, splitting its backward would add its kept
    gradients: the W placement leaves it unsplit and the plan's peak does not grow; with room for
    them it splits."""
    g = _graph()
    p1 = build_plan(g, _cluster(), _specs(None), 6, planner="m", search=INFO)
    peak = p1.predicted.peak_memory_bytes
    assert peak == p1.stages[1].predicted.memory_bytes  # stage 1 sets the peak
    for cluster in (_cluster(), _cluster(peak)):
        pz = build_plan(g, cluster, _specs(None), 6, planner="m", search=INFO, schedule="zb")
        gs.validate(pz, g, cluster)
        assert pz.predicted.peak_memory_bytes <= peak
        assert not any(a.kind == "W" for a in pz.stages[1].schedule.order)
    roomy = [StageSpec(("src",), (0,), 2), StageSpec(("a", "b", "c", "e"), (1, 2), 2)]  # 2 replicas
    big = [StageSpec(("src", "a"), (0,), 2), StageSpec(("b", "c", "e"), (1,), 2)]
    for specs in (roomy, big):
        base = build_plan(g, _cluster(), specs, 6, planner="m", search=INFO)
        pz = build_plan(g, _cluster(), specs, 6, planner="m", search=INFO, schedule="zb")
        gs.validate(pz, g, _cluster(base.predicted.peak_memory_bytes))
        assert pz.predicted.peak_memory_bytes <= base.predicted.peak_memory_bytes


@pytest.mark.parametrize("planner", ["graphpipe", "gpp"])
@pytest.mark.parametrize("schedule", ["zb", "auto"])
def test_planner_zb_plan_fits_a_tight_cluster(planner, schedule):
    """The cluster's memory at the 1F1B plan's peak: the plan the planner returns (validated by
    ``solve``) stays within it, its kept gradients included (graphpipe's W placement on this graph
    exceeds it when the placement does not price them)."""
    g = _graph()
    kw = {"time_limit": 10} if planner == "gpp" else {}
    p1 = gs.solve(g, _cluster(), mini_batch_size=6, planner=planner, schedule="1f1b", **kw)
    tight = _cluster(p1.predicted.peak_memory_bytes)
    pz = gs.solve(g, tight, mini_batch_size=6, planner=planner, schedule=schedule, **kw)
    gs.validate(pz, g, tight)
    for s in pz.stages:
        assert order_memory(g, tight, s, s.schedule.order, pz.stages) <= tight.memory_bytes * (1 + 1e-9)
