"""Three models the fidelity benchmark's suite does not hold, for an outside-style check of the
cost model (``--models``): none is profiled, planned or trained by a test, and none shaped a rule
of the model.

- ``three_branch``: three branches of different depth and width over one input, float64: an MLP
  with in-place ReLUs, a 1-d convolution tower whose output is flattened (a view), a gated branch
  multiplied in place, concatenated into a linear head;
- ``shufflenet``: torchvision's ``shufflenet_v2_x0_5`` (channel split, shuffle by views,
  concatenation), 32x32 images, BatchNorm frozen;
- ``squeezenet``: torchvision's ``squeezenet1_1`` (fire modules: two parallel expand convolutions
  concatenated, in-place ReLUs everywhere), 64x64 images.

Run (``docs/fidelity.md``, *Models the suite has never seen*)::

    python benchmarks/cost_model_fidelity.py --mode cpu --devices 1,2 --time-limit 10 --steps 10 \
        --warmup-steps 3 --repeats 3 --models benchmarks.fidelity_unseen:three_branch@64,\
    benchmarks.fidelity_unseen:shufflenet@16,benchmarks.fidelity_unseen:squeezenet@8
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn as nn

from examples.real_models import CLASSES, _classification, _freeze_batchnorm
from gpp_runtime.capture.third_party import import_torchvision


class ThreeBranch(nn.Module):
    """Three branches of different depth and width (MLP with in-place ReLUs, a conv tower whose
    output is flattened (a view), a gated branch with an in-place multiply), concatenated."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.a1 = nn.Linear(d, 512)
        self.a2 = nn.Linear(512, 512)
        self.a3 = nn.Linear(512, 128)
        self.c1 = nn.Conv1d(1, 8, 5, padding=2)
        self.c2 = nn.Conv1d(8, 4, 5, padding=2)
        self.c3 = nn.Linear(4 * d, 128)
        self.g1 = nn.Linear(d, 384)
        self.g2 = nn.Linear(d, 384)
        self.g3 = nn.Linear(384, 128)
        self.head = nn.Linear(384, CLASSES)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        a = self.a3(self.relu(self.a2(self.relu(self.a1(x)))))
        c = self.relu(self.c2(torch.relu(self.c1(x.unsqueeze(1)))))
        c = self.c3(c.flatten(1))
        g = self.g1(x)
        g.mul_(torch.sigmoid(self.g2(x)))
        g = self.g3(g)
        return self.head(torch.cat([a, c, g], dim=1))


def three_branch():
    model = ThreeBranch().double()

    def sample(b, step):
        gen = torch.Generator().manual_seed(77 + step)
        return (torch.randn(b, 256, generator=gen, dtype=torch.float64),), torch.randint(
            0, CLASSES, (b,), generator=gen
        )

    return SimpleNamespace(
        model=model, sample=sample, loss=lambda o, t: nn.functional.cross_entropy(o, t, reduction="sum")
    )


def shufflenet(size: int = 32):
    tv = import_torchvision()
    net = tv.models.shufflenet_v2_x0_5(weights=None, num_classes=CLASSES)
    return _classification(_freeze_batchnorm(net), (3, size, size), leaf_modules=(tv.ops.misc.FrozenBatchNorm2d,))


def squeezenet(size: int = 64):
    tv = import_torchvision()
    net = tv.models.squeezenet1_1(weights=None, num_classes=CLASSES, dropout=0.0)
    return _classification(net, (3, size, size))
