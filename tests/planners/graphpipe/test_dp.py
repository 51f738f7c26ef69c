"""The stage DP against a brute-force enumeration of the same search space.

The brute force shares nothing with the DP but the SP tree: it lists every partition that follows
the tree (consecutive segments of Series/Parallel children, each one stage or — for a single
child — recursively split), computes stage depths on the SP-ized stage order, prices every stage
with its own implementation of the DP's stage estimate, and for each partition finds the best
degree assignment by scanning every threshold.
"""

from __future__ import annotations

import math
import random

import pytest
from tiny_graphs import random_instance

from gpp_solver.binary_search import search_tps
from gpp_solver.cost.model import interp_time
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.planners.graphpipe.dp.stage import assign_devices, power_of_two_degrees
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.sp_tree import Leaf, Parallel, Series, decompose, order_pairs
from gpp_solver.types import Cluster


# ---------------------------------------------------------------- brute force
def _leaves_of(c):
    return frozenset([c.node]) if isinstance(c, Leaf) else frozenset().union(*(_leaves_of(x) for x in c.children))


def _chain_parts(kids, shared, is_series):
    """Partitions of consecutive children: segments, each one stage or (a single child) split
    recursively; with ``shared`` a series' parallel child may hand one branch's tail to the stage
    that holds the children after it, or a group of whole branches (GraphPipe's shared sink)."""
    out = []

    def seg_options(i, j):
        if i == j:
            return partitions(kids[i], shared)
        return [[frozenset().union(*(_leaves_of(kids[x]) for x in range(i, j + 1)))]]

    def rec(p, acc):
        if p == len(kids):
            out.append(list(acc))
            return
        for q in range(p, len(kids)):
            for opt in seg_options(p, q):
                rec(q + 1, acc + opt)
        if is_series and shared and isinstance(kids[p], Parallel) and p + 1 < len(kids):
            branches = kids[p].children

            def shared_stage(core, heads, a, c):
                """``core`` (branches a..c's part) joins children p+1..q; the other branches before/after."""
                before = _chain_parts(list(branches[:a]), shared, False) if a else [[]]
                after = _chain_parts(list(branches[c + 1 :]), shared, False) if c + 1 < len(branches) else [[]]
                for q in range(p + 1, len(kids)):
                    X = core | frozenset().union(*(_leaves_of(kids[x]) for x in range(p + 1, q + 1)))
                    for h in heads:
                        for b1 in before:
                            for b2 in after:
                                rec(q + 1, acc + [X] + h + b1 + b2)

            for i, br in enumerate(branches):  # one branch's tail keeps the sink
                parts = list(br.children) if isinstance(br, Series) else [br]
                for u in range(len(parts)):
                    tail = frozenset().union(*(_leaves_of(x) for x in parts[u:]))
                    shared_stage(tail, _chain_parts(parts[:u], shared, True) if u else [[]], i, i)
            for a in range(len(branches)):  # a group of whole branches keeps the sink
                for c in range(a + 1, len(branches)):
                    shared_stage(frozenset().union(*(_leaves_of(x) for x in branches[a : c + 1])), [[]], a, c)

    rec(0, [])
    return out


def partitions(t, shared=False):
    """Every partition following the tree, as lists of frozensets of operators (``shared``: with
    GraphPipe's shared-sink stages)."""
    if isinstance(t, Leaf):
        return [[frozenset([t.node])]]
    out = _chain_parts(list(t.children), shared, isinstance(t, Series))
    uniq = {tuple(sorted(tuple(sorted(s)) for s in part)): part for part in out}
    return list(uniq.values())


def stage_estimate(graph, cluster, nodes, b, d, B):
    """The DP's documented upper-bound estimate, written out directly."""
    x = b / d
    sizes = graph.micro_batch_sizes
    C = sum(interp_time(graph.node(v).fw_time, sizes, x) + interp_time(graph.node(v).bw_time, sizes, x) for v in nodes)
    incoming: dict[str, float] = {}
    out_cnt, out_bytes = 0, 0.0
    for (u, v), nb in graph.edge_bytes_map.items():
        if v in nodes and u not in nodes:
            incoming[u] = max(incoming.get(u, 0.0), nb)
        if u in nodes and v not in nodes:
            out_cnt += 1
            out_bytes += nb
    intra = cluster.intra_node_bandwidth or cluster.inter_node_bandwidth
    low = min(intra, cluster.inter_node_bandwidth)
    dpn = cluster.devices_per_node
    bw = intra if dpn is not None and cluster.devices <= dpn else low
    count = len(incoming) + out_cnt
    nbytes = sum(incoming.values()) + out_bytes
    comm_half = count * cluster.latency + nbytes * x / bw
    W = sum(graph.node(v).weight_bytes for v in nodes)
    ar_bw = intra if dpn is not None and dpn % d == 0 else low
    ar = 0.0 if d == 1 else 2 * (d - 1) / d * W / ar_bw
    return (C + 2 * comm_half) / b + ar / B


