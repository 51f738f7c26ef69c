"""Exact MILP: equals the brute-force oracle on tiny graphs (any DAG, placement, tight memory),
honest statuses, infeasibility with the smallest memory, clear refusals, never worse than the DP."""

from __future__ import annotations

import math
import random

import pytest

import gpp_solver as gs
from gpp_solver.errors import InfeasibleError, InvalidInputError, SearchSpaceTooLargeError, SolverError
from gpp_solver.oracles.brute_force import (
    GRAPH_KINDS,
    best_plan_bruteforce,
    min_peak_memory_bruteforce,
    random_cluster,
    random_graph,
)
from gpp_solver.planners.milp.model import build_model
from gpp_solver.planners.milp.planner import MAX_NODE_SLOTS, plan_milp
from gpp_solver.planners.milp.space import layouts
from gpp_solver.planners.registry import get_planner

B = 8


def _heavy(graph: gs.Graph) -> gs.Graph:
    """Activation-heavy variant: in-flight samples (pipeline depth) dominate memory."""
    d = gs.graph_to_dict(graph)
    for nd in d["nodes"]:
        nd["activation_bytes"] *= 20
        nd["weight_bytes"] /= 10
    return gs.graph_from_dict(d)


def instance(seed: int) -> tuple[gs.Graph, gs.Cluster]:
    """Seeded tiny instance: kinds rotate, every other cluster has two devices per node, every
    third instance is activation-heavy with memory halfway between the least any plan needs and
    what the unconstrained optimum needs (so memory changes the answer)."""
    rng = random.Random(seed)
    kind = GRAPH_KINDS[seed % len(GRAPH_KINDS)]
    graph = random_graph(rng, kind, rng.randint(4, 8), name=f"{kind}-s{seed}")
    cluster = random_cluster(rng, placement=seed % 2 == 1)
    if seed % 3 == 2:
        graph = _heavy(graph)
        _, free = best_plan_bruteforce(graph, cluster, B)
        least = min_peak_memory_bruteforce(graph, cluster, B)
        cluster = cluster.with_(memory_bytes=(least + free.predicted.peak_memory_bytes) / 2)
    return graph, cluster


def check_against_oracle(seed: int) -> gs.Plan:
    graph, cluster = instance(seed)
    want, _ = best_plan_bruteforce(graph, cluster, B)
    plan = plan_milp(graph, cluster, B)
    gs.validate(plan, graph, cluster)
    assert plan.planner == "milp"
    assert plan.search.status == "optimal-time-per-sample" and "time per sample" in plan.search.objective
    assert plan.predicted.time_per_sample == pytest.approx(want, rel=1e-6), (seed, graph.name)
    return plan


@pytest.mark.parametrize("seed", range(6))
def test_equals_oracle(seed):
    check_against_oracle(seed)


@pytest.mark.slow
def test_equals_oracle_on_40_random_instances():
    kinds = set()
    for seed in range(40):
        plan = check_against_oracle(seed)
        kinds.add(plan.graph.split("-")[0])
    assert kinds == set(GRAPH_KINDS)


def test_memory_tight_optimum_uses_fewer_stages():
    """Where the fastest plan does not fit, the MILP finds the oracle's smaller, shallower plan."""
    found = 0
    for seed in range(40):
        rng = random.Random(seed)
        graph = _heavy(random_graph(rng, "chain" if seed % 2 else "sp", rng.randint(5, 8)))
        cluster = random_cluster(rng)
        _, free = best_plan_bruteforce(graph, cluster, B)
        least = min_peak_memory_bruteforce(graph, cluster, B)
        tight = cluster.with_(memory_bytes=(least + free.predicted.peak_memory_bytes) / 2)
        want, constrained = best_plan_bruteforce(graph, tight, B)
        if len(constrained.stages) >= len(free.stages):
            continue
        plan = plan_milp(graph, tight, B)
        gs.validate(plan, graph, tight)
        assert plan.predicted.time_per_sample == pytest.approx(want, rel=1e-6)
        assert plan.predicted.time_per_sample > free.predicted.time_per_sample
        assert plan.predicted.peak_memory_bytes <= tight.memory_bytes
        assert len(plan.stages) < len(free.stages)
        found += 1
        if found == 2:
            break
    assert found == 2


@pytest.mark.parametrize("seed", [1, 2])
def test_infeasible_reports_least_memory(seed):
    rng = random.Random(seed)
    graph = random_graph(rng, GRAPH_KINDS[seed], 6)
    cluster = random_cluster(rng, placement=seed == 1)
    least = min_peak_memory_bruteforce(graph, cluster, B)
    with pytest.raises(InfeasibleError) as err:
        plan_milp(graph, cluster.with_(memory_bytes=least * 0.99), B)
    assert err.value.required_memory_bytes == pytest.approx(least, rel=1e-6)
    assert "at least" in str(err.value)
    plan = plan_milp(graph, cluster.with_(memory_bytes=least), B)  # exactly enough: a plan exists
    assert plan.predicted.peak_memory_bytes <= least * (1 + 1e-9)


