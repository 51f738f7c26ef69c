"""What a split backward costs beside the nodes' own times: the graph's ``split_backward_overhead``
(``docs/zero-bubble.md``, *Cost model*), measured on a CPU.

``gpp_runtime.engine.split_backward`` runs a micro-batch's backward as ``B`` (one engine call to
the received inputs) and ``W`` (the weight gradients).  Two of its costs are not in any node's
profiled times:

- ``B`` first walks the stage's autograd graph in Python to find its weight nodes (``walk``);
- ``W`` makes one engine call per parameter group, and the engine walks every autograd node below
  the call's roots before it runs the few that lead to the parameters (``call`` per call,
  ``node`` per node walked).

They are measured on chains of ``Linear`` + ``Tanh`` blocks of two depths, with the runtime's own
functions: the walk's time and one weight-gradient call's time per autograd node, the call's time
at no depth.  The graph's figures are per *graph node*: the per-autograd-node costs times the
autograd nodes one forward of the whole model makes per graph node (:func:`autograd_nodes`).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

import torch
from torch.autograd.graph import GradientEdge

from ..engine.split_backward import _plan_weight

#: chain depths (``Linear`` + ``Tanh`` blocks) the per-node costs are fitted between
DEPTHS = (4, 64)
_WIDTH = 4


def autograd_nodes(outputs: list[torch.Tensor]) -> int:
    """The autograd nodes a backward from ``outputs`` can reach (parameters' accumulators included)."""
    seen: set = set()
    queue = deque(t.grad_fn for t in outputs if t.grad_fn is not None)
    seen.update(queue)
    while queue:
        for nxt, _ in queue.popleft().next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen)


def _chain(depth: int) -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(_WIDTH, _WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def _best(fn, repeats: int) -> float:
    """The fastest of ``repeats`` timed runs of ``fn()()`` (``fn`` prepares untimed)."""
    times = []
    for _ in range(repeats):
        run = fn()
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def _one_depth(depth: int, repeats: int) -> tuple[int, float, float]:
    """``(autograd nodes, walk seconds, one weight-gradient call's seconds)`` on a chain of ``depth``
    blocks: the call starts at the top ``Linear``'s weight node, with the whole chain below it."""
    model = _chain(depth)
    params = list(model.parameters())
    top = model[-2]

    def forward():
        x = torch.randn(2, _WIDTH, requires_grad=True)
        h = model[:-2](x)
        out = model[-1](top(h))
        return x, out

    def walk():
        x, out = forward()
        grad = torch.ones_like(out)
        return lambda: _plan_weight([out], [grad], [x], params)

    def call():
        _, out = forward()
        edge = GradientEdge(out.grad_fn.next_functions[0][0], 0)  # the top Linear's addmm
        grad = torch.ones(2, _WIDTH)
        return lambda: torch.autograd.backward([edge], [grad], inputs=[top.weight])

    _, out = forward()
    nodes = autograd_nodes([out])
    t_walk = _best(walk, repeats)
    t_call = _best(call, repeats)
    for p in params:
        p.grad = None
    return nodes, t_walk, t_call


def per_autograd_node(repeats: int = 20) -> dict[str, float]:
    """``call`` (seconds per weight-gradient call), ``node`` and ``walk`` (seconds per autograd node
    a call walks, per autograd node ``B``'s search walks), fitted on two chain depths."""
    lo, hi = (_one_depth(d, repeats) for d in DEPTHS)
    dn = hi[0] - lo[0]
    node = max(0.0, (hi[2] - lo[2]) / dn)
    walk = max(0.0, (hi[1] - lo[1]) / dn)
    call = max(0.0, lo[2] - node * lo[0])
    return {"call": call, "node": node, "walk": walk}


def split_backward_overhead(outputs: list[torch.Tensor], n_nodes: int, repeats: int = 20) -> tuple[dict, dict]:
    """The graph's ``split_backward_overhead`` for a model of ``n_nodes`` graph nodes whose one
    forward gave ``outputs`` (its floating outputs that need a gradient), and what it came from
    (module docstring)."""
    per_graph_node = autograd_nodes(outputs) / max(1, n_nodes)
    fits = [per_autograd_node(repeats) for _ in range(3)]
    per = {k: statistics.median(f[k] for f in fits) for k in ("call", "node", "walk")}
    return {
        "call": per["call"],
        "node": per["node"] * per_graph_node,
        "walk": per["walk"] * per_graph_node,
    }, {"autograd_nodes_per_graph_node": per_graph_node, "per_autograd_node": per}
