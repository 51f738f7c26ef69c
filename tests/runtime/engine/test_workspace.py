"""Operators' workspace (``gpp_runtime.capture.workspace``): the profiler's ``workspace_bytes`` covers the
convolutions' transients measured on their own, and with it the two-tower model's two-stage plan
(image tower | text tower, fusion and head) meets the memory targets on every rank."""

from __future__ import annotations

import json

import torch
from runtime_plans import write_cluster
from test_memory_measured import _assert_targets, _train_ranks

from gpp_runtime.capture.fx_graph import load_workload
from gpp_runtime.capture.profiler import profile
from gpp_runtime.engine.memory import MemoryMeter
from gpp_solver import cluster_from_dict, graph_from_dict, save_plan, validate
from gpp_solver.action import parse_order
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo

SPEC = "examples.real_models:two_tower"
B = 32
IMAGE = ["image.0", "image.1", "image.2", "image.3", "flatten", "transpose"]


def _peak(fn) -> int:
    """The peak of live CPU allocations during ``fn()`` above those live at its start (the runtime's
    meter, nothing resident); ``fn``'s result stays alive until the window closes."""
    meter = MemoryMeter(torch.device("cpu"), first=0, steps=1)
    meter.step_starts(0, list)
    kept = fn()
    meter.close()
    del kept
    return meter.peak


def test_profiler_records_the_convolutions_transients():
    """The image tower's convolutions at a micro-batch of 32: the first one's forward transient
    (above its output) and the second one's backward peak (its input's gradient, its weight
    gradient and the backward's workspace), each measured alone by the runtime's meter."""
    workload = load_workload(SPEC)
    doc = profile(workload, [B], warmup=0, repeats=1, name=SPEC)
    assert all(len(nd["workspace_bytes"]) == 1 for nd in doc["nodes"])  # one figure per profiled size
    ws = {nd["id"]: nd["workspace_bytes"][0] * B for nd in doc["nodes"]}
    out = {nd["id"]: nd["output_bytes"] * B for nd in doc["nodes"]}
    conv1, relu, conv2 = workload.model.image[:3]
    _, image = workload.sample(B, 0)[0]
    first = _peak(lambda: conv1(image))
    assert first - out["image.0"] > 0  # a transient beyond the output it keeps
    assert ws["image.0"] >= first - out["image.0"]
    x = relu(conv1(image))
    y = conv2(x)
    grad = torch.ones_like(y)  # the gradient flowing in exists before the backward
    second = _peak(lambda: torch.autograd.grad(y, [x, *conv2.parameters()], grad))
    assert second > x.numel() * x.element_size()  # more than the input's gradient it produces
    assert ws["image.2"] >= second
    assert 0 <= ws["flatten"] <= out["image.3"]  # a view: nothing beyond its output


def test_two_tower_two_stages_within_targets(tmp_path):
    """The image tower on rank 0, the rest on rank 1, one micro-batch of 32 (SGD): measured within
    the targets of the prediction that prices the operators' workspace; the prediction without it
    (the field removed) falls short on the image tower's rank."""
    doc = profile(load_workload(SPEC), [B], warmup=0, repeats=1, name=SPEC)
    (tmp_path / "graph.json").write_text(json.dumps(doc))
    cdoc = write_cluster(tmp_path, 2, 2.0)
    graph, cluster = graph_from_dict(doc), cluster_from_dict(cdoc)
    rest = tuple(v for v in graph.ids if v not in IMAGE)
    order = parse_order("F0 B0")
    specs = [StageSpec(tuple(IMAGE), (0,), B, order=order), StageSpec(rest, (1,), B, order=order)]
    plan = build_plan(graph, cluster, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"))
    validate(plan, graph, cluster)
    assert len(plan.stages) == 2 and plan.devices_used == 2  # the shape, before training
    assert [s.micro_batch_size for s in plan.stages] == [B, B] and plan.stages[0].nodes == tuple(IMAGE)
    bare = graph_from_dict(
        {**doc, "nodes": [{k: v for k, v in n.items() if k != "workspace_bytes"} for n in doc["nodes"]]}
    )
    without = build_plan(bare, cluster, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"))
    save_plan(plan, tmp_path / "plan.json")
    ranks = _train_ranks(tmp_path, SPEC, plan, tmp_path / "graph.json", tmp_path / "cluster.json", "sgd")
    _assert_targets(ranks)
    measured = next(r["peak_memory_bytes"] for r in ranks if r["stage"] == 0)
    assert measured > 1.05 * without.stages[0].predicted.memory_bytes  # the workspace is real
