"""A traced stage module moved to another device: the devices torch.export baked into its graph and
fx's tensor constants move too (gpp_runtime.capture.device_move). Checked on the ``meta`` device,
which the CPU build has: a call mixing devices fails there as it does on a GPU."""

import pytest
import torch
import torch.fx as fx

from gpp_runtime.capture.device_move import move_module
from gpp_runtime.capture.fx_graph import load_workload, trace_workload

pytestmark = pytest.mark.filterwarnings("ignore")


def _devices_in(gm: fx.GraphModule) -> set:
    found = set()

    def walk(v):
        if isinstance(v, torch.device):
            found.add(v.type)
        elif isinstance(v, (tuple, list)):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)

    for n in gm.graph.nodes:
        walk(n.args)
        walk(n.kwargs)
    return found


def test_exported_clip_graph_runs_on_the_device_it_is_moved_to():
    wl = load_workload("examples.real_models:clip_tiny")
    gm = trace_workload(wl).gm
    assert "cpu" in _devices_in(gm)  # torch.export baked the tracing device in (the case fixed)
    inputs, _ = wl.sample(3, 0)
    meta = tuple(x.to("meta") for x in inputs)
    with pytest.raises(Exception):  # noqa: B017 - moved as nn.Module.to moves it: the graph still says cpu
        gm.to("meta")(*meta)
    moved = move_module(gm, "meta")
    assert _devices_in(moved) == {"meta"}
    out = moved(*meta)
    assert out.device.type == "meta" and out.shape[0] == 3


def test_fx_tensor_constants_move_and_cpu_is_left_alone():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) + torch.tensor([1.0, 2.0, 3.0, 4.0])  # a constant fx keeps as an attribute

    gm = fx.symbolic_trace(M())
    consts = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    assert consts and all(getattr(gm, c).device.type == "cpu" for c in consts)
    x = torch.randn(2, 4)
    want = gm(x)
    assert move_module(gm, "cpu") is gm and torch.equal(gm(x), want)
    moved = move_module(gm, "meta")
    assert all(getattr(moved, c).device.type == "meta" for c in consts)
    assert moved(x.to("meta")).device.type == "meta"
