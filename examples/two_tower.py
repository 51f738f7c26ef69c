"""A two-tower (multi-modal) workload from standard ``torch.nn`` blocks, with dropout.

A text tower and an image tower read their own inputs; their features are concatenated and a
head predicts 3 values. The text tower starts with ``ReLU(inplace=True)`` after its first Linear
and has a ``Dropout``, so plans that cut there exercise in-place first ops and per-chunk dropout.

Node ids: ``text.0`` .. ``text.4`` (Linear, ReLU(inplace), Dropout, Linear, ReLU),
``image.0`` .. ``image.2`` (Linear, ReLU, Linear), ``cat``, ``head``.
``workload()`` is tiny (CPU tests; loss summed over samples, as ``gpp_runtime.train`` expects).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn


class TwoTower(nn.Module):
    """Text (``text_dim``) and image (``image_dim``) towers of width ``width``, a Linear head."""

    def __init__(self, text_dim: int = 12, image_dim: int = 10, width: int = 16, out: int = 3, p: float = 0.25) -> None:
        super().__init__()
        self.text = nn.Sequential(
            nn.Linear(text_dim, width), nn.ReLU(inplace=True), nn.Dropout(p), nn.Linear(width, width), nn.ReLU()
        )
        self.image = nn.Sequential(nn.Linear(image_dim, width), nn.ReLU(), nn.Linear(width, width))
        self.head = nn.Linear(2 * width, out)

    def forward(self, text: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.text(text), self.image(image)], dim=1))


def synthetic(n: int, seed: int = 0, text_dim: int = 12, image_dim: int = 10, out: int = 3):
    """``n`` samples (text, image, target) with a learnable relation between inputs and target."""
    g = torch.Generator().manual_seed(seed)
    text = torch.randn(n, text_dim, generator=g)
    image = torch.randn(n, image_dim, generator=g)
    w = torch.randn(text_dim + image_dim, out, generator=g) / 4
    target = torch.cat([text, image], dim=1) @ w + 0.05 * torch.randn(n, out, generator=g)
    return text, image, target


def workload():
    """The ``gpp_runtime.train`` interface: model, sample(batch_size, step), loss summed over samples."""
    model = TwoTower()

    def sample(batch_size: int, step: int):
        text, image, target = synthetic(batch_size, seed=3000 + step)
        return (text, image), target

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((output - target) ** 2).sum()

    return SimpleNamespace(model=model, sample=sample, loss=loss)


def workload_mean():
    """As ``workload`` with a mean-reduced loss (``F.mse_loss``), declared as such."""
    wl = workload()
    wl.loss = torch.nn.functional.mse_loss
    wl.loss_reduction = "mean"
    return wl
