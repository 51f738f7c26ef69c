"""A stage that recomputes its activations (``recompute``): docs/cost-model.md's worked example by
hand, the plan format, and what the validator and ``build_plan`` refuse."""

from __future__ import annotations

import pytest

import gpp_solver as gs
from gpp_solver.cost import memory
from gpp_solver.cost.memory import RANDOM_STATE_BYTES, order_memory
from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InvalidInputError, InvalidPlanError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate
from gpp_solver.plan.validate import validate
from gpp_solver.types import SearchInfo


def _node(name: str, fw: float, weights: float, activations: float) -> dict:
    """A node at micro-batch 2: forward ``fw`` seconds, backward twice that, 10 output bytes a sample."""
    return {
        "id": name,
        "fw_time": [fw],
        "bw_time": [2 * fw],
        "weight_bytes": weights,
        "activation_bytes": activations,
        "output_bytes": 10,
    }


GRAPH = {
    "format": "gpp-graph/1",
    "name": "recompute-chain",
    "micro_batch_sizes": [2],
    "nodes": [_node("a", 0.0, 0, 0), _node("b", 1e-3, 600, 50), _node("c", 2e-3, 400, 30)],
    "edges": [["a", "b"], ["b", "c"]],
}
CLUSTER = dict(
    format="gpp-cluster/1",
    devices=2,
    memory_bytes=1e6,
    inter_node_bandwidth=1e12,
    latency=0.0,
    optimizer_state_factor=4.0,
)
EVERY_FORWARD_FIRST = tuple([("F", j) for j in range(4)] + [("B", j) for j in range(4)])


def _plan(recompute: bool, cluster: dict = CLUSTER, schedule: str = "1f1b") -> gs.Plan:
    specs = [
        StageSpec(("a",), (0,), 2, order=EVERY_FORWARD_FIRST),
        StageSpec(("b", "c"), (1,), 2, order=EVERY_FORWARD_FIRST, recompute=recompute),
    ]
    return build_plan(
        gs.graph_from_dict(GRAPH),
        gs.cluster_from_dict(cluster),
        specs,
        8,
        planner="hand",
        search=SearchInfo(0.0, "feasible"),
        schedule=schedule,
    )


def test_the_worked_example():
    """docs/cost-model.md, *Recomputation*: C(S) 12 ms against 9, memory 4240 against 4640."""
    g, c = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    plain, again = _plan(False), _plan(True)
    assert [s.recompute for s in again.stages] == [False, True]
    costs = stage_costs(g, c, again.stages, 8)
    assert costs[1].compute_fw == pytest.approx(3e-3)
    assert costs[1].compute_bw == pytest.approx(9e-3)  # the forward again, then the backward
    assert costs[1].compute == pytest.approx(12e-3)
    assert stage_costs(g, c, plain.stages, 8)[1].compute == pytest.approx(9e-3)
    assert again.stages[1].in_flight_samples == 8
    assert order_memory(g, c, again.stages[1], EVERY_FORWARD_FIRST, again.stages) == pytest.approx(
        4 * 1000 + 8 * 10 + 2 * 80
    )
    assert plain.stages[1].predicted.memory_bytes == pytest.approx(4 * 1000 + 8 * 80)
    assert again.stages[1].predicted.memory_bytes == pytest.approx(4240)
    # the simulation: each of the stage's four backwards lasts 3 ms longer
    busy = {p: simulate(p, g, c).stages[1].busy for p in (plain, again)}
    assert busy[again] - busy[plain] == pytest.approx(4 * 3e-3)
    assert again.predicted.iteration_time > plain.predicted.iteration_time
    validate(again, g, c)  # its own figures are the model's


def test_with_the_runtime_overheads_a_micro_batch_waits_with_its_inputs_alone(monkeypatch):
    """With the overheads (SGD, so the optimizer step is no phase of its own): without the random
    state, the peak is the second backward, beside two micro-batches waiting, each holding its
    received values (20 bytes) and no activations (2 x 80 bytes without recomputation); the stage
    sends nothing. Each micro-batch also keeps its random state (``RANDOM_STATE_BYTES``) until its
    backward's recomputation ends."""
    sgd = {**CLUSTER, "memory_overheads": True, "optimizer_state_factor": 2.0}
    g, c = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(sgd)
    plain, again = _plan(False, sgd), _plan(True, sgd)
    validate(again, g, c)
    with_state = again.stages[1].predicted.memory_bytes
    monkeypatch.setattr(memory, "RANDOM_STATE_BYTES", 0)
    assert _plan(False, sgd).stages[1].predicted.memory_bytes == plain.stages[1].predicted.memory_bytes
    without_state = _plan(True, sgd).stages[1].predicted.memory_bytes
    assert plain.stages[1].predicted.memory_bytes - without_state == pytest.approx(2 * 2 * 80)
    # the peak's backward holds the states of the micro-batches not done: its own and 2 or 3 waiting
    assert 3 * RANDOM_STATE_BYTES <= with_state - without_state <= 4 * RANDOM_STATE_BYTES


def test_the_plan_format_keeps_the_flag():
    doc = gs.plan_to_dict(_plan(True))
    assert [s.get("recompute") for s in doc["stages"]] == [None, True]  # written only when true
    assert gs.plan_from_dict(doc).stages[1].recompute
    bad = {**doc, "stages": [doc["stages"][0], {**doc["stages"][1], "recompute": "yes"}]}
    with pytest.raises(InvalidPlanError, match=r"stage 1\.recompute must be true or false"):
        gs.plan_from_dict(bad)


def test_an_order_with_w_is_refused_for_a_stage_that_recomputes():
    g, c = gs.graph_from_dict(GRAPH), gs.cluster_from_dict(CLUSTER)
    doc = gs.plan_to_dict(_plan(True))
    order = [["F", j] for j in range(4)] + [x for j in range(4) for x in (["B", j], ["W", j])]
    doc["stages"][1]["schedule"]["order"] = order
    with pytest.raises(InvalidPlanError, match="stage 1: recompute with a split backward"):
        validate(gs.plan_from_dict(doc), g, c, check_predictions=False)
    with pytest.raises(InvalidInputError, match="recomputes"):
        _plan(True, schedule="zb")
    assert not any(a[0] == "W" for s in _plan(True, schedule="auto").stages for a in s.schedule.order)
