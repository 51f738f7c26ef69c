"""The ``gpp`` planner: exact pricing of partition states, valid moves, quality against the exact
optimum on tiny random graphs, never worse than GraphPipe, deterministic."""

from __future__ import annotations

import math
import random

import pytest

import gpp_solver as gs
from gpp_solver.cost.model import stage_costs
from gpp_solver.errors import InfeasibleError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.planners.gpp.chains import chain_states
from gpp_solver.planners.gpp.local_search import neighbours, repartitions, search
from gpp_solver.planners.gpp.partition_eval import Problem
from gpp_solver.planners.gpp.planner import plan_gpp
from gpp_solver.planners.gpp.plans import build_from_state
from gpp_solver.planners.gpp.seeds import seed_fn
from gpp_solver.types import Cluster, SearchInfo

oracle = pytest.importorskip("gpp_solver.oracles.brute_force")

KINDS = ("chain", "diamond", "sp", "dag")


def instances(count: int, seed: int, sizes=(6, 7)):
    """Seeded tiny instances: every kind in turn, 4 devices, flat or 2-per-node clusters."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        kind = KINDS[i % len(KINDS)]
        n = rng.choice(sizes)
        g = oracle.random_graph(rng, kind, n, name=f"{kind}-{n}-{i}")
        c = oracle.random_cluster(rng, 4, placement=i % 2 == 1)
        out.append((g, c))
    return out


def _no_seeds(**kw):
    return dict(seed_planners=(), tighten=False, **kw)


# ------------------------------------------------------------------------------- evaluator
@pytest.mark.parametrize("g,c", instances(4, 11))
def test_evaluator_matches_cost_model_and_plan_build(g, c):
    """The local search's fast pricing equals cost.stage_costs / build_plan on every neighbour state."""
    B = 16
    checked = 0
    for b in (2, 4):
        P = Problem(g, c, B, b)
        label, st = next(iter(chain_states(P)))
        states = [st] + [cand for _, cand in neighbours(P, st, 0)][:40]
        for cand in states:
            ev = P.evaluate(cand.assign, cand.devs)
            if ev is None:
                continue
            specs = [
                StageSpec(
                    tuple(g.ids[u] for u in range(P.N) if cand.assign[u] == s),
                    tuple(range(ev.offsets[s], ev.offsets[s] + cand.devs[s])),
                    b,
                )
                for s in range(len(cand.devs))
            ]
            costs = stage_costs(g, c, specs, B)
            for s, cost in enumerate(costs):
                assert math.isclose(cost.time_per_sample, ev.tps[s], rel_tol=1e-9)
            plan = build_plan(g, c, specs, B, planner="gpp", search=SearchInfo(0.0, "feasible"))
            assert math.isclose(plan.predicted.time_per_sample, ev.max_tps, rel_tol=1e-9)
            assert math.isclose(plan.predicted.peak_memory_bytes, max(ev.memory), rel_tol=1e-9)
            checked += 1
    assert checked > 10


def test_cyclic_stage_graph_is_rejected_by_the_evaluator():
    g = gs.graph_from_dict(
        {
            "name": "c3",
            "micro_batch_sizes": [1],
            "nodes": [
                {
                    "id": x,
                    "fw_time": [1.0],
                    "bw_time": [2.0],
                    "weight_bytes": 1.0,
                    "activation_bytes": 1.0,
                    "output_bytes": 1.0,
                }
                for x in "abc"
            ],
            "edges": [{"src": "a", "dst": "b"}, {"src": "b", "dst": "c"}],
        }
    )
    c = Cluster(devices=2, memory_bytes=1e9, inter_node_bandwidth=1e9)
    P = Problem(g, c, 4, 2)
    assert P.evaluate((0, 1, 0), (1, 1)) is None  # {a, c} is not convex: a cycle 0 -> 1 -> 0
    assert P.evaluate((0, 0, 1), (1, 1)) is not None


