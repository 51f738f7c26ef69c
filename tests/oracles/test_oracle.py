"""Brute-force oracle: its enumeration is exactly the convex partitions with an acyclic stage
graph, its figures are the cost model's, memory and the refusal limits hold."""

from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest

import gpp_solver as gs
from gpp_solver.cost.micro_batch import powers_of_two_dividing
from gpp_solver.cost.network import constant_bandwidth
from gpp_solver.errors import SearchSpaceTooLargeError
from gpp_solver.oracles.brute_force import (
    GRAPH_KINDS,
    best_plan_bruteforce,
    candidates,
    min_peak_memory_bruteforce,
    ordered_partitions,
    random_cluster,
    random_graph,
)
from gpp_solver.planners.milp import space as milp_space
from gpp_solver.planners.milp.space import contiguous_ranges, layouts
from gpp_solver.sp_tree import decompose


def _set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in _set_partitions(rest):
        for i in range(len(p)):
            yield p[:i] + [[first] + p[i]] + p[i + 1 :]
        yield [[first]] + p


def _valid_by_networkx(graph, parts) -> bool:
    """Convex stages and an acyclic stage graph, checked the slow way."""
    g = graph.to_networkx()
    stage_of = {v: i for i, p in enumerate(parts) for v in p}
    sg = nx.DiGraph()
    sg.add_nodes_from(range(len(parts)))
    sg.add_edges_from((stage_of[u], stage_of[v]) for u, v in g.edges if stage_of[u] != stage_of[v])
    if not nx.is_directed_acyclic_graph(sg):
        return False
    for p in parts:  # convex: no path leaves p and comes back
        inside = set(p)
        out = {w for v in p for w in nx.descendants(g, v)} - inside
        if any(nx.descendants(g, w) & inside for w in out):
            return False
    return True


@pytest.mark.parametrize("seed", range(8))
def test_the_milp_space_enumerates_what_the_oracle_does(seed):
    """The oracle enumerates its partitions itself (it does not use the MILP's space): both give
    the same partitions in the same order, with every order of the stage graph or one."""
    rng = random.Random(100 + seed)
    graph = random_graph(rng, GRAPH_KINDS[seed % len(GRAPH_KINDS)], 5 + seed % 3)
    for max_stages in (1, 3, 4):
        for every_order in (True, False):
            mine = list(ordered_partitions(graph, max_stages, every_order=every_order))
            theirs = list(milp_space.ordered_partitions(graph, max_stages, every_order=every_order))
            assert mine == theirs and mine, (max_stages, every_order)


@pytest.mark.parametrize("seed", range(6))
def test_enumeration_is_exactly_convex_acyclic_partitions(seed):
    rng = random.Random(seed)
    graph = random_graph(rng, GRAPH_KINDS[seed % len(GRAPH_KINDS)], 6)
    want = {
        frozenset(map(frozenset, p))
        for p in _set_partitions(list(graph.ids))
        if len(p) <= 4 and _valid_by_networkx(graph, p)
    }
    got = [frozenset(map(frozenset, p)) for p in ordered_partitions(graph, 4, every_order=False)]
    assert len(got) == len(set(got))
    assert set(got) == want
    # with every order: each partition once per topological order of its stage graph
    ordered = list(ordered_partitions(graph, 4))
    assert len(ordered) == len(set(ordered))
    g = graph.to_networkx()
    for parts in ordered:
        pos = {v: i for i, p in enumerate(parts) for v in p}
        assert all(pos[u] <= pos[v] for u, v in g.edges)
    counts: dict = {}
    for parts in ordered:
        key = frozenset(map(frozenset, parts))
        counts[key] = counts.get(key, 0) + 1
    for key, n in counts.items():
        parts = list(key)
        sg = nx.DiGraph()
        sg.add_nodes_from(range(len(parts)))
        idx = {v: i for i, p in enumerate(parts) for v in p}
        sg.add_edges_from((idx[u], idx[v]) for u, v in g.edges if idx[u] != idx[v])
        assert n == len(list(nx.all_topological_sorts(sg)))


def test_chain_partition_count():
    graph = random_graph(random.Random(0), "chain", 7)
    # a chain of n nodes cut into k contiguous pieces: C(n-1, k-1)
    assert len(list(ordered_partitions(graph, 3))) == sum(math.comb(6, k - 1) for k in (1, 2, 3))


