"""The calibrated terms of the time model (graph ``op_overhead``, ``optimizer_time_per_byte``,
``step_time_per_sample``, ``grad_accumulation_time_per_byte``; cluster
``allreduce_bandwidth``, ``allreduce_latency``): read and written, priced by the reference pricing,
the simulator, and every fast pricer alike; absent, nothing changes."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import test_pricers as tp

from gpp_solver import simulate, solve
from gpp_solver.cost import TimeTerms, allreduce_time, stage_costs
from gpp_solver.errors import InvalidClusterError, InvalidGraphError
from gpp_solver.formats.cluster import cluster_from_dict, cluster_to_dict
from gpp_solver.formats.graph import graph_from_dict, graph_to_dict
from gpp_solver.oracles.brute_force import random_cluster, random_graph
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.types import Cluster, Graph, SearchInfo


def calibrated(g: Graph, c: Cluster, rng: random.Random) -> tuple[Graph, Cluster]:
    g = replace(
        g,
        op_overhead=(rng.uniform(1e-5, 1e-4), rng.uniform(1e-5, 2e-4)),
        optimizer_time_per_byte=rng.uniform(1e-11, 1e-9),
        step_time_per_sample=rng.uniform(1e-6, 1e-4),
        step_time_fixed=rng.uniform(1e-5, 1e-3),
        grad_accumulation_time_per_byte=rng.uniform(1e-11, 1e-10),
    )
    c = c.with_(allreduce_bandwidth=rng.uniform(1e8, 1e10), allreduce_latency=rng.uniform(1e-6, 1e-4))
    return g, c


def _doc(**extra) -> dict:
    return {
        "format": "gpp-graph/1",
        "micro_batch_sizes": [1, 4],
        "nodes": [
            {
                "id": "a",
                "fw_time": [1e-3, 3e-3],
                "bw_time": [2e-3, 6e-3],
                "weight_bytes": 4e6,
                "activation_bytes": 10,
                "output_bytes": 10,
            },
            {
                "id": "b",
                "fw_time": [1e-3, 2e-3],
                "bw_time": [2e-3, 4e-3],
                "weight_bytes": 8e6,
                "activation_bytes": 10,
                "output_bytes": 10,
            },
        ],
        "edges": [{"src": "a", "dst": "b"}],
        **extra,
    }


def test_fields_round_trip_and_absent_fields_are_not_written() -> None:
    g = graph_from_dict(_doc(op_overhead={"fw": 2e-5, "bw": 3e-5}, optimizer_time_per_byte=1e-10))
    assert g.op_overhead == (2e-5, 3e-5) and g.optimizer_time_per_byte == 1e-10
    assert graph_from_dict(graph_to_dict(g)) == g
    plain = graph_from_dict(_doc())
    assert plain.op_overhead == (0.0, 0.0) and plain.optimizer_time_per_byte == 0.0
    d = graph_to_dict(plain)
    assert "op_overhead" not in d and "optimizer_time_per_byte" not in d and "step_time_per_sample" not in d
    s = graph_from_dict(_doc(step_time_per_sample=2e-6))
    assert s.step_time_per_sample == 2e-6 and graph_from_dict(graph_to_dict(s)) == s
    f = graph_from_dict(_doc(step_time_fixed=3e-4))
    assert f.step_time_fixed == 3e-4 and graph_from_dict(graph_to_dict(f)) == f
    assert "step_time_fixed" not in d
    a = graph_from_dict(_doc(grad_accumulation_time_per_byte=5e-11))
    assert a.grad_accumulation_time_per_byte == 5e-11 and graph_from_dict(graph_to_dict(a)) == a
    assert "grad_accumulation_time_per_byte" not in d
    cdoc = {"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e9, "inter_node_bandwidth": 1e9}
    c = cluster_from_dict({**cdoc, "allreduce_bandwidth": 5e8, "allreduce_latency": 1e-4})
    assert (c.allreduce_bandwidth, c.allreduce_latency) == (5e8, 1e-4)
    assert cluster_from_dict(cluster_to_dict(c)) == c
    d = cluster_to_dict(cluster_from_dict(cdoc))
    assert "allreduce_bandwidth" not in d and "allreduce_latency" not in d


@pytest.mark.parametrize(
    "bad",
    [
        {"op_overhead": 1e-5},
        {"op_overhead": {"fw": 1e-5}},
        {"op_overhead": {"fw": -1e-5, "bw": 0}},
        {"optimizer_time_per_byte": -1},
        {"optimizer_time_per_byte": "x"},
        {"step_time_per_sample": -1e-6},
        {"step_time_per_sample": True},
        {"step_time_fixed": -1e-4},
        {"step_time_fixed": "slow"},
        {"grad_accumulation_time_per_byte": -1e-11},
        {"grad_accumulation_time_per_byte": "fast"},
    ],
)
def test_bad_graph_fields_are_named(bad: dict) -> None:
    with pytest.raises(InvalidGraphError, match=next(iter(bad))):
        graph_from_dict(_doc(**bad))


@pytest.mark.parametrize(
    "bad",
    [
        {"allreduce_bandwidth": 0},
        {"allreduce_bandwidth": -5},
        {"allreduce_latency": -1e-3},
        {"allreduce_latency": True},
    ],
)
def test_bad_cluster_fields_are_named(bad: dict) -> None:
    with pytest.raises(InvalidClusterError, match=next(iter(bad))):
        cluster_from_dict(
            {"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e9, "inter_node_bandwidth": 1e9, **bad}
        )


def test_ring_allreduce_formula() -> None:
    W, bw, lat = 8e6, 1e9, 5e-5
    for d in (2, 3, 4, 8):
        assert math.isclose(allreduce_time(W, d, bw, lat), 2 * (d - 1) * lat + 2 * (d - 1) / d * W / bw)
    assert allreduce_time(W, 1, bw, lat) == 0.0
    assert allreduce_time(W, 4, bw) == 2 * 3 / 4 * W / bw  # no latency: the formula without it


def test_stage_costs_and_simulator_price_every_term() -> None:
    """A one-stage plan on 2 replicas: forward/backward carry 2 nodes' overhead, the tail is the ring
    all-reduce at the cluster's all-reduce bandwidth plus the optimizer step, and the simulated
    iteration is n (F + B) + A + O."""
    g = graph_from_dict(_doc(op_overhead={"fw": 2e-5, "bw": 3e-5}, optimizer_time_per_byte=1e-10))
    c = cluster_from_dict(
        {
            "format": "gpp-cluster/1",
            "devices": 2,
            "memory_bytes": 1e12,
            "inter_node_bandwidth": 1e9,
            "allreduce_bandwidth": 4e8,
            "allreduce_latency": 1e-4,
        }
    )
    plan = build_plan(g, c, [StageSpec(("a", "b"), (0, 1), 8)], 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert [len(s.devices) for s in plan.stages] == [2], "expected one stage on two replicas"
    (cost,) = stage_costs(g, c, plan.stages, 8)
    # b/d = 4 samples per replica: the profiled times at 4, plus 2 nodes' overhead
    assert math.isclose(cost.compute_fw, 3e-3 + 2e-3 + 2 * 2e-5)
    assert math.isclose(cost.compute_bw, 6e-3 + 4e-3 + 2 * 3e-5)
    W = 12e6
    assert math.isclose(cost.allreduce, 2 * 1e-4 + W / 4e8)
    assert math.isclose(cost.optimizer, 1e-10 * W)
    sim = simulate(plan, g, c)
    assert math.isclose(sim.iteration_time, cost.forward + cost.backward + cost.allreduce + cost.optimizer)
    assert math.isclose(cost.time_per_sample, (cost.per_micro_batch) / 8 + (cost.allreduce + cost.optimizer) / 8)
    # the same plan without the terms is cheaper by exactly them
    plain = stage_costs(
        graph_from_dict(_doc()), c.with_(allreduce_bandwidth=None, allreduce_latency=0.0), plan.stages, 8
    )[0]
    assert math.isclose(plain.allreduce, W / 1e9) and plain.optimizer == 0.0


def test_the_steps_own_work_is_paid_by_every_stage_once_per_step() -> None:
    """``step_time_per_sample`` (gpp_runtime.train samples the whole mini-batch on every rank): every
    stage's tail gains ``B * per_sample``, one- and two-stage plans alike, so the simulated
    iteration of a one-stage plan grows by exactly that, and TimeTerms without the mini-batch
    leaves it out."""
    g0 = graph_from_dict(_doc(optimizer_time_per_byte=1e-10))
    g = graph_from_dict(_doc(optimizer_time_per_byte=1e-10, step_time_per_sample=5e-6))
    c = cluster_from_dict({"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9})
    one = [StageSpec(("a", "b"), (0,), 8)]
    two = [StageSpec(("a",), (0,), 4), StageSpec(("b",), (1,), 4)]
    for specs in (one, two):
        for with_, without in zip(stage_costs(g, c, specs, 8), stage_costs(g0, c, specs, 8)):
            assert math.isclose(with_.optimizer, without.optimizer + 8 * 5e-6)
            assert math.isclose(with_.time_per_sample, without.time_per_sample + 5e-6)
    plan = build_plan(g, c, one, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    plan0 = build_plan(g0, c, one, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert math.isclose(simulate(plan, g, c).iteration_time, simulate(plan0, g0, c).iteration_time + 8 * 5e-6)
    assert TimeTerms.of(g, c).per_step == 0.0 and TimeTerms.of(g, c, 8).per_step == 8 * 5e-6


def test_the_steps_fixed_work_is_paid_by_every_stage_whatever_its_weights() -> None:
    """``step_time_fixed`` (the training loop around a rank's actions): every stage's tail gains the
    same seconds, whatever its share of the weights (a term per weight byte gave each of two
    stages a part), so a one-stage plan's iteration grows by exactly it and each stage of a
    two-stage plan by it too; TimeTerms without the mini-batch leaves it out, as the term per
    sample."""
    g0 = graph_from_dict(_doc(optimizer_time_per_byte=1e-10, step_time_per_sample=5e-6))
    g = graph_from_dict(_doc(optimizer_time_per_byte=1e-10, step_time_per_sample=5e-6, step_time_fixed=2e-4))
    c = cluster_from_dict({"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9})
    one = [StageSpec(("a", "b"), (0,), 8)]
    two = [StageSpec(("a",), (0,), 4), StageSpec(("b",), (1,), 4)]
    for specs in (one, two):
        for with_, without in zip(stage_costs(g, c, specs, 8), stage_costs(g0, c, specs, 8)):
            assert math.isclose(with_.optimizer, without.optimizer + 2e-4)
            assert math.isclose(with_.time_per_sample, without.time_per_sample + 2e-4 / 8)
    plan = build_plan(g, c, one, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    plan0 = build_plan(g0, c, one, 8, planner="manual", search=SearchInfo(0.0, "feasible"))
    assert math.isclose(simulate(plan, g, c).iteration_time, simulate(plan0, g0, c).iteration_time + 2e-4)
    assert TimeTerms.of(g, c).per_step == 0.0 and math.isclose(TimeTerms.of(g, c, 8).per_step, 2e-4 + 8 * 5e-6)


def test_every_micro_batch_after_the_first_pays_its_gradient_sum() -> None:
    """``grad_accumulation_time_per_byte``: each replica sums ``B/b - 1`` micro-batches' weight
    gradients into ``.grad`` a step; its tail gains ``g * W_S * (B/b - 1)``, so one micro-batch pays
    nothing, a stage's TPS grows by ``g * W_S * (1/b - 1/B)`` and the simulated one-stage iteration by
    exactly the sum; replicas each pay for their whole stage; TimeTerms without the mini-batch
    leaves it out."""
    g_acc = 5e-11
    g0 = graph_from_dict(_doc(optimizer_time_per_byte=1e-10))
    g = graph_from_dict(_doc(optimizer_time_per_byte=1e-10, grad_accumulation_time_per_byte=g_acc))
    c = cluster_from_dict({"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9})
    B = 8
    cases = {
        "one micro-batch": [StageSpec(("a", "b"), (0,), 8)],
        "four micro-batches": [StageSpec(("a", "b"), (0,), 2)],
        "two replicas": [StageSpec(("a", "b"), (0, 1), 4)],
        "two stages": [StageSpec(("a",), (0,), 2), StageSpec(("b",), (1,), 4)],
    }
    for name, specs in cases.items():
        for s, with_, without in zip(specs, stage_costs(g, c, specs, B), stage_costs(g0, c, specs, B)):
            W = sum(graph_from_dict(_doc()).node(v).weight_bytes for v in s.nodes)
            extra = g_acc * W * (B / s.micro_batch_size - 1)
            assert math.isclose(with_.optimizer, without.optimizer + extra), name
            assert math.isclose(with_.time_per_sample, without.time_per_sample + extra / B), name
            if s.micro_batch_size == B:
                assert with_.optimizer == without.optimizer, name
        if len(specs) == 1:
            plan = build_plan(g, c, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"))
            plan0 = build_plan(g0, c, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"))
            W = 12e6
            extra = g_acc * W * (B / specs[0].micro_batch_size - 1)
            assert math.isclose(simulate(plan, g, c).iteration_time, simulate(plan0, g0, c).iteration_time + extra)
    assert TimeTerms.of(g, c).accumulate_per_byte == 0.0 and TimeTerms.of(g, c, B).accumulate_per_byte == g_acc
    assert TimeTerms.of(g, c).tail(12e6, 1, 1e9, 2) == TimeTerms.of(g0, c).tail(12e6, 1, 1e9, 2)


def test_the_gradient_sums_run_inside_the_later_backwards() -> None:
    """The simulator runs a stage's sums inside its backwards after the first (``B``, or ``W`` in a
    split order), where a stage before it waits for them: a two-stage 1F1B pipeline whose second
    stage sums pays for them on its critical path, not hidden in that stage's tail behind the first
    stage's last backward; the busy time and the plan's predicted figures stay the model's."""
    g_acc = 2e-10
    g0 = graph_from_dict(_doc())
    g = graph_from_dict(_doc(grad_accumulation_time_per_byte=g_acc))
    c = cluster_from_dict({"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9})
    B, b = 8, 2
    specs = [StageSpec(("a",), (0,), b), StageSpec(("b",), (1,), b)]
    for schedule in ("1f1b", "zb"):
        plan = build_plan(g, c, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"), schedule=schedule)
        plan0 = build_plan(g0, c, specs, B, planner="manual", search=SearchInfo(0.0, "feasible"), schedule=schedule)
        sim, sim0 = simulate(plan, g, c), simulate(plan0, g0, c)
        assert math.isclose(plan.predicted.iteration_time, sim.iteration_time)  # the plan states what runs
        one = g_acc * graph_from_dict(_doc()).node("b").weight_bytes
        summing = "W" if any(a[0] == "W" for a in plan.stages[1].schedule.order) else "B"
        lengths = [t.end - t.start for t in sim.stage_tasks(1) if t.kind == summing]
        lengths0 = [t.end - t.start for t in sim0.stage_tasks(1) if t.kind == summing]
        assert math.isclose(lengths[0], lengths0[0]) and len(lengths) == B // b
        assert all(math.isclose(x, x0 + one) for x, x0 in zip(lengths[1:], lengths0[1:])), schedule
        for st, st0, cost in zip(sim.stages, sim0.stages, stage_costs(g, c, specs, B)):
            assert math.isclose(st.busy - st0.busy, cost.accumulation)  # the same total as priced
        # the first stage's backwards wait for the second's: three sums on the critical path
        costs = stage_costs(g, c, specs, B)
        in_tails, _ = simulate_orders(
            {s.id: s.schedule.order for s in plan.stages},
            {s.id: b for s in plan.stages},
            {s.id: k.forward for s, k in zip(plan.stages, costs)},
            {s.id: k.backward for s, k in zip(plan.stages, costs)},
            {s.id: k.tail for s, k in zip(plan.stages, costs)},  # the sums in the tails, as before
            plan.edges,
            B,
            weight={s.id: k.backward_weight for s, k in zip(plan.stages, costs)},
        )
        assert sim.iteration_time > in_tails + 0.5 * one, schedule
        assert sim.iteration_time <= sim0.iteration_time + sum(k.accumulation for k in costs) + 1e-12


def test_absent_terms_price_as_before() -> None:
    """Without the fields, TimeTerms adds nothing: the same floats as the plain formulas."""
    rng = random.Random(3)
    g = random_graph(rng, "chain", 5)
    c = random_cluster(rng, devices=4)
    specs = [StageSpec(tuple(g.topo_order[:2]), (0, 1), 2), StageSpec(tuple(g.topo_order[2:]), (2, 3), 2)]
    for s, cost in zip(specs, stage_costs(g, c, specs, 8)):
        W = sum(g.node(v).weight_bytes for v in s.nodes)
        assert cost.allreduce == allreduce_time(W, 2, c.bandwidth(s.devices)) and cost.optimizer == 0.0
    assert TimeTerms.of(g, c) == TimeTerms()


# -- every fast pricer agrees with the reference pricing on graphs and clusters that carry the terms


@pytest.fixture
def with_terms(monkeypatch):
    """test_pricers' instances with every calibrated term set (random values per seed)."""
    plain_instance, plain_graph, plain_cluster = tp.instance, tp.random_graph, tp.random_cluster

    def instance(seed):
        g, c, B, b, parts, degs = plain_instance(seed)
        g, c = calibrated(g, c, random.Random(seed + 1000))
        return g, c, B, b, parts, degs

    rngs = {}

    def graph(rng, *a, **k):
        g = plain_graph(rng, *a, **k)
        rngs["r"] = random.Random(rng.random())
        return calibrated(g, Cluster(1, 1.0, 1.0), rngs["r"])[0]

    def cluster(rng, *a, **k):
        return calibrated(Graph("x", (1,), (), ()), plain_cluster(rng, *a, **k), rngs.get("r", random.Random(0)))[1]

    monkeypatch.setattr(tp, "instance", instance)
    monkeypatch.setattr(tp, "random_graph", graph)
    monkeypatch.setattr(tp, "random_cluster", cluster)


PRICER_TESTS = [
    "test_graphpipe_staging_pricer",
    "test_gpp_evaluator",
    "test_sequential_pricer",
    "test_pipedream_range_costs",
    "test_graphpipe_dp_segment_table",
]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("name", PRICER_TESTS)
def test_fast_pricers_price_the_terms(with_terms, name: str, seed: int) -> None:
    g, c, *_ = tp.instance(seed)
    assert g.op_overhead[0] > 0 and c.allreduce_bandwidth is not None  # the fixture is active
    getattr(tp, name)(seed)


@pytest.mark.parametrize("planner", ["graphpipe", "gpp", "pipedream", "piper", "milp", "alpa"])
def test_planners_predict_what_the_simulator_prices(planner: str) -> None:
    """Each planner's plan on a calibrated graph: its stated per-stage TPS is the reference pricing's."""
    rng = random.Random(7)
    g, c = calibrated(random_graph(rng, "diamond", 6), random_cluster(rng, devices=4).with_(memory_bytes=1e15), rng)
    plan = solve(g, c, mini_batch_size=8, planner=planner, time_limit=20)
    costs = stage_costs(g, c, plan.stages, 8)
    for s, cost in zip(plan.stages, costs):
        assert math.isclose(s.predicted.time_per_sample, cost.time_per_sample, rel_tol=1e-9)
    assert math.isclose(plan.predicted.iteration_time, simulate(plan, g, c).iteration_time, rel_tol=1e-9)
