"""``sp_tree.decompose`` (reachability matrix and in-set counts) against the bitset recursion it
replaced: the same tree, the same forced cuts (same tie-breaks), on SP and non-SP graphs."""

from __future__ import annotations

import random
from collections.abc import Hashable
from pathlib import Path

import networkx as nx
from tiny_graphs import random_dag_edges

from gpp_solver.sp_tree import Leaf, Parallel, Series, SPNode, _adjacency, decompose

DATA = Path(__file__).resolve().parents[2] / "data" / "pipedream"


def reference_decompose(graph) -> tuple[SPNode, tuple]:
    """The old recursion on bitsets of descendants (Python ints): ``(tree, forced cuts)``."""
    order, succ, pred = _adjacency(graph)
    n = len(order)
    idx = {v: i for i, v in enumerate(order)}
    desc, anc = [0] * n, [0] * n
    for i in range(n - 1, -1, -1):
        for s in succ[order[i]]:
            j = idx[s]
            desc[i] |= desc[j] | (1 << j)
    for i in range(n):
        for p in pred[order[i]]:
            j = idx[p]
            anc[i] |= anc[j] | (1 << j)
    forced: list[tuple[tuple[Hashable, ...], tuple[Hashable, ...], int]] = []

    def members(mask: int) -> list[int]:
        out = []
        while mask:
            low = mask & -mask
            out.append(low.bit_length() - 1)
            mask ^= low
        return out

    def components(mask: int) -> list[int]:
        comps, rest = [], mask
        while rest:
            comp = frontier = rest & -rest
            while frontier:
                grow = 0
                for i in members(frontier):
                    grow |= desc[i] | anc[i]
                grow &= mask & ~comp
                comp |= grow
                frontier = grow
            comps.append(comp)
            rest &= ~comp
        return comps

    def series_cuts(mem: list[int], mask: int) -> list[int]:
        cuts, acc, suffix = [], -1, mask
        for i in range(len(mem) - 1):
            acc &= desc[mem[i]]
            suffix &= ~(1 << mem[i])
            if acc & suffix == suffix:
                cuts.append(i + 1)
        return cuts

    def forced_cut(mem: list[int], mask: int) -> tuple[int, int]:
        best, suffix, pmask, missing, half = None, mask, 0, 0, len(mem) / 2
        for i in range(len(mem) - 1):
            v = mem[i]
            suffix &= ~(1 << v)
            missing += (suffix & ~desc[v]).bit_count() - (i - (anc[v] & pmask).bit_count())
            pmask |= 1 << v
            key = (missing, abs(i + 1 - half), i + 1)
            if best is None or key < best[0]:
                best = (key, i + 1)
        return best[1], best[0][0]

    def build(mask: int) -> SPNode:
        mem = members(mask)
        if len(mem) == 1:
            return Leaf(order[mem[0]])
        comps = components(mask)
        if len(comps) > 1:
            comps.sort(key=lambda c: (c & -c).bit_length())
            return Parallel(tuple(build(c) for c in comps))
        cuts = series_cuts(mem, mask)
        if not cuts:
            at, missing = forced_cut(mem, mask)
            forced.append((tuple(order[v] for v in mem[:at]), tuple(order[v] for v in mem[at:]), missing))
            cuts = [at]
        kids: list[SPNode] = []
        for a, b in zip([0, *cuts], [*cuts, len(mem)]):
            child = build(sum(1 << v for v in mem[a:b]))
            kids.extend(child.children if isinstance(child, Series) else [child])
        return Series(tuple(kids))

    return build((1 << n) - 1), tuple(forced)


def _same(g):
    res = decompose(g)
    tree, forced = reference_decompose(g)
    assert res.tree == tree
    assert res.forced_cuts == forced
    assert all(type(c[2]) is int for c in res.forced_cuts)
    return res


def test_random_dags_match_the_bitset_recursion() -> None:
    rng = random.Random(5)
    n_forced = 0
    for _ in range(200):
        n = rng.randint(1, 40)
        edges = random_dag_edges(rng, n, rng.choice([0.0, 0.5, 1.0]), rng.choice([0.05, 0.15, 0.3, 0.6]))
        g = nx.DiGraph()
        nodes = list(range(n))
        rng.shuffle(nodes)
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        if rng.random() < 0.2:  # a few isolated operators besides
            g.add_nodes_from(range(n, n + rng.randint(1, 3)))
        n_forced += len(_same(g).forced_cuts)
    assert n_forced > 80  # the SP-ization path is exercised


def test_models_match_the_bitset_recursion() -> None:
    from gpp_solver.workloads import build_model

    for name, kw in (("mmt", {}), ("dlrm", {}), ("candle-uno", {}), ("transformer", {"layers": 8})):
        _same(build_model(name, **kw))


def test_non_sp_profiles_match_the_bitset_recursion() -> None:
    from gpp_solver.formats.pipedream import import_pipedream

    for name in ("gnmt.graph.txt", "gnmt_large.graph.txt", "inception_v3.graph.txt"):
        _same(import_pipedream(DATA / name, batch_size=128))
