"""``--verify``: train the same workload on one process and compare every parameter.

The reference starts from the same weights (``torch.manual_seed(0)`` then ``FUNCTION()``), sees
the same data (``sample(B, step)``), uses the same loss scaling (summed loss / B) and the same
optimizer, for the same steps.
"""

from __future__ import annotations

import logging

import torch

from runtime.fx_graph import load_workload

logger = logging.getLogger(__name__)


def make_optimizer(params, lr: float, momentum: float):
    """SGD over ``params``, or None when there are none (a parameter-free stage)."""
    params = list(params)
    if not params:
        return None
    return torch.optim.SGD(params, lr=lr, momentum=momentum)


def reference_params(model_spec: str, steps: int, mini_batch: int, lr: float, momentum: float,
                     device: torch.device) -> dict[str, torch.Tensor]:
    """Parameters after ``steps`` steps of plain single-process training."""
    torch.manual_seed(0)
    wl = load_workload(model_spec)
    model = wl.model.to(device)
    model.train()
    opt = make_optimizer(model.parameters(), lr, momentum)
    for step in range(steps):
        inputs, target = wl.sample(mini_batch, step)
        inputs = tuple(x.to(device) for x in inputs)
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        loss = wl.loss(model(*inputs), target.to(device)) / mini_batch
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
