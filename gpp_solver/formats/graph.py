"""Read, validate and write ``gpp-graph/1`` documents; convert from/to ``networkx.DiGraph``.

Every rejection listed in ``docs/formats.md`` raises :class:`InvalidGraphError` with one message
naming the node or edge: duplicate ids, edges to unknown ids, self-loops, cycles (one cycle named),
negative or non-finite numbers, time lists of the wrong length, an empty or disconnected graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx

from gpp_solver.errors import InvalidGraphError
from gpp_solver.formats.jsonio import document, extra, integer, known_fields, number, read_json, require, write_json
from gpp_solver.limits import MAX_BYTES, MAX_COUNT, MAX_SECONDS, MIN_SECONDS
from gpp_solver.types import GRAPH_FORMAT, Edge, Graph, Node, Tmpc

E = InvalidGraphError
_GRAPH_FIELDS = frozenset(
    {
        "format",
        "name",
        "micro_batch_sizes",
        "nodes",
        "edges",
        "extra",
        "op_overhead",
        "optimizer_time_per_byte",
        "step_time_per_sample",
        "step_time_fixed",
        "grad_accumulation_time_per_byte",
        "split_backward_overhead",
    }
)
_NODE_FIELDS = frozenset(
    {
        "id",
        "fw_time",
        "bw_time",
        "bw_weight_time",
        "weight_bytes",
        "activation_bytes",
        "output_bytes",
        "workspace_bytes",
        "weight_copy_bytes",
        "grad_views",
        "tmpc",
        "extra",
    }
)
_TMPC_FIELDS = frozenset(
    {"t", "recompute", "fw_time", "bw_time", "bw_weight_time", "weight_bytes", "activation_bytes", "extra"}
)
_EDGE_FIELDS = frozenset({"src", "dst", "bytes", "extra"})


def _bytes(value: Any, where: str) -> float:
    return number(value, where, E, maximum=MAX_BYTES)


def _times(value: Any, where: str, n: int) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise E(f"{where} must be a list of {n} numbers, got {value!r}")
    if len(value) != n:
        raise E(f"{where} has {len(value)} entries but micro_batch_sizes has {n}")
    return tuple(
        number(v, f"{where}[{i}]", E, maximum=MAX_SECONDS, minimum_nonzero=MIN_SECONDS) for i, v in enumerate(value)
    )


def _workspace(d: Mapping[str, Any], where: str, n: int) -> float | tuple[float, ...] | None:
    """The optional ``workspace_bytes``: bytes per sample, one number for every size or a list of
    one per micro-batch size."""
    if "workspace_bytes" not in d:
        return None
    value, where = d["workspace_bytes"], f"{where}.workspace_bytes"
    if not isinstance(value, list):
        return _bytes(value, where)
    if len(value) != n:
        raise E(f"{where} has {len(value)} entries but micro_batch_sizes has {n}")
    return tuple(_bytes(v, f"{where}[{i}]") for i, v in enumerate(value))


def _weight_times(d: Mapping[str, Any], bw: tuple[float, ...], where: str, n: int) -> tuple[float, ...] | None:
    """The optional ``bw_weight_time`` list: same shape as ``bw_time``, each entry at most its ``bw_time``."""
    if "bw_weight_time" not in d:
        return None
    w = _times(d["bw_weight_time"], f"{where}.bw_weight_time", n)
    for i, (wi, bi) in enumerate(zip(w, bw)):
        if wi > bi:
            raise E(
                f"{where}.bw_weight_time[{i}] = {wi:.6g} exceeds bw_time[{i}] = {bi:.6g} (the weight "
                "gradient is a part of the backward pass)"
            )
    return w


def _flag(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise E(f"{where} must be true or false, got {v!r}")
    return v


def _tmpc(d: Any, where: str, n: int) -> Tmpc:
    if not isinstance(d, dict):
        raise E(f"{where} must be an object")
    known_fields(d, _TMPC_FIELDS, where, E)
    t = integer(d.get("t", 1), f"{where}.t", E, minimum=1, maximum=MAX_COUNT)
    rec = d.get("recompute", False)
    if not isinstance(rec, bool):
        raise E(f"{where}.recompute must be true or false, got {rec!r}")
    bw = _times(require(d, "bw_time", where, E), f"{where}.bw_time", n)
    return Tmpc(
        t=t,
        recompute=rec,
        fw_time=_times(require(d, "fw_time", where, E), f"{where}.fw_time", n),
        bw_time=bw,
        bw_weight_time=_weight_times(d, bw, where, n),
        weight_bytes=_bytes(require(d, "weight_bytes", where, E), f"{where}.weight_bytes"),
        activation_bytes=_bytes(require(d, "activation_bytes", where, E), f"{where}.activation_bytes"),
        extra=extra(d, where, E),
    )


def _micro_batch_sizes(d: dict) -> tuple[int, ...]:
    """The document's ``micro_batch_sizes``: a non-empty, strictly increasing list of positive integers."""
    sizes_raw = require(d, "micro_batch_sizes", "graph", E)
    if not isinstance(sizes_raw, list) or not sizes_raw:
        raise E("graph: micro_batch_sizes must be a non-empty list of positive integers")
    sizes = tuple(
        integer(s, f"graph: micro_batch_sizes[{i}]", E, minimum=1, maximum=MAX_COUNT) for i, s in enumerate(sizes_raw)
    )
    for i in range(1, len(sizes)):
        if sizes[i] <= sizes[i - 1]:
            raise E(f"graph: micro_batch_sizes must be strictly increasing, got {list(sizes)}")
    return sizes


