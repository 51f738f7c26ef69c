"""``segment_comm`` (vectorised) against the straightforward child-by-child loop it replaced."""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pytest
from tiny_graphs import random_dag_edges

from gpp_solver.planners.graphpipe.dp.segment_comm import segment_comm
from gpp_solver.planners.graphpipe.dp.tree import TreeIndex, index_tree
from gpp_solver.sp_tree import decompose


def reference_segment_comm(idx: TreeIndex, edges: dict[tuple, float]) -> tuple[np.ndarray, np.ndarray]:
    """The reference loop: tree segments grown child by child, shared-sink stages from the leaf set."""
    pos = {v: i for i, v in enumerate(idx.leaf_order)}
    n = len(pos)
    succ: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    pred: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (u, v), nb in edges.items():
        pu, pv = pos[u], pos[v]
        succ[pu].append((pv, nb))
        pred[pv].append((pu, nb))
    count = np.zeros(len(idx.seg_lo), dtype=float)
    nbytes = np.zeros(len(idx.seg_lo), dtype=float)
    for t, ranges in enumerate(idx.child_range):
        k = len(ranges)
        for i in range(k):
            lo = ranges[i][0]
            in_max: dict[int, float] = {}
            in_sum = 0.0
            out_cnt = 0
            out_sum = 0.0
            for j in range(i, k):
                a, hi = ranges[j]
                for w in range(a, hi):
                    for pu, nb in pred[w]:
                        if pu < lo:
                            old = in_max.get(pu)
                            if old is None:
                                in_max[pu] = nb
                                in_sum += nb
                            elif nb > old:
                                in_max[pu] = nb
                                in_sum += nb - old
                        else:
                            out_cnt -= 1
                            out_sum -= nb
                    for _, nb in succ[w]:
                        out_cnt += 1
                        out_sum += nb
                g = idx.seg[t][i, j]
                count[g] = len(in_max) + out_cnt
                nbytes[g] = in_sum + max(out_sum, 0.0)
    for g in range(idx.n_tree_segments, len(idx.seg_lo)):
        inside = {w for lo, hi in idx.ranges(g) for w in range(lo, hi)}
        ins: dict[int, float] = {}
        out_cnt, out_sum = 0, 0.0
        for w in inside:
            for pu, nb in pred[w]:
                if pu not in inside:
                    ins[pu] = max(ins.get(pu, 0.0), nb)
            for pv, nb in succ[w]:
                if pv not in inside:
                    out_cnt += 1
                    out_sum += nb
        count[g] = len(ins) + out_cnt
        nbytes[g] = sum(ins.values()) + out_sum
    return count, nbytes


def _graphs(seed: int, k: int):
    rng = random.Random(seed)
    for _ in range(k):
        n = rng.randint(1, 30)
        edges = random_dag_edges(rng, n, rng.choice([0.0, 0.5, 1.0]), rng.choice([0.05, 0.2, 0.5]))
        g = nx.DiGraph()
        nodes = list(range(n))
        rng.shuffle(nodes)
        g.add_nodes_from(nodes)
        g.add_edges_from(edges)
        yield rng, g
    g = nx.DiGraph()
    g.add_nodes_from(range(4))  # no edges at all
    yield rng, g


@pytest.mark.parametrize("seed", range(3))
def test_equals_the_loop_bit_for_bit(seed: int) -> None:
    """Dyadic bytes (as every profiled graph has): all segments equal exactly.  Arbitrary floats:
    tree segments still equal bit for bit (same running sums, same order); the reference sums a
    shared-sink stage in set (hash) order, so there the bytes agree to rounding."""
    for rng, g in _graphs(seed, 40):
        tree = decompose(g).tree
        for shared in (False, True):
            idx = index_tree(tree, shared)
            T = idx.n_tree_segments
            dyadic = {e: rng.randint(0, 4096) / 64 for e in g.edges}
            arbitrary = {e: rng.random() * 1e4 for e in g.edges}
            for edges in (dyadic, arbitrary):
                ref_count, ref_bytes = reference_segment_comm(idx, edges)
                got = segment_comm(idx, edges)
                assert np.array_equal(got.count, ref_count)
                assert np.array_equal(got.nbytes[:T], ref_bytes[:T])
                if edges is dyadic:
                    assert np.array_equal(got.nbytes, ref_bytes)
                else:
                    np.testing.assert_allclose(got.nbytes[T:], ref_bytes[T:], rtol=1e-12, atol=0)


def test_cancelling_floats_keep_the_reference_clamp() -> None:
    """Values whose running sums cancel with rounding: the tree segments keep the reference loop's
    residues and its clamp at zero exactly."""
    rng = random.Random(11)
    for _ in range(25):
        n = rng.randint(3, 25)
        g = nx.DiGraph(random_dag_edges(rng, n, 0.0, 0.4))
        g.add_nodes_from(range(n))
        idx = index_tree(decompose(g).tree, True)
        edges = {e: rng.choice([0.1, 0.2, 0.3, 1e-17, 1e17, 0.0]) for e in g.edges}
        ref_count, ref_bytes = reference_segment_comm(idx, edges)
        got = segment_comm(idx, edges)
        T = idx.n_tree_segments
        assert np.array_equal(got.count, ref_count)
        assert np.array_equal(got.nbytes[:T], ref_bytes[:T])
