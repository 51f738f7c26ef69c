"""``gpp_runtime.calibration.context``: on a CPU each node's forward is timed inside whole forwards."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from torch import nn

from gpp_runtime.calibration.context import forward_in_context, use_in_context_forward
from gpp_runtime.calibration.terms import profile_with_terms
from gpp_runtime.capture.fx_graph import trace_workload

NAP = 0.004


class Nap(nn.Module):
    """A leaf that sleeps ``NAP`` seconds in its forward: a node of known forward time."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(NAP)
        return x * 1.0


def _workload():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Nap(), nn.ReLU(), nn.Linear(8, 2))

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(batch_size, 8, generator=g),), torch.randn(batch_size, 2, generator=g)

    return SimpleNamespace(model=model, sample=sample, loss=lambda o, t: ((o - t) ** 2).sum(), leaf_modules=(Nap,))


def test_each_node_is_timed_where_it_runs():
    wl = _workload()
    mg = trace_workload(wl)
    ids = [gid for gid, _ in mg.groups]
    assert "1" in ids  # the sleeping leaf is one graph node
    saved = []
    times = forward_in_context(mg, wl.sample(4, 0)[0], 1, 5, lambda t: saved.append(t.shape) or t)
    assert set(times) == set(ids)
    for gid, (med, lo, hi) in times.items():
        assert 0 < lo <= med <= hi
        # the sleeping node takes its nap, and no other node is charged with it
        assert (med >= NAP) if gid == "1" else (med < NAP / 2), (gid, med)
    assert saved, "the forwards run with grad enabled, under the saved-tensor hook given"
    assert all(p.grad is None for p in wl.model.parameters())


def test_under_autocast_every_forward_casts_its_weights():
    """The trainer opens an autocast region per micro-batch's forward, so each forward casts the
    weights to bfloat16 again; so does each timed whole forward (before, the first run's casts
    were cached and the later, timed ones read them: the cast was left out of the times)."""
    wl = _workload()
    mg = trace_workload(wl)
    casts = []

    def pack(t):
        # a saved bf16 weight copy (or its transposed view) of a Linear whose input needs grad
        if t.dtype == torch.bfloat16 and t.grad_fn is not None and t.shape in {(8, 8), (2, 8), (8, 2)}:
            casts.append(t)  # kept alive, so no storage is reused for a later copy
        return t

    x = wl.sample(4, 0)[0][0].requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        forward_in_context(mg, (x,), 0, 3, pack)
    # two Linears a forward, three forwards: six copies, none shared between forwards
    assert len(casts) == 6
    assert len({t.untyped_storage().data_ptr() for t in casts}) == 6


def test_the_times_replace_the_forward_and_its_spread():
    nodes = [{"id": "a", "fw_time": [1.0, 2.0], "extra": {"time_spread": {"fw": [[0.5, 1.5]] * 2, "bw": [[1, 2]]}}}]
    use_in_context_forward(nodes, [{"a": (3e-4, 2e-4, 5e-4)}, {"a": (6e-4, 5e-4, 9e-4)}])
    assert nodes[0]["fw_time"] == [3e-4, 6e-4]
    assert nodes[0]["extra"]["time_spread"] == {"fw": [[2e-4, 5e-4], [5e-4, 9e-4]], "bw": [[1, 2]]}


def test_a_cpu_profile_takes_the_forward_in_context():
    wl = _workload()
    doc = profile_with_terms(wl, [1, 4], warmup=1, repeats=3, name="nap", in_situ=False)
    assert doc["extra"]["profile"]["forward_times"] == "in-context"
    nap = next(nd for nd in doc["nodes"] if nd["id"] == "1")
    assert all(t >= 0.9 * NAP for t in nap["fw_time"])  # less a per-node call cost, if any
    for nd in doc["nodes"]:  # each figure within its spread (shifted by the same call cost)
        assert all(lo <= t <= hi for t, (lo, hi) in zip(nd["fw_time"], nd["extra"]["time_spread"]["fw"]))
