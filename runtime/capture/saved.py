"""Bytes autograd keeps from the forward to the backward pass, per graph node (its ``activation_bytes``).

One training-mode forward of the traced model runs node by node with autograd recording, under
``torch.autograd.graph.saved_tensors_hooks``: every tensor an operator saves for its backward is
seen, and its storage (each storage once, however many operators save it or views of it) is
charged to the graph node that *produced* it, the node whose operator allocated it (an output, or
an intermediate inside a node of several operators, e.g. attention's softmax or dropout's mask).
A model input that an operator saves is charged to the first node that saves it. Parameters and
buffers are not activations (the weights term of the cost model holds them).

A saved copy of a parameter (``param.to(dtype)``: what ``torch.autocast`` makes of a float32
weight before a matmul or a convolution, once per autocast region, which the runtime opens per
micro-batch; or its view, or anything else computed from one parameter alone) is not an
activation either: its size does not follow the micro-batch's rows, so it
is counted apart, per micro-batch (the node's ``weight_copy_bytes``), charged to the node whose
operator saved it first.

Charging the producer follows what a pipeline stage holds per in-flight sample: a value its own
nodes saved, and a value it sends to another stage, which stays alive as the root of the stage's
backward (so a stage's kept bytes do not depend on where its consumers are). What this figure
does not hold is partition-dependent and priced by the cost model from the plan's transfers: the
received copy of a value a stage reads from another stage (its received buffers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .fx_graph import COMPUTE_OPS, ModelGraph, run_node


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


@dataclass(frozen=True)
class SavedBytes:
    """Per graph node (every node has an entry), bytes of the storages its forward keeps for the
    backward: ``activations`` (in one forward of the measured rows) and ``weight_copies`` (copies
    of parameters, one set per forward whatever its rows)."""

    activations: dict[str, int]
    weight_copies: dict[str, int]


def _copies_a_parameter(t: torch.Tensor, weights: set[int]) -> bool:
    """Whether ``t`` was computed from one parameter (or buffer) alone, through operators of one
    input each: a cast (``to``/``_to_copy``, what autocast calls) and its views (a Linear saves
    its cast weight transposed), found by walking ``t``'s autograd history back to the weight.
    Its storage holds at most the parameter's elements: a ``repeat`` over the batch grows with
    the rows, so it is an activation, not a copy."""
    fn = t.grad_fn
    for _ in range(_CHAIN):
        if fn is None:
            return False
        variable = getattr(fn, "variable", None)  # AccumulateGrad: the leaf
        if isinstance(variable, torch.Tensor):
            elements = t.untyped_storage().nbytes() // t.element_size()
            return variable.untyped_storage().data_ptr() in weights and elements <= variable.numel()
        sources = [f for f, _ in fn.next_functions if f is not None]
        if len(sources) != 1:
            return False
        fn = sources[0]
    return False


#: the most one-input operators between a saved weight copy and its parameter
_CHAIN = 8


def saved_bytes(mg: ModelGraph, inputs: tuple) -> SavedBytes:
    """Bytes of saved-for-backward storages charged to each graph node (see the module docstring)
    in one forward of ``inputs``."""
    weights = {t.untyped_storage().data_ptr() for t in list(mg.gm.parameters()) + list(mg.gm.buffers())}
    owner: dict[int, str] = {}  # storage -> graph node charged with it
    size: dict[int, int] = {}
    saved: set[int] = set()
    copies: set[int] = set()
    current: list[str | None] = [None]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            s = t.untyped_storage()
            ptr = s.data_ptr()
            if ptr not in weights and s.nbytes():
                saved.add(ptr)
                size[ptr] = s.nbytes()
                owner.setdefault(ptr, current[0])
                if _copies_a_parameter(t, weights):
                    copies.add(ptr)
        return t

    env: dict = dict(zip(mg.placeholders, inputs))
    torch.clear_autocast_cache()  # one forward's copies, made in it
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for n in mg.gm.graph.nodes:
            if n.op not in COMPUTE_OPS and n.op != "get_attr":
                continue
            current[0] = mg.group.get(n)
            env[n] = run_node(mg.gm, n, env)
            if current[0] is not None:
                for t in _tensors(env[n]):
                    owner.setdefault(t.untyped_storage().data_ptr(), current[0])
    out = SavedBytes({gid: 0 for gid, _ in mg.groups}, {gid: 0 for gid, _ in mg.groups})
    for ptr in saved:
        gid = owner.get(ptr)
        kind = out.weight_copies if ptr in copies else out.activations
        if gid in kind:
            kind[gid] += size[ptr]
    return out
