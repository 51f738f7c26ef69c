"""Split backward for plans with ``W`` actions (``docs/zero-bubble.md``): ``B j`` computes only the
gradients of the stage's received inputs (what the producer stages wait for), ``W j`` later the
weight gradients, with the technique of torch.distributed.pipelining's ``stage_backward_input`` /
``stage_backward_weight``: no operator's input-gradient part runs twice (a weight shared by two
operators aside, below).

The autograd graph between the roots (the stage's outputs, its loss) and the received inputs is
the *input region*: ``B`` runs it (``torch.autograd.grad(roots, inputs)``), each operator computing
only the gradients asked of it. A node of that region with an edge out of it towards a parameter
(a Linear's ``addmm`` towards its weight) is a *weight node*; a pre-hook keeps the gradient flowing
into it in ``B``. ``W`` starts the engine at the weight nodes with those kept gradients
(``GradientEdge`` roots), asking only for the parameters, so each weight node computes only its
weight-gradient outputs and nothing between the roots and the weight nodes runs again. Roots
outside the input region (a parameter-only output, every root of a stage whose inputs need no
gradient) are backpropagated whole in ``W``. The gradients equal one full backward.

Parameters whose weight nodes or outside roots are connected through the parameter side (a
weight used by two operators, a parameter used in the region and by a parameter-only output) form
one group, backpropagated in one engine call, so each parameter's gradient is accumulated once per
``W`` (the data-parallel hooks of ``gpp_runtime.engine.grad_sync`` see it final). While a group runs, a
pre-hook holds each of its weight nodes to its kept gradient, so a weight node that one of the
group's roots reaches through the input region does not count twice (the engine does run the input
region between them again: the price of a shared weight, as in torch's).

The torch functions themselves are not called: they need every parameter to reach the received
inputs' region (the first stage, a parameter-only output lose their gradients), write ``.grad`` of
the inputs, detach the roots, and their merge of parameter groups can count a parameter in two
groups.

:func:`phase` tells an operator which part runs (``"input"``, ``"weight"`` or ``"full"``); the
emulated operators (``gpp_runtime.emulate``) sleep the matching share of their profiled backward.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

_PHASE: contextvars.ContextVar[str] = contextvars.ContextVar("gpp_backward_phase", default="full")


def phase() -> str:
    """The part of the backward now running: ``"input"``, ``"weight"`` or ``"full"``."""
    return _PHASE.get()


@contextlib.contextmanager
def backward_phase(name: str) -> Iterator[None]:
    token = _PHASE.set(name)
    try:
        yield
    finally:
        _PHASE.reset(token)


@dataclass
class _Group:
    """Parameters and where their gradients enter: weight nodes (their gradients kept in ``B``)
    and roots outside the input region; ``W`` backpropagates a group in one engine call, so each
    parameter's gradient is accumulated once (the data-parallel hooks see it final)."""

    params: list[torch.Tensor] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    kept: dict[Node, tuple] = field(default_factory=dict)
    roots: list[torch.Tensor] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)


@dataclass
class PendingWeight:
    """What ``W`` needs of one micro-batch's ``B``."""

    groups: list[_Group]


def _node(t: torch.Tensor) -> Node | None:
    """The node a tensor's gradient enters: its ``grad_fn``, or a leaf's gradient accumulator."""
    if t.grad_fn is not None or not t.requires_grad:
        return t.grad_fn
    return t.view_as(t).grad_fn.next_functions[0][0]


def _consumers(starts: Iterable[Node]) -> dict[Node, list[Node]]:
    """For every node the backward from ``starts`` reaches, the nodes that pass it a gradient."""
    into: dict[Node, list[Node]] = {}
    queue = deque()
    for n in starts:
        if n not in into:
            into[n] = []
            queue.append(n)
    while queue:
        n = queue.popleft()
        for nxt, _ in n.next_functions:
            if nxt is None:
                continue
            if nxt not in into:
                into[nxt] = []
                queue.append(nxt)
            into[nxt].append(n)
    return into


