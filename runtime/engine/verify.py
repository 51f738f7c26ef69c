"""``--verify``: train the same workload on one process and compare every parameter.

The reference starts from the same weights (``torch.manual_seed(0)`` then ``FUNCTION()``), sees
the same data (``sample(mini_batch_size, step)``), runs the same traced graph with the same dropout masks (each
dropout node's mini-batch is split into the chunks its stage computes, each drawn from
``(seed, step, chunk's first sample, node)``, see ``gpp_runtime.capture.dropout``), uses the same loss
and the same optimizer, for the same steps. The tolerance is the caller's (``--rtol/--atol``) or
:func:`default_tolerance`'s, chosen by dtype and optimizer.
"""

from __future__ import annotations

import logging

import torch

from gpp_solver.types import Plan

from ..capture.dropout import Context, per_chunk, set_context
from ..capture.fx_graph import set_training, trace
from ..capture.precision import Precision
from ..capture.precision import precision as as_precision
from ..lowering.plan_io import replica_batch
from .loss_scale import LossScaler

logger = logging.getLogger(__name__)


def optimizer_spec(name: str, lr: float, momentum: float = 0.0) -> tuple[type, dict]:
    """``sgd`` or ``adam``: its class and settings."""
    if name == "adam":
        return torch.optim.Adam, {"lr": lr}
    return torch.optim.SGD, {"lr": lr, "momentum": momentum}


def make_optimizer(params, name: str, lr: float, momentum: float = 0.0):
    """``sgd`` or ``adam`` over ``params``, or None when there are none (a parameter-free stage)."""
    params = list(params)
    if not params:
        return None
    cls, settings = optimizer_spec(name, lr, momentum)
    return cls(params, **settings)


def default_tolerance(
    dtype: torch.dtype, optimizer: str, lr: float, steps: int, precision: Precision | str | None = None
) -> tuple[float, float] | None:
    """``(rtol, atol)`` that a correct pipeline passes and a wrong gradient fails; None where no
    default separates the two (Adam in a low precision: pass ``--rtol/--atol``).

    A pipeline sums each gradient per micro-batch and per replica, in another order than one
    process does, so the two differ by rounding. SGD passes that difference on linearly: float32
    ``rtol 1e-5, atol 1e-6``, float64 ``rtol 1e-9, atol 1e-12``. Adam divides each gradient by its
    own running magnitude, so an element whose true gradient is zero (the key bias of an attention:
    softmax ignores a shift of all logits) moves by rounding noise scaled up to a sizeable fraction
    of ``lr`` per step. The absolute tolerance is therefore proportional to ``lr * steps``:
    ``0.02 * lr * steps`` in float32 (``examples.real_models:two_tower`` on 3 ranks, 5 Adam steps,
    lr 0.01: 7.6e-5 at most, the key bias; 5e-2 with a micro-batch dropped or the data-parallel
    all-reduce left out), ``1e-8 * lr * steps`` in float64 (2.3e-13 at most there). A wrong
    gradient moves Adam's parameters by about ``lr`` per step (its first step is ``lr * sign(g)``),
    far above both.

    In a low precision (``bf16-autocast``, ``fp16-autocast``, ``bf16-model``) the micro-batches'
    activations round differently from the whole mini-batch's, by about the low dtype's ``eps``
    (bfloat16 2**-7, float16 2**-10). With SGD: ``atol = eps / 2 * lr * steps``, and for a bf16
    model (whose weights are themselves rounded to bfloat16) ``rtol = eps``, one unit in the last
    place. Measured on the same two-tower model, SGD lr 0.1, 5 steps, a data-parallel plan and a
    graph pipeline: largest difference 2.7e-4 in bf16-autocast, 1.2e-5 in fp16-autocast, 9.8e-4
    (one ulp) as a bf16 model; 7.8e-3 with the all-reduce left out and 2.3e-2 with a micro-batch
    dropped, in all three. Adam turns those rounding differences into steps of about ``lr`` (5.8e-2
    there against 9.1e-2 for a dropped micro-batch): no default tolerance tells them apart.
    """
    low = as_precision(precision).low
    if low is not None:
        if optimizer == "adam":
            return None
        eps = torch.finfo(low).eps
        rtol = eps if as_precision(precision).model_dtype is not None else 0.0
        return rtol, eps / 2 * lr * max(steps, 1)
    wide = dtype == torch.float64
    rtol, atol = (1e-9, 1e-12) if wide else (1e-5, 1e-6)
    if optimizer == "adam":
        atol = max(atol, (1e-8 if wide else 2e-2) * lr * max(steps, 1))
    return rtol, atol


def chunk_rows(plan: Plan) -> dict[str, int]:
    """Rows per chunk of every node: its stage's samples per replica and micro-batch."""
    return {nid: replica_batch(s) for s in plan.stages for nid in s.nodes}


def reference_params(
    model: torch.nn.Module,
    sample,
    loss_fn,
    plan: Plan,
    steps: int,
    make_opt,
    device: torch.device,
    seed: int = 0,
    tracing: dict | None = None,
    precision: Precision | str | None = None,
) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` steps of plain single-process training of ``model``.

    ``sample(mini_batch_size, step)`` gives the data, ``loss_fn`` the mean loss of the whole mini-batch,
    ``make_opt(params)`` the optimizer. In ``precision`` as the pipeline trains: the forward and
    the loss under its autocast, with fp16 a loss scale of the same settings (one process: a step
    is skipped when a gradient is not finite); a bf16-model's ``model`` and ``sample`` are the
    caller's to cast (``TrainWorkload``).
    """
    prec = as_precision(precision)
    model = model.to(device)
    first, _ = sample(plan.mini_batch_size, 0)
    mg = trace(model, tuple(x.to(device) for x in first), **(tracing or {}))
    per_chunk(mg.gm, mg.ids)
    gm = mg.gm.to(device)
    set_training(gm, True)  # not gm.train(): torch.export's modules refuse it
    opt = make_opt(model.parameters())
    scaler = LossScaler(model.parameters, device, enabled=prec.scaled, distributed=False)
    rows = chunk_rows(plan)
    for step in range(steps):
        inputs, target = sample(plan.mini_batch_size, step)
        inputs = tuple(x.to(device) for x in inputs)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        set_context(Context(seed=seed, step=step, lo=0, chunk_rows=rows))
        with prec.forward(device):
            loss = loss_fn(gm(*inputs), target.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return {k: v.detach().cpu() for k, v in model.named_parameters()}


def largest_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference over every parameter both hold with the same shape."""
    return max(
        (
            float((got[k].double() - w.double()).abs().max())
            for k, w in want.items()
            if k in got and got[k].shape == w.shape and w.numel()
        ),
        default=0.0,
    )


def compare(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], rtol: float = 1e-5, atol: float = 1e-6
) -> list[str]:
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
