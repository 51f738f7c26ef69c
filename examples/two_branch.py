"""A multi-branch workload: ``branches`` MLP branches read one input, are concatenated, then a head.

Node ids: ``branch{i}.fc1``, ``branch{i}.act``, ``branch{i}.fc2`` for each branch, ``cat``, ``head``.
``workload()`` is tiny (2 branches, CPU tests); ``workload3()`` has three branches;
``bench()`` is the benchmark size (2 branches, width 512, 4 layers each), also README's CPU recipe.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class Branch(nn.Module):
    """Linear, ReLU, Linear (``layers`` > 1 adds more Linear+ReLU pairs before fc2)."""

    def __init__(self, width: int, layers: int = 1) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.act = nn.ReLU()
        self.more = nn.Sequential(*[m for _ in range(layers - 1) for m in (nn.Linear(width, width), nn.ReLU())])
        self.fc2 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.fc1(x))
        if len(self.more):
            h = self.more(h)
        return self.fc2(h)


class MultiBranch(nn.Module):
    """``branches`` branches on the same input, ``torch.cat`` of their outputs, a Linear head."""

    def __init__(self, width: int, branches: int, out: int, layers: int = 1) -> None:
        super().__init__()
        self.n = branches
        for i in range(branches):
            setattr(self, f"branch{i}", Branch(width, layers))
        self.head = nn.Linear(branches * width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [getattr(self, f"branch{i}")(x) for i in range(self.n)]
        return self.head(torch.cat(outs, dim=1))


def make(width: int = 8, branches: int = 2, out: int = 4, layers: int = 1, dtype: torch.dtype = torch.float32):
    """A workload namespace: ``model``, ``sample(batch_size, step)``, ``loss(output, target)``."""
    model = MultiBranch(width, branches, out, layers).to(dtype)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(2000 + step)
        x = torch.randn(batch_size, width, generator=g, dtype=dtype)
        y = torch.randn(batch_size, out, generator=g, dtype=dtype)
        return (x,), y

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output - target) ** 2).sum()

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def workload():
    """Tiny: two branches of width 8 (8 nodes)."""
    return make()


def workload3():
    """Three branches of width 8."""
    return make(branches=3)


def bench():
    """Benchmark size: two branches, width 512, 4 Linear layers per branch."""
    return make(width=512, branches=2, out=512, layers=3)