# ------------------------------------------------------------------------------- search
@pytest.mark.parametrize("g,c", instances(3, 5))
def test_every_accepted_state_is_a_valid_plan(g, c):
    """Stopping the search after 1, 2, ... iterations always leaves a plan the validator accepts."""
    P = Problem(g, c, 16, 4)
    start = min((st for _, st in chain_states(P)), key=lambda st: P.evaluate(st.assign, st.devs).key)
    prev = None
    for it in range(1, 8):
        res = search(P, start, max_iterations=it)
        plan = build_from_state(P, res.state, res.ev, SearchInfo(0.0, "feasible"))
        gs.validate(plan, g, c)
        assert math.isclose(plan.predicted.time_per_sample, res.ev.max_tps, rel_tol=1e-9)
        if prev is not None:
            assert res.ev.key <= prev  # never worse than after fewer iterations
        prev = res.ev.key
        if res.stopped == "converged":
            break


def test_repartition_covers_every_two_stage_split_of_a_pair():
    """On a 2-stage chain the exact pair re-partition enumerates every prefix cut."""
    g, c = instances(1, 3, sizes=(6,))[0]
    P = Problem(g, c, 16, 4)
    order = [g.index[v] for v in g.topo_order]
    a = [0] * P.N
    for u in order[3:]:
        a[u] = 1
    from gpp_solver.planners.gpp.partition_eval import State

    cands = list(repartitions(P, State(tuple(a), (2, 2)), 0))
    assert cands and all(lbl == "repartition" for lbl, _ in cands)
    assert all(P.evaluate(st.assign, st.devs) is not None for _, st in cands)


# ------------------------------------------------------------------------------- quality
def _quality(cases):
    hits, gaps = 0, []
    for g, c in cases:
        opt, oplan = oracle.best_plan_bruteforce(g, c, 16)
        if oplan is None:
            continue
        p = plan_gpp(g, c, 16, objective="time_per_sample", **_no_seeds())
        gs.validate(p, g, c)
        gap = p.predicted.time_per_sample / opt - 1
        gaps.append(gap)
        hits += gap <= 1e-9
    return hits, gaps


def test_reaches_the_exact_optimum_in_most_tiny_cases():
    """Bottleneck TPS against the brute-force oracle (all convex partitions), own seeds only."""
    hits, gaps = _quality(instances(8, 2024))
    assert len(gaps) == 8
    assert hits >= 6, gaps
    assert max(gaps) < 0.15, gaps


@pytest.mark.slow
def test_reaches_the_exact_optimum_in_most_cases_many():
    hits, gaps = _quality(instances(40, 7, sizes=(6, 7, 8)))
    assert hits >= 0.85 * len(gaps), gaps
    assert sum(gaps) / len(gaps) < 0.02, gaps


@pytest.mark.parametrize("g,c", instances(4, 99))
def test_never_worse_than_graphpipe(g, c):
    gp = seed_fn("graphpipe")
    if gp is None:
        pytest.skip("the graphpipe planner is not installed")
    ref = gp(g, c, 16)
    p = plan_gpp(g, c, 16, seed_planners=("graphpipe",))
    gs.validate(p, g, c)
    assert p.predicted.iteration_time <= ref.predicted.iteration_time * (1 + 1e-9)
    q = plan_gpp(g, c, 16, seed_planners=("graphpipe",), objective="time_per_sample", tighten=False)
    assert q.predicted.time_per_sample <= ref.predicted.time_per_sample * (1 + 1e-9)
    assert p.search.extra["seeds"]["graphpipe"]["status"] == ref.search.status