def _edges(d: dict, ids: set[str]) -> list[Edge]:
    """The document's ``edges`` (objects, or the compact ``[src, dst]`` pairs) between the node ``ids``."""
    edges_raw = d.get("edges", [])
    if not isinstance(edges_raw, list):
        raise E("graph: edges must be a list")
    edges: list[Edge] = []
    for i, ed in enumerate(edges_raw):
        if isinstance(ed, list) and len(ed) == 2:  # tolerate the compact [src, dst] form
            ed = {"src": ed[0], "dst": ed[1]}
        src = require(ed, "src", f"edge #{i}", E)
        dst = require(ed, "dst", f"edge #{i}", E)
        known_fields(ed, _EDGE_FIELDS, f"edge #{i}", E)
        extra(ed, f"edge #{i}", E)
        where = f"edge {src!r} -> {dst!r}"
        for end in (src, dst):
            if not isinstance(end, str) or end not in ids:
                raise E(f"{where} refers to unknown node {end!r}")
        if src == dst:
            raise E(f"{where} is a self-loop")
        b = ed.get("bytes")
        edges.append(Edge(src, dst, None if b is None else _bytes(b, f"{where}.bytes")))
    return edges


def graph_from_dict(d: Any) -> Graph:
    """Validate a ``gpp-graph/1`` document and return a :class:`Graph`.

    A field the format does not define is an error naming it; extensions go under an ``extra`` object
    (of the graph, a node, a ``tmpc`` entry or an edge), kept in ``.extra`` (an edge's is not kept)."""
    document(d, "graph", _GRAPH_FIELDS, GRAPH_FORMAT, E)
    name = d.get("name", "graph")
    if not isinstance(name, str):
        raise E(f"graph: name must be a string, got {name!r}")
    sizes = _micro_batch_sizes(d)
    n = len(sizes)
    nodes_raw = require(d, "nodes", "graph", E)
    if not isinstance(nodes_raw, list):
        raise E("graph: nodes must be a list")
    if not nodes_raw:
        raise E("graph is empty: it has no nodes")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, nd in enumerate(nodes_raw):
        where = f"node #{i}"
        nid = require(nd, "id", where, E)
        if not isinstance(nid, str) or not nid:
            raise E(f"{where}: id must be a non-empty string, got {nid!r}")
        where = f"node '{nid}'"
        known_fields(nd, _NODE_FIELDS, where, E)
        if nid in seen:
            raise E(f"duplicate node id '{nid}'")
        seen.add(nid)
        tm = nd.get("tmpc", [])
        if not isinstance(tm, list):
            raise E(f"{where}.tmpc must be a list")
        bw = _times(require(nd, "bw_time", where, E), f"{where}.bw_time", n)
        nodes.append(
            Node(
                id=nid,
                fw_time=_times(require(nd, "fw_time", where, E), f"{where}.fw_time", n),
                bw_time=bw,
                bw_weight_time=_weight_times(nd, bw, where, n),
                weight_bytes=_bytes(require(nd, "weight_bytes", where, E), f"{where}.weight_bytes"),
                activation_bytes=_bytes(require(nd, "activation_bytes", where, E), f"{where}.activation_bytes"),
                output_bytes=_bytes(require(nd, "output_bytes", where, E), f"{where}.output_bytes"),
                workspace_bytes=_workspace(nd, where, n),
                weight_copy_bytes=_bytes(nd.get("weight_copy_bytes", 0), f"{where}.weight_copy_bytes"),
                grad_views=_flag(nd.get("grad_views", False), f"{where}.grad_views"),
                tmpc=tuple(_tmpc(t, f"{where}.tmpc[{j}]", n) for j, t in enumerate(tm)),
                extra=extra(nd, where, E),
            )
        )
    edges = _edges(d, seen)
    g = Graph(
        name=name,
        micro_batch_sizes=sizes,
        nodes=tuple(nodes),
        edges=tuple(edges),
        extra=extra(d, "graph", E),
        **_calibration(d),
    )
    _check_structure(g)
    return g


