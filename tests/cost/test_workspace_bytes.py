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
    # two micro-batches, one in flight at a time (a forward follows a backward): the whole step
    assert gs.cost.stage_memory(without, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 160 + 320)
    # a's transient of 400 bytes per sample: 2 * 400 + 2 * 5 = 810 > 320
    big = _graph(a=400, b=10, c=0)
    assert gs.cost.stage_memory(big, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 160 + 810)
    # small transients (2 * 10 + 2 * 5 = 30 < 320): today's figure, never less
    small = _graph(a=10, b=10, c=10)
    assert gs.cost.stage_memory(small, c, spec, 2, [spec], mini_batch_size=4) == pytest.approx(800 + 160 + 320)
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
