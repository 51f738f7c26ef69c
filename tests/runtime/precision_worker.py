"""A torchrun worker for the precision tests: ``precision_worker.py CASE PLAN.json``.

Every rank builds ``pipe_worker.TwoTower`` (seeded) as a ``GraphPipeline`` and trains 3 steps of
8 samples with SGD; rank 0 gathers what each rank saw and prints ``PREC-OK <json>`` or exits 1
with ``PREC-FAILED <what>``.

- ``bf16``: ``precision="bf16-autocast"``; every rank reports the dtypes of the values that
  cross stages (as traced), its parameters' dtype and the losses.
- ``overflow-RANK``: ``precision="fp16-autocast"``; at step 1, after ``step()``, rank RANK alone
  sets one gradient element to inf. Every rank reports whether it stepped at each step, its
  loss scale after each ``update()`` and whether its parameters changed at step 1.
- ``cast-after-build``: float32; after the pipeline is built rank 0's last layer is made to
  return float64 (a forward hook), so its first send is of another dtype than traced: rank 0
  prints ``PREC-REFUSED <message>`` and exits 3 (its peers then time out).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from pipe_worker import TwoTower

import gpp_runtime
from gpp_solver.errors import InvalidInputError

B = 8


def data(step: int):
    g = torch.Generator().manual_seed(100 + step)
    return (torch.randn(B, 6, generator=g), torch.randn(B, 5, generator=g)), torch.randn(B, 3, generator=g)


def _dtypes(pipe) -> dict:
    """value -> the dtype names of its tensors, as the setup traced every value that crosses stages."""
    return {key: [str(t.dtype).removeprefix("torch.") for t in meta.tensors] for key, meta in pipe.setup.meta.items()}


def main() -> int:
    case, plan_path = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = TwoTower()
    example, _ = data(0)
    precision = {"bf16": "bf16-autocast", "cast-after-build": "float32"}.get(case, "fp16-autocast")
    pipe = gpp_runtime.GraphPipeline(model, plan_path, F.mse_loss, example, precision=precision, timeout=10.0)
    if case == "cast-after-build" and rank == 0:  # the tower's last layer now returns float64
        pipe.module.get_submodule("text.2").register_forward_hook(lambda _m, _i, out: out.double())
    params = list(pipe.parameters())
    opt = torch.optim.SGD(params, lr=0.05) if params else None
    poison = int(case.split("-")[1]) if case.startswith("overflow-") else None
    report = {"rank": rank, "stage": pipe.stage.id, "stepped": [], "scale": [], "losses": [], "changed_at_1": None}
    for step in range(3):
        inputs, target = data(step)
        if opt is not None:
            opt.zero_grad()
        try:
            loss = pipe.step(*inputs, target=target)
        except InvalidInputError as exc:
            print(f"PREC-REFUSED {exc}", file=sys.stderr, flush=True)
            os._exit(3)  # its peers wait for a message that never comes: they time out
        report["losses"].append(None if loss is None else float(loss))
        if step == 1 and rank == poison and params:
            params[0].grad.view(-1)[0] = float("inf")
        before = [p.detach().clone() for p in params]
        report["stepped"].append(pipe.scaler.step(opt))
        pipe.scaler.update()
        report["scale"].append(pipe.scaler.get_scale())
        if step == 1:
            report["changed_at_1"] = any(not torch.equal(a, p) for a, p in zip(before, params))
    report["dtypes"] = _dtypes(pipe)
    report["param_dtypes"] = sorted({str(p.dtype).removeprefix("torch.") for p in params})
    everyone = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(report, everyone, dst=0)
    dist.barrier()
    if rank == 0:
        print("PREC-OK " + json.dumps(everyone), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