def _calibration(d: dict) -> dict[str, Any]:
    """The optional time-model terms of a graph (``op_overhead``, ``optimizer_time_per_byte``,
    ``step_time_per_sample``, ``step_time_fixed``, ``grad_accumulation_time_per_byte``) as
    :class:`Graph` keyword arguments; absent fields are left to the defaults (no term)."""
    out: dict[str, Any] = {}
    if "op_overhead" in d:
        oh = d["op_overhead"]
        if not isinstance(oh, dict) or set(oh) != {"fw", "bw"}:
            raise E(f"graph: op_overhead must be an object {{\"fw\": seconds, \"bw\": seconds}}, got {oh!r}")
        out["op_overhead"] = tuple(
            number(oh[k], f"graph: op_overhead.{k}", E, maximum=MAX_SECONDS) for k in ("fw", "bw")
        )
    if "optimizer_time_per_byte" in d:
        out["optimizer_time_per_byte"] = number(
            d["optimizer_time_per_byte"], "graph: optimizer_time_per_byte", E, maximum=MAX_SECONDS
        )
    if "step_time_per_sample" in d:
        out["step_time_per_sample"] = number(
            d["step_time_per_sample"], "graph: step_time_per_sample", E, maximum=MAX_SECONDS
        )
    if "step_time_fixed" in d:
        out["step_time_fixed"] = number(d["step_time_fixed"], "graph: step_time_fixed", E, maximum=MAX_SECONDS)
    if "grad_accumulation_time_per_byte" in d:
        out["grad_accumulation_time_per_byte"] = number(
            d["grad_accumulation_time_per_byte"], "graph: grad_accumulation_time_per_byte", E, maximum=MAX_SECONDS
        )
    if "split_backward_overhead" in d:
        sb = d["split_backward_overhead"]
        keys = ("call", "node", "walk")
        if not isinstance(sb, dict) or set(sb) != set(keys):
            raise E(
                'graph: split_backward_overhead must be an object {"call": seconds, "node": seconds, '
                f'"walk": seconds}}, got {sb!r}'
            )
        out["split_backward_overhead"] = tuple(
            number(sb[k], f"graph: split_backward_overhead.{k}", E, maximum=MAX_SECONDS) for k in keys
        )
    return out


def _check_structure(g: Graph) -> None:
    nxg = nx.DiGraph()
    nxg.add_nodes_from(g.ids)
    nxg.add_edges_from((e.src, e.dst) for e in g.edges)
    cycle = None
    if not nx.is_directed_acyclic_graph(nxg):  # a topological sort: find_cycle's search costs 300x more
        cycle = nx.find_cycle(nxg)
    if cycle:
        names = [u for u, _ in cycle] + [cycle[0][0]]
        raise E("graph has a cycle: " + " -> ".join(names))
    if len(g.ids) > 1 and not nx.is_weakly_connected(nxg):
        comps = sorted(nx.weakly_connected_components(nxg), key=lambda c: min(g.index[x] for x in c))
        other = min(comps[1], key=lambda x: g.index[x])
        raise E(
            f"graph is disconnected: node '{other}' is not connected to node '{g.ids[0]}' "
            f"({len(comps)} weakly connected components)"
        )


def graph_to_dict(g: Graph) -> dict[str, Any]:
    """The ``gpp-graph/1`` document of ``g`` (round-trips with :func:`graph_from_dict`)."""
    nodes = []
    for n in g.nodes:
        nd: dict[str, Any] = {
            "id": n.id,
            "fw_time": list(n.fw_time),
            "bw_time": list(n.bw_time),
            "weight_bytes": n.weight_bytes,
            "activation_bytes": n.activation_bytes,
            "output_bytes": n.output_bytes,
        }
        if n.bw_weight_time is not None:
            nd["bw_weight_time"] = list(n.bw_weight_time)
        if n.workspace_bytes is not None:
            ws = n.workspace_bytes
            nd["workspace_bytes"] = list(ws) if isinstance(ws, tuple) else ws
        if n.weight_copy_bytes:
            nd["weight_copy_bytes"] = n.weight_copy_bytes
        if n.grad_views:
            nd["grad_views"] = True
        if n.tmpc:
            nd["tmpc"] = [
                {
                    "t": t.t,
                    "recompute": t.recompute,
                    "fw_time": list(t.fw_time),
                    "bw_time": list(t.bw_time),
                    "weight_bytes": t.weight_bytes,
                    "activation_bytes": t.activation_bytes,
                    **({"bw_weight_time": list(t.bw_weight_time)} if t.bw_weight_time is not None else {}),
                    **({"extra": dict(t.extra)} if t.extra else {}),
                }
                for t in n.tmpc
            ]
        if n.extra:
            nd["extra"] = dict(n.extra)
        nodes.append(nd)
    edges = []
    for e in g.edges:
        ed: dict[str, Any] = {"src": e.src, "dst": e.dst}
        if e.bytes is not None:
            ed["bytes"] = e.bytes
        edges.append(ed)
    out = {
        "format": GRAPH_FORMAT,
        "name": g.name,
        "micro_batch_sizes": list(g.micro_batch_sizes),
        "nodes": nodes,
        "edges": edges,
    }
    out.update(_terms_to_dict(g))
    if g.extra:
        out["extra"] = dict(g.extra)
    return out


