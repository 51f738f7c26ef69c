"""Split backward for plans with ``W`` actions (``docs/zero-bubble.md``): ``B j`` computes only the
gradients of the stage's received inputs (what the producer stages wait for), ``W j`` later the
weight gradients, as torch.distributed.pipelining's ``stage_backward_input`` /
``stage_backward_weight`` do.

``B``: ``torch.autograd.grad(roots, inputs, grads, retain_graph=True)`` — the autograd engine runs
only the part of the graph between the roots and the received inputs, and each operator computes
only the gradients asked of it (no weight gradient); the graph is kept for ``W``.
``W``: ``torch.autograd.backward(roots, grads, inputs=parameters)`` accumulates the parameters'
gradients and frees the graph. The operators between the roots and a weighted operator run their
input-gradient part again in ``W`` (torch's ``stage_backward_weight`` reuses it from ``B``): the
result is the same, ``W`` costs that much more than the cost model's ``bw_weight_time``.

:func:`phase` tells an operator which part runs (``"input"``, ``"weight"`` or ``"full"``); the
emulated operators (``runtime.emulate``) sleep the matching share of their profiled backward.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence

import torch

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


def backward_input(
    roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor]
) -> list[torch.Tensor | None]:
    """The gradients of ``inputs`` (``None`` where unused), keeping the graph for :func:`backward_weight`."""
    if not roots or not inputs:
        return [None] * len(inputs)
    with backward_phase("input"):
        return list(torch.autograd.grad(list(roots), list(inputs), list(grads), retain_graph=True, allow_unused=True))


def backward_weight(
    roots: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], params: Sequence[torch.Tensor]
) -> None:
    """Accumulate the gradients of ``params`` into ``.grad`` and free the graph."""
    if not roots or not params:  # no weights: nothing to do (the graph is freed with its roots)
        return
    with backward_phase("weight"):
        torch.autograd.backward(list(roots), list(grads), inputs=list(params))
