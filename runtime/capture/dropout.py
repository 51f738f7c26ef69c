"""Dropout with one reproducible random stream per (seed, step, chunk of samples, node).

The pipeline computes a dropout node on chunks of samples (a replica's share of a micro-batch),
so torch's global RNG would draw masks that depend on the plan, repeat across data-parallel
replicas (every rank seeds alike) and differ from one-process training. ``per_chunk`` rewrites
each ``nn.Dropout`` module and ``F.dropout`` call of a traced model into ``ChunkDropout``, whose
mask for samples ``[lo, hi)`` comes from a generator seeded by ``(seed, step, lo, node id)``.
The executor sets ``lo`` per chunk; the one-process reference (``verify``) splits the mini-batch
into the same chunks per node (``Context.chunk_rows``), so both draw identical masks, and two
replicas (different ``lo``) draw different ones.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
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
        masks.append(_mask((n, *x.shape[1:]), p, _seed(ctx.seed, ctx.step, ctx.lo + lo, node),
                           x.device, x.dtype))
    return x * (masks[0] if len(masks) == 1 else torch.cat(masks))


class ChunkDropout(nn.Module):
    """Stands in for ``nn.Dropout`` module ``node``; follows ``self.training`` like it."""

    def __init__(self, p: float, node: str) -> None:
        super().__init__()
        self.p = p
        self.node = node

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return chunk_dropout(x, self.p, self.node, self.training)


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