@pytest.mark.parametrize("seed", range(8))
def test_oracle_plan_is_valid_and_priced_by_cost_model(seed):
    rng = random.Random(100 + seed)
    graph = random_graph(rng, GRAPH_KINDS[seed % len(GRAPH_KINDS)], rng.randint(4, 7))
    cluster = random_cluster(rng, placement=seed % 2 == 1)
    tps, plan = best_plan_bruteforce(graph, cluster, 8)
    gs.validate(plan, graph, cluster)
    assert plan.predicted.time_per_sample == pytest.approx(tps, rel=1e-9)
    # nothing enumerated beats it, and every candidate's TPS is the cost model's
    cands = list(candidates(graph, cluster, 8))
    assert min(c.tps for c in cands) == pytest.approx(tps, rel=1e-12)
    for c in rng.sample(cands, 5):
        specs = [gs.StageSpec(p, r, c.micro_batch_size) for p, r in zip(c.stages, contiguous_ranges(c.devices))]
        built = gs.build_plan(graph, cluster, specs, 8, planner="x", search=gs.SearchInfo(0.0, "feasible"))
        assert built.predicted.time_per_sample == pytest.approx(c.tps, rel=1e-9)
        assert built.predicted.peak_memory_bytes == pytest.approx(c.peak_memory, rel=1e-9)


def test_placement_changes_cost_and_oracle_sees_it():
    """With two devices per node, the same stages cost differently in different device orders."""
    rng = random.Random(7)
    graph = random_graph(rng, "diamond", 6)
    cluster = random_cluster(rng, placement=True)
    assert constant_bandwidth(cluster) is None
    by_partition: dict = {}
    for c in candidates(graph, cluster, 8):
        key = (frozenset(map(frozenset, c.stages)), c.micro_batch_size, tuple(sorted(c.devices)))
        by_partition.setdefault(key, set()).add(round(c.tps, 15))
    assert any(len(v) > 1 for v in by_partition.values())
    flat = cluster.with_(devices_per_node=None)
    assert constant_bandwidth(flat) == flat.inter_node_bandwidth


@pytest.mark.parametrize("seed", range(4))
def test_memory_limit_and_min_peak_memory(seed):
    rng = random.Random(200 + seed)
    graph = random_graph(rng, GRAPH_KINDS[seed], 6)
    cluster = random_cluster(rng)
    need = min_peak_memory_bruteforce(graph, cluster, 8)
    tps, plan = best_plan_bruteforce(graph, cluster.with_(memory_bytes=need), 8)
    assert plan is not None and plan.predicted.peak_memory_bytes <= need * (1 + 1e-9)
    gs.validate(plan, graph, cluster.with_(memory_bytes=need))
    assert best_plan_bruteforce(graph, cluster.with_(memory_bytes=need * 0.999), 8) == (math.inf, None)
    loose, _ = best_plan_bruteforce(graph, cluster, 8)
    assert loose <= tps


def test_refuses_large_inputs():
    rng = random.Random(0)
    with pytest.raises(SearchSpaceTooLargeError, match="8 nodes"):
        best_plan_bruteforce(random_graph(rng, "chain", 9), random_cluster(rng), 8)
    with pytest.raises(SearchSpaceTooLargeError, match="4 devices"):
        best_plan_bruteforce(random_graph(rng, "chain", 4), random_cluster(rng, devices=5), 8)


def test_search_space_helpers():
    assert powers_of_two_dividing(24) == (1, 2, 4, 8)
    assert powers_of_two_dividing(7) == (1,)
    assert contiguous_ranges([2, 1, 1]) == [(0, 1), (2,), (3,)]
    lay = list(layouts(4, 4, 4))
    assert all(sum(p) <= 4 and all(4 % d == 0 for d in p) for p in lay)
    brute = {p for k in range(1, 5) for p in itertools.product((1, 2, 4), repeat=k) if sum(p) <= 4}
    assert set(lay) == brute and len(lay) == len(brute)


def test_random_instances_cover_the_kinds():
    rng = random.Random(3)
    sp = {kind: [decompose(random_graph(rng, kind, 7)).is_series_parallel for _ in range(12)] for kind in GRAPH_KINDS}
    assert all(sp["chain"]) and all(sp["diamond"]) and all(sp["sp"])
    assert not all(sp["dag"])  # some general DAGs are not series-parallel
    multi = [random_graph(rng, "dag", 8) for _ in range(12)]
    assert any(sum(1 for v in g.ids if not g.preds(v)) > 1 for g in multi)  # several sources
    assert any(sum(1 for v in g.ids if not g.succs(v)) > 1 for g in multi)  # several sinks
