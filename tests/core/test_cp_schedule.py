"""CP-SAT model of the stage orders: its shape, verify == simulator, tighten never worse."""

from __future__ import annotations

import random

import pytest

import gpp_solver as gs
from gpp_solver.cp_schedule import (
    build_schedule_model,
    max_in_flight_micro_batches,
    solve_model,
    tighten,
    tighten_plan_if_fits,
    verify_orders,
)
from gpp_solver.plan.build import StageSpec

SEARCH = gs.SearchInfo(0.0, "feasible")


def five_stage(seed: int, B: int = 8, memory: float = 1e6):
    """a -> (b, c -> d) -> e, one node per stage, random times and micro-batch sizes."""
    rng = random.Random(seed)
    nodes = [
        {
            "id": x,
            "fw_time": [t, 1.5 * t],
            "bw_time": [2 * t, 3 * t],
            "weight_bytes": 100.0,
            "activation_bytes": 10.0,
            "output_bytes": 5.0,
        }
        for x, t in zip("abcde", (rng.choice([0.5, 1.0, 2.0, 4.0]) for _ in range(5)))
    ]
    graph = gs.graph_from_dict(
        {
            "name": f"five{seed}",
            "micro_batch_sizes": [1, 2],
            "nodes": nodes,
            "edges": [
                {"src": "a", "dst": "b"},
                {"src": "a", "dst": "c"},
                {"src": "c", "dst": "d"},
                {"src": "b", "dst": "e"},
                {"src": "d", "dst": "e"},
            ],
        }
    )
    cluster = gs.cluster_from_dict(
        {
            "devices": 5,
            "memory_bytes": memory,
            "devices_per_node": 2,
            "intra_node_bandwidth": 1000.0,
            "inter_node_bandwidth": 100.0,
            "latency": 0.01,
        }
    )
    bs = [rng.choice([1, 2]) for _ in range(5)]
    plan = gs.build_plan(
        graph,
        cluster,
        [StageSpec((x,), (i,), bs[i]) for i, x in enumerate("abcde")],
        B,
        planner="manual",
        search=SEARCH,
    )
    return plan, graph, cluster


@pytest.fixture
def diamond_plan(diamond, cluster_dict):
    graph = gs.graph_from_dict(diamond)
    cluster = gs.cluster_from_dict(cluster_dict)
    plan = gs.build_plan(
        graph, cluster, [StageSpec((v,), (i,), 2) for i, v in enumerate("abcd")], 8, planner="manual", search=SEARCH
    )
    return plan, graph, cluster


def test_model_shape_without_solving(diamond_plan):
    plan, graph, cluster = diamond_plan
    model, v = build_schedule_model(plan, graph, cluster)
    proto = model.proto
    n = 4
    intervals = [c for c in proto.constraints if c.has_interval()]
    no_overlap = [c for c in proto.constraints if c.has_no_overlap()]
    assert len(intervals) == 4 * 2 * n and len(no_overlap) == 4
    assert all(len(c.no_overlap.intervals) == 2 * n for c in no_overlap)
    names = {var.name for var in proto.variables}
    assert {"F_s0_j0_start", "B_s3_j3_start", "makespan"} <= names
    assert v.start[(2, "B", 1)].name == "B_s2_j1_start"
    assert list(proto.objective.vars) == [v.makespan.index]
    # durations are the cost model's, in ticks
    costs = gs.cost.stage_costs(graph, cluster, plan.stages, plan.mini_batch_size)
    for s, c in zip(plan.stages, costs):
        assert v.data.forward[s.id] * v.data.unit == pytest.approx(c.forward, abs=v.data.unit)
        assert v.data.allreduce[s.id] * v.data.unit == pytest.approx(c.allreduce, abs=v.data.unit)
    # a fixed order adds one precedence per consecutive pair: 2n - 1 per stage
    fixed, _ = build_schedule_model(plan, graph, cluster, orders={s.id: s.schedule.order for s in plan.stages})
    assert len(fixed.proto.constraints) == len(proto.constraints) + 4 * (2 * n - 1)


