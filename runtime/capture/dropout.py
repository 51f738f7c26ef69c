"""Dropout with one reproducible random stream per (seed, step, chunk of samples, node).

The pipeline computes a dropout node on chunks of samples (a replica's share of a micro-batch),
so torch's global RNG would draw masks that depend on the plan, repeat across data-parallel
replicas (every rank seeds alike) and differ from one-process training. ``per_chunk`` rewrites
each ``nn.Dropout`` module and ``F.dropout`` call of a traced model into ``ChunkDropout``, whose
mask for samples ``[lo, hi)`` comes from a generator seeded by ``(seed, step, lo, node id)``.
The executor sets ``lo`` per chunk; the one-process reference (``verify``) splits the mini-batch
into the same chunks per node (``Context.chunk_rows``), so both draw identical masks, and two
replicas (different ``lo``) draw different ones.

Dropout inside a module traced whole (a leaf: ``nn.MultiheadAttention``'s attention dropout, an
``nn.TransformerEncoderLayer``, a workload's ``leaf_modules``) is out of reach of that rewrite: it
draws from torch's global RNG, and its masks would depend on the micro-batch size.  ``per_chunk``
wraps such a module in ``ChunkSeeded``, which runs it once per chunk with the global RNG forked and
seeded by the same ``(seed, step, lo, node id)``; the reference splits the module's inputs into
the same chunks (rows of every tensor argument with the input's row count) and concatenates the
outputs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
import torch.utils._pytree as pytree
from torch import nn


@dataclass(frozen=True)
class Context:
    """What a ChunkDropout reads: the seed, the step, the chunk's first sample (pipeline) or
    each node's chunk size (reference over a whole mini-batch)."""

    seed: int = 0
    step: int = 0
    lo: int = 0
    chunk_rows: dict | None = None


_current = Context()


def set_context(ctx: Context) -> None:
    """Set the context the next forward's dropout nodes read."""
    global _current
    _current = ctx


def _seed(seed: int, step: int, lo: int, node: str) -> int:
    h = hashlib.blake2b(f"{seed}/{step}/{lo}/{node}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & ((1 << 63) - 1)


def _mask(shape, p: float, seed: int, device, dtype) -> torch.Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    keep = torch.rand(shape, generator=g, device=device) >= p
    return keep.to(dtype) / (1.0 - p)


def chunk_dropout(x: torch.Tensor, p: float, node: str, training: bool = True) -> torch.Tensor:
    """Dropout of ``x`` (rows = samples) with per-chunk masks from the current Context."""
    if not training or p == 0.0:
        return x
    if p >= 1.0:
        return x * 0.0
    ctx = _current
    rows = x.shape[0]
    size = ctx.chunk_rows.get(node, rows) if ctx.chunk_rows is not None else rows
    masks = []
    for lo in range(0, rows, size):
        n = min(size, rows - lo)
        masks.append(_mask((n, *x.shape[1:]), p, _seed(ctx.seed, ctx.step, ctx.lo + lo, node), x.device, x.dtype))
    return x * (masks[0] if len(masks) == 1 else torch.cat(masks))


class ChunkDropout(nn.Module):
    """Stands in for ``nn.Dropout`` module ``node``; follows ``self.training`` like it."""

    def __init__(self, p: float, node: str) -> None:
        super().__init__()
        self.p = p
        self.node = node

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return chunk_dropout(x, self.p, self.node, self.training)


def is_stochastic(mod: nn.Module) -> bool:
    """Whether ``mod`` (traced whole) draws random numbers in training: a dropout submodule or an
    attention with a dropout probability above 0."""
    for m in mod.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return True
        if isinstance(m, nn.MultiheadAttention) and m.dropout > 0:
            return True
    return False


def _rows_of(value, rows: int, lo: int, hi: int):
    """``value`` with every tensor of ``rows`` rows cut to rows ``[lo, hi)``."""
    return pytree.tree_map(
        lambda t: t[lo:hi] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == rows else t, value
    )


def _seeded_call(mod: nn.Module, seed: int, args, kwargs):
    cuda = sorted(
        {t.device.index or 0 for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_cuda}
    )
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        return mod(*args, **kwargs)


def _cat_rows(outs: list):
    """Outputs of the chunks joined along rows (tensors); other leaves from the first chunk."""
    if len(outs) == 1:
        return outs[0]
    flat = [pytree.tree_flatten(o) for o in outs]
    spec = flat[0][1]
    cols = zip(*(f[0] for f in flat))
    return pytree.tree_unflatten(
        [torch.cat(c) if isinstance(c[0], torch.Tensor) and c[0].dim() else c[0] for c in cols], spec
    )


class ChunkSeeded(nn.Module):
    """Stands in for a stochastic module ``node`` traced whole: each chunk of samples runs it with
    the global RNG seeded by ``(seed, step, chunk's first sample, node)`` and restored after."""

    def __init__(self, inner: nn.Module, node: str) -> None:
        super().__init__()
        self.inner = inner
        self.node = node

    def forward(self, *args, **kwargs):
        if not self.training:
            return self.inner(*args, **kwargs)
        ctx = _current
        first = next((t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim()), None)
        if first is None:
            return _seeded_call(self.inner, _seed(ctx.seed, ctx.step, ctx.lo, self.node), args, kwargs)
        rows = first.shape[0]
        size = ctx.chunk_rows.get(self.node, rows) if ctx.chunk_rows is not None else rows
        outs = []
        for lo in range(0, rows, size):
            hi = min(rows, lo + size)
            a, k = _rows_of((args, kwargs), rows, lo, hi) if size < rows else (args, kwargs)
            outs.append(_seeded_call(self.inner, _seed(ctx.seed, ctx.step, ctx.lo + lo, self.node), a, k))
        return _cat_rows(outs)


def per_chunk(gm: fx.GraphModule, ids: dict) -> int:
    """Rewrite ``gm``'s dropout nodes in place (``ids``: node -> node id); returns how many."""
    count = 0
    for n in gm.graph.nodes:
        if n.op == "call_module" and type(gm.get_submodule(n.target)) is nn.Dropout:
            mod = gm.get_submodule(n.target)
            drop = ChunkDropout(mod.p, ids.get(n, n.name))
            drop.train(mod.training)
            parent, _, leaf = str(n.target).rpartition(".")
            setattr(gm.get_submodule(parent) if parent else gm, leaf, drop)
            count += 1
        elif n.op == "call_module" and is_stochastic(gm.get_submodule(n.target)):
            mod = gm.get_submodule(n.target)
            wrapped = ChunkSeeded(mod, ids.get(n, n.name))
            wrapped.train(mod.training)
            parent, _, leaf = str(n.target).rpartition(".")
            setattr(gm.get_submodule(parent) if parent else gm, leaf, wrapped)
            count += 1
        elif n.op == "call_function" and n.target in (F.dropout, torch.dropout):
            args = list(n.args) + [None] * 3
            p = n.kwargs.get("p", args[1] if args[1] is not None else 0.5)
            training = n.kwargs.get("training", n.kwargs.get("train", args[2] if args[2] is not None else True))
            n.target = chunk_dropout
            n.args = (n.args[0],)
            n.kwargs = {"p": float(p), "node": ids.get(n, n.name), "training": bool(training)}
            count += 1
    if count:
        gm.recompile()
    return count
