"""One fx node run on its own, as the profiler times and measures it: its inputs as fresh leaves,
its parameters, and the callables of its forward and of its backward (``torch.autograd.grad`` of
its floating outputs, with gradients of ones, with respect to its floating inputs and parameters).

``grad_of``, where given, is the set of fx nodes whose values need grad in the model (computed from
a parameter): only those inputs are leaves that need grad, so the backward computes no gradient
the model's backward would not (the model's own inputs have none).

Each setup empties autocast's cache of weight casts first (``torch.clear_autocast_cache``): the
runtime opens an autocast region per micro-batch's forward, so every forward casts its weights
anew, and so does every timed call (outside autocast the cache is empty and this does nothing)."""

from __future__ import annotations

import torch

from .fx_graph import ModelGraph, run_node


def tensors_in(value) -> list[torch.Tensor]:
    """The tensors inside a value (a tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    return []


def leaf_inputs(node, env: dict, requires_grad: bool, grad_of: set | None = None) -> tuple[dict, list[torch.Tensor]]:
    """A fresh environment for ``node``'s inputs: copies of its tensor inputs (floating ones
    cloned from a leaf that needs grad, so an in-place operator may modify them) and the leaves."""
    local: dict = {}
    leaves: list[torch.Tensor] = []
    for m in node.all_input_nodes:
        v = env[m]
        if m.op == "get_attr":
            local[m] = v
        elif isinstance(v, torch.Tensor):
            t = v.detach().clone()
            if requires_grad and t.is_floating_point() and (grad_of is None or m in grad_of):
                t.requires_grad_(True)
                leaves.append(t)
                t = t.clone()  # not a leaf: in-place operators are allowed on it
            local[m] = t
        else:
            local[m] = v
    return local, leaves


def node_params(mg: ModelGraph, node, env: dict) -> list[torch.Tensor]:
    """The parameters that need grad which ``node`` reads (of its module or its attributes)."""
    params = []
    if node.op == "call_module":
        params = [p for p in mg.gm.get_submodule(node.target).parameters() if p.requires_grad]
    return params + [
        t for m in node.all_input_nodes if m.op == "get_attr" for t in tensors_in(env[m]) if t.requires_grad
    ]


def forward_setup(mg: ModelGraph, node, env: dict, grad_of: set | None = None):
    """A setup (untimed) returning the node's forward as the trainer runs it: autograd records it."""

    def setup():
        torch.clear_autocast_cache()
        local, _ = leaf_inputs(node, env, requires_grad=True, grad_of=grad_of)
        return lambda: run_node(mg.gm, node, local)

    return setup


def backward_setup(mg: ModelGraph, node, env: dict, grad_of: set | None = None):
    """A setup (its forward, untimed) returning the node's backward: ``torch.autograd.grad`` of
    its floating outputs with respect to its leaves and parameters (a no-op when there are none)."""
    params = node_params(mg, node, env)

    def setup():
        torch.clear_autocast_cache()
        local, leaves = leaf_inputs(node, env, requires_grad=True, grad_of=grad_of)
        outs = [t for t in tensors_in(run_node(mg.gm, node, local)) if t.is_floating_point() and t.requires_grad]
        wrt = leaves + params
        if not outs or not wrt:
            return lambda: None
        grads = [torch.ones_like(t) for t in outs]
        return lambda: torch.autograd.grad(outs, wrt, grads, allow_unused=True)

    return setup


def needs_grad(env_with_grad: dict) -> set:
    """The fx nodes whose values need grad in a forward run with autograd (``env_with_grad``)."""
    return {n for n, v in env_with_grad.items() if any(t.requires_grad for t in tensors_in(v))}
