"""What the profiler makes of code people write: unsendable values inside graph nodes, optional
arguments, in-place operators, BatchNorm, and models fx cannot trace (no torchrun here)."""

from __future__ import annotations

from types import SimpleNamespace

import networkx as nx
import pytest
import torch
from torch import nn

from gpp_runtime.capture.fx_graph import input_derived, load_workload, propagate, trace_workload
from gpp_runtime.capture.profiler import profile
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.graph import graph_from_dict


class Quirky(nn.Module):
    """A tuple output, shape arithmetic, an assert, in-place ops and an optional argument."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, d = x.shape
        torch._assert(d == 8, "width 8")
        out, _ = self.attn(x, x, x)
        h = self.act(self.fc(out))
        h = torch.nn.functional.relu(h, inplace=True)
        h += out
        if mask is not None:
            h = h * mask
        return self.head(h.reshape(b * s, h.size(-1))).reshape(b, s * 3)


def _workload(model: nn.Module):
    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(batch_size, 4, 8, generator=g),), torch.randn(batch_size, 12, generator=g)

    return SimpleNamespace(model=model, sample=sample, loss=lambda o, t: ((o - t) ** 2).sum())


def test_unsendable_values_stay_inside_graph_nodes():
    wl = _workload(Quirky())
    mg = trace_workload(wl)
    assert [p.name for p in mg.placeholders] == ["x"]  # the optional mask is not an input
    env = propagate(mg, wl.sample(2, 0)[0])
    derived = input_derived(mg.gm)  # x.shape and its unpacking: recomputed by any stage
    assert {mg.ids[n] for n in derived} >= {"getattr_1", "getitem", "getitem_1", "getitem_2"}
    for n in mg.nodes:  # no other value that is not a tensor is read across two graph nodes
        if not isinstance(env[n], torch.Tensor) and n not in derived:
            assert all(mg.group[u] == mg.group[n] for u in n.users if u in mg.group), mg.ids[n]
    by_id = {mg.ids[n]: n for n in mg.nodes}
    assert mg.group[by_id["size"]] == mg.group[by_id["reshape"]]  # h.size(-1) of an activation
    # h.reshape(b * s, -1) has no leading batch dimension: it stays with the head that reads it
    assert mg.group[by_id["reshape"]] == mg.group[by_id["head"]]
    groups = dict(mg.groups)
    assert [mg.ids[n] for n in groups["attn"]] == ["attn", "getitem_3", "getitem_4"]
    # x.shape, its unpacking and the _assert end up in the graph nodes that use them
    assert len(mg.groups) < len(mg.nodes)
    doc = profile(wl, [1, 2], warmup=0, repeats=1)
    graph = graph_from_dict(doc)  # the project's reader accepts it: connected, acyclic
    g = nx.DiGraph([(e["src"], e["dst"]) for e in doc["edges"]])
    assert set(g.nodes) == {n["id"] for n in doc["nodes"]} and nx.is_weakly_connected(g)
    assert len(graph.nodes) == len(mg.groups)
    merged = [n for n in doc["nodes"] if "fx_nodes" in n.get("extra", {})]
    assert merged and all(len(n["extra"]["fx_nodes"]) > 1 for n in merged)


def test_profile_runs_in_place_operators_on_fresh_inputs():
    wl = _workload(Quirky())
    before = {k: v.clone() for k, v in wl.model.state_dict().items()}
    doc = profile(wl, [2], warmup=1, repeats=2)
    by = {n["id"]: n for n in doc["nodes"]}
    assert by["act"]["bw_time"][0] > 0  # ReLU(inplace=True) was differentiated
    for k, v in wl.model.state_dict().items():
        assert torch.equal(v, before[k]), k


class FunctionalTied(nn.Module):
    """A parameter read by two functional ops (an embedding lookup and a head's matmul, as the
    exported GPT-2 reads its tied weight)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Parameter(torch.randn(11, 8))
        self.mid = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.mid(nn.functional.embedding(idx, self.wte)))
        h = h * self.scale + torch.tanh(h)
        return nn.functional.linear(h, self.wte).flatten(1)


def test_tied_parameter_is_shared_not_merged():
    wl = _workload(FunctionalTied())
    wl.sample = lambda b, s: ((torch.randint(0, 11, (b, 4)),), torch.randn(b, 44))
    mg = trace_workload(wl)
    by_id = {mg.ids[n]: n for n in mg.nodes}
    wte = [a for a in mg.gm.graph.nodes if a.op == "get_attr" and a.target == "wte"]
    assert len(wte) == 1 and {u.name for u in wte[0].users} == {"embedding", "linear"}
    # the two readers of wte stay apart: a plan may cut between them
    assert mg.group[by_id["embedding"]] != mg.group[by_id["linear"]]
    doc = profile(wl, [1, 2], warmup=0, repeats=1)
    graph_from_dict(doc)
    by = {n["id"]: n for n in doc["nodes"]}
    assert by["embedding"]["weight_bytes"] == by["linear"]["weight_bytes"] == 11 * 8 * 4
    # no edge stands for the shared weight: the head reads only the activations before it
    assert [e["src"] for e in doc["edges"] if e["dst"] == "linear"] == [mg.group[by_id["add"]]]


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.fc(x)
        return x


def test_untraceable_model_names_the_construct_and_line():
    with pytest.raises(InvalidInputError) as err:
        trace_workload(_workload(DataDependent()))
    msg = str(err.value)
    assert "data-dependent control flow" in msg
    assert "test_real_models_graph.py" in msg and "`if x.sum() > 0:`" in msg
    assert "leaf_modules" in msg and "\n" not in msg


def test_leaf_modules_hook_keeps_a_block_whole():
    wl = _workload(DataDependent())
    wrapper = nn.Sequential(nn.Linear(8, 4), DataDependent(), nn.Linear(4, 12))
    wl.model = wrapper
    wl.sample = lambda b, s: ((torch.randn(b, 8),), torch.randn(b, 12))
    wl.leaf_modules = (DataDependent,)
    mg = trace_workload(wl)
    assert [g for g, _ in mg.groups] == ["0", "1", "2"]


def test_batchnorm_size_refused_and_warned(caplog):
    wl = load_workload("examples.real_models:googlenet_bn")
    with caplog.at_level("WARNING"):
        with pytest.raises(InvalidInputError, match=r"micro-batch of 1 .* node '.*bn'.*--micro-batch-sizes at 2"):
            profile(wl, [1, 2], warmup=0, repeats=1)
    assert "statistics are computed per micro-batch" in caplog.text


@pytest.mark.slow
def test_googlenet_profiles_as_shipped(caplog):
    wl = load_workload("examples.real_models:googlenet_bn")
    with caplog.at_level("WARNING"):
        doc = profile(wl, [2], warmup=0, repeats=1)  # as shipped: in-place ReLUs, trainable BN
    assert "statistics are computed per micro-batch" in caplog.text
    assert len(doc["nodes"]) > 150 and graph_from_dict(doc)
