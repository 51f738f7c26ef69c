"""A stage whose replicas shard the optimizer state (``"zero": 1``, ZeRO-1): docs/cost-model.md's
worked example by hand, the plan format, and what the validator refuses."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import gpp_solver as gs
from gpp_solver.cost.memory import held_factor, order_memory, step_bytes
from gpp_solver.cost.model import optimizer_shards, stage_costs
from gpp_solver.errors import InvalidPlanError
from gpp_solver.formats.summary import describe_plan
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo


def _node(name: str, weights: float, activations: float) -> dict:
    return {
        "id": name,
        "fw_time": [1e-3],
        "bw_time": [2e-3],
        "weight_bytes": weights,
        "activation_bytes": activations,
        "output_bytes": 10,
    }


GRAPH = {
    "format": "gpp-graph/1",
    "name": "zero-chain",
    "micro_batch_sizes": [2],
    "nodes": [_node("b", 600, 50), _node("c", 400, 30)],
    "edges": [["b", "c"]],
    "optimizer_time_per_byte": 1e-6,
}
CLUSTER = dict(
    format="gpp-cluster/1",
    devices=2,
    memory_bytes=1e6,
    inter_node_bandwidth=1e6,
    latency=0.0,
    optimizer_state_factor=4.0,
    memory_overheads=False,
)
ONE_F_ONE_B = (("F", 0), ("B", 0), ("F", 1), ("B", 1))


def _plan(zero: int, cluster: dict = CLUSTER) -> gs.Plan:
    specs = [StageSpec(("b", "c"), (0, 1), 4, order=ONE_F_ONE_B, zero=zero)]
    return build_plan(
        gs.graph_from_dict(GRAPH),
        gs.cluster_from_dict(cluster),
        specs,
        8,
        planner="hand",
        search=SearchInfo(0.0, "feasible"),
    )


def test_the_worked_example_time():
    graph, cluster = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    (whole,) = stage_costs(graph, cluster, _plan(0).stages, 8)
    (sharded,) = stage_costs(graph, cluster, _plan(1).stages, 8)
    # all-reduce 2 (d-1)/d W / bandwidth = 1000 / 1e6; the all-gather adds (d-1)/d W / bandwidth
    assert whole.allreduce == pytest.approx(1e-3) and sharded.allreduce == pytest.approx(1.5e-3)
    # the step on W/d: 1e-6 * 1000 / 2
    assert whole.optimizer == pytest.approx(1e-3) and sharded.optimizer == pytest.approx(0.5e-3)
    assert sharded.tail == pytest.approx(whole.tail)  # here the all-gather costs what the step saves


def test_the_worked_example_memory():
    graph, cluster = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    whole, sharded = _plan(0), _plan(1)
    s = sharded.stages[0]
    assert optimizer_shards(s) == 2 and optimizer_shards(whole.stages[0]) == 1
    assert held_factor(4.0, s) == 3.0 and held_factor(2.0, s) == 2.0 and held_factor(3.0, s) == 2.5
    # M(S) = held * W_S + in_flight / d * act_S: 4 samples in flight over 2 replicas, 80 bytes each
    assert whole.stages[0].predicted.memory_bytes == pytest.approx(4 * 1000 + 2 * 80)
    assert s.predicted.memory_bytes == pytest.approx(3 * 1000 + 2 * 80)
    assert order_memory(graph, cluster, s, s.schedule.order, sharded.stages) == s.predicted.memory_bytes
    # the step's own bytes with the overheads: its part's gradient (500) and Adam's scratch on it
    # beyond the released gradients: 500 + max(0, 3 * 500 - 1000); SGD: the part's gradient alone
    assert step_bytes(4.0, s, 1000, 600) == 1000 and step_bytes(2.0, s, 1000, 600) == 500
    assert step_bytes(4.0, whole.stages[0], 1000, 600) == 1800
    over = gs.cluster_from_dict({**CLUSTER, "memory_overheads": True})
    m_whole = order_memory(graph, over, whole.stages[0], ONE_F_ONE_B, whole.stages)
    m_sharded = order_memory(graph, over, s, ONE_F_ONE_B, sharded.stages)
    assert m_sharded < m_whole - 900  # 1000 bytes of state fewer; the step's scratch no larger


def test_validated_simulated_and_round_tripped():
    graph, cluster = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    plan = _plan(1)
    gs.validate(plan, graph, cluster)
    doc = gs.plan_to_dict(plan)
    assert doc["stages"][0]["zero"] == 1
    again = gs.plan_from_dict(json.loads(json.dumps(doc)))
    assert again.stages[0].zero == 1
    gs.validate(again, graph, cluster)
    assert "optimizer state sharded (ZeRO-1) on stage 0" in describe_plan(plan)
    assert "zero" not in gs.plan_to_dict(_plan(0))["stages"][0]


@pytest.mark.parametrize(
    ("value", "needle"), [(2, "ZeRO-2"), (True, "must be 0"), ("1", "must be 0"), (-1, "must be 0")]
)
def test_a_bad_zero_is_refused(value, needle):
    doc = gs.plan_to_dict(_plan(1))
    doc["stages"][0]["zero"] = value
    with pytest.raises(gs.InvalidInputError, match=needle):
        gs.plan_from_dict(doc)


def test_zero_on_a_stage_with_one_replica_is_refused():
    graph, cluster = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    plan = _plan(1)
    one = replace(plan.stages[0], devices=(0,), zero=1)
    with pytest.raises(InvalidPlanError, match="zero 1 shards the optimizer state"):
        gs.validate(replace(plan, stages=(one,)), graph, cluster)