def test_given_seed_plan_is_never_beaten_by_the_result():
    """A seed plan handed in is a candidate: the result's simulated iteration time is at most its."""
    g, c = instances(1, 17, sizes=(7,))[0]
    seed_plan = oracle.best_plan_bruteforce(g, c, 16)[1]
    p = plan_gpp(g, c, 16, seed_plans={"oracle": seed_plan}, **_no_seeds())
    assert p.predicted.iteration_time <= seed_plan.predicted.iteration_time * (1 + 1e-9)
    assert p.search.extra["seeds"]["oracle"]["given"] is True


# ------------------------------------------------------------------------------- contract
def test_deterministic_under_a_fixed_seed_and_time_limit():
    g, c = instances(1, 23, sizes=(7,))[0]
    a = plan_gpp(g, c, 16, time_limit=30, seed=3)
    b = plan_gpp(g, c, 16, time_limit=30, seed=3)

    def strip(p):
        return {**gs.plan_to_dict(p), "search": None}

    assert strip(a) == strip(b)
    for k in ("seed_planner", "moves", "tps_before", "tps_after"):
        assert a.search.extra[k] == b.search.extra[k]
    assert a.search.micro_batch_size == b.search.micro_batch_size


def test_status_and_record():
    g, c = instances(1, 31, sizes=(6,))[0]
    p = plan_gpp(g, c, 16, exact=False, **_no_seeds())  # the local search's record (exact: test_exact.py)
    assert p.planner == "gpp"
    assert p.search.status == "feasible"
    ex = p.search.extra
    assert ex["tps_after"] == p.predicted.time_per_sample
    assert ex["seed_planner"].startswith(("chain", "uniform"))
    assert ex["moves"] >= ex["polish_moves"] >= 0
    if ex["polish_moves"] == 0:  # the TPS search never raises the bottleneck; the polish may
        assert ex["tps_after"] <= ex["tps_before"] * (1 + 1e-9)
    assert p.search.micro_batch_size == p.stages[0].micro_batch_size


def test_optimal_only_when_proven_by_the_exact_planner():
    g, c = instances(1, 41, sizes=(6,))[0]
    p = plan_gpp(g, c, 16, objective="time_per_sample", prove=True, **_no_seeds())
    exact = p.search.extra["exact_tps"]
    if exact is None:
        assert p.search.status != "optimal-time-per-sample"
    else:
        assert (p.search.status == "optimal-time-per-sample") == (p.predicted.time_per_sample <= exact * (1 + 1e-9))


def test_failing_or_missing_seed_planner_is_skipped(monkeypatch):
    from gpp_solver import planners

    monkeypatch.setitem(planners.REGISTRY, "boom", "gpp_solver.no_such_module:plan")
    monkeypatch.setitem(planners.REGISTRY, "raises", "tests_fake:plan")
    import sys
    import types

    fake = types.ModuleType("tests_fake")

    def plan(*a, **k):
        raise RuntimeError("seed planner crashed")

    fake.plan = plan
    monkeypatch.setitem(sys.modules, "tests_fake", fake)
    g, c = instances(1, 5, sizes=(6,))[0]
    p = plan_gpp(g, c, 16, seed_planners=("boom", "raises"), tighten=False)
    gs.validate(p, g, c)
    assert p.search.extra["seeds"]["boom"]["status"] == "missing"
    assert p.search.extra["seeds"]["raises"]["status"].startswith("error")


def test_memory_bound_forces_a_split_and_infeasible_reports_need():
    g, c = instances(1, 8, sizes=(6,))[0]
    w = sum(n.weight_bytes for n in g.nodes)
    tight = Cluster(devices=4, memory_bytes=c.optimizer_state_factor * w * 0.6, inter_node_bandwidth=1e10, latency=1e-5)
    try:
        p = plan_gpp(g, tight, 16, **_no_seeds())
    except InfeasibleError as exc:
        assert exc.required_memory_bytes is None or exc.required_memory_bytes > tight.memory_bytes
    else:
        gs.validate(p, g, tight)
        assert len(p.stages) >= 2
    nothing = Cluster(devices=4, memory_bytes=1.0, inter_node_bandwidth=1e10)
    with pytest.raises(InfeasibleError) as e:
        plan_gpp(g, nothing, 16, **_no_seeds())
    assert e.value.required_memory_bytes > 1.0


