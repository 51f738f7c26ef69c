"""PipeDream planner: antichain linearisation, the min-max DP against brute force, fidelity with the
published optimizer on the shared profiles, and plan validity under the shared cost model."""

from __future__ import annotations

import itertools
import logging
import math
import random
import time

import numpy as np
import pytest
from conftest import CLUSTER, chain_dict, diamond_dict, node

from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InfeasibleError, TimeLimitError
from gpp_solver.formats.cluster import cluster_from_dict
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.oracles.brute_force import random_graph
from gpp_solver.plan.build import StageSpec
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.linearize import antichain_states, linearize, topological_states
from gpp_solver.planners.sequential.pipedream import plan_pipedream
from gpp_solver.planners.sequential.pipedream_costs import pipedream_optimizer
from gpp_solver.types import Cluster


def branchy_dict() -> dict:
    """src -> three branches of lengths 1, 2, 3 -> join."""
    nodes = [
        node("src"),
        node("a1", 2.0),
        node("b1"),
        node("b2", 0.5),
        node("c1"),
        node("c2"),
        node("c3", 3.0),
        node("join"),
    ]
    edges = [
        ("src", "a1"),
        ("src", "b1"),
        ("b1", "b2"),
        ("src", "c1"),
        ("c1", "c2"),
        ("c2", "c3"),
        ("a1", "join"),
        ("b2", "join"),
        ("c3", "join"),
    ]
    return {
        "format": "gpp-graph/1",
        "name": "branchy",
        "micro_batch_sizes": [1, 2],
        "nodes": nodes,
        "edges": [{"src": s, "dst": d} for s, d in edges],
    }


def flat_cluster(devices: int, memory: float = 1e12) -> dict:
    return {
        "format": "gpp-cluster/1",
        "devices": devices,
        "memory_bytes": memory,
        "inter_node_bandwidth": 100.0,
        "latency": 0.01,
        "optimizer_state_factor": 4.0,
    }


def is_downset(graph, members: set[str]) -> bool:
    return all(p in members for v in members for p in graph.preds(v))


# ---------------------------------------------------------------- linearisation


@pytest.mark.parametrize("gd", [diamond_dict(), branchy_dict(), chain_dict(5)])
def test_antichain_states_are_exactly_the_downsets(gd):
    g = graph_from_dict(gd)
    lin = antichain_states(g, max_states=None)
    got = {frozenset(lin.members(s)) for s in lin.states}
    every = {
        frozenset(c) for r in range(len(g.ids) + 1) for c in itertools.combinations(g.ids, r) if is_downset(g, set(c))
    }
    assert got == every
    assert lin.states[0] == 0 and len(lin.members(lin.states[-1])) == len(g.ids)
    sizes = [len(lin.members(s)) for s in lin.states]
    assert sizes == sorted(sizes)  # every state after its subsets


def test_first_source_start_needs_the_first_source():
    g = graph_from_dict(diamond_dict())
    lin = antichain_states(g, first_source=True)
    assert all("a" in lin.members(s) for s in lin.states[1:])
    assert len(lin.states) == 6  # {}, {a}, {a,b}, {a,c}, {a,b,c}, all


def test_fallback_to_topological_order_is_logged(caplog):
    g = graph_from_dict(branchy_dict())
    with caplog.at_level(logging.INFO):
        lin = linearize(g, max_states=5)
    assert lin.kind == "topological" and lin.n_states == len(g.ids) + 1
    assert "falling back" in caplog.text
    assert lin.states == topological_states(g).states


# ---------------------------------------------------------------- DP against brute force


def compositions(n: int):
    """Every way to cut n items into contiguous non-empty parts (as cut lists)."""
    for r in range(n):
        for cuts in itertools.combinations(range(1, n), r):
            yield [0, *cuts, n]


def best_chain_tps(g, cl, B, b, ids, replicas):
    """Brute force: the least bottleneck TPS over contiguous splits of ``ids`` and replica counts."""
    best = math.inf
    for cuts in compositions(len(ids)):
        parts = [ids[cuts[i] : cuts[i + 1]] for i in range(len(cuts) - 1)]
        for reps in itertools.product(replicas, repeat=len(parts)):
            if sum(reps) > cl.devices:
                continue
            specs, dev = [], 0
            for p, r in zip(parts, reps):
                specs.append(StageSpec(tuple(p), tuple(range(dev, dev + r)), b))
                dev += r
            best = min(best, max(c.time_per_sample for c in stage_costs(g, cl, specs, B)))
    return best


