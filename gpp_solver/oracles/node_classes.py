"""The node classes of the TPS lower bound's MILP (:mod:`gpp_solver.oracles.tps_bound`, step 6):
nodes grouped by identical figures, and the nodes alone in their class with their edges (step 6b)."""

from __future__ import annotations

from dataclasses import dataclass

from gpp_solver.types import Graph


def node_classes(graph: Graph) -> list[list[int]]:
    """Node indices grouped by identical (fw times, bw times, weight, activation bytes)."""
    groups: dict[tuple, list[int]] = {}
    for i, n in enumerate(graph.nodes):
        groups.setdefault((n.fw_time, n.bw_time, n.weight_bytes, n.activation_bytes), []).append(i)
    return list(groups.values())


@dataclass(frozen=True)
class Watched:
    """A node alone in its class (step 6b): its in-neighbours per class and its out-edges."""

    cls: int  # its own class
    ins: tuple[tuple[int, int, float], ...]  # (class c, m = |U_{v,c}|, least bytes of those edges)
    outs: tuple[tuple[int, int], ...]  # (class c, out-neighbours of v in c)
    out_bytes: float  # least bytes of v's out-edges


def watched_nodes(graph: Graph, classes: list[list[int]]) -> list[Watched]:
    """Step 6b's data; in-neighbour sets ``U_{v,c}`` are made disjoint across watched nodes."""
    cls_of = {i: c for c, m in enumerate(classes) for i in m}
    ids, idx, eb = graph.ids, graph.index, graph.edge_bytes_map
    claimed: set[int] = set()
    out = []
    for c, m in enumerate(classes):
        if len(m) != 1:
            continue
        v = m[0]
        ins: dict[int, list[float]] = {}
        for uid in graph.preds(ids[v]):
            u = idx[uid]
            if u not in claimed:
                claimed.add(u)
                ins.setdefault(cls_of[u], []).append(eb[(uid, ids[v])])
        outs: dict[int, int] = {}
        for wid in graph.succs(ids[v]):
            outs[cls_of[idx[wid]]] = outs.get(cls_of[idx[wid]], 0) + 1
        ob = min((eb[(ids[v], w)] for w in graph.succs(ids[v])), default=0.0)
        out.append(
            Watched(c, tuple((cc, len(bs), min(bs)) for cc, bs in sorted(ins.items())), tuple(sorted(outs.items())), ob)
        )
    return out
