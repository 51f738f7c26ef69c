"""The split backward's own cost as ``gpp_runtime.calibration.split_cost`` measures it, against the
runtime's split itself (docs/zero-bubble.md): the priced ``W`` of a chain grows with its parameter
groups times the nodes below them, as the measured one does."""

from __future__ import annotations

import time

import pytest
import torch

from gpp_runtime.calibration.split_cost import autograd_nodes, per_autograd_node
from gpp_runtime.engine.split_backward import backward_input, backward_weight


def test_autograd_nodes_counts_the_graph_a_backward_reaches():
    lin = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    out = torch.tanh(lin(x))
    # TanhBackward, AddmmBackward, TBackward, and the accumulators of x, weight and bias
    assert autograd_nodes([out]) == 6
    assert autograd_nodes([x]) == 0  # a leaf: nothing to walk


def _w_seconds(depth: int, repeats: int = 15) -> float:
    """The fastest ``W`` of a micro-batch through a chain of ``depth`` Linear + Tanh blocks that
    received its input from another stage (every Linear a parameter group)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[m for _ in range(depth) for m in (torch.nn.Linear(4, 4), torch.nn.Tanh())])
    params = list(model.parameters())
    best = float("inf")
    for _ in range(repeats):
        x = torch.randn(2, 4, requires_grad=True)
        out = model(x)
        _, pending = backward_input([out], [torch.ones_like(out)], [x], params)
        t0 = time.perf_counter()
        backward_weight(pending)
        best = min(best, time.perf_counter() - t0)
    return best


@pytest.mark.slow  # timings: run alone (benchmarks' habit), not beside the suite
def test_the_priced_weight_gradient_follows_the_measured_one():
    """Each Linear of a chain is one W call walking the blocks below it (5 autograd nodes a block:
    tanh, addmm, the transpose, two accumulators; its own 4 and the input's accumulator): the
    measured W of 8 and 32 blocks, against the fitted figures, agree within a factor of 2."""
    per = per_autograd_node(repeats=10)
    assert per["call"] > 0 and per["node"] > 0 and per["walk"] > 0
    for depth in (8, 32):
        priced = sum(per["call"] + per["node"] * (5 * i + 5) for i in range(depth))
        measured = _w_seconds(depth)
        assert 0.5 < measured / priced < 2.0, (depth, measured, priced)
