"""``gpp_runtime.train`` with one deliberate gradient fault, for the ``--verify`` tolerance tests.

    torchrun ... tests/runtime/fault_train.py FAULT [gpp_runtime.train arguments]

FAULT is ``none`` (plain ``gpp_runtime.train``), ``drop-microbatch`` (the sink's last micro-batch
contributes no gradient: its loss is multiplied by 0 before backward), ``no-allreduce`` (data-
parallel replicas keep their own gradients) or ``no-tied-sync`` (a weight tied across stages is
updated with each stage's own gradient). The faults are monkeypatched here, in the test's process,
so the runtime itself carries no test hooks for them.

``tied_workload`` is a tiny GPT-like model whose head weight is the embedding's (for
``--model tests.runtime.fault_train:tied_workload``).
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from gpp_runtime import train
from gpp_runtime.engine import pipeline


class TinyTied(nn.Module):
    """Embedding, an MLP block, LayerNorm, a head whose weight IS the embedding's weight."""

    def __init__(self, vocab: int = 11, width: int = 8) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.block0 = nn.Linear(width, width)
        self.act0 = nn.GELU()
        self.block1 = nn.Linear(width, width)
        self.ln = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        h = self.wte(idx)
        h = h + self.block1(self.act0(self.block0(h)))
        return self.lm_head(self.ln(h)).flatten(1)


def tied_workload():
    model = TinyTied()

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(500 + step)
        ids = torch.randint(0, 11, (batch_size, 6), generator=g)
        return (ids[:, :-1],), ids[:, 1:]

    def loss(output, target):
        return F.cross_entropy(output.reshape(-1, 11), target.reshape(-1), reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def _drop_last_microbatch() -> None:
    base = pipeline.StageExecutor

    class Dropping(base):
        def _forward(self, st, c, bufs, inputs, target, state, step, out_tensors):
            loss = super()._forward(st, c, bufs, inputs, target, state, step, out_tensors)
            if loss is not None and c.hi == self.mini_batch_size:
                leaves, outs, _loss = state[c.mb]
                state[c.mb] = (leaves, outs, loss * 0)
            return loss

    pipeline.StageExecutor = Dropping


def _grad_sync(dp: bool, tied: bool) -> None:
    base = pipeline.GradSync

    class Faulty(base):
        def __init__(self, params, dp_group, tied_groups, *args, **kwargs):
            super().__init__(params, dp_group if dp else None, tied_groups if tied else [], *args, **kwargs)

    pipeline.GradSync = Faulty


FAULTS = {
    "none": lambda: None,
    "drop-microbatch": _drop_last_microbatch,
    "no-allreduce": lambda: _grad_sync(dp=False, tied=True),
    "no-tied-sync": lambda: _grad_sync(dp=True, tied=False),
}


if __name__ == "__main__":
    FAULTS[sys.argv[1]]()
    code = train.main(sys.argv[2:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