def test_refuses_above_limits():
    rng = random.Random(0)
    big = random_graph(rng, "chain", 40)
    with pytest.raises(SearchSpaceTooLargeError, match=str(MAX_NODE_SLOTS)):
        plan_milp(big, random_cluster(rng, devices=8), B)
    # placement matters (two devices per node) and 16 devices: too many device layouts
    with pytest.raises(SearchSpaceTooLargeError, match="layouts"):
        plan_milp(random_graph(rng, "dag", 12), random_cluster(rng, devices=16, placement=True), 16)


def test_refusal_is_cli_exit_2(tmp_path, capsys):
    cli = pytest.importorskip("gpp_solver.cli")
    rng = random.Random(0)
    gs.save_graph(random_graph(rng, "chain", 40), tmp_path / "g.json")
    gs.save_cluster(random_cluster(rng, devices=8), tmp_path / "c.json")
    code = cli.main(
        [
            "plan",
            str(tmp_path / "g.json"),
            "--cluster",
            str(tmp_path / "c.json"),
            "--batch",
            "8",
            "--planner",
            "milp",
            "-o",
            str(tmp_path / "p.json"),
        ]
    )
    assert code == 2
    assert str(MAX_NODE_SLOTS) in capsys.readouterr().err


def test_time_limit_is_reported_honestly():
    rng = random.Random(12)
    graph, cluster = random_graph(rng, "dag", 12), random_cluster(rng, devices=8)
    try:
        plan = plan_milp(graph, cluster, 16, time_limit=2.0)
    except SolverError as exc:  # nothing found in time: said so, no plan
        assert "time limit" in str(exc)
        return
    gs.validate(plan, graph, cluster)
    assert plan.search.status == "time-limit"
    assert set(plan.search.extra["per_b_status"].values()) & {"time-limit", "no-solution"}


def test_options_and_inputs_are_checked():
    graph, cluster = instance(0)
    with pytest.raises(
        InvalidInputError, match="no option 'epsilon'; its options: max_stages, micro_batch_sizes, solver"
    ):
        plan_milp(graph, cluster, B, epsilon=0.1)
    with pytest.raises(InvalidInputError, match=r"B % b == 0"):
        plan_milp(graph, cluster, B, micro_batch_sizes=[3])
    with pytest.raises(InvalidInputError, match="time_limit"):
        plan_milp(graph, cluster, B, time_limit=0)
    assert get_planner("milp") is plan_milp


def test_max_stages_and_micro_batch_sizes_restrict_the_space():
    graph, cluster = instance(4)
    plan = plan_milp(graph, cluster, B, max_stages=1, micro_batch_sizes=[2])
    assert len(plan.stages) == 1 and plan.stages[0].micro_batch_size == 2
    free = plan_milp(graph, cluster, B)
    assert free.predicted.time_per_sample <= plan.predicted.time_per_sample


def test_model_is_inspectable_without_solving():
    graph, flat = instance(0)
    m = build_model(graph, flat, B, 4, 3)
    names = {v.name for v in m.problem.variables()}
    assert sum(n.startswith("x_") for n in names) == len(graph.nodes) * 3
    assert any(n.startswith("y_") for n in names) and not any(n.startswith("z_") for n in names)
    _, placed = instance(1)
    m = build_model(graph, placed, B, 4, 3)
    names = {v.name for v in m.problem.variables()}
    assert sum(n.startswith("z_") for n in names) == len(list(layouts(4, placed.devices, 3)))


def _graphpipe():
    try:
        return get_planner("graphpipe")
    except InvalidInputError:
        pytest.skip("the GraphPipe DP planner is not available yet")


@pytest.mark.parametrize("seed", range(3))
def test_never_worse_than_graphpipe_dp(seed):
    _never_worse(seed)


@pytest.mark.slow
def test_never_worse_than_graphpipe_dp_many():
    for seed in range(3, 25):
        _never_worse(seed)


def _never_worse(seed: int) -> None:
    """On a flat network (so device placement cannot differ) the DP's plan lies in the MILP's space."""
    dp = _graphpipe()
    rng = random.Random(1000 + seed)
    graph = random_graph(rng, GRAPH_KINDS[seed % len(GRAPH_KINDS)], rng.randint(5, 8))
    cluster = random_cluster(rng)
    if seed % 2:
        graph = _heavy(graph)
        least = min_peak_memory_bruteforce(graph, cluster, B)
        cluster = cluster.with_(memory_bytes=least * 1.5)
    try:
        theirs = dp(graph, cluster, B)
    except InfeasibleError:
        theirs = None
    ours = plan_milp(graph, cluster, B)
    if theirs is not None:
        assert ours.predicted.time_per_sample <= theirs.predicted.time_per_sample * (1 + 1e-9)
    assert math.isfinite(ours.predicted.time_per_sample)
