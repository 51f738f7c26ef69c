"""Transformer workloads: the Multi-Modal Transformer (GraphPipe A.2, Fig. 10) and the sequential
Transformer of A.3.

Each Transformer layer is three nodes ``<p>l<j>.attn -> <p>l<j>.fc1 -> <p>l<j>.fc2`` plus the
residual edge ``attn -> fc2`` (fc2 adds the attention block's output back in).
"""

from __future__ import annotations

from typing import Any

import gpp_solver.workloads.ops as ops
from gpp_solver.errors import InvalidInputError
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.types import GRAPH_FORMAT, Graph
from gpp_solver.workloads.device import V100, DeviceProfile, node_dict, positive_int, powers_of_two


def _check(
    layers_name: str, layers: int, seq: int, hidden: int, heads: int, ffn: int, vocab: int, max_micro_batch: int
) -> None:
    for name, v in (
        (layers_name, layers),
        ("seq", seq),
        ("hidden", hidden),
        ("heads", heads),
        ("ffn", ffn),
        ("vocab", vocab),
        ("max_micro_batch", max_micro_batch),
    ):
        positive_int(v, name)
    if hidden % heads:
        raise InvalidInputError(f"`hidden % heads == 0` must hold, but got (hidden={hidden}, heads={heads})")


def _layer(
    nodes: list,
    edges: list,
    prefix: str,
    prev: str,
    seq: int,
    hidden: int,
    heads: int,
    ffn: int,
    dev: DeviceProfile,
    sizes: list[int],
) -> str:
    """Append one layer after node ``prev``; return the id of its last node."""
    attn, fc1, fc2 = f"{prefix}.attn", f"{prefix}.fc1", f"{prefix}.fc2"
    nodes.append(node_dict(attn, ops.attention(seq, hidden, heads, dev), dev, sizes, op="attention"))
    nodes.append(node_dict(fc1, ops.ffn_in(seq, hidden, ffn, dev), dev, sizes, op="ffn-in"))
    nodes.append(node_dict(fc2, ops.ffn_out(seq, hidden, ffn, dev), dev, sizes, op="ffn-out"))
    edges.extend(
        [{"src": prev, "dst": attn}, {"src": attn, "dst": fc1}, {"src": fc1, "dst": fc2}, {"src": attn, "dst": fc2}]
    )
    return fc2


def mmt_dict(
    branches: int = 4,
    layers: int = 8,
    seq: int = 256,
    hidden: int = 1024,
    heads: int = 16,
    ffn: int = 4096,
    vocab: int = 32000,
    max_micro_batch: int = 64,
    device: DeviceProfile = V100,
    name: str | None = None,
) -> dict[str, Any]:
    """Multi-Modal Transformer as a gpp-graph/1 dict.

    ``branches`` parallel branches ``b<i>.embed -> b<i>.l0.* -> ... -> b<i>.l<layers-1>.*``, whose
    outputs are concatenated (``concat``, ``branches * hidden`` per token) and fed to ``head``
    (a linear ``branches * hidden -> hidden`` per token).
    Nodes: ``branches * (1 + 3 layers) + 2``; edges: ``branches * (4 layers + 1) + 1``.
    """
    positive_int(branches, "branches")
    _check("layers", layers, seq, hidden, heads, ffn, vocab, max_micro_batch)
    sizes = powers_of_two(max_micro_batch)
    nodes: list[dict] = []
    edges: list[dict] = []
    for i in range(branches):
        prev = f"b{i}.embed"
        nodes.append(node_dict(prev, ops.token_embedding(seq, hidden, vocab, device), device, sizes, op="embedding"))
        for j in range(layers):
            prev = _layer(nodes, edges, f"b{i}.l{j}", prev, seq, hidden, heads, ffn, device, sizes)
        edges.append({"src": prev, "dst": "concat"})
    nodes.append(node_dict("concat", ops.concat(branches * seq * hidden, device), device, sizes, op="concat"))
    nodes.append(
        node_dict(
            "head", ops.linear(branches * hidden, hidden, device, rows=seq, relu=False), device, sizes, op="linear"
        )
    )
    edges.append({"src": "concat", "dst": "head"})
    return {
        "format": GRAPH_FORMAT,
        "name": name or f"mmt-{branches}x{layers}",
        "micro_batch_sizes": sizes,
        "nodes": nodes,
        "edges": edges,
        "extra": {"device": device.name},
    }


def transformer_dict(
    layers: int = 32,
    seq: int = 256,
    hidden: int = 1024,
    heads: int = 16,
    ffn: int = 4096,
    vocab: int = 32000,
    max_micro_batch: int = 64,
    device: DeviceProfile = V100,
    name: str | None = None,
) -> dict[str, Any]:
    """Sequential Transformer (GraphPipe A.3) as a gpp-graph/1 dict: ``embed -> l0.* -> ... -> head``.

    Nodes: ``3 layers + 2``; edges: ``4 layers + 1``.
    """
    _check("layers", layers, seq, hidden, heads, ffn, vocab, max_micro_batch)
    sizes = powers_of_two(max_micro_batch)
    nodes = [node_dict("embed", ops.token_embedding(seq, hidden, vocab, device), device, sizes, op="embedding")]
    edges: list[dict] = []
    prev = "embed"
    for j in range(layers):
        prev = _layer(nodes, edges, f"l{j}", prev, seq, hidden, heads, ffn, device, sizes)
    nodes.append(
        node_dict("head", ops.linear(hidden, hidden, device, rows=seq, relu=False), device, sizes, op="linear")
    )
    edges.append({"src": prev, "dst": "head"})
    return {
        "format": GRAPH_FORMAT,
        "name": name or f"transformer-{layers}",
        "micro_batch_sizes": sizes,
        "nodes": nodes,
        "edges": edges,
        "extra": {"device": device.name},
    }


def mmt(**params: Any) -> Graph:
    """Multi-Modal Transformer (GraphPipe A.2): see :func:`mmt_dict`."""
    return graph_from_dict(mmt_dict(**params))


def transformer(**params: Any) -> Graph:
    """Sequential Transformer (GraphPipe A.3): see :func:`transformer_dict`."""
    return graph_from_dict(transformer_dict(**params))