def test_memory_limit_is_the_validators(diamond_plan):
    plan, graph, cluster = diamond_plan
    # weights 4*100 = 400 B; activations 10 B per sample on one device: (1e6 - 400) / 10 samples fit
    assert max_in_flight_micro_batches(plan, graph, cluster) == {s.id: 4 for s in plan.stages}  # capped at n
    tight = cluster.with_(memory_bytes=400 + 10 * 4)  # 4 samples = 2 micro-batches of 2
    assert max_in_flight_micro_batches(plan, graph, tight) == {s.id: 2 for s in plan.stages}
    assert max_in_flight_micro_batches(plan, graph, cluster.with_(memory_bytes=405)) == {s.id: 0 for s in plan.stages}


@pytest.mark.parametrize("seed", range(5))
def test_verify_agrees_with_simulator(seed):
    plan, graph, cluster = five_stage(seed)
    # with a tick that divides every duration the two are equal; with the default tick they agree
    # up to one tick per action
    exact = verify_orders(plan, graph, cluster, unit=1e-4)
    sim = gs.simulate(plan, graph, cluster).iteration_time
    assert exact.feasible and exact.status == "OPTIMAL"
    assert exact.makespan == pytest.approx(sim) and exact.makespan_cp == pytest.approx(sim, rel=1e-9)
    default = verify_orders(plan, graph, cluster)
    actions = 2 * sum(plan.mini_batch_size // s.micro_batch_size for s in plan.stages)
    assert abs(default.makespan_cp - sim) <= actions * default.unit


def test_verify_rejects_memory_and_deadlock(diamond_plan):
    plan, graph, cluster = diamond_plan
    gpipe = {s.id: tuple([("F", j) for j in range(4)] + [("B", j) for j in range(4)]) for s in plan.stages}
    ok = verify_orders(plan, graph, cluster, orders=gpipe)
    assert ok.feasible
    tight = cluster.with_(memory_bytes=400 + 10 * 4)  # two micro-batches of 2 per stage
    bad = verify_orders(plan, graph, tight, orders=gpipe)
    assert not bad.feasible and bad.status == "INFEASIBLE" and "stage 0 holds 4 micro-batches" in bad.reason
    with pytest.raises(gs.InvalidPlanError):  # the validator agrees
        gs.validate(
            gs.build_plan(
                graph,
                tight,
                [StageSpec((v,), (i,), 2, order=gpipe[i]) for i, v in enumerate("abcd")],
                8,
                planner="m",
                search=SEARCH,
            ),
            graph,
            tight,
        )
    dead = dict(gpipe)
    dead[0] = (("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3))
    res = verify_orders(plan, graph, cluster, orders=dead)
    assert not res.feasible and res.status == "INFEASIBLE" and "deadlocks" in res.reason


@pytest.mark.parametrize("seed", range(4))
def test_tighten_never_worse_and_valid(seed):
    plan, graph, cluster = five_stage(seed)
    r = tighten(plan, graph, cluster, time_limit=2.0)
    assert r.status in ("OPTIMAL", "FEASIBLE")
    assert r.makespan_after <= r.makespan_before * (1 + 1e-12)
    assert r.makespan_before == pytest.approx(gs.simulate(plan, graph, cluster).iteration_time)
    gs.validate(r.plan, graph, cluster)
    assert r.plan.predicted.iteration_time == pytest.approx(r.makespan_after)
    assert r.improved == (r.plan is not plan)
    if r.status == "OPTIMAL":  # proven for tick-rounded durations: the float optimum is within ticks
        actions = 2 * sum(plan.mini_batch_size // s.micro_batch_size for s in plan.stages)
        assert r.makespan_after <= r.lower_bound + actions * r.unit


def test_tighten_improves_unequal_micro_batches():
    """Algorithm 2's kFkB orders are not optimal for this plan; CP-SAT proves a shorter makespan."""
    plan, graph, cluster = five_stage(4)
    r = tighten(plan, graph, cluster, time_limit=5.0)
    assert r.status == "OPTIMAL" and r.improved
    assert r.makespan_after < r.makespan_before * 0.99
    assert all(s.schedule.kind == "custom" for s in r.plan.stages)


def test_tighten_respects_memory_and_fixes_an_overfull_plan(diamond_plan):
    plan, graph, cluster = diamond_plan
    tight = cluster.with_(memory_bytes=400 + 10 * 2)  # one micro-batch of 2 per stage
    gpipe = [
        StageSpec((v,), (i,), 2, order=tuple([("F", j) for j in range(4)] + [("B", j) for j in range(4)]))
        for i, v in enumerate("abcd")
    ]
    over = gs.build_plan(graph, tight, gpipe, 8, planner="m", search=SEARCH)
    r = tighten(over, graph, tight, time_limit=2.0)
    assert r.improved and r.status == "OPTIMAL"
    gs.validate(r.plan, graph, tight)
    assert all(s.in_flight_samples == 2 for s in r.plan.stages)
    assert r.makespan_after >= r.makespan_before  # slower than the overfull orders, but it fits


@pytest.mark.parametrize("seed", [2, 7])
def test_memory_phase_keeps_makespan_and_lowers_memory(seed):
    plan, graph, cluster = five_stage(seed, B=16)
    fast = tighten(plan, graph, cluster, time_limit=3.0, minimize_memory=False)
    lean = tighten(plan, graph, cluster, time_limit=3.0)
    assert fast.memory_status == "skipped" and lean.memory_status in ("OPTIMAL", "FEASIBLE")
    assert lean.makespan_after == pytest.approx(fast.makespan_after, rel=1e-6)
    assert lean.makespan_after <= lean.makespan_before * (1 + 1e-12)
    assert lean.peak_memory_after < fast.peak_memory_after or lean.peak_memory_after < lean.peak_memory_before
    assert lean.peak_memory_after == pytest.approx(lean.plan.predicted.peak_memory_bytes)
    assert sum(s.in_flight_samples for s in lean.plan.stages) < sum(s.in_flight_samples for s in fast.plan.stages)
    gs.validate(lean.plan, graph, cluster)


@pytest.mark.parametrize("seed", [2, 4, 5])
def test_memory_forms_agree(seed):
    """Precedences F(j + K) after B(j) and a cumulative over live ranges give the same optimum."""
    plan, graph, cluster = five_stage(seed, B=4, memory=400 + 10 * 2)  # 2 samples in flight at most
    opt = {}
    for form in ("precedence", "cumulative"):
        model, v = build_schedule_model(plan, graph, cluster, memory_form=form, unit=1e-3)
        opt[form] = solve_model(model, v, time_limit=5.0)
        assert opt[form].status == "OPTIMAL"
        for s in plan.stages:
            assert gs.cost.in_flight_from_order(opt[form].orders[s.id], s.micro_batch_size) <= 2
        assert min(v.data.max_in_flight.values()) < 4  # the limit binds somewhere
    assert opt["precedence"].objective_ticks == opt["cumulative"].objective_ticks


def test_max_in_flight_override(diamond_plan):
    plan, graph, cluster = diamond_plan
    model, v = build_schedule_model(plan, graph, cluster, max_in_flight={0: 2})
    res = solve_model(model, v, time_limit=2.0)
    assert res.status == "OPTIMAL"
    assert gs.cost.in_flight_from_order(res.orders[0], 2) == 2


def test_deterministic_with_seed():
    plan, graph, cluster = five_stage(2, B=16, memory=400 + 10 * 6)
    a = tighten(plan, graph, cluster, time_limit=0.5, seed=7, deterministic=True)
    b = tighten(plan, graph, cluster, time_limit=0.5, seed=7, deterministic=True)
    assert [s.schedule.order for s in a.plan.stages] == [s.schedule.order for s in b.plan.stages]
    assert (a.status, a.memory_status, a.makespan_after) == (b.status, b.memory_status, b.makespan_after)
    assert a.improved


def test_too_large_and_integration_helper(diamond_plan):
    plan, graph, cluster = diamond_plan
    r = tighten(plan, graph, cluster, max_actions=10)
    assert r.status == "too-large" and r.plan is plan and r.actions == 32
    out, info = tighten_plan_if_fits(plan, graph, cluster, 1.0, max_actions=10)
    assert info["status"] == "too-large" and out.search.cp_tighten == info and "cp_tighten" not in out.search.extra
    gs.validate(out, graph, cluster)
    p5, g5, c5 = five_stage(4)
    out, info = tighten_plan_if_fits(p5, g5, c5, 2.0)
    assert info["status"] == "OPTIMAL" and info["improved"]
    assert info["makespan_after"] == pytest.approx(out.predicted.iteration_time)
    assert info["makespan_after"] < info["makespan_before"]
    assert out.search.cp_tighten["status"] == "OPTIMAL"
    gs.validate(out, g5, c5)
    assert gs.plan_from_dict(gs.plan_to_dict(out)).search.cp_tighten["status"] == "OPTIMAL"
    _, skipped = tighten_plan_if_fits(p5, g5, c5, 0)
    assert skipped["status"] == "skipped"
