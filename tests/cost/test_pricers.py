"""Every fast pricer gives the reference pricing's figures (``gpp_solver.cost.stage_costs``).

On random partitions of random graphs (seeded, a few dozen instances), through each pricer's public
entry point: GraphPipe's staging pricer, the ``gpp`` evaluator, the sequential baselines' pricer,
PipeDream's range costs and GraphPipe's DP segment table (the last two are exact where their
transfer estimate is: the middle and last stages of a three-stage cut; a chain on a flat network).
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gpp_solver.cost import CostTables, iteration_time_estimate, stage_costs, stage_memory
from gpp_solver.oracles.brute_force import GRAPH_KINDS, random_cluster, random_graph
from gpp_solver.plan.build import StageSpec, stage_graph_edges
from gpp_solver.planners.gpp.partition_eval import Problem
from gpp_solver.planners.graphpipe.dp.stage import DPStage, assign_devices
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.staging import price_staging
from gpp_solver.planners.sequential.linearize import topological_states
from gpp_solver.planners.sequential.pipedream import RangeCosts
from gpp_solver.planners.sequential.seq_eval import SequentialPricer
from gpp_solver.types import Cluster, Graph

REL = 1e-9
SEEDS = range(24)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL, abs_tol=1e-300)


def instance(seed: int) -> tuple[Graph, Cluster, int, int, list[list[str]], list[int]]:
    """A random graph and cluster, ``B``, ``b``, a partition into contiguous ranges of a topological
    order (acyclic stage graph) and a degree per stage dividing ``b`` (total at most the devices)."""
    rng = random.Random(seed)
    g = random_graph(rng, GRAPH_KINDS[seed % len(GRAPH_KINDS)], rng.randint(3, 9))
    c = random_cluster(rng, devices=rng.choice((4, 8)), placement=seed % 2 == 1)
    B = rng.choice((8, 16))
    b = rng.choice((1, 2, 4, 8))
    order = list(g.topo_order)
    k = rng.randint(1, min(len(order), c.devices))
    cuts = sorted(rng.sample(range(1, len(order)), k - 1))
    parts = [order[i:j] for i, j in zip([0] + cuts, cuts + [len(order)])]
    degs = [1] * k
    for _ in range(c.devices - k):  # double random stages' degrees while b % d == 0 and devices last
        i = rng.randrange(k)
        if b % (2 * degs[i]) == 0 and sum(degs) + degs[i] <= c.devices:
            degs[i] *= 2
    return g, c, B, b, parts, degs


def reference(g: Graph, c: Cluster, B: int, specs: list[StageSpec]):
    costs = stage_costs(g, c, specs, B)
    stage_of = {v: i for i, s in enumerate(specs) for v in s.nodes}
    return costs, iteration_time_estimate(costs, stage_graph_edges(g, stage_of), B)


@pytest.mark.parametrize("seed", SEEDS)
def test_graphpipe_staging_pricer(seed: int) -> None:
    g, c, B, b, parts, degs = instance(seed)
    stages = [DPStage(tuple(p), d, 1, 0.0, g.topo_order.index(p[0])) for p, d in zip(parts, degs)]
    devs = assign_devices(stages, c.devices_per_node)
    specs = [StageSpec(tuple(p), dv, b) for p, dv in zip(parts, devs)]
    costs, est = reference(g, c, B, specs)
    tps, estimate = price_staging(g, c, stages, b, B, CostTables(g))
    assert close(tps, max(x.time_per_sample for x in costs))
    assert close(estimate, est)


@pytest.mark.parametrize("seed", SEEDS)
def test_gpp_evaluator(seed: int) -> None:
    g, c, B, b, parts, degs = instance(seed)
    P = Problem(g, c, B, b)
    assign = [0] * len(g.nodes)
    for i, p in enumerate(parts):
        for v in p:
            assign[g.index[v]] = i
    ev = P.evaluate(assign, degs)
    assert ev is not None
    specs = [StageSpec(tuple(p), tuple(range(ev.offsets[i], ev.offsets[i] + degs[i])), b) for i, p in enumerate(parts)]
    costs, est = reference(g, c, B, specs)
    for i, cost in enumerate(costs):
        assert close(ev.tps[i], cost.time_per_sample)
    assert close(ev.estimate, est)
    depth = {i: 1 for i in range(len(parts))}  # 1F1B in-flight: (longest path to a sink) * b
    stage_of = {v: i for i, p in enumerate(parts) for v in p}
    for u, v in sorted(stage_graph_edges(g, stage_of), reverse=True):
        depth[u] = max(depth[u], depth[v] + 1)
    for i, s in enumerate(specs):
        assert close(ev.memory[i], stage_memory(g, c, s, min(depth[i], B // b) * b))


@pytest.mark.parametrize("seed", SEEDS)
def test_sequential_pricer(seed: int) -> None:
    g, c, B, b, parts, degs = instance(seed)
    order = list(g.topo_order)
    pricer = SequentialPricer(g, c, B, order, [], [])
    stage = np.asarray([i for i, p in enumerate(parts) for _ in p], dtype=np.int64)
    starts = np.cumsum([0] + degs)
    devices = [tuple(range(starts[i], starts[i + 1])) for i in range(len(parts))]
    priced = pricer.price(stage, devices, b)
    specs = [StageSpec(tuple(p), dv, b) for p, dv in zip(parts, devices)]
    costs, _ = reference(g, c, B, specs)
    for i, cost in enumerate(costs):
        assert close(priced.per_micro_batch[i], cost.per_micro_batch)
        assert close(priced.weights[i], sum(g.node(v).weight_bytes for v in parts[i]))


@pytest.mark.parametrize("seed", SEEDS)
def test_pipedream_range_costs(seed: int) -> None:
    """Three stages cut at topological positions ``k < j``: the middle and last stages' transfers
    are exact in PipeDream's range model, so their TPS must equal the cost model's (flat network:
    the DP prices one bandwidth per stage)."""
    g, c, B, b, _, _ = instance(seed)
    c = c.with_(devices_per_node=None, memory_bytes=1e18)
    lin = topological_states(g)
    n = len(lin.order)
    if n < 3:
        pytest.skip("needs three stages")
    rng = random.Random(seed)
    k, j = sorted(rng.sample(range(1, n), 2))
    d = rng.choice([x for x in (1, 2) if b % x == 0])
    costs = RangeCosts(g, c, lin, B, b)
    T = costs.stage_time(d, c.inter_node_bandwidth, 1)
    parts = [lin.stage_nodes(0, k), lin.stage_nodes(k, j), lin.stage_nodes(j, n)]
    devs = [(0,), tuple(range(1, 1 + d)), (1 + d,)]
    specs = [StageSpec(tuple(p), dv, b) for p, dv in zip(parts, devs)]
    ref, _ = reference(g, c.with_(devices=2 + d), B, specs)
    assert close(T[k, j], ref[1].time_per_sample)
    T1 = costs.stage_time(1, c.inter_node_bandwidth, 1)
    assert close(T1[j, n], ref[2].time_per_sample)


@pytest.mark.parametrize("seed", SEEDS)
def test_graphpipe_dp_segment_table(seed: int) -> None:
    """On a chain and a flat network every DP segment's estimate is the cost model's exact TPS of
    that segment as the middle stage of a three-stage cut (elsewhere it is an upper bound)."""
    rng = random.Random(seed)
    g = random_graph(rng, "chain", rng.randint(3, 8))
    c = random_cluster(rng, devices=4)
    B, b = 8, rng.choice((2, 4))
    dp = StageDP(g, c, B)
    tb = dp.tables(b)
    order = list(dp.idx.leaf_order)
    for seg in range(len(dp.idx.seg_lo)):
        lo, hi = int(dp.idx.seg_lo[seg]), int(dp.idx.seg_hi[seg])
        for j, d in enumerate(tb.degrees):
            parts = [p for p in (order[:lo], order[lo:hi], order[hi:]) if p]
            mid = 1 if lo > 0 else 0
            devs, nxt = [], 0
            for i in range(len(parts)):
                w = d if i == mid else 1
                devs.append(tuple(range(nxt, nxt + w)))
                nxt += w
            specs = [StageSpec(tuple(p), dv, b) for p, dv in zip(parts, devs)]
            ref, _ = reference(g, c.with_(devices=max(nxt, c.devices)), B, specs)
            assert close(tb.tps[seg, j], ref[mid].time_per_sample)
