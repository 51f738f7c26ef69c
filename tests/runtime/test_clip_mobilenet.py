"""Two more models the project did not write, end to end (profile -> a two-stage pipeline of the
profiled graph -> torchrun with ``--verify`` against one process): torchvision's
``mobilenet_v3_small`` and a HuggingFace ``CLIPModel`` from a tiny random config (text and vision
towers, traced with ``torch.export``)."""

from __future__ import annotations

import json

import pytest
from test_real_models import _train_verify

from gpp_runtime.calibration.terms import profile_with_terms
from gpp_runtime.capture.fx_graph import load_workload
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import save_plan
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import Cluster, SearchInfo


def _profile(tmp_path, fn: str) -> dict:
    """The profile with the time-model terms, as the command line writes it."""
    doc = profile_with_terms(load_workload(f"examples.real_models:{fn}"), [2, 4], warmup=0, repeats=1, name=fn)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    return doc


def _two_stages(tmp_path, doc: dict, batch: int) -> dict:
    """A 1F1B pipeline of two stages, the graph cut in the middle of its topological order (a
    prefix of a topological order is a convex stage), micro-batch 2, one device each."""
    g = graph_from_dict(doc)
    order = list(g.topo_order)
    half = len(order) // 2
    plan = build_plan(
        g,
        Cluster(devices=2, memory_bytes=1e15, inter_node_bandwidth=1e9),
        [StageSpec(tuple(order[:half]), (0,), 2), StageSpec(tuple(order[half:]), (1,), 2)],
        batch,
        planner="manual",
        search=SearchInfo(0.0, "feasible"),
    )
    assert [len(s.nodes) for s in plan.stages] == [half, len(order) - half] and len(plan.stages) == 2
    save_plan(plan, tmp_path / "plan.json")
    return {"stages": [{"devices": list(s.devices)} for s in plan.stages]}


@pytest.mark.slow  # about 17 s; CLIP's two towers stay in the default run
def test_mobilenet_v3_small_as_shipped(tmp_path):
    doc = _profile(tmp_path, "mobilenet_v3_small")
    assert len(doc["nodes"]) > 100 and doc["optimizer_time_per_byte"] > 0
    _train_verify(tmp_path, "mobilenet_v3_small", _two_stages(tmp_path, doc, 4))


def test_clip_two_towers(tmp_path):
    doc = _profile(tmp_path, "clip_tiny")
    assert len(doc["nodes"]) > 50 and "op_overhead" in doc
    assert len([n for n in doc["nodes"] if "loss_time" in n["extra"]]) == 1
    _train_verify(tmp_path, "clip_tiny", _two_stages(tmp_path, doc, 4))