def brute_force(graph, cluster, B, b, tree, shared_sinks=False):
    pairs = order_pairs(tree)
    degrees = [d for d in power_of_two_degrees(cluster.devices) if b % d == 0]
    n_micro = B // b
    best = None
    for part in partitions(tree, shared_sinks):
        k = len(part)
        after = {
            i: [j for j in range(k) if j != i and any((u, v) in pairs for u in part[i] for v in part[j])]
            for i in range(k)
        }
        depth: dict[int, int] = {}

        def dep(i, depth=depth, after=after):
            if i not in depth:
                depth[i] = 1 + max((dep(j) for j in after[i]), default=0)
            return depth[i]

        options = []
        for i, s in enumerate(part):
            W = sum(graph.node(v).weight_bytes for v in s)
            A = sum(graph.node(v).activation_bytes for v in s)
            opts = []
            for d in degrees:
                mem = cluster.optimizer_state_factor * W + min(dep(i), n_micro) * b / d * A
                if mem <= cluster.memory_bytes:
                    opts.append((stage_estimate(graph, cluster, s, b, d, B), d))
            options.append(opts)
        if any(not o for o in options):
            continue
        for t in sorted({tp for o in options for tp, _ in o}):
            need = sum(min(d for tp, d in o if tp <= t) if any(tp <= t for tp, _ in o) else 10**9 for o in options)
            if need <= cluster.devices:
                best = t if best is None else min(best, t)
                break
    return best


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("shared_sinks", [False, True])
@pytest.mark.parametrize("seed", range(220))
def test_dp_equals_brute_force(seed: int, shared_sinks: bool) -> None:
    graph, cluster, B, b = random_instance(random.Random(seed))
    dec = decompose(graph)
    dp = StageDP(graph, cluster, B, decomposition=dec, shared_sinks=shared_sinks)
    res = search_tps(dp, b)
    want = brute_force(graph, cluster, B, b, dec.tree, shared_sinks)
    if want is None:
        assert res is None
        return
    assert res is not None
    assert math.isclose(res.tps, want, rel_tol=1e-9)
    # the traceback is a partition of the graph that meets the target with at most D devices
    covered = [v for s in res.stages for v in s.nodes]
    assert sorted(covered) == sorted(graph.ids)
    assert sum(s.degree for s in res.stages) <= cluster.devices
    for s in res.stages:
        assert s.tps_estimate <= res.tps * (1 + 1e-12)
        assert b % s.degree == 0


def test_min_devices_is_monotone_in_target() -> None:
    graph, cluster, B, b = random_instance(random.Random(7))
    cluster = Cluster(devices=4, memory_bytes=1e9, inter_node_bandwidth=10.0)
    dp = StageDP(graph, cluster, B)
    cands = dp.candidates(b)
    devs = [dp.min_devices(b, float(t)) for t in cands]
    assert all(x >= y for x, y in zip(devs, devs[1:]))


def test_assign_devices_aligns_power_of_two_groups() -> None:
    from gpp_solver.planners.graphpipe.dp.stage import DPStage

    stages = [
        DPStage(("a",), 1, 1, 0.0, 0),
        DPStage(("b",), 4, 1, 0.0, 1),
        DPStage(("c",), 2, 1, 0.0, 2),
        DPStage(("d",), 1, 1, 0.0, 3),
    ]
    devs = assign_devices(stages, 4)
    assert devs[1] == (0, 1, 2, 3) and devs[2] == (4, 5) and devs[0] == (6,) and devs[3] == (7,)
    for s, d in zip(stages, devs):
        assert len(d) == s.degree and d[0] % s.degree == 0
    assert len({x for d in devs for x in d}) == 8


