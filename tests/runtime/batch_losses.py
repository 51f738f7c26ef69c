"""CLIP-like workloads whose loss is over the whole batch (for ``--model``): a pipeline must refuse them.

``logits``: the model itself pairs every image with every text (``logits_per_image``, B x B, as
HuggingFace's ``CLIPModel`` returns) and the loss is cross-entropy against ``arange(len(logits))``.
``embeddings``: the model returns each sample's two embeddings, the loss pairs them over the batch.
``per_sample``: the same embeddings with a per-sample loss (each image against its own text), which
a pipeline computes exactly.

``REFUSED`` and ``ACCEPTED``: losses of an 8-wide output over the batch's statistics or in-batch
negatives, and per-sample ones (``loss_worker.py`` runs each through a pipeline);
``centering`` and ``nan_at_step_2``: workloads of the small ``Net`` for ``gpp_runtime.train``.
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


# Batch-level losses (refused) and per-sample ones (accepted) of an 8-wide output.


def centering_loss(out, target):
    """A term over the batch's statistics: the outputs' spread around their batch mean."""
    return ((out - out.mean(0)) ** 2).mean() + F.mse_loss(out, target)


def batch_norm_loss(out, target):
    """A normalisation over the batch (batch-norm style, biased so one row is finite)."""
    return F.mse_loss((out - out.mean(0)) / (out.std(0, unbiased=False) + 1e-5), target)


def in_batch_negatives_loss(out, _target):
    """Each sample's first half against every sample's second half, its own as the positive."""
    logits = out[:, :4] @ out[:, 4:].T
    return F.cross_entropy(logits, torch.arange(len(logits), device=out.device))


def weighted_loss(out, target):
    """A custom per-sample loss: each sample's squared error weighted by its target's size."""
    return ((1 + target.abs().sum(1)) * ((out - target) ** 2).mean(1)).mean()


def dict_loss(out, target):
    """Regression values and class logits in one output against a dict target (a model's output
    is one tensor; a target may be any tree)."""
    return F.mse_loss(out[:, :4], target["reg"]) + F.cross_entropy(out[:, 4:], target["cls"])


def _float_target(n: int, g: torch.Generator):
    return torch.randn(n, 8, generator=g)


def _class_target(n: int, g: torch.Generator):
    return torch.randint(0, 8, (n,), generator=g)


def _dict_target(n: int, g: torch.Generator):
    return {"reg": torch.randn(n, 4, generator=g), "cls": torch.randint(0, 4, (n,), generator=g)}


#: name -> loss_fn (loss_reduction "mean")
REFUSED = {"centering": centering_loss, "batch_norm": batch_norm_loss, "in_batch_negatives": in_batch_negatives_loss}
#: name -> (loss_fn, loss_reduction, target(n, generator))
ACCEPTED = {
    "mse_mean": (F.mse_loss, "mean", _float_target),
    "mse_sum": (lambda o, t: F.mse_loss(o, t, reduction="sum"), "sum", _float_target),
    "cross_entropy": (F.cross_entropy, "mean", _class_target),
    "smooth_l1": (F.smooth_l1_loss, "mean", _float_target),
    "huber": (lambda o, t: F.huber_loss(o, t, delta=0.5), "mean", _float_target),
    "weighted": (weighted_loss, "mean", _float_target),
    "dict_target": (dict_loss, "mean", _dict_target),
}


class Net(nn.Module):
    """Three nodes (``fc1``, ``act``, ``fc2``), 6 inputs, 8 outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _net_sample(batch_size: int, step: int):
    g = torch.Generator().manual_seed(900 + step)
    return (torch.randn(batch_size, 6, generator=g),), torch.randn(batch_size, 8, generator=g)


def centering():
    """For gpp_runtime.train: a centering term, refused at the first step."""
    return SimpleNamespace(model=Net(), sample=_net_sample, loss_reduction="mean", loss=centering_loss)


def _nan_sample(batch_size: int, step: int):
    inputs, target = _net_sample(batch_size, step)
    if step == 2:
        inputs[0][5] = float("nan")  # micro-batch 2 (samples 4:6) of micro-batches of 2
    return inputs, target


def nan_at_step_2():
    """For gpp_runtime.train: a per-sample loss, NaN at step 2 from sample 5's input."""
    return SimpleNamespace(model=Net(), sample=_nan_sample, loss_reduction="mean", loss=F.mse_loss)
