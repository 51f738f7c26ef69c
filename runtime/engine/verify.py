"""``--verify``: train the same workload on one process and compare every parameter.

The reference starts from the same weights (``torch.manual_seed(0)`` then ``FUNCTION()``), sees
the same data (``sample(B, step)``), runs the same traced graph with the same dropout masks (each
dropout node's mini-batch is split into the chunks its stage computes, each drawn from
``(seed, step, chunk's first sample, node)``, see ``runtime.capture.dropout``), uses the same loss and
the same optimizer, for the same steps. The tolerance is the caller's (``--rtol/--atol``); in
float64 (``--dtype float64``) rounding no longer hides in it.
"""

from __future__ import annotations

import logging

import torch

from ..capture.dropout import Context, per_chunk, set_context
from ..capture.fx_graph import set_training, trace
from ..lowering.plan_io import Plan

logger = logging.getLogger(__name__)


def make_optimizer(params, name: str, lr: float, momentum: float = 0.0):
    """``sgd`` or ``adam`` over ``params``, or None when there are none (a parameter-free stage)."""
    params = list(params)
    if not params:
        return None
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def chunk_rows(plan: Plan) -> dict[str, int]:
    """Rows per chunk of every node: its stage's samples per replica and micro-batch."""
    return {nid: s.replica_batch for s in plan.stages for nid in s.nodes}


def reference_params(model: torch.nn.Module, sample, loss_fn, plan: Plan, steps: int,
                     make_opt, device: torch.device, seed: int = 0,
                     tracing: dict | None = None) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` steps of plain single-process training of ``model``.

    ``sample(B, step)`` gives the data, ``loss_fn`` the mean loss of the whole mini-batch,
    ``make_opt(params)`` the optimizer.
    """
    model = model.to(device)
    first, _ = sample(plan.mini_batch_size, 0)
    mg = trace(model, tuple(x.to(device) for x in first), **(tracing or {}))
    per_chunk(mg.gm, mg.ids)
    gm = mg.gm.to(device)
    set_training(gm, True)  # not gm.train(): torch.export's modules refuse it
    opt = make_opt(model.parameters())
    rows = chunk_rows(plan)
    for step in range(steps):
        inputs, target = sample(plan.mini_batch_size, step)
        inputs = tuple(x.to(device) for x in inputs)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        set_context(Context(seed=seed, step=step, lo=0, chunk_rows=rows))
        loss = loss_fn(gm(*inputs), target.to(device))
        loss.backward()
        if opt is not None:
            opt.step()
    return {k: v.detach().cpu() for k, v in model.named_parameters()}


def compare(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor],
            rtol: float = 1e-5, atol: float = 1e-6) -> list[str]:
    """Names of parameters that are missing or differ beyond tolerance, with the largest error."""
    bad = []
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            bad.append(f"{name}: missing from the pipeline's parameters")
            continue
        try:
            torch.testing.assert_close(g, w, rtol=rtol, atol=atol)
        except AssertionError:
            err = (g.double() - w.double()).abs().max().item() if g.shape == w.shape else float("nan")
            bad.append(f"{name}: max abs difference {err:.3g}")
    for name in got:
        if name not in want:
            bad.append(f"{name}: not a parameter of the reference model")
    return bad