def test_parallel_branches_get_their_own_stages() -> None:
    """Two heavy independent branches joined by a free node; five devices: the branches run side by
    side in four stages of TPS 3, depth 3 (a sequential pipeline of the same cut would be 5 deep)."""
    nodes = [
        {
            "id": v,
            "fw_time": [1.0 if v != "j" else 0.0],
            "bw_time": [2.0 if v != "j" else 0.0],
            "weight_bytes": 0,
            "activation_bytes": 0,
            "output_bytes": 0,
        }
        for v in ("a1", "a2", "b1", "b2", "j")
    ]
    g = graph_from_dict(
        {
            "name": "two",
            "micro_batch_sizes": [1],
            "nodes": nodes,
            "edges": [
                {"src": "a1", "dst": "a2"},
                {"src": "b1", "dst": "b2"},
                {"src": "a2", "dst": "j"},
                {"src": "b2", "dst": "j"},
            ],
        }
    )
    c = Cluster(devices=5, memory_bytes=1e9, inter_node_bandwidth=1.0)
    res = search_tps(StageDP(g, c, 4, shared_sinks=False), 1)
    assert res is not None and math.isclose(res.tps, 3.0)
    assert len(res.stages) == 5 and max(s.depth for s in res.stages) == 3
    c4 = Cluster(devices=4, memory_bytes=1e9, inter_node_bandwidth=1.0)
    res4 = search_tps(StageDP(g, c4, 4, shared_sinks=False), 1)
    assert res4 is not None and math.isclose(res4.tps, 6.0)
    # GraphPipe's shared sink (§7.5: "one stage necessarily contains the concatenation operator"):
    # the join rides with one branch's last stage, so four devices reach TPS 3
    res_shared = search_tps(StageDP(g, c4, 4), 1)
    assert res_shared is not None and math.isclose(res_shared.tps, 3.0)
    assert len(res_shared.stages) == 4 and max(s.depth for s in res_shared.stages) == 3
    assert any(set(s.nodes) in ({"a2", "j"}, {"b2", "j"}) for s in res_shared.stages)


def test_a_group_of_whole_branches_keeps_the_shared_sink() -> None:
    """One heavy two-operator branch and two light one-operator branches before a join: with three
    devices the light branches and the join form one stage (the parallel split's group that keeps
    the sink) and each heavy operator gets a device: TPS 3.  With one branch's tail at most, the
    best is 4.5 (the join rides with the heavy branch's last operator)."""
    times = {"a1": (1.0, 2.0), "a2": (1.0, 2.0), "b": (0.25, 0.5), "c": (0.25, 0.5), "j": (0.5, 1.0)}
    nodes = [
        {"id": v, "fw_time": [f], "bw_time": [g], "weight_bytes": 0, "activation_bytes": 0, "output_bytes": 0}
        for v, (f, g) in times.items()
    ]
    edges = [("a1", "a2"), ("a2", "j"), ("b", "j"), ("c", "j")]
    g = graph_from_dict(
        {"name": "group", "micro_batch_sizes": [1], "nodes": nodes, "edges": [{"src": u, "dst": v} for u, v in edges]}
    )
    c3 = Cluster(devices=3, memory_bytes=1e9, inter_node_bandwidth=1.0)
    res = search_tps(StageDP(g, c3, 4), 1)
    assert res is not None and math.isclose(res.tps, 3.0)
    assert sorted(sorted(s.nodes) for s in res.stages) == [["a1"], ["a2"], ["b", "c", "j"]]
    dec = decompose(g)
    assert math.isclose(brute_force(g, c3, 4, 1, dec.tree, True), 3.0)
    strict = search_tps(StageDP(g, c3, 4, shared_sinks=False), 1)
    assert strict is not None and strict.tps > 3.0


@pytest.mark.parametrize("seed", range(20))
def test_threshold_lookup_equals_the_per_degree_pass(seed: int) -> None:
    import numpy as np

    from gpp_solver.planners.graphpipe.dp.stage_tables import (
        degree_thresholds,
        devices_by_depth,
        devices_from_thresholds,
    )

    graph, cluster, B, b = random_instance(random.Random(500 + seed))
    dp = StageDP(graph, cluster, B)
    tb = dp.tables(b)
    targets = np.concatenate([dp.candidates(b), [0.0, np.inf]])
    want = devices_by_depth(tb.tps, tb.maxdepth, tb.degrees, targets, dp.E)
    got = devices_from_thresholds(degree_thresholds(tb.tps, tb.maxdepth, dp.E), tb.degrees, targets)
    assert np.array_equal(want, got)


@pytest.mark.parametrize("seed", range(30))
def test_a_pass_bounded_in_depth_gives_the_same_answers_up_to_its_bound(seed: int) -> None:
    import numpy as np

    graph, cluster, B, b = random_instance(random.Random(700 + seed))
    dp = StageDP(graph, cluster, B)
    cands = dp.candidates(b)
    if len(cands) == 0:
        return
    targets = [float(x) for x in np.quantile(cands, [0.0, 0.3, 0.6, 1.0])]
    full = dp.probe([(b, t) for t in targets])
    for E in range(1, dp.E):
        small = dp.probe([(b, t) for t in targets], E=E)
        assert small.devices.shape[1] == E + 1
        assert np.array_equal(np.minimum(small.devices, 10**9), np.minimum(full.devices[:, : E + 1], 10**9))
        for i in range(len(targets)):
            if small.devices[i, E] <= dp.D:
                st = dp.traceback(small, i)
                assert max(s.depth for s in st) <= E
                assert sorted(v for s in st for v in s.nodes) == sorted(graph.ids)
