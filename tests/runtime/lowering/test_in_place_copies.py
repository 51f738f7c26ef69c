"""Which received values a stage copies before an in-place operator may modify them
(``gpp_runtime.lowering.fx_split.modified_in_place``), and that a received piece the executor frees
once copied still gets its gradient."""

from __future__ import annotations

import torch
import torch.nn as nn

from gpp_runtime.capture.fx_graph import trace
from gpp_runtime.lowering.fx_split import modified_in_place


class Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)
        self.lin2 = nn.Linear(4, 4)

    def forward(self, x):
        a = self.lin(x)  # received by the second stage
        b = self.act(a)  # in place on it: copy
        c = self.lin2(b)  # a new tensor
        d = torch.relu_(c)  # in place on a tensor the stage made: nothing received is modified
        e = a.view(-1, 4)  # (a view of a received value)
        e.add_(d)  # in place on the view: copy
        f = self.lin2(d)
        f.add_(a)  # `a` is the second operand, not modified
        return e + f


def _graph():
    return trace(Blocks(), (torch.randn(2, 4),))


def test_in_place_on_a_received_value_or_a_view_of_it_needs_a_copy():
    mg = _graph()
    by = {mg.ids[n]: n for n in mg.nodes}
    local = set(mg.nodes)
    assert modified_in_place(mg, by["lin"], local)  # ReLU(inplace=True) on it, and `e += d` on a view
    # without the ReLU and the view's `add_`: only `f += a` reads it, as the operand that is not modified
    keep = {n for n in mg.nodes if mg.ids[n] not in {"act", "add_", "view"}}
    assert not modified_in_place(mg, by["lin"], keep)
    # past a layer with weights, the in-place ReLU on its output modifies a new tensor
    assert not modified_in_place(mg, by["act"], {by["lin2"], by["relu_"]})
    assert modified_in_place(mg, by["lin2"], {by["relu_"]})


def test_a_freed_received_piece_still_receives_its_gradient():
    """``executor._free``: the received leaf's memory is released after the copy; the backward
    still gives the leaf its gradient (shape, not data, is what it needs)."""
    from gpp_runtime.engine.executor import _free

    leaf = torch.randn(3, 4, requires_grad=True)
    copy = leaf.clone()
    _free([leaf])
    assert leaf.untyped_storage().nbytes() == 0
    torch.relu_(copy)
    (copy * 2.0).sum().backward()
    assert leaf.grad is not None and leaf.grad.shape == (3, 4)
    assert torch.equal(leaf.grad, 2.0 * (copy > 0).to(leaf.grad.dtype))