def test_shared_dp_matches_brute_force_on_a_chain():
    gd = chain_dict(5, [1.0, 3.0, 0.5, 2.0, 1.5])
    for i, n in enumerate(gd["nodes"]):
        n["weight_bytes"] = 50.0 * (i + 1)
    g = graph_from_dict(gd)
    cl = cluster_from_dict(flat_cluster(4))
    B, b = 8, 4
    ids = list(g.topo_order)
    best = best_chain_tps(g, cl, B, b, ids, (1, 2, 4))
    plan = plan_pipedream(g, cl, B, micro_batch_sizes=[b])
    assert plan.search.extra["dp_bottleneck_tps"] == pytest.approx(best, rel=1e-9)
    assert plan.predicted.time_per_sample == pytest.approx(best, rel=1e-9)  # chain: transfers exact


def test_pipedream_costs_dp_matches_brute_force_on_a_chain():
    gd = chain_dict(6, [1.0, 3.0, 0.5, 2.0, 1.5, 4.0])
    for i, n in enumerate(gd["nodes"]):
        n["weight_bytes"] = 1e6 * (i % 3)
    g = graph_from_dict(gd)
    K, bw = 4, 1e8
    C = [g.node(v).fw_time[0] + g.node(v).bw_time[0] for v in g.topo_order]
    W = [g.node(v).weight_bytes for v in g.topo_order]
    best = math.inf
    for cuts in compositions(len(C)):
        spans = list(zip(cuts, cuts[1:]))
        for reps in itertools.product(range(1, K + 1), repeat=len(spans)):
            if sum(reps) != K:  # the original uses every machine
                continue
            t = max((sum(C[a:z]) + 4 * (r - 1) * sum(W[a:z]) / (bw * r)) / r for (a, z), r in zip(spans, reps))
            best = min(best, t)
    sol = pipedream_optimizer(g, [K], bw)
    assert sol.bottleneck == pytest.approx(best, rel=1e-12)
    assert sum(r for _, r in sol.stages) == K
    assert sorted(v for nodes, _ in sol.stages for v in nodes) == sorted(g.ids)


# ---------------------------------------------------------------- fidelity with the published optimizer


@pytest.mark.parametrize("name, machines, expected", [("gnmt", 4, 0.025868), ("alexnet", 8, 0.011620)])
def test_fidelity_with_the_published_optimizer(data_dir, name, machines, expected):
    from gpp_solver.formats.importers import import_pipedream

    g = import_pipedream(data_dir / "pipedream" / f"{name}.graph.txt", batch_size=1)
    sol = pipedream_optimizer(g, [machines], 1e9)
    assert sol.bottleneck == pytest.approx(expected, rel=1e-4)
    assert sol.linearization == "antichain"


def test_pipedream_costs_mode_builds_a_valid_plan(data_dir):
    from gpp_solver.formats.importers import import_pipedream

    g = import_pipedream(data_dir / "pipedream" / "gnmt.graph.txt", batch_size=1)
    cl = cluster_from_dict(flat_cluster(4, memory=1e15))
    plan = plan_pipedream(g, cl, 4, mode="pipedream-costs")
    assert plan.search.extra["pipedream_bottleneck"] == pytest.approx(0.025868, rel=1e-4)
    assert plan.devices_used <= 4 and plan.search.status == "optimal-within-search-space"
    assert "PipeDream's own cost model" in plan.search.objective
    validate(plan, g, cl)


# ---------------------------------------------------------------- plans under the shared model


