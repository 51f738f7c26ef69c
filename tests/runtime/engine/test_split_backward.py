"""gpp_runtime.engine.split_backward: B computes the input gradients, W the weight gradients from the
gradients B kept at the weight nodes; together they equal one full backward and no operator's
input-gradient part runs twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpp_runtime.engine.split_backward import backward_input, backward_weight, phase


class Count(torch.autograd.Function):
    """Identity whose backward records the phase it runs in."""

    calls: list[str] = []

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        Count.calls.append(phase())
        return g


class Chain(nn.Module):
    """Linear, GELU, the counted identity, Linear: the counted operator lies between the root and
    the first Linear's weight."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.b(Count.apply(nn.functional.gelu(self.a(x))))


class Branches(nn.Module):
    """A weight used twice with operators between its uses, an unused parameter, a path with no
    weights (x * 2 into the add), a parameter-only second output and a weight shared by two branches."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(5, 5)
        self.left, self.right = nn.Linear(5, 4), nn.Linear(5, 4)
        self.unused = nn.Parameter(torch.randn(3))
        self.scale = nn.Parameter(torch.randn(4))
        self.bias_only = nn.Parameter(torch.randn(2))

    def forward(self, x, y):
        h = self.shared(torch.tanh(self.shared(x)))  # the same weight twice, tanh between
        out = self.left(h) * self.scale + self.right(torch.relu(h)) + (y * 2).sum(-1, keepdim=True)
        return out, self.bias_only.exp() * self.scale.sum()  # the second output depends on no input


def _inputs(seed: int, rows: int = 4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 5, generator=g).requires_grad_(True)
    y = torch.randn(rows, 4, generator=g).requires_grad_(True)
    gouts = [torch.randn(rows, 4, generator=g), torch.randn(2, generator=g)]
    return [x, y], gouts


def _full(model, batches):
    """Plain backward per micro-batch: the inputs' gradients and the parameters' accumulated ones."""
    model.zero_grad(set_to_none=True)
    got = []
    for inputs, gouts in batches:
        torch.autograd.backward(list(model(*inputs)), gouts)
        got.append([t.grad for t in inputs])
    return got, {n: p.grad for n, p in model.named_parameters()}


def _split(model, batches, order):
    """B and W in ``order`` (``("B", j)`` / ``("W", j)``) as the executor runs them; each W
    accumulates every parameter it reaches once (what the data-parallel hooks rely on)."""
    model.zero_grad(set_to_none=True)
    params = [p for p in model.parameters() if p.requires_grad]
    got, pending, seen = {}, {}, []
    hooks = [p.register_post_accumulate_grad_hook(lambda p: seen.append(id(p))) for p in params]
    for kind, j in order:
        inputs, gouts = batches[j]
        if kind == "B":
            got[j], pending[j] = backward_input(list(model(*inputs)), gouts, inputs, params)
        else:
            seen.clear()
            backward_weight(pending.pop(j))
            assert sorted(seen) == sorted(id(p) for p in params if p is not model.unused)
    for h in hooks:
        h.remove()
    return [got[j] for j in range(len(batches))], {n: p.grad for n, p in model.named_parameters()}


def _fresh(batches):
    return [([t.detach().clone().requires_grad_(True) for t in ins], g) for ins, g in batches]


def test_input_gradient_of_an_operator_between_root_and_weights_runs_once():
    torch.manual_seed(0)
    model = Chain()
    x = torch.randn(4, 6, requires_grad=True)
    params = list(model.parameters())
    Count.calls = []
    out = model(x)
    (gx,), pending = backward_input([out], [torch.ones_like(out)], [x], params)
    assert Count.calls == ["input"] and model.a.weight.grad is None  # B: no weight gradient yet
    backward_weight(pending)
    assert Count.calls == ["input"]  # W started at the Linears' weight nodes: the identity did not run again
    assert all(p.grad is not None for p in params)
    Count.calls = []
    x2 = x.detach().clone().requires_grad_(True)
    ref = Chain()
    ref.load_state_dict(model.state_dict())
    ref(x2).backward(torch.ones(4, 3))
    assert Count.calls == ["full"]
    assert torch.equal(gx, x2.grad)
    for (n, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad), n


@pytest.mark.parametrize(
    "order",
    [
        [("B", 0), ("W", 0), ("B", 1), ("W", 1)],
        [("B", 0), ("B", 1), ("W", 0), ("B", 2), ("W", 1), ("W", 2)],
    ],
)
def test_split_equals_full_backward_on_branches(order):
    torch.manual_seed(1)
    model = Branches()
    n = 1 + max(j for _, j in order)
    batches = [_inputs(seed) for seed in range(n)]
    want_in, want_p = _full(model, _fresh(batches))
    got_in, got_p = _split(model, _fresh(batches), order)
    for w, g in zip(want_in, got_in):
        assert all(torch.equal(a, b) for a, b in zip(w, g))
    assert want_p["unused"] is None and got_p["unused"] is None
    assert set(want_p) == set(got_p)
    for name, w in want_p.items():
        if w is not None:
            assert got_p[name] is not None and torch.equal(w, got_p[name]), name


def test_stage_whose_inputs_need_no_gradient_gets_its_weights_in_w():
    torch.manual_seed(2)
    model = Chain()
    x = torch.randn(4, 6)  # the first stage's data: no gradient
    out = model(x)
    got, pending = backward_input([out], [torch.ones_like(out)], [], list(model.parameters()))
    assert got == [] and model.a.weight.grad is None
    backward_weight(pending)
    ref = Chain()
    ref.load_state_dict(model.state_dict())
    ref(x).backward(torch.ones(4, 3))
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_emulated_operators_sleep_input_share_in_b_and_weight_share_in_w():
    """The ``phase()`` protocol of gpp_runtime.emulate: each operator sleeps ``g - w`` in B and ``w`` in W."""
    from gpp_runtime.emulate import SLEEPER, EmulatedOp
    from gpp_solver.types import Node

    def op(i: int) -> EmulatedOp:
        node = Node(f"n{i}", (1e-4, 1e-4), (1e-3, 1e-3), 64.0, 8.0, 64.0, bw_weight_time=(4e-4, 4e-4))
        return EmulatedOp(node.id, node.fw_time, node.bw_time, (1, 4), 4, 8, weight_grad=node)

    ops = [op(i) for i in range(3)]
    x = torch.zeros(2, 4, requires_grad=True)
    out = x
    for o in ops:
        out = o(out)
    params = [o.weight for o in ops]
    start = SLEEPER.requested
    (gx,), pending = backward_input([out], [torch.ones_like(out)], [x], params)
    after_b = SLEEPER.requested
    backward_weight(pending)
    assert gx is not None
    assert after_b - start == pytest.approx(3 * (1e-3 - 4e-4))
    assert SLEEPER.requested - after_b == pytest.approx(3 * 4e-4)
