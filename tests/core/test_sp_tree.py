"""Series-parallel decomposition: SP graphs round-trip, non-SP graphs only gain dependencies."""

from __future__ import annotations

import random
import time
from pathlib import Path

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpp_solver.errors import InvalidGraphError
from gpp_solver.sp_tree import (
    Leaf,
    Parallel,
    Series,
    decompose,
    describe,
    leaves,
    order_pairs,
    reachability_pairs,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "pipedream"


def _check_shape(tree) -> None:
    """No Series directly under a Series, no Parallel under a Parallel, at least two children."""
    if isinstance(tree, Leaf):
        return
    assert len(tree.children) >= 2
    for c in tree.children:
        assert type(c) is not type(tree)
        _check_shape(c)


def _sp_graph(rng: random.Random, n_leaves: int) -> nx.DiGraph:
    """A random SP DAG by recursive series/parallel composition (plus redundant transitive edges)."""
    counter = iter(range(10**9))

    def build(k: int) -> tuple[nx.DiGraph, list, list]:
        if k == 1:
            v = f"v{next(counter)}"
            g = nx.DiGraph()
            g.add_node(v)
            return g, [v], [v]
        split = rng.randint(1, k - 1)
        g1, s1, t1 = build(split)
        g2, s2, t2 = build(k - split)
        g = nx.union(g1, g2)
        if rng.random() < 0.5:  # series: every sink of the first to every source of the second
            g.add_edges_from((u, v) for u in t1 for v in s2)
            if rng.random() < 0.3:  # a redundant shortcut keeps the reachability
                g.add_edge(rng.choice(list(g1)), rng.choice(list(g2)))
            return g, s1, t2
        return g, s1 + s2, t1 + t2

    g, _, _ = build(n_leaves)
    # shuffle insertion order so the decomposition cannot rely on it
    nodes = list(g.nodes)
    rng.shuffle(nodes)
    h = nx.DiGraph()
    h.add_nodes_from(nodes)
    edges = list(g.edges)
    rng.shuffle(edges)
    h.add_edges_from(edges)
    return h


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=14), st.integers(min_value=0, max_value=10**6))
def test_sp_graphs_round_trip(n: int, seed: int) -> None:
    g = _sp_graph(random.Random(seed), n)
    res = decompose(g)
    assert res.is_series_parallel and res.added_pairs == 0
    assert sorted(leaves(res.tree)) == sorted(g.nodes)
    assert order_pairs(res.tree) == reachability_pairs(g)
    _check_shape(res.tree)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=1, max_value=12),
    st.floats(min_value=0.05, max_value=0.6),
    st.integers(min_value=0, max_value=10**6),
)
def test_random_dags_only_gain_dependencies(n: int, p: float, seed: int) -> None:
    rng = random.Random(seed)
    g = nx.DiGraph()
    names = [f"n{i}" for i in range(n)]
    g.add_nodes_from(names)
    perm = list(range(n))
    rng.shuffle(perm)
    for i in range(n):
        for j in range(i + 1, n):
            if rng.random() < p:
                g.add_edge(names[perm[i]], names[perm[j]])
    res = decompose(g)
    covered = list(leaves(res.tree))
    assert sorted(covered) == sorted(g.nodes) and len(covered) == len(set(covered))
    orig = reachability_pairs(g)
    sp = order_pairs(res.tree)
    assert orig <= sp
    assert len(sp) - len(orig) == res.added_pairs  # every extra pair is one a forced cut reported
    assert res.is_series_parallel == (sp == orig)
    _check_shape(res.tree)


def test_diamond() -> None:
    g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert decompose(g).tree == Series((Leaf("a"), Parallel((Leaf("b"), Leaf("c"))), Leaf("d")))


def test_several_sources_and_sinks_need_no_virtual_node() -> None:
    g = nx.DiGraph([("x1", "m"), ("x2", "m"), ("m", "y1"), ("m", "y2")])
    res = decompose(g)
    assert describe(res.tree) == "S(P(x1, x2), m, P(y1, y2))"
    assert sorted(leaves(res.tree)) == sorted(g.nodes)


def test_n_graph_gets_the_cheapest_cut() -> None:
    # a->c, b->c, b->d is the forbidden "N"; cutting {a,b} | {c,d} adds only a->d.
    g = nx.DiGraph([("s", "a"), ("s", "b"), ("a", "c"), ("b", "c"), ("b", "d"), ("c", "t"), ("d", "t")])
    res = decompose(g)
    assert not res.is_series_parallel
    assert res.added_pairs == 1
    assert order_pairs(res.tree) - reachability_pairs(g) == {("a", "d")}


def test_disconnected_pieces_are_parallel_and_residual_is_a_chain() -> None:
    g = nx.DiGraph([("a", "b"), ("b", "c"), ("a", "c")])
    g.add_node("z")
    assert describe(decompose(g).tree) == "P(S(a, b, c), z)"


def test_cycle_and_empty_are_rejected() -> None:
    with pytest.raises(InvalidGraphError, match="cycle"):
        decompose(nx.DiGraph([("a", "b"), ("b", "a")]))
    with pytest.raises(InvalidGraphError, match="empty"):
        decompose(nx.DiGraph())


def test_project_graph_type_and_models() -> None:
    from gpp_solver.workloads import build_model

    g = build_model("candle-uno")
    res = decompose(g)
    assert res.is_series_parallel
    assert isinstance(res.tree, Series) and isinstance(res.tree.children[0], Parallel)
    assert len(res.tree.children[0].children) == 7
    assert order_pairs(res.tree) == reachability_pairs(g.to_networkx())


def test_inception_decomposes_quickly() -> None:
    from gpp_solver.formats.pipedream import import_pipedream

    g = import_pipedream(DATA / "inception_v3.graph.txt", batch_size=128)
    assert len(g.nodes) == 326
    t0 = time.perf_counter()
    res = decompose(g)
    assert time.perf_counter() - t0 < 1.0
    assert sorted(leaves(res.tree)) == sorted(g.ids)
    assert reachability_pairs(g.to_networkx()) <= order_pairs(res.tree)
