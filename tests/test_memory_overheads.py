"""The cost model's runtime memory overheads (a cluster with ``memory_overheads``) by hand, and
planning under them: every plan ``solve`` returns fits the whole model."""

from __future__ import annotations

import pytest
from three_node_stage import CLUSTER, DOC

import gpp_solver as gs
from gpp_solver.cost.memory import OPTIMIZER_STEP_SCRATCH, POSTED_AHEAD, TEMPORARY_OUTPUTS, boundary_bytes, stage_memory
from gpp_solver.errors import InvalidClusterError
from gpp_solver.plan.build import StageSpec


def _cluster(cluster_dict, **kw):
    return gs.cluster_from_dict({**cluster_dict, **kw})


def test_absent_means_the_model_without_overheads(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    stages = [StageSpec(("a",), (0,), 4), spec, StageSpec(("d",), (1,), 4)]
    off = _cluster(cluster_dict)
    assert not off.memory_overheads
    assert stage_memory(g, off, spec, 12, stages) == stage_memory(g, off, spec, 12) == 4 * 200 + 6 * 20
    assert "memory_overheads" not in gs.cluster_to_dict(off)
    assert gs.cluster_to_dict(_cluster(cluster_dict, memory_overheads=True))["memory_overheads"] is True


def test_overheads_by_hand(diamond, cluster_dict):
    """Stage {b, c} of a -> {b, c} -> d, 2 replicas, micro-batch 4, 12 samples in flight: nodes of
    100 weight bytes, 10 activation and 5 output bytes per sample (tiny_graphs.node)."""
    g = gs.graph_from_dict(diamond)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    stages = [StageSpec(("a",), (0,), 4), spec, StageSpec(("d",), (1,), 4)]
    assert boundary_bytes(g, stages, spec) == (5.0, 10.0)  # a's output received once; b, c send theirs
    sgd = _cluster(cluster_dict, memory_overheads=True, optimizer_state_factor=2.0)
    rows = 4 / 2
    temporaries = 100 + TEMPORARY_OUTPUTS * rows * 5 + POSTED_AHEAD * rows * (5 + 10)
    activations = 12 / 2 * (20 + 5)
    backward = activations + temporaries
    assert stage_memory(g, sgd, spec, 12, stages) == pytest.approx(2 * 200 + max(backward, 200))
    # a larger stage weight: the data-parallel all-reduce's buckets (W_S) are the larger phase
    big = gs.graph_from_dict({**diamond, "nodes": [dict(n, weight_bytes=1e4) for n in diamond["nodes"]]})
    assert stage_memory(big, sgd, spec, 12, stages) == pytest.approx(2 * 2e4 + 2e4)
    # Adam's class (factor >= 4): its step scratch, 3 tensors of the largest weight, is a phase too
    adam = _cluster(cluster_dict, memory_overheads=True, optimizer_state_factor=4.0)
    one = StageSpec(("b", "c"), (2,), 4)
    stages1 = [StageSpec(("a",), (0,), 4), one, StageSpec(("d",), (1,), 4)]
    got = stage_memory(big, adam, one, 4, stages1)
    assert got == pytest.approx(4 * 2e4 + OPTIMIZER_STEP_SCRATCH * 1e4)


def test_cluster_field_is_a_boolean(cluster_dict):
    with pytest.raises(InvalidClusterError, match="memory_overheads"):
        _cluster(cluster_dict, memory_overheads="yes")


@pytest.mark.parametrize("planner", ["graphpipe", "pipedream", "gpp", "piper", "milp"])
def test_every_plan_fits_the_whole_model(planner, chain, cluster_dict):
    """A memory bound that the model without overheads meets with a plan the overheads break: the
    plan returned fits under the whole model (validate checks it), and a plan that was planned
    again under a lowered memory claims no more than feasible."""
    chain = {
        **chain,
        "nodes": [dict(n, weight_bytes=1000.0, activation_bytes=400.0, output_bytes=300.0) for n in chain["nodes"]],
    }
    g = gs.graph_from_dict(chain)
    base = {**cluster_dict, "devices": 4, "memory_bytes": 4 * 2000 + 2 * 800}
    c = gs.cluster_from_dict({**base, "memory_overheads": True})
    try:
        plain = gs.solve(g, base, mini_batch_size=2, planner=planner, time_limit=10)
    except gs.InfeasibleError:  # nothing fits even without the overheads: nothing fits with them
        with pytest.raises(gs.InfeasibleError):
            gs.solve(g, c, mini_batch_size=2, planner=planner, time_limit=10)
        return
    over = [
        s
        for s in plain.stages
        if stage_memory(g, c, s, s.in_flight_samples, plain.stages, mini_batch_size=2) > c.memory_bytes
    ]
    if planner == "graphpipe":
        assert over, "the instance must need the second planning round"
    try:
        plan = gs.solve(g, c, mini_batch_size=2, planner=planner, time_limit=10)
    except gs.InfeasibleError as exc:
        assert "memory overheads" in str(exc)
        return
    for s in plan.stages:
        assert s.predicted.memory_bytes == pytest.approx(
            stage_memory(g, c, s, s.in_flight_samples, plan.stages, mini_batch_size=2)
        )
        assert s.predicted.memory_bytes <= c.memory_bytes
    if over:
        assert plan.search.status == "feasible"
    else:  # the planner's plan fits as it is: the same plan, its status kept
        assert [s.nodes for s in plan.stages] == [s.nodes for s in plain.stages]
        assert plan.search.status == plain.search.status
    gs.validate(plan, g, c)


def test_a_stage_that_runs_every_forward_first_is_priced_by_phase():
    """Weights 100 (node a), 300 (b), 0 (c); activations per sample 50, 20, 10; one replica, b = 2."""
    g, c = gs.graph_from_dict(DOC), gs.cluster_from_dict(CLUSTER)
    spec = gs.StageSpec(nodes=("a", "b", "c"), devices=(0,), micro_batch_size=2)
    temporaries = 300 + 2 * 2 * 5  # the largest weight gradient, two outputs' gradients of 2 rows
    # one micro-batch (B = 2): the forward holds 2 * 80 = 160; in the backward (c, b, a) the most is
    # after b: a's activations 2 * 50 plus b's and c's weight gradients 300 -> 400; after it W = 400
    one = 1 * 400 + max(160 + temporaries, 400 + temporaries, 400)
    assert stage_memory(g, c, spec, 2, [spec], mini_batch_size=2) == pytest.approx(one)
    # two micro-batches, both in flight before the first backward (B = 4): one more micro-batch of 160
    assert stage_memory(g, c, spec, 4, [spec], mini_batch_size=4) == pytest.approx(400 + 160 + 400 + temporaries)
    # a forward after a backward (B = 4, one in flight): the gradients and the activations together
    whole = 2 * 400 + 160 + temporaries
    assert stage_memory(g, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(whole)
    assert stage_memory(g, c, spec, 2, [spec]) == pytest.approx(whole)  # no mini-batch given: the same
