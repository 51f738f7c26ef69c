"""A node's optional ``workspace_bytes`` (an operator's measured transient memory): read, written and
refused like the other node fields, and priced by the memory model with ``memory_overheads``: in
the general rule as the larger of the temporaries without it and the largest operator's transient
plus the gradient flowing into it (never below the figure without it); for a stage that runs every
forward first, at the node where it occurs."""

from __future__ import annotations

import copy

import pytest
from three_node_stage import CLUSTER, DOC

import gpp_solver as gs
from gpp_solver.errors import InvalidGraphError


def _graph(**workspace):
    doc = copy.deepcopy(DOC)
    for nd in doc["nodes"]:
        if nd["id"] in workspace:
            nd["workspace_bytes"] = workspace[nd["id"]]
    return gs.graph_from_dict(doc)


def test_round_trip_and_absent():
    g = _graph(a=400, b=0)
    assert [n.workspace_bytes for n in g.nodes] == [400.0, 0.0, None]
    doc = gs.graph_to_dict(g)
    assert [nd.get("workspace_bytes", "absent") for nd in doc["nodes"]] == [400.0, 0.0, "absent"]
    assert gs.graph_from_dict(doc) == g
    assert "workspace_bytes" not in gs.graph_to_dict(gs.graph_from_dict(DOC))["nodes"][0]


@pytest.mark.parametrize(
    "bad,words",
    [(-1, "non-negative"), (float("nan"), "finite"), ("1kB", "number"), (True, "number"), (1e19, "range")],
)
def test_bad_values_are_refused_naming_the_node(bad, words):
    with pytest.raises(InvalidGraphError, match=rf"node 'b'\.workspace_bytes.*{words}"):
        _graph(b=bad)


def test_temporaries_with_and_without_the_field():
    """Nodes a, b, c (weights 100, 300, 0; activations 50, 20, 10; outputs 5), micro-batch 2, one
    replica, SGD (osf 2): today's temporaries are 300 + 2 * 2 * 5 = 320."""
    c = gs.cluster_from_dict(CLUSTER)
    spec = gs.StageSpec(nodes=("a", "b", "c"), devices=(0,), micro_batch_size=2)
    without = _graph()
    # no mini-batch given (a planner's check): the whole step, activations and temporaries together
    assert gs.cost.stage_memory(without, c, spec, 2) == pytest.approx(800 + 160 + 320)
    # a's transient of 400 bytes per sample: 2 * 400 + 2 * 5 = 810 > 320
    big = _graph(a=400, b=10, c=0)
    assert gs.cost.stage_memory(big, c, spec, 2) == pytest.approx(800 + 160 + 810)
    # small transients (2 * 10 + 2 * 5 = 30 < 320): today's figure, never less
    small = _graph(a=10, b=10, c=10)
    assert gs.cost.stage_memory(small, c, spec, 2) == pytest.approx(800 + 160 + 320)
    # two micro-batches, one in flight at a time (a forward follows a backward): a later backward at
    # its largest node, every gradient beside it: 800 + max(H_a, H_b, H_c) with H_k = 2 * (activations
    # of v_1 .. v_k + 5) + max(T_k, 2 * ws_k): 210, 460, 180 without the field
    assert gs.cost.stage_memory(without, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 460)
    # a's transient: H_a = 110 + 800 = 910
    assert gs.cost.stage_memory(big, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 910)
    # small transients: c's 2 * 10 = 20 > T_c = 10 (H_c = 190), the largest still b's 460
    assert gs.cost.stage_memory(small, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 460)
    # one micro-batch (every forward first, priced at each node of its backward, W = 400 beside):
    # at v_k 2 * (activations of v_1 .. v_k + 5) + T_k with T_k = max(weight_bytes_k + 2 * 5 per input
    # edge, 2 * ws_k) and the later nodes' weight gradients: a 210 + 300, b 460, c 180 without the field
    assert gs.cost.stage_memory(without, c, spec, 2, [spec], mini_batch_size=2) == pytest.approx(400 + 510)
    # a's transient 2 * 400 = 800 > T_a = 100, where b's gradients (300) are there: 110 + 800 + 300
    assert gs.cost.stage_memory(big, c, spec, 2, [spec], mini_batch_size=2) == pytest.approx(400 + 1210)
    # small transients: c's 2 * 10 = 20 > T_c = 10 (c's figure 190), the largest still a's 510
    assert gs.cost.stage_memory(small, c, spec, 2, [spec], mini_batch_size=2) == pytest.approx(400 + 510)


def test_the_model_without_overheads_ignores_the_field():
    c = gs.cluster_from_dict({**CLUSTER, "memory_overheads": False})
    spec = gs.StageSpec(nodes=("a", "b", "c"), devices=(0,), micro_batch_size=2)
    assert gs.cost.stage_memory(_graph(a=1e6), c, spec, 2) == gs.cost.stage_memory(_graph(), c, spec, 2)


def test_one_figure_per_size_is_read_and_interpolated():
    """``workspace_bytes`` as a list, one per micro-batch size: the totals are interpolated by the
    graph's rule (``docs/cost-model.md``, *Workspace at a micro-batch size*)."""
    from gpp_solver.cost.memory import workspace_at

    doc = copy.deepcopy(DOC)
    doc["micro_batch_sizes"] = [1, 64]
    for nd in doc["nodes"]:
        nd["fw_time"], nd["bw_time"] = [nd["fw_time"][0]] * 2, [nd["bw_time"][0]] * 2
    doc["nodes"][0]["workspace_bytes"] = [143488, 98498]
    g = gs.graph_from_dict(doc)
    assert g.nodes[0].workspace_bytes == (143488.0, 98498.0)
    assert gs.graph_to_dict(g)["nodes"][0]["workspace_bytes"] == [143488.0, 98498.0]
    a = g.nodes[0].id
    assert workspace_at(g, a, 1) == 143488
    assert workspace_at(g, a, 64) == 98498 * 64
    assert workspace_at(g, a, 2) == pytest.approx(143488 + (98498 * 64 - 143488) / 63)
    assert round(workspace_at(g, a, 2)) == 241272  # the worked example
    assert workspace_at(g, a, 0.5) == 143488  # below the smallest size: its total
    assert workspace_at(g, a, 128) == 98498 * 128  # above the largest: per sample
    assert workspace_at(g, g.nodes[1].id, 4) is None
    bad = copy.deepcopy(doc)
    bad["nodes"][0]["workspace_bytes"] = [1.0]
    with pytest.raises(InvalidGraphError, match="workspace_bytes has 1 entries"):
        gs.graph_from_dict(bad)
