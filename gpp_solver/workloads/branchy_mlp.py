"""Multi-branch feed-forward workloads: DLRM and CANDLE-Uno (GraphPipe A.2).

One sample is one row (no sequence dimension), so a micro-batch of ``b`` samples gives GEMMs of
``b`` rows: at small ``b`` streaming the weights dominates and time per sample falls steeply.
"""

from __future__ import annotations

from typing import Any

import gpp_solver.workloads.ops as ops
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.types import GRAPH_FORMAT, Graph
from gpp_solver.workloads.device import V100, DeviceProfile, node_dict, positive_int, powers_of_two


def _chain(
    nodes: list, edges: list, prefix: str, n_in: int, hidden: int, layers: int, dev: DeviceProfile, sizes: list[int]
) -> tuple[str, str]:
    """``layers`` linear+ReLU nodes ``<prefix>.fc0 .. fc<layers-1>``; returns (first id, last id)."""
    first = prev = ""
    for j in range(layers):
        nid = f"{prefix}.fc{j}"
        nodes.append(node_dict(nid, ops.linear(n_in if j == 0 else hidden, hidden, dev), dev, sizes, op="linear-relu"))
        if prev:
            edges.append({"src": prev, "dst": nid})
        else:
            first = nid
        prev = nid
    return first, prev


def dlrm_dict(
    dense_branches: int = 7,
    sparse_branches: int = 7,
    dense_layers: int = 4,
    hidden: int = 4096,
    dense_features: int = 4096,
    table_rows: int = 1_000_000,
    embed_dim: int = 64,
    bag_size: int = 100,
    top_layers: int = 4,
    max_micro_batch: int = 512,
    device: DeviceProfile = V100,
    name: str | None = None,
) -> dict[str, Any]:
    """DLRM as a gpp-graph/1 dict.

    Dense branches ``dense<i>.fc0 .. fc<dense_layers-1>`` (``dense_features -> hidden -> ...``),
    sparse branches ``sparse<i>.emb`` (embedding bag of ``table_rows x embed_dim``, ``bag_size``
    lookups concatenated), all into ``concat``, then ``interaction`` and ``top.fc0 ..
    fc<top_layers-1>``.  The paper does not specify the interaction; since dense (``hidden``) and
    sparse (``bag_size * embed_dim``) outputs differ in width, DLRM's pairwise dot product is not
    defined here, so ``interaction`` is a linear+ReLU of the concatenated features to ``hidden``.
    Nodes: ``dense_branches * dense_layers + sparse_branches + 2 + top_layers``; edges:
    ``dense_branches * dense_layers + sparse_branches + 1 + top_layers``.
    """
    for pname, v in (
        ("dense_branches", dense_branches),
        ("sparse_branches", sparse_branches),
        ("dense_layers", dense_layers),
        ("hidden", hidden),
        ("dense_features", dense_features),
        ("table_rows", table_rows),
        ("embed_dim", embed_dim),
        ("bag_size", bag_size),
        ("top_layers", top_layers),
        ("max_micro_batch", max_micro_batch),
    ):
        positive_int(v, pname)
    sizes = powers_of_two(max_micro_batch)
    nodes: list[dict] = []
    edges: list[dict] = []
    for i in range(dense_branches):
        _, last = _chain(nodes, edges, f"dense{i}", dense_features, hidden, dense_layers, device, sizes)
        edges.append({"src": last, "dst": "concat"})
    for i in range(sparse_branches):
        nid = f"sparse{i}.emb"
        nodes.append(
            node_dict(
                nid, ops.embedding_bag(table_rows, embed_dim, bag_size, device), device, sizes, op="embedding-bag"
            )
        )
        edges.append({"src": nid, "dst": "concat"})
    width = dense_branches * hidden + sparse_branches * bag_size * embed_dim
    nodes.append(node_dict("concat", ops.concat(width, device), device, sizes, op="concat"))
    nodes.append(node_dict("interaction", ops.linear(width, hidden, device), device, sizes, op="linear-relu"))
    edges.append({"src": "concat", "dst": "interaction"})
    first, _ = _chain(nodes, edges, "top", hidden, hidden, top_layers, device, sizes)
    edges.append({"src": "interaction", "dst": first})
    return {
        "format": GRAPH_FORMAT,
        "name": name or f"dlrm-{dense_branches}d{sparse_branches}s",
        "micro_batch_sizes": sizes,
        "nodes": nodes,
        "edges": edges,
        "extra": {"device": device.name},
    }


def candle_uno_dict(
    branches: int = 7,
    layers: int = 4,
    hidden: int = 4096,
    top_layers: int = 4,
    input_features: int = 4096,
    max_micro_batch: int = 4096,
    device: DeviceProfile = V100,
    name: str | None = None,
) -> dict[str, Any]:
    """CANDLE-Uno as a gpp-graph/1 dict.

    ``branches`` feature branches ``b<i>.fc0 .. fc<layers-1>`` (``input_features -> hidden -> ...``),
    ``concat`` (``branches * hidden``), then ``top.fc0 .. fc<top_layers-1>`` (the first maps
    ``branches * hidden -> hidden``).  The paper gives no top-layer count; 4 is our default.
    Nodes: ``branches * layers + 1 + top_layers``; edges: ``branches * layers + top_layers``.
    """
    for pname, v in (
        ("branches", branches),
        ("layers", layers),
        ("hidden", hidden),
        ("top_layers", top_layers),
        ("input_features", input_features),
        ("max_micro_batch", max_micro_batch),
    ):
        positive_int(v, pname)
    sizes = powers_of_two(max_micro_batch)
    nodes: list[dict] = []
    edges: list[dict] = []
    for i in range(branches):
        _, last = _chain(nodes, edges, f"b{i}", input_features, hidden, layers, device, sizes)
        edges.append({"src": last, "dst": "concat"})
    nodes.append(node_dict("concat", ops.concat(branches * hidden, device), device, sizes, op="concat"))
    first, _ = _chain(nodes, edges, "top", branches * hidden, hidden, top_layers, device, sizes)
    edges.append({"src": "concat", "dst": first})
    return {
        "format": GRAPH_FORMAT,
        "name": name or f"candle-uno-{branches}",
        "micro_batch_sizes": sizes,
        "nodes": nodes,
        "edges": edges,
        "extra": {"device": device.name},
    }


def dlrm(**params: Any) -> Graph:
    """DLRM (GraphPipe A.2): see :func:`dlrm_dict`."""
    return graph_from_dict(dlrm_dict(**params))


def candle_uno(**params: Any) -> Graph:
    """CANDLE-Uno (GraphPipe A.2): see :func:`candle_uno_dict`."""
    return graph_from_dict(candle_uno_dict(**params))
