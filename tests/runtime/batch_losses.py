"""CLIP-like workloads whose loss is over the whole batch (for ``--model``): a pipeline must refuse them.

``logits``: the model itself pairs every image with every text (``logits_per_image``, B x B, as
HuggingFace's ``CLIPModel`` returns) and the loss is cross-entropy against ``arange(len(logits))``.
``embeddings``: the model returns each sample's two embeddings, the loss pairs them over the batch.
``per_sample``: the same embeddings with a per-sample loss (each image against its own text), which
a pipeline computes exactly.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class TwoTowers(nn.Module):
    def __init__(self, logits: bool) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))
        self.text = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 4))
        self.logits = logits

    def forward(self, image, text):
        i, t = self.image(image), self.text(text)
        return i @ t.T if self.logits else torch.cat([i, t], dim=1)


def _sample(batch_size: int, step: int):
    g = torch.Generator().manual_seed(700 + step)
    return (torch.randn(batch_size, 6, generator=g), torch.randn(batch_size, 5, generator=g)), torch.zeros(batch_size)


def _contrastive(logits):
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def logits():
    return SimpleNamespace(
        model=TwoTowers(logits=True), sample=_sample, loss_reduction="mean", loss=lambda out, _t: _contrastive(out)
    )


def embeddings():
    return SimpleNamespace(
        model=TwoTowers(logits=False),
        sample=_sample,
        loss_reduction="mean",
        loss=lambda out, _t: _contrastive(out[:, :4] @ out[:, 4:].T),
    )


def per_sample():
    return SimpleNamespace(
        model=TwoTowers(logits=False),
        sample=_sample,
        loss_reduction="mean",
        loss=lambda out, _t: (1 - F.cosine_similarity(out[:, :4], out[:, 4:])).mean(),
    )
