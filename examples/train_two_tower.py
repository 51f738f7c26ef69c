"""Train the two-tower model with ``gpp_runtime.GraphPipeline`` in a plain PyTorch loop.

Your own loop, optimizer, scheduler and data loader; the pipeline runs one mini-batch of the
plan's schedule per ``pipe.step``. From the repository root (gloo on CPU, NCCL when CUDA is
available):

    torchrun --standalone --nproc-per-node 3 examples/train_two_tower.py \\
        --plan examples/plans/two_tower_3ranks.json --epochs 3
    # mixed precision: each forward under torch.autocast in bfloat16, fp32 weights and Adam state
    torchrun --standalone --nproc-per-node 3 examples/train_two_tower.py --precision bf16-autocast

Every rank builds the same model (same seed) and iterates the same DataLoader (same shuffling
seed), so every rank sees the same mini-batches; each rank uses the columns and samples its
stage needs. ``F.mse_loss`` is a mean over the samples it is given, so the gradients equal
one-process training on the whole mini-batch. The rank holding the head prints the loss.
``pipe.scaler.step(opt)`` is ``opt.step()``, except with ``--precision fp16-autocast``: there it
unscales the gradients and steps every rank or none (``gpp_runtime.engine.loss_scale``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import gpp_runtime

# run as a file (`torchrun examples/train_two_tower.py`), Python puts examples/ on the path, not the
# repository root that holds the `examples` package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.two_tower import TwoTower, synthetic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="examples/plans/two_tower_3ranks.json")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--save", default=None, help="directory for each stage's final state_dict")
    ap.add_argument("--precision", choices=tuple(gpp_runtime.PRECISIONS), default="float32")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    with open(args.plan) as f:
        batch = json.load(f)["mini_batch_size"]

    torch.manual_seed(0)  # the same initial weights on every rank
    model = TwoTower()
    text, image, target = synthetic(args.samples)
    loader = DataLoader(
        TensorDataset(text, image, target),
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(0),
    )

    pipe = gpp_runtime.GraphPipeline(
        model, args.plan, F.mse_loss, example_inputs=(text[:batch], image[:batch]), precision=args.precision
    )
    # this rank's stage (None without parameters); sharded over its replicas where the plan says "zero": 1
    opt = pipe.optimizer(torch.optim.Adam, lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * len(loader)) if opt else None

    for epoch in range(args.epochs):
        total, n = 0.0, 0
        for t, i, y in loader:
            if opt:
                opt.zero_grad()
            loss = pipe.step(t, i, target=y)  # a tensor on the head's ranks, None elsewhere
            stepped = pipe.scaler.step(opt)  # every rank, also one without parameters (opt None)
            pipe.scaler.update()
            if opt and stepped:
                sched.step()
            if loss is not None:
                total, n = total + float(loss), n + 1
        if n and dist.get_rank() == min(pipe.stage.devices):
            print(
                f"epoch {epoch}: mean loss {total / n:.4f} (stage {pipe.stage.id}, rank {dist.get_rank()})", flush=True
            )
    if args.save:
        os.makedirs(args.save, exist_ok=True)
        if pipe.setup.replica == 0:
            torch.save(pipe.state_dict(), os.path.join(args.save, f"stage{pipe.stage.id}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
