"""A sequential MLP workload: ``blocks`` Linear+ReLU blocks and a Linear head.

Node ids (``gpp_runtime.profile``): ``layers.0`` ... ``layers.{2*blocks-1}`` (Linear, ReLU alternating)
and ``head``.  ``workload()`` is tiny (CPU tests); ``bench()`` is width 512, 8 blocks.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class MLP(nn.Module):
    """``blocks`` x (Linear(width, width), ReLU) then Linear(width, out)."""

    def __init__(self, width: int, blocks: int, out: int) -> None:
        super().__init__()
        mods: list[nn.Module] = []
        for _ in range(blocks):
            mods += [nn.Linear(width, width), nn.ReLU()]
        self.layers = nn.Sequential(*mods)
        self.head = nn.Linear(width, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def make(width: int = 16, blocks: int = 3, out: int = 4, dtype: torch.dtype = torch.float32):
    """A workload namespace: ``model``, ``sample(batch_size, step)``, ``loss(output, target)``."""
    model = MLP(width, blocks, out).to(dtype)

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(batch_size, width, generator=g, dtype=dtype)
        y = torch.randn(batch_size, out, generator=g, dtype=dtype)
        return (x,), y

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output - target) ** 2).sum()

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def workload():
    """Tiny: width 16, 3 blocks (7 nodes)."""
    return make()


def workload_f64():
    """As ``workload`` in float64 (bit-for-bit comparisons need no tolerance worries)."""
    return make(dtype=torch.float64)


def bench():
    """Benchmark size: width 512, 8 blocks, 17 nodes."""
    return make(width=512, blocks=8, out=512)