def test_uniform_chain_seeds_cover_equal_degree_pipelines():
    """Own seeds include, for every degree d | b, a chain of D // d stages with d devices each."""
    g, c = instances(1, 13, sizes=(7,))[0]
    P = Problem(g, c, 16, 4)
    uni = [st for label, st in chain_states(P) if label.startswith("uniform")]
    degs = {st.devs[0] for st in uni}
    assert degs == set(P.degrees)
    for st in uni:
        assert len(set(st.devs)) == 1 and sum(st.devs) <= P.D
        assert len(st.devs) == min(P.D // st.devs[0], P.N)
        assert P.evaluate(st.assign, st.devs) is not None  # prefix cuts of a topological order


def test_seed_planners_run_until_the_safety_stop_and_a_time_limited_seed_cuts_the_run(monkeypatch):
    """Seed planners get the time left until SEED_SAFETY_SHARE of the limit (not a fixed share each);
    one that takes longer than a 20 % share is used as is; a plan stopped by its own time
    limit is kept as a candidate but makes the result's status ``time-limit``."""
    import sys
    import time as _time
    import types
    from dataclasses import replace as dc_replace

    from gpp_solver import planners
    from gpp_solver.planners.gpp import seeds as gpp_seeds

    g, c = instances(1, 19, sizes=(6,))[0]
    gp = seed_fn("graphpipe")
    if gp is None:
        pytest.skip("the graphpipe planner is not installed")
    seen: dict[str, float] = {}
    clock = {"skew": 0.0}
    real = _time.perf_counter
    monkeypatch.setattr(_time, "perf_counter", lambda: real() + clock["skew"])
    fake = types.ModuleType("tests_fake_seeds")

    def ok(graph, cluster, B, *, time_limit=None, **kw):
        seen["ok"] = time_limit
        clock["skew"] += 0.3 * 5.0  # "takes" 30 % of the limit, within its own time_limit
        return gp(graph, cluster, B)

    def cut(graph, cluster, B, *, time_limit=None, **kw):
        seen["cut"] = time_limit
        p = gp(graph, cluster, B)
        return dc_replace(p, search=dc_replace(p.search, status="time-limit"))

    fake.ok, fake.cut = ok, cut
    monkeypatch.setitem(sys.modules, "tests_fake_seeds", fake)
    monkeypatch.setitem(planners.REGISTRY, "ok", "tests_fake_seeds:ok")
    monkeypatch.setitem(planners.REGISTRY, "cut", "tests_fake_seeds:cut")
    p = plan_gpp(g, c, 16, time_limit=5.0, seed_planners=("ok",), tighten=False, ladder=0)
    gs.validate(p, g, c)
    assert gpp_seeds.SEED_SAFETY_SHARE * 5.0 * 0.9 < seen["ok"] <= gpp_seeds.SEED_SAFETY_SHARE * 5.0 + 1e-9
    assert p.search.extra["seeds"]["ok"]["status"] == gp(g, c, 16).search.status  # the seed's own
    assert p.search.status in ("feasible", "optimal-iteration-time")  # not time-limit
    clock["skew"] = 0.0
    p = plan_gpp(g, c, 16, time_limit=5.0, seed_planners=("ok", "cut"), tighten=False, exact=False, ladder=0)
    gs.validate(p, g, c)
    assert 0 < seen["cut"] <= (gpp_seeds.SEED_SAFETY_SHARE - 0.3) * 5.0 + 1e-9
    seeds = p.search.extra["seeds"]
    assert seeds["cut"]["status"] == "time-limit" and "time_per_sample" in seeds["cut"]
    assert p.search.status == "time-limit"


def _multi_branch_instance():
    rng = random.Random(7)
    g = oracle.random_graph(rng, "sp", 10, name="sp-10")
    c = oracle.random_cluster(rng, 4, placement=True)
    return g, c


def test_same_plan_on_a_five_times_slower_machine(monkeypatch):
    """With every clock reading running 5x fast (a machine 5x slower) but the limit not reached,
    seed planners, local search and CP-SAT tightening give exactly the same plan."""
    import time as _time

    g, c = _multi_branch_instance()
    assert max(len(g.succs(v)) for v in g.ids) >= 2  # a multi-branch graph
    # exact=False: the exact search on this 10-node graph is wall-clock bound (cut: time-limit, by design)
    a = plan_gpp(g, c, 16, time_limit=20, exact=False)
    real_pc, real_mono = _time.perf_counter, _time.monotonic
    t0, m0 = real_pc(), real_mono()
    monkeypatch.setattr(_time, "perf_counter", lambda: t0 + 5.0 * (real_pc() - t0))
    monkeypatch.setattr(_time, "monotonic", lambda: m0 + 5.0 * (real_mono() - m0))
    b = plan_gpp(g, c, 16, time_limit=20, exact=False)
    monkeypatch.undo()
    assert a.search.status == b.search.status == "feasible"

    def strip(p):
        return {k: v for k, v in gs.plan_to_dict(p).items() if k != "search"}

    assert strip(a) == strip(b)
    ea, eb = a.search.extra, b.search.extra
    assert a.search.cp_tighten["status"] == b.search.cp_tighten["status"] != "skipped"
    assert {k: v["status"] for k, v in ea["seeds"].items()} == {k: v["status"] for k, v in eb["seeds"].items()}


def test_quickstart_plan_is_the_same_under_a_ten_times_larger_limit():
    """The README's quickstart (MMT, 8 V100s, B = 128): the default budget is work, not wall clock,
    so the default limit and a 10x larger one give the same plan, neither stopped by the clock."""
    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT
    from gpp_solver.workloads import build_model

    g, c = build_model("mmt"), v100_cluster(8)
    a = plan_gpp(g, c, 128)
    b = plan_gpp(g, c, 128, time_limit=10 * DEFAULT_TIME_LIMIT)
    assert a.search.status == b.search.status == "feasible"

    def strip(p):
        return {k: v for k, v in gs.plan_to_dict(p).items() if k != "search"}

    assert strip(a) == strip(b)
    assert a.search.cp_tighten["status"] == b.search.cp_tighten["status"] != "skipped"


@pytest.mark.slow
@pytest.mark.parametrize("model,per_device", [("mmt", 16), ("dlrm", 64), ("candle-uno", 1024), ("transformer", 16)])
def test_default_search_fits_ten_seconds_at_32_devices(model, per_device):
    """The default time limit (seed planners included) holds at 32 devices, not reached (the plan
    does not depend on load); some slack for load in the seconds."""
    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT
    from gpp_solver.workloads import build_model

    g, c = build_model(model), v100_cluster(32)
    p = plan_gpp(g, c, per_device * 32)
    gs.validate(p, g, c)
    assert p.search.status != "time-limit"
    assert p.search.seconds <= 1.5 * DEFAULT_TIME_LIMIT


def test_nodes_move_between_parallel_branches_with_no_edge_between_them():
    """n1 fans out to n2, n3 and n4 -> n5: moving n2 into the stage of {n4, n5} (no edge joins them)
    is a candidate, and a valid one (the MILP's optimum on such a graph needs it)."""
    from gpp_solver.planners.gpp.partition_eval import State

    nodes = [
        {
            "id": f"n{i}",
            "fw_time": [1.0],
            "bw_time": [2.0],
            "weight_bytes": 1.0,
            "activation_bytes": 1.0,
            "output_bytes": 1.0,
        }
        for i in range(6)
    ]
    edges = [("n0", "n1"), ("n1", "n2"), ("n1", "n3"), ("n1", "n4"), ("n4", "n5")]
    g = gs.graph_from_dict(
        {"name": "fan", "micro_batch_sizes": [1], "nodes": nodes, "edges": [{"src": a, "dst": b} for a, b in edges]}
    )
    c = Cluster(devices=4, memory_bytes=1e9, inter_node_bandwidth=1e9)
    P = Problem(g, c, 8, 2)
    idx = g.index
    a = [0] * 6
    for v in ("n2", "n3"):
        a[idx[v]] = 1
    for v in ("n4", "n5"):
        a[idx[v]] = 2
    st = State(tuple(a), (1, 1, 2))
    want = list(a)
    want[idx["n2"]] = 2
    cands = [cand for label, cand in neighbours(P, st, 1) if label == "move"]
    assert State(tuple(want), (1, 1, 2)) in cands
    assert P.evaluate(tuple(want), (1, 1, 2)) is not None


def _bench(name: str):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_bounds_never_exceed_the_exact_optimum():
    """gpp_quality's plain and node bounds are true lower bounds: at every micro-batch size they are
    at most the brute-force optimum's TPS (flat and 2-per-node clusters)."""
    q = _bench("gpp_quality")
    checked = 0
    for g, c in instances(6, 77, sizes=(6, 7)):
        for b in (1, 4, 16):
            opt, plan = oracle.best_plan_bruteforce(g, c, 16, micro_batch_sizes=[b])
            if plan is None:
                continue
            assert q.perfect_balance_tps(g, b, c.devices) <= opt * (1 + 1e-9)
            assert q.node_bound_tps(g, c, b, 16) <= opt * (1 + 1e-9)
            checked += 1
    assert checked >= 10


def test_small_stage_is_split_at_every_down_set():
    """A stage of a fan (n0 -> n1, n2, n3) has down-sets that are no prefix of a topological
    order ({n0, n2}); the split move offers each of them."""
    from gpp_solver.planners.gpp.partition_eval import State

    nodes = [
        {
            "id": f"n{i}",
            "fw_time": [1.0],
            "bw_time": [2.0],
            "weight_bytes": 1.0,
            "activation_bytes": 1.0,
            "output_bytes": 1.0,
        }
        for i in range(4)
    ]
    g = gs.graph_from_dict(
        {
            "name": "fan3",
            "micro_batch_sizes": [1],
            "nodes": nodes,
            "edges": [{"src": "n0", "dst": f"n{i}"} for i in (1, 2, 3)],
        }
    )
    c = Cluster(devices=4, memory_bytes=1e9, inter_node_bandwidth=1e9)
    P = Problem(g, c, 8, 2)
    splits = {
        tuple(sorted(g.ids[u] for u in range(4) if cand.assign[u] == 0))
        for label, cand in neighbours(P, State((0, 0, 0, 0), (1,)), 0)
        if label == "split"
    }
    assert ("n0", "n2") in splits and ("n0", "n1", "n3") in splits
    assert len(splits) == 7  # {n0} plus any non-empty proper subset of {n1, n2, n3}


def test_seed_planners_overrunning_the_whole_budget_still_leave_a_plan(monkeypatch):
    """A seed planner that ignores its time limit eats the whole budget; gpp still returns a valid
    plan of its own (status time-limit) instead of claiming infeasibility."""
    import sys
    import time as _time
    import types

    from gpp_solver import planners

    fake = types.ModuleType("tests_fake_slow")

    def slow(graph, cluster, B, *, time_limit=None, **kw):
        _time.sleep(0.6)
        raise RuntimeError("gave up")

    fake.slow = slow
    monkeypatch.setitem(sys.modules, "tests_fake_slow", fake)
    monkeypatch.setitem(planners.REGISTRY, "slow", "tests_fake_slow:slow")
    g, c = instances(1, 29, sizes=(6,))[0]
    p = plan_gpp(g, c, 16, time_limit=0.5, seed_planners=("slow",), tighten=False)
    gs.validate(p, g, c)
    assert p.search.status == "time-limit"
    assert p.search.extra["seeds"]["slow"]["status"].startswith("error")


def test_small_graphs_get_every_seed_and_more_restarts_by_default():
    """On graphs of at most SMALL_GRAPH_NODES nodes and SMALL_GRAPH_DEVICES devices the default seeds add PipeDream's and Alpa's DPs
    and the local search restarts from SMALL_GRAPH_RESTARTS starts (a rule on the input's size: the
    plan still does not depend on load); explicit options win; larger graphs keep the lean defaults."""
    import random

    from gpp_solver.formats.cluster_spec import cluster_from_spec
    from gpp_solver.oracles.brute_force import random_cluster, random_graph
    from gpp_solver.planners.gpp.options import SMALL_GRAPH_NODES, SMALL_GRAPH_RESTARTS
    from gpp_solver.workloads import build_model

    rng = random.Random(9)
    g, c = random_graph(rng, "dag", 8), random_cluster(rng, 4)
    extra = gs.solve(g, c, mini_batch_size=8, planner="gpp").search.extra
    assert set(extra["seeds"]) >= {"graphpipe", "pipedream-2bw", "pipedream", "alpa"}
    assert max(v["restarts"] for v in extra["per_micro_batch"].values()) == SMALL_GRAPH_RESTARTS
    extra = gs.solve(g, c, mini_batch_size=8, planner="gpp", seed_planners=("graphpipe",), restarts=1).search.extra
    assert set(extra["seeds"]) == {"graphpipe"} and max(v["restarts"] for v in extra["per_micro_batch"].values()) == 1
    big = build_model("mmt")
    assert len(big.nodes) > SMALL_GRAPH_NODES
    extra = gs.solve(big, cluster_from_spec("v100:4"), mini_batch_size=64, planner="gpp").search.extra
    assert set(extra["seeds"]) == {"graphpipe", "pipedream-2bw"}
    extra = gs.solve(g, random_cluster(rng, 32), mini_batch_size=64, planner="gpp").search.extra  # many devices
    assert set(extra["seeds"]) == {"graphpipe", "pipedream-2bw"}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_restarts_must_be_a_positive_integer(bad):
    import random

    from gpp_solver.errors import InvalidInputError
    from gpp_solver.oracles.brute_force import random_cluster, random_graph

    rng = random.Random(9)
    with pytest.raises(InvalidInputError, match="restarts"):
        gs.solve(random_graph(rng, "chain", 5), random_cluster(rng, 2), mini_batch_size=4, planner="gpp", restarts=bad)


def test_a_plan_found_with_more_memory_is_found_again_at_its_own_peak():
    """DLRM on 8 V100s: PipeDream-2BW's model (two weight versions) refuses the unconstrained plan's
    own peak, where that plan fits the cost model's rule; its retry with more memory
    (seeds.RELAXED_MEMORY) brings the plan back, so gpp at that peak is no slower."""
    from dataclasses import replace

    from gpp_solver.formats.machines import machine_cluster
    from gpp_solver.workloads import build_model

    graph, cluster = build_model("dlrm"), machine_cluster("v100", 8)
    roomy = gs.solve(graph, replace(cluster, memory_bytes=1e15), mini_batch_size=128)
    peak = roomy.predicted.peak_memory_bytes
    tight = gs.solve(graph, replace(cluster, memory_bytes=peak), mini_batch_size=128)
    gs.validate(tight, graph, replace(cluster, memory_bytes=peak))
    seed = tight.search.extra["seeds"]["pipedream-2bw"]
    assert seed["status"] == "error: InfeasibleError" and seed["relaxed"]["memory_bytes"] == 2 * peak
    assert tight.predicted.iteration_time <= roomy.predicted.iteration_time * (1 + 1e-9)