def _terms_to_dict(g: Graph) -> dict[str, Any]:
    """The graph's time-model terms as ``gpp-graph/1`` fields; absent (zero) terms are left out."""
    out: dict[str, Any] = {}
    if g.op_overhead != (0.0, 0.0):
        out["op_overhead"] = {"fw": g.op_overhead[0], "bw": g.op_overhead[1]}
    if g.optimizer_time_per_byte:
        out["optimizer_time_per_byte"] = g.optimizer_time_per_byte
    if g.step_time_per_sample:
        out["step_time_per_sample"] = g.step_time_per_sample
    if g.step_time_fixed:
        out["step_time_fixed"] = g.step_time_fixed
    if g.grad_accumulation_time_per_byte:
        out["grad_accumulation_time_per_byte"] = g.grad_accumulation_time_per_byte
    if any(g.split_backward_overhead):
        out["split_backward_overhead"] = dict(zip(("call", "node", "walk"), g.split_backward_overhead))
    return out


def load_graph(path: str | Path) -> Graph:
    return graph_from_dict(read_json(path, "graph", E))


def save_graph(g: Graph, path: str | Path) -> None:
    write_json(graph_to_dict(g), path)


def as_graph(obj: Any) -> Graph:
    """Accept a :class:`Graph`, a ``gpp-graph/1`` dict, a path, or a ``networkx.DiGraph``."""
    if isinstance(obj, Graph):
        return obj
    if isinstance(obj, dict):
        return graph_from_dict(obj)
    if isinstance(obj, (str, Path)):
        return load_graph(obj)
    if isinstance(obj, nx.DiGraph):
        return graph_from_networkx(obj)
    raise E(f"cannot read a graph from {type(obj).__name__}")


def graph_from_networkx(
    G: nx.DiGraph,
    *,
    name: str | None = None,
    micro_batch_sizes: tuple[int, ...] | list[int] = (1,),
    fw_time: str = "fw_time",
    bw_time: str = "bw_time",
    weight_bytes: str = "weight_bytes",
    activation_bytes: str = "activation_bytes",
    output_bytes: str = "output_bytes",
    edge_bytes: str = "bytes",
) -> Graph:
    """Build a graph from a DiGraph whose node attributes carry the costs.

    A scalar time attribute is accepted when there is one micro-batch size.  Node ids are
    converted with ``str``.  Missing byte attributes default to 0.
    """
    sizes = list(micro_batch_sizes)

    def times(v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return [v] * len(sizes) if len(sizes) == 1 else v
        return list(v) if isinstance(v, (list, tuple)) else v

    nodes = []
    for n, a in G.nodes(data=True):
        if fw_time not in a or bw_time not in a:
            raise E(f"node '{n}': networkx attributes '{fw_time}' and '{bw_time}' are required")
        nodes.append(
            {
                "id": str(n),
                "fw_time": times(a[fw_time]),
                "bw_time": times(a[bw_time]),
                "weight_bytes": a.get(weight_bytes, 0),
                "activation_bytes": a.get(activation_bytes, 0),
                "output_bytes": a.get(output_bytes, 0),
            }
        )
    edges = []
    for u, v, a in G.edges(data=True):
        ed = {"src": str(u), "dst": str(v)}
        if a.get(edge_bytes) is not None:
            ed["bytes"] = a[edge_bytes]
        edges.append(ed)
    return graph_from_dict(
        {
            "format": GRAPH_FORMAT,
            "name": name or G.graph.get("name", "graph"),
            "micro_batch_sizes": sizes,
            "nodes": nodes,
            "edges": edges,
        }
    )


def graph_to_networkx(g: Graph) -> nx.DiGraph:
    return g.to_networkx()
