"""``gpp_runtime.profile`` records the time-model terms: op_overhead, the optimizer step, the loss,
the split backward's own cost."""

from __future__ import annotations

import torch

from gpp_runtime.calibration.terms import (
    graph_overhead,
    optimizer_seconds,
    profile_with_terms,
    remove_call_cost,
    whole_model_times,
)
from gpp_runtime.capture.fx_graph import load_workload
from gpp_runtime.capture.profiler import profile
from gpp_solver.cost import TimeTerms, stage_costs
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.plan.build import StageSpec
from gpp_solver.types import Cluster


def test_profile_records_overhead_optimizer_and_loss():
    torch.manual_seed(0)
    wl = load_workload("examples.sequential:workload")
    doc = profile_with_terms(wl, [1, 2], warmup=1, repeats=3, name="seq", in_situ=False)  # test_profile_insitu
    g = graph_from_dict(doc)  # the fields are the format's
    assert min(g.op_overhead) >= 0.0 and g.optimizer_time_per_byte > 0
    info = doc["extra"]["profile"]
    assert info["optimizer"]["name"] == "sgd" and info["optimizer"]["seconds"] > 0
    assert set(info["op_overhead_per_size"]) == {"fw", "bw"} and len(info["op_overhead_per_size"]["bw"]) == 2
    weight = sum(n.weight_bytes for n in g.nodes)
    assert abs(g.optimizer_time_per_byte * weight - info["optimizer"]["seconds"]) < 1e-12
    # the loss is added to the sink node (the node nothing reads), and only there
    sinks = [nd for nd in doc["nodes"] if not any(e["src"] == nd["id"] for e in doc["edges"])]
    assert len(sinks) == 1 and [nd["id"] for nd in doc["nodes"] if "loss_time" in nd["extra"]] == [sinks[0]["id"]]
    loss = sinks[0]["extra"]["loss_time"]
    assert all(t > 0 for t in loss["fw"] + loss["bw"])
    assert all(t >= x for t, x in zip(sinks[0]["fw_time"], loss["fw"]))
    for nd in doc["nodes"]:  # the weight gradient stays a part of the (shifted) backward
        assert all(0 <= w <= t for w, t in zip(nd["bw_weight_time"], nd["bw_time"]))
    for nd in doc["nodes"]:  # the recorded figure stays within its (shifted) spread
        for kind in ("fw", "bw"):
            assert all(lo <= t <= hi for t, (lo, hi) in zip(nd[f"{kind}_time"], nd["extra"]["time_spread"][kind]))
    # a one-stage plan's iteration is priced with the optimizer step after the last backward
    c = Cluster(devices=1, memory_bytes=1e12, inter_node_bandwidth=1e9)
    (cost,) = stage_costs(g, c, [StageSpec(g.ids, (0,), 2)], 2)
    assert cost.optimizer == TimeTerms.of(g, c, 2).optimizer(weight, 2) > 0
    # the split backward's own cost (docs/zero-bubble.md): measured per autograd node, per graph node here
    call, per_node, walk = g.split_backward_overhead
    split = info["split_backward_overhead"]
    assert call > 0 and per_node > 0 and walk > 0
    ratio = split["autograd_nodes_per_graph_node"]
    assert ratio >= 1.0  # every graph node of this model makes at least one autograd node
    assert per_node == split["per_autograd_node"]["node"] * ratio
    plain = profile(wl, [1, 2], warmup=1, repeats=3, name="seq")
    assert "op_overhead" not in plain and "optimizer_time_per_byte" not in plain
    assert "split_backward_overhead" not in plain
    assert not any("loss_time" in nd["extra"] for nd in plain["nodes"])


def test_optimizer_timing_leaves_the_model_as_it_was():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = [p.detach().clone() for p in model.parameters()]
    for name in ("sgd", "adam"):
        assert optimizer_seconds(model, name, 1, 3, torch.device("cpu")) > 0
    assert all(torch.equal(a, p) and p.grad is None for a, p in zip(before, model.parameters()))
    assert optimizer_seconds(torch.nn.ReLU(), "sgd", 1, 3, torch.device("cpu")) == 0.0


def test_whole_model_times_and_overhead_rules():
    model = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
    fw, bw = whole_model_times(model, (torch.randn(4, 8),), 1, 3, torch.device("cpu"))
    assert fw > 0 and bw > 0 and all(p.grad is None for p in model.parameters())
    nodes = [{"fw_time": [1e-4, 2e-4], "bw_time": [3e-5, 1e-4]}, {"fw_time": [1e-4, 2e-4], "bw_time": [5e-5, 2e-4]}]
    nodes[1]["extra"] = {"time_spread": {"bw": [[4e-5, 6e-5], [1e-4, 3e-4]]}}
    remove_call_cost(nodes, "bw", [-4e-5, 1e-5])  # negative at size 0: off every node, never below 0
    assert [nd["bw_time"] for nd in nodes] == [[0.0, 1e-4], [5e-5 - 4e-5, 2e-4]]
    assert nodes[1]["extra"]["time_spread"]["bw"] == [[0.0, 6e-5 - 4e-5], [1e-4, 3e-4]]
    assert graph_overhead([-1e-5, 2e-5, 4e-5], [1e-6, -3e-6]) == {"fw": 2e-5, "bw": 0.5e-6}
    # a measured weight-gradient time pays the same call cost and stays within the backward
    split = [{"bw_time": [6e-5, 1e-4], "bw_weight_time": [5e-5, 3e-5]}, {"bw_time": [3e-5], "bw_weight_time": [0.0]}]
    remove_call_cost(split, "bw", [-2e-5, 0.0])
    assert split[0]["bw_time"] == [6e-5 - 2e-5, 1e-4] and split[0]["bw_weight_time"] == [5e-5 - 2e-5, 3e-5]
    assert split[1]["bw_weight_time"] == [0.0]
    tight = [{"bw_time": [1e-5], "bw_weight_time": [1e-5]}]  # never below 0
    remove_call_cost(tight, "bw", [-2e-5])
    assert tight[0]["bw_time"] == tight[0]["bw_weight_time"] == [0.0]
    fw_only = [{"fw_time": [3e-5], "bw_time": [3e-5], "bw_weight_time": [3e-5]}]
    remove_call_cost(fw_only, "fw", [-1e-5])
    assert fw_only[0]["bw_weight_time"] == [3e-5]


def test_a_loss_that_fails_is_named():
    from types import SimpleNamespace

    import pytest

    from gpp_solver.errors import InvalidInputError

    wl = load_workload("examples.sequential:workload")

    def bad_loss(out, target):
        raise ValueError("shapes differ")

    with pytest.raises(InvalidInputError, match="loss fails on the model's output at 1 samples .*shapes differ"):
        profile_with_terms(SimpleNamespace(model=wl.model, sample=wl.sample, loss=bad_loss), [1], warmup=0, repeats=1)
