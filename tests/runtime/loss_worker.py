"""A torchrun worker (3 ranks) for the loss check: ``loss_worker.py``, no arguments.

One launch runs every case through ``gpp_runtime.GraphPipeline`` on the small ``Net`` of
``batch_losses``: the batch-level losses (``batch_losses.REFUSED``) on a 3-stage chain with
micro-batches of 1, 2 and 8 rows and on a 2-stage plan whose sink has two data-parallel
replicas (chunks of 1 and 8 rows), each of which must raise ``LossRefused`` on every rank at the
first step; the per-sample losses (``batch_losses.ACCEPTED``) on the chain with one-row
micro-batches and on the replicated sink, each of which must train two steps with the sink's loss
equal to the one-process loss of the mini-batch. Rank 0 prints ``LOSS-CASES <json>``: per case,
every rank's outcome.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from batch_losses import ACCEPTED, REFUSED, Net
from runtime_plans import plan, stage

import gpp_runtime
from gpp_solver.errors import InvalidInputError

B = 16


def chain(rows: int) -> dict:
    """fc1 | act | fc2 on ranks 0, 1, 2, micro-batches of ``rows``."""
    return plan(
        B,
        [stage(i, [n], [i], rows, B, depth=2 - i) for i, n in enumerate(["fc1", "act", "fc2"])],
        [[0, 1], [1, 2]],
    )


def replicated(rows: int) -> dict:
    """fc1, act on rank 0 | fc2 on ranks 1 and 2 (``rows`` each), micro-batches of ``2 * rows``."""
    return plan(
        B,
        [stage(0, ["fc1", "act"], [0], 2 * rows, B, depth=1), stage(1, ["fc2"], [1, 2], 2 * rows, B, depth=0)],
        [[0, 1]],
    )


def run(loss_fn, reduction: str, make_target, doc: dict, steps: int) -> dict:
    torch.manual_seed(0)
    model = Net()
    g = torch.Generator().manual_seed(5)
    x, target = torch.randn(B, 6, generator=g), make_target(B, g)
    with torch.no_grad():
        want = float(loss_fn(model(x), target))
    pipe = gpp_runtime.GraphPipeline(
        model, doc, loss_fn, example_inputs=(x,), loss_reduction=reduction, memory_step=None, timeout=30
    )
    losses = []
    try:
        for _ in range(steps):
            loss = pipe.step(x, target=target)
            losses.append(None if loss is None else float(loss))
            for p in pipe.parameters():
                p.grad = None
    except InvalidInputError as exc:
        return {"error": type(exc).__name__, "origin": getattr(exc, "origin", None), "msg": str(exc)}
    return {"losses": losses, "want": want}


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    plans = {f"chain{r}": chain(r) for r in (1, 2, 8)} | {f"dp{r}": replicated(r) for r in (1, 8)}
    cases = [
        (name, p, fn, "mean", lambda n, g: torch.randn(n, 8, generator=g), 1)
        for name, fn in REFUSED.items()
        for p in plans
    ]
    cases += [(name, p, fn, red, tgt, 2) for name, (fn, red, tgt) in ACCEPTED.items() for p in ("chain1", "dp1")]
    mine = {f"{name}@{p}": run(fn, red, tgt, plans[p], steps) for name, p, fn, red, tgt, steps in cases}
    out = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    dist.barrier()
    if rank == 0:
        print("LOSS-CASES " + json.dumps({k: [o[k] for o in out] for k in mine}), flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
