"""Tiny hand-drawn graphs shared by the tests."""

from __future__ import annotations

import random

from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.types import Cluster


def node(i: str, f: float = 1.0, w: float = 100.0, a: float = 10.0, o: float = 5.0) -> dict:
    return {
        "id": i,
        "fw_time": [f, 1.5 * f],
        "bw_time": [2 * f, 3 * f],
        "weight_bytes": w,
        "activation_bytes": a,
        "output_bytes": o,
    }


def diamond_dict() -> dict:
    return {
        "format": "gpp-graph/1",
        "name": "diamond",
        "micro_batch_sizes": [1, 2],
        "nodes": [node("a"), node("b"), node("c"), node("d")],
        "edges": [
            {"src": "a", "dst": "b"},
            {"src": "a", "dst": "c"},
            {"src": "b", "dst": "d"},
            {"src": "c", "dst": "d"},
        ],
    }


def chain_dict(n: int = 4, times: list[float] | None = None) -> dict:
    times = times or [1.0] * n
    return {
        "format": "gpp-graph/1",
        "name": f"chain{n}",
        "micro_batch_sizes": [1, 2],
        "nodes": [node(f"n{i}", times[i]) for i in range(n)],
        "edges": [{"src": f"n{i}", "dst": f"n{i + 1}"} for i in range(n - 1)],
    }


def random_dag_edges(rng, n: int, p_sp: float, p_edge: float) -> set[tuple[int, int]]:
    """Edges of a random weakly connected DAG on ``0..n-1``: with probability ``p_sp`` series-parallel by
    recursive composition, else any DAG with edge probability ``p_edge``; components are chained."""
    import networkx as nx

    edges: set[tuple[int, int]] = set()
    if rng.random() < p_sp:

        def build(lo: int, hi: int) -> tuple[list[int], list[int]]:
            if hi - lo == 1:
                return [lo], [lo]
            m = rng.randint(lo + 1, hi - 1)
            s1, t1 = build(lo, m)
            s2, t2 = build(m, hi)
            if rng.random() < 0.6:
                edges.update((u, v) for u in t1 for v in s2)
                return s1, t2
            return s1 + s2, t1 + t2

        build(0, n)
    else:
        edges.update((i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p_edge)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    comps = sorted(min(c) for c in nx.connected_components(g))
    edges.update(zip(comps, comps[1:]))
    return edges


def random_instance(rng: random.Random):
    """A random tiny graph (1-8 nodes), cluster, mini-batch B and micro-batch b (the stage DP's and solve's tests)."""
    n = rng.randint(1, 8)
    names = [f"v{i}" for i in range(n)]
    edges = random_dag_edges(rng, n, 0.5, 0.35)
    sizes = [1, 2, 4]
    nodes = []
    for v in names:
        f1 = rng.uniform(0.5, 3.0)
        fw = [f1, f1 * rng.uniform(1.0, 2.0), 0.0]
        fw[2] = fw[1] * rng.uniform(1.0, 2.0)
        nodes.append(
            {
                "id": v,
                "fw_time": fw,
                "bw_time": [2 * x for x in fw],
                "weight_bytes": rng.choice([0.0, rng.uniform(10, 200)]),
                "activation_bytes": rng.uniform(0, 50),
                "output_bytes": rng.uniform(1, 30),
            }
        )
    graph = graph_from_dict(
        {
            "name": "rand",
            "micro_batch_sizes": sizes,
            "nodes": nodes,
            "edges": [{"src": names[a], "dst": names[b]} for a, b in sorted(edges)],
        }
    )
    D = rng.randint(1, 4)
    dpn = rng.choice([None, 1, 2, 4])
    cluster = Cluster(
        devices=D,
        memory_bytes=rng.uniform(300, 3000),
        devices_per_node=dpn,
        intra_node_bandwidth=rng.uniform(50, 200),
        inter_node_bandwidth=rng.uniform(5, 50),
        latency=rng.choice([0.0, 0.05]),
        optimizer_state_factor=rng.choice([1.0, 4.0]),
    )
    B = rng.choice([4, 8])
    b = rng.choice([x for x in (1, 2, 4) if B % x == 0])
    return graph, cluster, B, b