def _closure(starts: Iterable[Node], step, stop: set[Node] | frozenset = frozenset()) -> tuple[set[Node], set[Node]]:
    """Nodes reached from ``starts`` along ``step`` without entering ``stop``, and those of ``stop`` met."""
    seen, met = set(starts), set()
    queue = deque(seen)
    while queue:
        for nxt in step(queue.popleft()):
            if nxt in stop:
                met.add(nxt)
            elif nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen, met


def _find(parent: dict, x):
    while parent[x] is not x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def _plan_weight(
    roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], params
) -> PendingWeight:
    """Group the parameters with the weight nodes of the input region and the roots outside it
    that their gradients come through (union-find)."""
    params = [p for p in params if p.requires_grad]
    if not params or not roots:
        return PendingWeight([])
    if not inputs or any(not t.is_leaf for t in inputs):  # no input region, or an input's own graph
        return PendingWeight([_Group(params=params, roots=list(roots), grads=list(grads))])
    root_nodes = [_node(r) for r in roots]
    into = _consumers(root_nodes)
    region, _ = _closure([n for n in map(_node, inputs) if n in into], lambda n: into[n])
    outside = {n for n in root_nodes if n not in region}
    parent: dict = {}
    acc_of = {}
    for p in params:
        acc = _node(p)
        if acc not in into:
            continue  # unused by this micro-batch's graph
        acc_of[acc] = p
        side, met = _closure([acc], lambda n: into[n], region)
        parent.setdefault(acc, acc)
        for x in met | (side & outside):
            parent.setdefault(x, x)
            parent[_find(parent, x)] = _find(parent, acc)
    groups: dict = {}
    for x in parent:
        g = groups.setdefault(_find(parent, x), _Group())
        if x in acc_of:
            g.params.append(acc_of[x])
        elif x in region:
            g.nodes.append(x)
    for r, n, grad in zip(roots, root_nodes, grads):
        if n in outside and n in parent:
            groups[_find(parent, n)].roots.append(r)
            groups[_find(parent, n)].grads.append(grad)
    return PendingWeight(list(groups.values()))


def backward_input(
    roots: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    inputs: Sequence[torch.Tensor],
    params: Sequence[torch.Tensor],
) -> tuple[list[torch.Tensor | None], PendingWeight]:
    """The gradients of ``inputs`` (``None`` where unused), and what :func:`backward_weight` needs
    to accumulate the gradients of ``params`` later."""
    pending = _plan_weight(roots, grads, inputs, params)
    if not roots or not inputs:
        return [None] * len(inputs), pending
    handles = []

    def keep(group: _Group, node: Node):
        def hook(grad_outputs):
            group.kept[node] = grad_outputs

        return hook

    try:
        for g in pending.groups:
            handles += [n.register_prehook(keep(g, n)) for n in g.nodes]
        with backward_phase("input"):
            got = torch.autograd.grad(list(roots), list(inputs), list(grads), retain_graph=True, allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    return list(got), pending


def backward_weight(pending: PendingWeight) -> None:
    """Accumulate the parameters' gradients into ``.grad`` from what :func:`backward_input` kept."""
    with backward_phase("weight"):
        for g in pending.groups:
            _group_backward(g)
    pending.groups.clear()


def _group_backward(g: _Group) -> None:
    edges = [get_gradient_edge(r) for r in g.roots]
    grads = list(g.grads)
    for node, kept in g.kept.items():
        for i, grad in enumerate(kept):
            if grad is not None:
                edges.append(GradientEdge(node, i))
                grads.append(grad)
    if not edges:
        return
    handles = []
    if len(g.kept) > 1:  # a weight node reached from another one of the group: its kept gradient only
        handles = [node.register_prehook(lambda _, kept=kept: kept) for node, kept in g.kept.items()]
    try:
        torch.autograd.backward(edges, grads, inputs=g.params, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
