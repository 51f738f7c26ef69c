"""Workloads for the memory tests (``MODULE:FUNCTION`` for ``gpp_runtime.train --model``)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn


class ConvTowers(nn.Module):
    """Two towers of 1-d convolutions (GELU; ReLU and dropout) over one sequence, concatenated,
    average-pooled and fed to a linear head: activation-heavy, its towers' outputs large."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.a1, self.a2 = nn.Conv1d(4, channels, 3, padding=1), nn.Conv1d(channels, channels, 3, padding=1)
        self.b1, self.b2 = nn.Conv1d(4, channels, 5, padding=2), nn.Conv1d(channels, channels, 5, padding=2)
        self.gelu, self.relu, self.drop = nn.GELU(), nn.ReLU(), nn.Dropout(0.1)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(2 * channels, 10)

    def forward(self, x):
        a = self.gelu(self.a2(self.gelu(self.a1(x))))
        b = self.relu(self.b2(self.drop(self.relu(self.b1(x)))))
        return self.head(self.pool(torch.cat([a, b], dim=1)).flatten(1))


def conv_towers():
    model = ConvTowers()

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(300 + step)
        return (torch.randn(batch_size, 4, 128, generator=g),), torch.randint(0, 10, (batch_size,), generator=g)

    return SimpleNamespace(
        model=model, sample=sample, loss=lambda o, t: nn.functional.cross_entropy(o, t, reduction="sum")
    )


class WideMlp(nn.Module):
    """Four wide linear layers (GELU between): weight-heavy, so under autocast each micro-batch's
    low-precision weight copies, which its backward reads, outweigh its activations."""

    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(4))
        self.act = nn.GELU()
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return self.head(x)


def wide_mlp():
    model = WideMlp()

    def sample(batch_size: int, step: int):
        g = torch.Generator().manual_seed(400 + step)
        return (torch.randn(batch_size, 256, generator=g),), torch.randint(0, 10, (batch_size,), generator=g)

    return SimpleNamespace(
        model=model, sample=sample, loss=lambda o, t: nn.functional.cross_entropy(o, t, reduction="sum")
    )
