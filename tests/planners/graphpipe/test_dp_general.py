"""The per-stage micro-batch DP (:mod:`gpp_solver.planners.graphpipe.dp.general`) and ``plan_graphpipe(...,
per_stage_micro_batch=True)``.

The brute force shares only the SP tree with the DP: it lists every partition that follows the tree
(``test_dp.partitions``), every micro-batch size (and ``k``) per stage, computes Algorithm 2's
in-flight counts on the stage order of the SP-ized graph (every ordered stage pair is an edge) with
Table 2, prices stages with ``test_dp.stage_estimate`` and, per assignment, finds the fewest devices
per target by scanning thresholds.
"""

from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest
from test_dp import partitions, stage_estimate
from tiny_graphs import random_dag_edges

from gpp_solver.binary_search import search_tps
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.plan.schedule import compute_in_flight, schedule_stage_graph
from gpp_solver.plan.validate import validate
from gpp_solver.planners.graphpipe.dp.general import GeneralStageDP, in_flight_delta
from gpp_solver.planners.graphpipe.dp.stage import power_of_two_degrees
from gpp_solver.planners.graphpipe.dp.stage_dp import StageDP
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.sp_tree import decompose, order_pairs
from gpp_solver.types import Cluster

B = 8
SIZES = (1, 2, 4)


def tiny_instance(rng: random.Random):
    """<= 6 operators, <= 3 devices, sizes {1, 2, 4}, B = 8; memory often binding."""
    n = rng.randint(1, 6)
    edges = random_dag_edges(rng, n, 0.6, 0.4)
    nodes = []
    for i in range(n):
        f1 = rng.uniform(0.5, 3.0)
        fw = [f1, f1 * rng.uniform(1.0, 2.0)]
        fw.append(fw[1] * rng.uniform(1.0, 2.0))
        nodes.append(
            {
                "id": f"v{i}",
                "fw_time": fw,
                "bw_time": [2 * x for x in fw],
                "weight_bytes": rng.choice([0.0, rng.uniform(5, 50)]),
                "activation_bytes": rng.choice([rng.uniform(0, 10), rng.uniform(10, 80)]),
                "output_bytes": rng.uniform(1, 30),
            }
        )
    graph = graph_from_dict(
        {
            "name": "tiny",
            "micro_batch_sizes": list(SIZES),
            "nodes": nodes,
            "edges": [{"src": f"v{a}", "dst": f"v{b}"} for a, b in sorted(edges)],
        }
    )
    cluster = Cluster(
        devices=rng.randint(1, 3),
        memory_bytes=rng.uniform(60, 500),
        devices_per_node=rng.choice([None, 1, 2]),
        intra_node_bandwidth=rng.uniform(50, 200),
        inter_node_bandwidth=rng.uniform(5, 50),
        latency=rng.choice([0.0, 0.05]),
        optimizer_state_factor=rng.choice([1.0, 4.0]),
    )
    return graph, cluster


def _assignments(graph, cluster, tree, k_options):
    """Every (partition, per-stage (b, k), Algorithm 2 in-flight on the SP stage order, W, A)."""
    pairs = order_pairs(tree)
    configs = [(b, k) for b in SIZES for k in k_options]
    for part in partitions(tree):
        m = len(part)
        after = [
            [j for j in range(m) if j != i and any((u, v) in pairs for u in part[i] for v in part[j])] for i in range(m)
        ]
        sg = nx.DiGraph()
        sg.add_nodes_from(range(m))
        sg.add_edges_from((i, j) for i in range(m) for j in after[i])
        order = list(nx.topological_sort(sg))
        W = [sum(graph.node(v).weight_bytes for v in s) for s in part]
        A = [sum(graph.node(v).activation_bytes for v in s) for s in part]
        for assign in itertools.product(configs, repeat=m):
            inflight = [0] * m
            for i in reversed(order):
                b, k = assign[i]
                inflight[i] = max(
                    (compute_in_flight(k, b, assign[j][1], assign[j][0], inflight[j]) for j in after[i]), default=k * b
                )
            yield part, assign, inflight, W, A