@pytest.mark.parametrize("gd", [chain_dict(6), diamond_dict(), branchy_dict()])
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(3)])
def test_plans_are_valid_within_budget_and_deterministic(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    plan = plan_pipedream(g, cl, 8)
    validate(plan, g, cl)
    assert plan.devices_used <= cl.devices
    assert plan.predicted.peak_memory_bytes <= cl.memory_bytes
    assert plan.search.status == "feasible"
    if gd["name"].startswith("chain"):
        assert plan.depth == len(plan.stages)  # a sequential pipeline
    again = plan_pipedream(g, cl, 8)
    strip = lambda p: {k: v for k, v in plan_to_dict(p).items() if k != "search"}  # noqa: E731
    assert strip(again) == strip(plan)


def test_memory_limit_forces_a_split_and_infeasible_reports_the_need():
    gd = chain_dict(4)
    for n in gd["nodes"]:
        n["weight_bytes"] = 1000.0
    g = graph_from_dict(gd)
    tight = cluster_from_dict(flat_cluster(4, memory=9000.0))  # 4000 bytes of weight state per node
    plan = plan_pipedream(g, tight, 4)
    assert len(plan.stages) >= 2
    assert all(st.predicted.memory_bytes <= 9000.0 for st in plan.stages)
    with pytest.raises(InfeasibleError) as err:
        plan_pipedream(g, cluster_from_dict(flat_cluster(4, memory=3000.0)), 4)
    assert err.value.required_memory_bytes >= 4000.0


def test_agrees_with_graphpipe_on_a_chain():
    from gpp_solver.errors import InvalidInputError
    from gpp_solver.planners.registry import get_planner

    try:
        graphpipe = get_planner("graphpipe")
    except InvalidInputError:
        pytest.skip("GraphPipe planner not available")
    g = graph_from_dict(chain_dict(5, [1.0, 3.0, 0.5, 2.0, 1.5]))
    cl = cluster_from_dict(flat_cluster(4))
    ours = plan_pipedream(g, cl, 8, micro_batch_sizes=[4])
    theirs = graphpipe(g, cl, 8, micro_batch_sizes=[4], depth_tradeoff=False)  # both: the least TPS
    assert ours.predicted.time_per_sample == pytest.approx(theirs.predicted.time_per_sample, rel=1e-6)


@pytest.mark.slow
def test_inception_falls_back_to_a_topological_order(data_dir, caplog):
    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.formats.importers import import_pipedream

    g = import_pipedream(data_dir / "pipedream" / "inception_v3.graph.txt", batch_size=128)
    cl = v100_cluster(8)
    with caplog.at_level(logging.INFO):
        plan = plan_pipedream(g, cl, 128)
    assert plan.search.extra["linearization"] == "topological"
    assert "falling back" in caplog.text
    validate(plan, g, cl)


def test_time_limit_is_reported_honestly():
    """The DP checks the clock at every step: a limit reached before any micro-batch size finished
    is an error (no plan), one reached later gives the plans found so far with ``time-limit``."""
    g, cl = graph_from_dict(chain_dict(6)), cluster_from_dict(CLUSTER)
    with pytest.raises(TimeLimitError, match="time limit"):
        plan_pipedream(g, cl, 8, time_limit=1e-9)
    rng = random.Random(2)
    big = random_graph(rng, "chain", 8)
    huge = Cluster(devices=10**6, memory_bytes=16e9, inter_node_bandwidth=1e10, latency=1e-5)
    t0 = time.perf_counter()
    try:
        plan = plan_pipedream(big, huge, 64, time_limit=0.3)
    except TimeLimitError:
        plan = None
    assert time.perf_counter() - t0 < 0.3 + 1.0  # clock checked inside the DP (slack: load)
    if plan is not None:
        assert plan.search.status == "time-limit"
        validate(plan, big, huge)


@pytest.mark.parametrize("per_node", [None, 8])
def test_devices_the_graph_cannot_use_cost_nothing(per_node):
    """16,384 and 10^6 devices: the DP considers only the devices a chain can use (nodes x max b),
    says so, and gives the same plan for both in time and memory independent of the device count."""
    import tracemalloc

    g = random_graph(random.Random(2), "chain", 6)
    plans, peaks = [], []
    for D in (16384, 10**6):
        cl = Cluster(
            devices=D,
            memory_bytes=16e9,
            inter_node_bandwidth=1e10,
            intra_node_bandwidth=1e11,
            devices_per_node=per_node,
            latency=1e-5,
        )
        tracemalloc.start()
        plan = plan_pipedream(g, cl, 8, time_limit=60)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        validate(plan, g, cl)
        assert plan.search.status == "feasible"
        considered = plan.search.extra["devices_considered"]
        assert considered == 6 * 8 * (per_node or 1) and max(d for s in plan.stages for d in s.devices) < considered
        plans.append(plan_to_dict(plan)["stages"])
    assert plans[0] == plans[1]
    assert peaks[1] < 1.5 * peaks[0] + 1e6 and peaks[1] < 200e6


# ---------------------------------------------------------------- shared-mode DP pricing vs exact


def two_sources_dict() -> dict:
    """Two source branches s1->a1->a2 and s2->b1->b2 joined by j -> t (no producer fans out)."""
    ts = {"s1": 1.0, "a1": 2.0, "a2": 0.5, "s2": 1.5, "b1": 0.7, "b2": 2.5, "j": 1.0, "t": 0.8}
    nodes = [node(v, f, w=100.0 * (i + 1)) for i, (v, f) in enumerate(ts.items())]
    edges = [("s1", "a1"), ("a1", "a2"), ("a2", "j"), ("s2", "b1"), ("b1", "b2"), ("b2", "j"), ("j", "t")]
    return {
        "format": "gpp-graph/1",
        "name": "two_sources",
        "micro_batch_sizes": [1, 2],
        "nodes": nodes,
        "edges": [{"src": s, "dst": d} for s, d in edges],
    }


def random_dag_dict(rng, n: int) -> dict:
    """A random DAG on n nodes in index order, several sources, random fan-out and edge bytes."""
    nodes = [node(f"v{i}", rng.uniform(0.2, 3.0), w=rng.uniform(0, 500), o=rng.uniform(1, 20)) for i in range(n)]
    edges = []
    for j in range(1, n):
        for i in rng.sample(range(j), min(j, rng.choice([0, 1, 1, 2]))):
            edges.append({"src": f"v{i}", "dst": f"v{j}", "bytes": rng.uniform(1, 20)})
    has_succ = {e["src"] for e in edges}
    edges += [
        {"src": f"v{i}", "dst": f"v{n - 1}", "bytes": rng.uniform(1, 20)}
        for i in range(n - 1)
        if f"v{i}" not in has_succ
    ]  # connected: sinks join the last
    return {"format": "gpp-graph/1", "name": f"rand{n}", "micro_batch_sizes": [1, 2], "nodes": nodes, "edges": edges}


def test_shared_mode_linearises_every_source_and_beats_every_topological_chain():
    """PipeDream's first-source start would jump over whole source branches; every downset is a
    state, so the DP (exact here: no producer fans out) is <= every chain of the topological order."""
    g = graph_from_dict(two_sources_dict())
    cl = cluster_from_dict(flat_cluster(4))
    B, b = 8, 2
    plan = plan_pipedream(g, cl, B, micro_batch_sizes=[b])
    every = sum(1 for r in range(len(g.ids) + 1) for c in itertools.combinations(g.ids, r) if is_downset(g, set(c)))
    assert plan.search.extra["n_states"] == every
    ids = list(g.topo_order)
    best = best_chain_tps(g, cl, B, b, ids, (1, 2))
    assert plan.search.extra["dp_bottleneck_tps"] == pytest.approx(plan.predicted.time_per_sample, rel=1e-9)
    assert plan.predicted.time_per_sample <= best * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_range_transfers_price_random_chains_like_the_shared_model(seed):
    """In-transfers exact; out-transfers exact unless a producer feeds two later stages (then a
    lower bound); so on a flat network the DP value is the exact TPS of its plan or below it."""
    import random

    rng = random.Random(seed)
    g = graph_from_dict(random_dag_dict(rng, rng.randint(5, 9)))
    cl = cluster_from_dict(flat_cluster(4))
    lin = linearize(g, max_states=None)
    in_b, in_c, out_b, out_c = lin.range_transfers(g)
    for _ in range(20):
        chain = [0]
        while chain[-1] != lin.n_states - 1:  # a random chain of nested states to the full set
            nxt = [j for j in range(lin.n_states) if lin.subset[chain[-1], j]]
            chain.append(rng.choice(nxt))
        b = 2
        specs = [StageSpec(tuple(lin.stage_nodes(k, j)), (s,), b) for s, (k, j) in enumerate(zip(chain, chain[1:]))]
        if len(specs) > cl.devices:
            continue
        stage = {v: s for s, sp in enumerate(specs) for v in sp.nodes}
        fans = any(len({stage[w] for w in g.succs(v) if stage[w] != stage[v]}) > 1 for v in g.ids)
        for _s, (sc, (k, j)) in enumerate(zip(stage_costs(g, cl, specs, 8), zip(chain, chain[1:]))):
            dp = 2.0 * (
                (in_c[k, j] + out_c[k, j]) * cl.latency + (in_b[k, j] + out_b[k, j]) * b / cl.inter_node_bandwidth
            )
            if fans:
                assert dp <= sc.comm * (1 + 1e-9) + 1e-12
            else:
                assert dp == pytest.approx(sc.comm, rel=1e-9, abs=1e-12)
    for b in (1, 2, 4):
        plan = plan_pipedream(g, cl, 8, micro_batch_sizes=[b])
        assert plan.search.extra["dp_bottleneck_tps"] <= plan.predicted.time_per_sample * (1 + 1e-9)


def _range_transfers_by_definition(lin, g):
    """``range_transfers`` read off its docstring, one range at a time."""
    S, pos = lin.n_states, {v: i for i, v in enumerate(lin.order)}
    out = [[[0.0] * S for _ in range(S)] for _ in range(4)]
    edges = [(pos[u], pos[v], float(b)) for (u, v), b in g.edge_bytes_map.items()]
    for k, j in itertools.product(range(S), repeat=2):
        K, J = lin.states[k], lin.states[j]
        into, leaving = {}, {}
        for u, v, b in edges:
            if K >> u & 1 and not K >> v & 1 and J >> v & 1:
                into[u] = max(into.get(u, -1.0), b)
            if J >> u & 1 and not K >> u & 1 and not J >> v & 1:
                leaving[u] = max(leaving.get(u, -1.0), b)
        out[0][k][j], out[1][k][j] = sum(into.values()), len(into)
        out[2][k][j], out[3][k][j] = sum(leaving.values()), len(leaving)
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("max_states", [None, 1])  # every downset; the prefixes of one order
def test_range_transfers_equal_their_definition(seed, max_states):
    """Both ways of computing the ranges' transfers (a block per producer; a running max along the
    prefixes of one order) give the definition's figures."""
    rng = random.Random(40 + seed)
    g = random_graph(rng, "dag", 9)
    lin = linearize(g, max_states=max_states)
    assert lin.kind == ("antichain" if max_states is None else "topological")
    for got, want in zip(lin.range_transfers(g), _range_transfers_by_definition(lin, g)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)


def test_range_transfers_of_a_long_chain_with_skips_take_no_time():
    """2,000 nodes with a skip edge every 4 and one from the first node to every 50th (an input
    read by every layer): the prefix states' arrays are 2,001 x 2,001."""
    n = 2000
    nodes = [node(f"n{i}", 1.0, 1.0, 0, 8) for i in range(n)]
    edges = [{"src": f"n{i}", "dst": f"n{i + 1}", "bytes": 8.0} for i in range(n - 1)]
    edges += [{"src": f"n{i}", "dst": f"n{i + 4}", "bytes": 4.0} for i in range(0, n - 4, 4)]
    edges += [{"src": "n0", "dst": f"n{i}", "bytes": 2.0} for i in range(50, n, 50)]
    g = graph_from_dict(
        {"format": "gpp-graph/1", "name": "skips", "micro_batch_sizes": [1, 2], "nodes": nodes, "edges": edges}
    )
    lin = linearize(g, max_states=n)  # more downsets than that: the prefixes of one order
    assert lin.kind == "topological" and lin.n_states == n + 1
    t0 = time.perf_counter()
    in_b, in_c, _, _ = lin.range_transfers(g)
    assert time.perf_counter() - t0 < 20  # 49 s a pass per edge over all ranges, 1.1 s now (2-core machine)
    assert in_c[1, n] == 1 and in_b[1, n] == 8.0  # n0's largest edge into n1..n1999
    assert in_c[3, 6] == 2 and in_b[3, 6] == 8.0 + 4.0  # n2 -> n3 and n0 -> n4 (skip)
