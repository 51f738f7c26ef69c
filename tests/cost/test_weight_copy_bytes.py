"""A node's optional ``weight_copy_bytes`` (the low-precision weight copies autocast makes in each
micro-batch's forward and saves for its backward): read, written and refused like the other node
fields, and priced with ``memory_overheads`` once per micro-batch in flight (not per sample), in
every phase of the memory rule; the model without overheads does not read it."""

from __future__ import annotations

import copy

import pytest
from three_node_stage import CLUSTER, DOC

import gpp_solver as gs
from gpp_solver.errors import InvalidGraphError

SPEC = gs.StageSpec(nodes=("a", "b", "c"), devices=(0,), micro_batch_size=2)


def _graph(**copies):
    doc = copy.deepcopy(DOC)
    for nd in doc["nodes"]:
        if nd["id"] in copies:
            nd["weight_copy_bytes"] = copies[nd["id"]]
    return gs.graph_from_dict(doc)


def test_round_trip_and_absent():
    g = _graph(b=150)
    assert [n.weight_copy_bytes for n in g.nodes] == [0.0, 150.0, 0.0]
    doc = gs.graph_to_dict(g)
    assert [nd.get("weight_copy_bytes", "absent") for nd in doc["nodes"]] == ["absent", 150.0, "absent"]
    assert gs.graph_from_dict(doc) == g


@pytest.mark.parametrize(
    "bad,words",
    [(-1, "non-negative"), (float("nan"), "finite"), ("1kB", "number"), (True, "number"), (1e19, "range")],
)
def test_bad_values_are_refused_naming_the_node(bad, words):
    with pytest.raises(InvalidGraphError, match=rf"node 'b'\.weight_copy_bytes.*{words}"):
        _graph(b=bad)


def test_copies_are_held_once_per_micro_batch_in_flight():
    """b's weights (300 bytes) cast to half precision: 150 bytes a micro-batch, whatever its rows.
    Micro-batch 2, SGD, one replica (``tests/three_node_stage.py``)."""
    c = gs.cluster_from_dict(CLUSTER)
    plain, cast = _graph(), _graph(b=150)
    # no order (a planner's check): in_flight / b micro-batches, each its copies
    assert gs.cost.stage_memory(cast, c, SPEC, 2) == gs.cost.stage_memory(plain, c, SPEC, 2) + 150
    assert gs.cost.stage_memory(cast, c, SPEC, 4) == gs.cost.stage_memory(plain, c, SPEC, 4) + 2 * 150
    # forwards and backwards interleaved (2 of a step's 4 micro-batches in flight): the waiting
    # micro-batch's copies, and the backward's own at b, its largest node (2 * (50 + 20 + 5) + 310)
    assert gs.cost.stage_memory(cast, c, SPEC, 4, [SPEC], mini_batch_size=8) == pytest.approx(
        gs.cost.stage_memory(plain, c, SPEC, 4, [SPEC], mini_batch_size=8) + 2 * 150
    )
    # every forward first, one micro-batch: its backward at b holds the copies (460 + 150 = 610,
    # above a's 510); at c, after b's backward freed them, nothing more
    assert gs.cost.stage_memory(plain, c, SPEC, 2, [SPEC], mini_batch_size=2) == pytest.approx(400 + 510)
    assert gs.cost.stage_memory(cast, c, SPEC, 2, [SPEC], mini_batch_size=2) == pytest.approx(400 + 610)


def test_copies_split_nothing_across_replicas():
    """Two replicas: each runs its half of a micro-batch's rows and casts the weights itself, so
    each holds a whole set of copies per micro-batch in flight."""
    c = gs.cluster_from_dict({**CLUSTER, "devices": 2})
    spec = gs.StageSpec(nodes=("a", "b", "c"), devices=(0, 1), micro_batch_size=2)
    diff = gs.cost.stage_memory(_graph(b=150), c, spec, 4) - gs.cost.stage_memory(_graph(), c, spec, 4)
    assert diff == pytest.approx(2 * 150)


def test_the_model_without_overheads_ignores_the_field():
    c = gs.cluster_from_dict({**CLUSTER, "memory_overheads": False})
    assert gs.cost.stage_memory(_graph(b=1e6), c, SPEC, 2) == gs.cost.stage_memory(_graph(), c, SPEC, 2)