def _memory(cluster, W, A, b, i, d):
    peak = max(1, min(B // b, math.ceil(i / b))) * b
    return cluster.optimizer_state_factor * W + peak / d * A


def _fewest(options, devices):
    """Smallest threshold ``t`` such that every stage has an option ``(value <= t, d)`` and the
    smallest such degrees sum to at most ``devices``."""
    for t in sorted({x for o in options for x, _ in o}):
        if sum(min((d for x, d in o if x <= t), default=10**9) for o in options) <= devices:
            return t
    return None


def sp_order_in_flight(stages, tree) -> list[int]:
    """Algorithm 2 (``schedule_stage_graph``) on the SP stage order, every ordered pair an edge."""
    pairs = order_pairs(tree)
    succs = {
        i: [j for j, y in enumerate(stages) if j != i and any((u, v) in pairs for u in x.nodes for v in y.nodes)]
        for i, x in enumerate(stages)
    }
    out = schedule_stage_graph(
        succs, {i: s.micro_batch_size for i, s in enumerate(stages)}, {i: s.k for i, s in enumerate(stages)}
    )
    return [out[i][1] for i in range(len(stages))]


def brute_force(graph, cluster, tree, k_options=(1,)):
    """Smallest bottleneck TPS estimate over partitions x per-stage (b, k) x degrees."""
    best = None
    for part, assign, inflight, W, A in _assignments(graph, cluster, tree, k_options):
        options = []
        for i, s in enumerate(part):
            b = assign[i][0]
            options.append(
                [
                    (stage_estimate(graph, cluster, s, b, d, B), d)
                    for d in power_of_two_degrees(cluster.devices)
                    if b % d == 0 and _memory(cluster, W[i], A[i], b, inflight[i], d) <= cluster.memory_bytes
                ]
            )
        t = _fewest(options, cluster.devices)
        if t is not None and (best is None or t < best):
            best = t
    return best


def brute_force_min_memory(graph, cluster, tree):
    """Smallest memory per device with which some plan of the search space fits (any TPS)."""
    best = None
    for part, assign, inflight, W, A in _assignments(graph, cluster, tree, (1,)):
        options = [
            [
                (_memory(cluster, W[i], A[i], assign[i][0], inflight[i], d), d)
                for d in power_of_two_degrees(cluster.devices)
                if assign[i][0] % d == 0
            ]
            for i in range(len(part))
        ]
        m = _fewest(options, cluster.devices)
        if m is not None and (best is None or m < best):
            best = m
    return best


def test_table2_delta_obeys_the_triangle_inequality() -> None:
    """What makes the DP's immediate-successor summary equal Algorithm 2 on the whole stage order."""
    configs = [(b, k) for b in (1, 2, 4, 8, 16) for k in (1, 2, 4, 8)]
    for (bx, kx), (by, ky), (bz, kz) in itertools.product(configs, repeat=3):
        assert in_flight_delta(kx, bx, kz, bz) <= in_flight_delta(kx, bx, ky, by) + in_flight_delta(ky, by, kz, bz)
    for (bx, kx), (by, ky) in itertools.product(configs, repeat=2):
        for iy in range(ky * by, ky * by + 20):
            got = compute_in_flight(kx, bx, ky, by, iy)
            assert got == iy + in_flight_delta(kx, bx, ky, by) and got >= kx * bx


@pytest.mark.parametrize("seed", range(120))
def test_dp_equals_brute_force(seed: int) -> None:
    graph, cluster = tiny_instance(random.Random(seed))
    k_options = (1, 2) if seed % 4 == 3 and len(graph.ids) <= 4 else (1,)
    dec = decompose(graph)
    dp = GeneralStageDP(graph, cluster, B, micro_batch_sizes=SIZES, k_options=k_options, decomposition=dec)
    res = dp.search()
    want = brute_force(graph, cluster, dec.tree, k_options)
    if want is None:
        assert res is None
        return
    assert res is not None and math.isclose(res.tps, want, rel_tol=1e-9)
    assert sorted(v for s in res.stages for v in s.nodes) == sorted(graph.ids)
    assert sum(s.degree for s in res.stages) <= cluster.devices
    for s in res.stages:
        assert s.tps_estimate <= res.tps * (1 + 1e-12)
        assert s.micro_batch_size % s.degree == 0 and s.k in k_options
    assert [s.in_flight_bound for s in res.stages] == sp_order_in_flight(res.stages, dec.tree)
    # never worse than one micro-batch size for all stages (the uniform DP's space is inside this one)
    uniform = [
        r.tps
        for r in (search_tps(StageDP(graph, cluster, B, decomposition=dec, shared_sinks=False), b) for b in SIZES)
        if r
    ]
    if uniform:
        assert res.tps <= min(uniform) * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_planner_plans_are_valid_bounded_and_deterministic(seed: int) -> None:
    graph, cluster = tiny_instance(random.Random(700 + seed))
    try:
        plan = plan_graphpipe(
            graph, cluster, B, micro_batch_sizes=SIZES, per_stage_micro_batch=True, search_k=seed % 3 == 0
        )
    except Exception as exc:  # infeasible instances: the brute force must agree
        from gpp_solver.errors import InfeasibleError

        assert isinstance(exc, InfeasibleError)
        assert brute_force(graph, cluster, decompose(graph).tree) is None
        return
    validate(plan, graph, cluster)
    extra = plan.search.extra
    assert plan.predicted.time_per_sample <= extra["dp_time_per_sample"] * (1 + 1e-9)
    bounds = {tuple(r["nodes"]): r for r in extra["dp_stages"] or ()}
    assert (extra["dp_stages"] is None) == (extra["stages_from"] == "uniform-b sweep")
    for st in plan.stages if bounds else ():
        r = bounds[st.nodes]
        b = st.micro_batch_size
        assert r["micro_batch_size"] == b and r["k"] == st.schedule.k
        assert st.in_flight_samples <= max(1, min(B // b, math.ceil(r["in_flight_bound"] / b))) * b
    exact = math.isclose(plan.predicted.time_per_sample, extra["dp_time_per_sample"], rel_tol=1e-9)
    assert (plan.search.status == "optimal-within-search-space") == exact
    again = plan_graphpipe(
        graph, cluster, B, micro_batch_sizes=SIZES, per_stage_micro_batch=True, search_k=seed % 3 == 0
    )
    a, b = plan_to_dict(plan), plan_to_dict(again)
    a["search"].pop("seconds")
    b["search"].pop("seconds")
    assert a == b


@pytest.mark.parametrize("seed", range(60))
def test_min_memory_equals_brute_force(seed: int) -> None:
    """Memory as the objective: this is where Table 2's in-flight counts decide the answer."""
    graph, cluster = tiny_instance(random.Random(300 + seed))
    dec = decompose(graph)
    dp = GeneralStageDP(graph, cluster, B, micro_batch_sizes=SIZES, decomposition=dec)
    assert math.isclose(dp.min_memory(), brute_force_min_memory(graph, cluster, dec.tree), rel_tol=1e-9)


def _branch_graph() -> tuple:
    """Figure 5's idea: a source feeding two sink branches; branch ``heavy`` keeps big activations."""

    def node(v, f, act):
        return {
            "id": v,
            "fw_time": f,
            "bw_time": [2 * x for x in f],
            "weight_bytes": 0.0,
            "activation_bytes": act,
            "output_bytes": 1.0,
        }

    eff = [1.0, 1.1, 1.2]  # almost free to batch: b = 4 is ~3.3x cheaper per sample than b = 1
    g = graph_from_dict(
        {
            "name": "fig5",
            "micro_batch_sizes": [1, 2, 4],
            "nodes": [node("src", eff, 1.0), node("light", eff, 1.0), node("heavy", [0.2, 0.22, 0.24], 100.0)],
            "edges": [{"src": "src", "dst": "light"}, {"src": "src", "dst": "heavy"}],
        }
    )
    c = Cluster(devices=3, memory_bytes=150.0, inter_node_bandwidth=1e6)
    return g, c


def test_per_stage_sizes_strictly_help_a_memory_bound_branch() -> None:
    g, c = _branch_graph()
    uniform = [r.tps for r in (search_tps(StageDP(g, c, B, shared_sinks=False), b) for b in SIZES) if r]
    plan = plan_graphpipe(g, c, B, micro_batch_sizes=SIZES, per_stage_micro_batch=True)
    validate(plan, g, c)
    assert plan.predicted.time_per_sample < min(uniform) * (1 - 1e-6)
    sizes = {v: s.micro_batch_size for s in plan.stages for v in s.nodes}
    assert sizes["heavy"] < sizes["src"]
    assert plan.search.status == "optimal-within-search-space"


def test_default_option_is_unchanged() -> None:
    g, c = _branch_graph()
    p = plan_graphpipe(g, c, B, micro_batch_sizes=SIZES)
    assert len({s.micro_batch_size for s in p.stages}) == 1
