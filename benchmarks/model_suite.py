"""A seeded generator of realistic multi-branch models, for measuring the cost model on models it
has never seen (``benchmarks/fidelity_heldout.py``).

A seed draws a model: 2 to 4 branches, each of one family, concatenated into a two-layer head.

- ``mlp``: Linear layers (LayerNorm or none, GELU/SiLU/Tanh/ReLU, dropout, residual adds where
  the widths agree) over a vector of features;
- ``conv1d``: Conv1d layers (kernels 3-7, BatchNorm1d or none, an activation, a max-pool halving
  the length now and then, residual adds) over a sequence of channels, average-pooled;
- ``conv2d``: Conv2d layers (3x3, BatchNorm2d or none, max-pools, residual adds) over an image,
  average-pooled or flattened;
- ``attention``: token embeddings and a learnt position table, pre-norm attention blocks (written
  with Linear layers, softmax and batched matmuls) with GELU MLPs, mean-pooled over the tokens;
- ``embedding``: an embedding table looked up by a bag of indices, mean-pooled, then a Linear.

Widths, depths, sequence lengths, image sizes, vocabularies and the mini-batch are drawn over
ranges that a 2-core CPU profiles and trains in seconds. A seed is either **activation-heavy**
(long sequences, large images, narrow layers) or **weight-heavy** (wide layers, large tables): the
first kind fills memory with what autograd saves, the second with weights and optimizer state.

The seeds are split in two, and the split is the point of the suite:

- :data:`DEV_SEEDS` may be looked at, debugged and tuned on;
- :data:`HELD_OUT_SEEDS` are only ever evaluated: no rule of the cost model, no profiler setting
  and no planner change may be made because of what one of them measured.

A seed is a workload for ``--model`` / ``--models``: ``benchmarks.model_suite:seed_17`` (the
module's ``seed_N`` attributes are made on demand); :func:`describe` says what it drew.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn as nn

#: seeds that may be looked at and tuned on
DEV_SEEDS = tuple(range(0, 6))
#: seeds evaluated, never tuned against
HELD_OUT_SEEDS = tuple(range(1000, 1008))
FAMILIES = ("mlp", "conv1d", "conv2d", "attention", "embedding")
CLASSES = 10
ACTIVATIONS = {"gelu": nn.GELU, "silu": nn.SiLU, "tanh": nn.Tanh, "relu": nn.ReLU}


@dataclass(frozen=True)
class BranchSpec:
    """One branch as drawn: its family and its sizes (``shape``: one sample's input)."""

    family: str
    depth: int
    width: int
    act: str
    norm: bool
    dropout: float
    residual: bool
    shape: tuple[int, ...]
    kernel: int = 3
    vocab: int = 0


@dataclass(frozen=True)
class ModelSpec:
    seed: int
    heavy: str  # "activations" | "weights"
    batch: int
    branches: tuple[BranchSpec, ...]
    head: int
    head_act: str
    extra: dict = field(default_factory=dict, compare=False)


def draw(seed: int) -> ModelSpec:
    """The model of ``seed`` (deterministic: Python's ``random.Random(seed)``)."""
    rng = random.Random(seed)
    heavy = rng.choice(("activations", "weights"))
    n = rng.randint(2, 4)
    families = [rng.choice(FAMILIES) for _ in range(n)]
    branches = tuple(_branch(rng, f, heavy) for f in families)
    return ModelSpec(
        seed=seed,
        heavy=heavy,
        batch=rng.choice((16, 32, 64)),
        branches=branches,
        head=rng.choice((64, 128, 256)),
        head_act=rng.choice(tuple(ACTIVATIONS)),
    )


def _branch(rng: random.Random, family: str, heavy: str) -> BranchSpec:
    act = rng.choice(tuple(ACTIVATIONS))
    dropout = rng.choice((0.0, 0.0, 0.1))
    residual = rng.random() < 0.5
    big = heavy == "weights"
    if family == "mlp":
        width = rng.choice((256, 512, 768) if big else (64, 128))
        return BranchSpec(family, rng.randint(2, 4), width, act, rng.random() < 0.5, dropout, residual, (width // 2,))
    if family == "conv1d":
        length = rng.choice((64, 128) if big else (256, 512))
        width = rng.choice((32, 64) if big else (16, 32))
        kernel = rng.choice((3, 5, 7))
        return BranchSpec(
            family, rng.randint(2, 4), width, act, rng.random() < 0.5, dropout, residual, (4, length), kernel
        )
    if family == "conv2d":
        side = rng.choice((8, 16) if big else (16, 32))
        width = rng.choice((32, 64) if big else (8, 16))
        return BranchSpec(family, rng.randint(2, 3), width, act, rng.random() < 0.5, dropout, residual, (3, side, side))
    if family == "attention":
        tokens = rng.choice((8, 16) if big else (32, 64))
        width = rng.choice((128, 256) if big else (32, 64))
        vocab = rng.choice((1000, 4000) if big else (200, 500))
        return BranchSpec(family, rng.randint(1, 2), width, "gelu", True, dropout, True, (tokens,), vocab=vocab)
    rows = rng.choice((20000, 50000) if big else (1000, 5000))
    width = rng.choice((64, 128) if big else (16, 32))
    bag = rng.choice((4, 8, 16))
    return BranchSpec("embedding", 1, width, act, False, 0.0, False, (bag,), vocab=rows)


class _Block(nn.Module):
    """A layer, an optional norm, an activation, an optional dropout, an optional residual add."""

    def __init__(self, layer: nn.Module, norm: nn.Module | None, act: str, dropout: float, residual: bool) -> None:
        super().__init__()
        self.layer = layer
        self.norm = norm if norm is not None else nn.Identity()
        self.act = ACTIVATIONS[act]()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()
        self.residual = residual

    def forward(self, x):
        y = self.drop(self.act(self.norm(self.layer(x))))
        return x + y if self.residual else y


class _Attention(nn.Module):
    """Pre-norm multi-head self-attention and a GELU MLP, each with its residual add."""

    def __init__(self, width: int, tokens: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.tokens, self.heads, self.dh = tokens, heads, width // heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x):
        t, h, dh = self.tokens, self.heads, self.dh
        q, k, v = self.qkv(self.norm1(x)).reshape(-1, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
        att = torch.softmax(q @ k.transpose(-2, -1) * dh**-0.5, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(-1, t, h * dh)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.down(self.act(self.up(self.norm2(x)))))


class _MeanTokens(nn.Module):
    def forward(self, x):
        return x.mean(dim=1)


def _build_branch(b: BranchSpec) -> tuple[nn.Module, int]:
    """The branch's module and its output width."""
    if b.family == "mlp":
        layers: list[nn.Module] = [nn.Linear(b.shape[0], b.width)]
        for _ in range(b.depth):
            norm = nn.LayerNorm(b.width) if b.norm else None
            layers.append(_Block(nn.Linear(b.width, b.width), norm, b.act, b.dropout, b.residual))
        return nn.Sequential(*layers), b.width
    if b.family in ("conv1d", "conv2d"):
        two = b.family == "conv2d"
        conv, bn = (nn.Conv2d, nn.BatchNorm2d) if two else (nn.Conv1d, nn.BatchNorm1d)
        k = 3 if two else b.kernel
        layers = [conv(b.shape[0], b.width, k, padding=k // 2)]
        for i in range(b.depth):
            norm = bn(b.width) if b.norm else None
            layers.append(_Block(conv(b.width, b.width, k, padding=k // 2), norm, b.act, b.dropout, b.residual))
            if i % 2 == 1:
                layers.append(nn.MaxPool2d(2) if two else nn.MaxPool1d(2))
        layers += [nn.AdaptiveAvgPool2d(1) if two else nn.AdaptiveAvgPool1d(1), nn.Flatten()]
        return nn.Sequential(*layers), b.width
    if b.family == "attention":
        tokens = b.shape[0]
        heads = 4 if b.width >= 64 else 2
        return nn.Sequential(
            _Embed(b.vocab, b.width, tokens),
            *[_Attention(b.width, tokens, heads, b.dropout) for _ in range(b.depth)],
            nn.LayerNorm(b.width),
            _MeanTokens(),
        ), b.width
    return nn.Sequential(
        _Embed(b.vocab, b.width, 0), _MeanTokens(), nn.Linear(b.width, b.width), ACTIVATIONS[b.act]()
    ), b.width


class _Embed(nn.Module):
    """An embedding lookup, plus a learnt position table when ``tokens`` > 0."""

    def __init__(self, rows: int, width: int, tokens: int) -> None:
        super().__init__()
        self.table = nn.Embedding(rows, width)
        self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02) if tokens else None

    def forward(self, idx):
        x = self.table(idx)
        return x + self.pos if self.pos is not None else x


class SuiteModel(nn.Module):
    """The branches of a :class:`ModelSpec`, concatenated into a two-layer head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        built = [_build_branch(b) for b in spec.branches]
        self.branches = nn.ModuleList(m for m, _ in built)
        self.head1 = nn.Linear(sum(w for _, w in built), spec.head)
        self.head_act = ACTIVATIONS[spec.head_act]()
        self.head2 = nn.Linear(spec.head, CLASSES)

    def forward(self, x0, x1, x2=None, x3=None):  # named inputs, as fx traces them (2 to 4 branches)
        inputs = (x0, x1, x2, x3)[: len(self.branches)]
        y = torch.cat([branch(x) for branch, x in zip(self.branches, inputs)], dim=1)
        return self.head2(self.head_act(self.head1(y)))


def _inputs(spec: ModelSpec, batch: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    out = []
    for b in spec.branches:
        if b.family in ("attention", "embedding"):
            out.append(torch.randint(0, b.vocab, (batch, *b.shape), generator=gen))
        else:
            out.append(torch.randn(batch, *b.shape, generator=gen))
    return tuple(out)


def workload(seed: int) -> SimpleNamespace:
    """The workload of ``seed``: ``model``, ``sample(batch_size, step)``, ``loss`` (cross-entropy,
    summed over samples), ``batch`` (its drawn mini-batch) and ``spec``."""
    spec = draw(seed)
    model = SuiteModel(spec)

    def sample(batch_size: int, step: int):
        gen = torch.Generator().manual_seed(seed * 7919 + step)
        return _inputs(spec, batch_size, gen), torch.randint(0, CLASSES, (batch_size,), generator=gen)

    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, target, reduction="sum")

    return SimpleNamespace(model=model, sample=sample, loss=loss, batch=spec.batch, spec=spec)


class _ConvTower(nn.Module):
    def __init__(self, kernel: int, act, dropout: float) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(4, 32, kernel, padding=kernel // 2)
        self.a1 = act()
        self.c2 = nn.Conv1d(32, 32, kernel, padding=kernel // 2)
        self.a2 = act()
        self.d = nn.Dropout(dropout) if dropout else nn.Identity()
        self.c3 = nn.Conv1d(32, 32, kernel, padding=kernel // 2)
        self.a3 = act()

    def forward(self, x):
        return self.a3(self.c3(self.d(self.a2(self.c2(self.a1(self.c1(x)))))))


class ConvTowers(nn.Module):
    """Two towers of 1-d convolutions (32 channels, length 256, kernels 3 and 5, GELU and ReLU, one
    with dropout) concatenated, average-pooled and fed to a two-layer head: the activation-heavy
    model whose pipelines of one-sample micro-batches once measured 2.4-4.3x their predicted memory.
    A development model (looked at and tuned on), outside the seeds."""

    def __init__(self) -> None:
        super().__init__()
        self.t1 = _ConvTower(3, nn.GELU, 0.0)
        self.t2 = _ConvTower(5, nn.ReLU, 0.1)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.h1 = nn.Linear(64, 64)
        self.h2 = nn.Linear(64, CLASSES)

    def forward(self, x):
        y = self.pool(torch.cat([self.t1(x), self.t2(x)], dim=1)).flatten(1)
        return self.h2(torch.relu(self.h1(y)))


def conv_towers() -> SimpleNamespace:
    """:class:`ConvTowers` as a workload (mini-batch 64 in the benchmarks)."""
    model = ConvTowers()

    def sample(batch_size: int, step: int):
        gen = torch.Generator().manual_seed(100 + step)
        return (torch.randn(batch_size, 4, 256, generator=gen),), torch.randint(
            0, CLASSES, (batch_size,), generator=gen
        )

    return SimpleNamespace(
        model=model, sample=sample, loss=lambda o, t: nn.functional.cross_entropy(o, t, reduction="sum"), batch=64
    )


def describe(seed: int) -> str:
    """One line: what ``seed`` drew."""
    s = draw(seed)
    parts = []
    for b in s.branches:
        size = "x".join(str(x) for x in b.shape)
        parts.append(
            f"{b.family}(d{b.depth} w{b.width} in {size}{' k' + str(b.kernel) if b.family == 'conv1d' else ''})"
        )
    return f"seed {seed}: {s.heavy}-heavy, batch {s.batch}, " + " + ".join(parts) + f" -> head {s.head}"


def specs(seeds) -> list[tuple[str, int]]:
    """``(MODULE:FUNCTION, mini-batch)`` for each seed, as ``--models`` takes them."""
    return [(f"benchmarks.model_suite:seed_{s}", draw(s).batch) for s in seeds]


def __getattr__(name: str):
    """``seed_N``: a function returning the workload of seed N (a ``MODULE:FUNCTION`` target)."""
    if name.startswith("seed_") and name[5:].isdigit():
        seed = int(name[5:])
        return lambda: workload(seed)
    raise AttributeError(name)
