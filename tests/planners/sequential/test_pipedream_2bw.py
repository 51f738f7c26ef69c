"""PipeDream-2BW baseline: equal partitions, (w, d, b) enumeration, two weight versions in memory."""

from __future__ import annotations

import pytest
from conftest import CLUSTER, chain_dict, diamond_dict
from test_pipedream import branchy_dict, flat_cluster

from gpp_solver.errors import InfeasibleError, InvalidInputError
from gpp_solver.formats.cluster import cluster_from_dict
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.planners.sequential.equal_partition import equal_partition
from gpp_solver.planners.sequential.pipedream_2bw import plan_pipedream_2bw
from gpp_solver.types import SearchInfo


def test_equal_partition_balances_and_keeps_every_part_non_empty():
    assert equal_partition([1, 1, 1, 1], 2) == [0, 2, 4]
    assert equal_partition([3, 1, 1, 1], 2) == [0, 1, 4]
    cuts = equal_partition([5, 0, 0, 0], 4)
    assert cuts == [0, 1, 2, 3, 4]
    with pytest.raises(InvalidInputError):
        equal_partition([1, 2], 3)


@pytest.mark.parametrize("gd", [chain_dict(6), diamond_dict(), branchy_dict()])
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(3)])
def test_plans_are_valid_within_budget_and_deterministic(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    plan = plan_pipedream_2bw(g, cl, 8)
    validate(plan, g, cl)
    w, d = plan.search.extra["w"], plan.search.extra["d"]
    assert len(plan.stages) == w and all(len(s.devices) == d for s in plan.stages)
    assert w * d <= cl.devices
    assert plan.search.status == "optimal-within-search-space"
    assert plan.search.objective.startswith("least simulated iteration time")
    assert plan.search.extra["weight_versions_bytes"] <= cl.memory_bytes
    strip = lambda p: {k: v for k, v in plan_to_dict(p).items() if k != "search"}  # noqa: E731
    assert strip(plan_pipedream_2bw(g, cl, 8)) == strip(plan)


def test_best_configuration_is_the_fastest_of_the_space():
    g = graph_from_dict(chain_dict(4, [1.0, 2.0, 3.0, 4.0]))
    cl = cluster_from_dict(flat_cluster(4))
    plan = plan_pipedream_2bw(g, cl, 8, micro_batch_sizes=[2])
    order = list(g.topo_order)
    for w in range(1, 5):
        for d in (1, 2):
            if w * d > 4:
                continue
            x = 2 / d
            cuts = equal_partition(
                [
                    sum(t)
                    for t in (
                        (
                            g.node(v).fw_time[0] if x <= 1 else g.node(v).fw_time[1],
                            g.node(v).bw_time[0] if x <= 1 else g.node(v).bw_time[1],
                        )
                        for v in order
                    )
                ],
                w,
            )
            specs = [
                StageSpec(tuple(order[cuts[i] : cuts[i + 1]]), tuple(range(i * d, (i + 1) * d)), 2) for i in range(w)
            ]
            other = build_plan(g, cl, specs, 8, planner="x", search=SearchInfo(0.0, "feasible"))
            assert plan.predicted.iteration_time <= other.predicted.iteration_time + 1e-12


def test_two_weight_versions_are_charged():
    gd = chain_dict(2)
    for n in gd["nodes"]:
        n["weight_bytes"] = 1000.0
    g = graph_from_dict(gd)
    # one node: 4000 (osf * W) + activations fits 4500 under the shared formula, but not 5000 with 2BW's copy
    cl = cluster_from_dict(flat_cluster(2, memory=4500.0))
    with pytest.raises(InfeasibleError) as err:
        plan_pipedream_2bw(g, cl, 2)
    assert err.value.required_memory_bytes >= 5000.0
    ok = cluster_from_dict(flat_cluster(2, memory=5200.0))
    plan = plan_pipedream_2bw(g, ok, 2)
    assert plan.search.extra["w"] == 2  # one node per stage: 5000 + activations
    assert plan.predicted.peak_memory_bytes + 1000.0 <= 5200.0


def _exhaustive_2bw(g, cl, B, micro_batch_sizes=None):
    """The pre-lazy planner: price every configuration, then ``select_by_simulation`` over the
    memory-feasible ones.  Returns (best plan or None, number built, least need)."""
    import numpy as np

    from gpp_solver.cost.model import node_compute
    from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core
    from gpp_solver.planners.sequential.seq_eval import MARGIN, SequentialPricer, select_by_simulation

    core, inputs, sinks = pipedream_core(g)
    order = [v for v in g.topo_order if v in set(core)]
    pricer = SequentialPricer(g, cl, B, order, inputs, sinks)
    configs, lower, least = [], [], float("inf")
    for b in candidate_micro_batches(B, micro_batch_sizes):
        for w in range(1, min(cl.devices, len(order)) + 1):
            for d in range(1, min(b, cl.devices // w) + 1):
                if b % d:
                    continue
                cuts = equal_partition(
                    [node_compute(g.node(v).fw_time, g.node(v).bw_time, g.micro_batch_sizes, b / d) for v in order], w
                )
                pr = pricer.price(
                    np.repeat(np.arange(w), np.diff(cuts)), [tuple(range(i * d, (i + 1) * d)) for i in range(w)], b
                )
                need = float(np.max(pr.memory + pr.weights))
                least = min(least, need)
                if need <= cl.memory_bytes * (1 + MARGIN):
                    configs.append((b, w, d, cuts))
                    lower.append(pr.lower_bound)

    def build(i):
        b, w, d, cuts = configs[i]
        rows = [(order[cuts[s] : cuts[s + 1]], tuple(range(s * d, (s + 1) * d)), b) for s in range(w)]
        plan = build_plan(
            g,
            cl,
            attach_detached(g, rows, inputs, sinks),
            B,
            planner="pipedream-2bw",
            search=SearchInfo(0.0, "feasible"),
        )
        need = max(st.predicted.memory_bytes + sum(g.node(v).weight_bytes for v in st.nodes) for st in plan.stages)
        return plan if need <= cl.memory_bytes else None

    built, _ = select_by_simulation(lower, build)
    keyed = [
        ((p.predicted.iteration_time, configs[i][1] * configs[i][2], configs[i][1], configs[i][0]), i)
        for i, p in built.items()
    ]
    return (built[min(keyed)[1]] if keyed else None), len(built), least


def _deep_chain(n: int) -> dict:
    gd = chain_dict(n, [1.0 + (7 * i % 5) * 0.5 for i in range(n)])
    for i, nd in enumerate(gd["nodes"]):
        nd["weight_bytes"] = 50.0 * (1 + i % 3)
        nd["activation_bytes"] = 20.0 * (1 + i % 4)
    return gd


@pytest.mark.parametrize(
    "gd", [chain_dict(6, [1.0, 3.0, 0.5, 2.0, 1.5, 2.5]), diamond_dict(), branchy_dict(), _deep_chain(12)]
)
@pytest.mark.parametrize(
    "cd",
    [
        CLUSTER,
        flat_cluster(4, memory=3000.0),
        flat_cluster(4, memory=800.0),
        flat_cluster(16, memory=1300.0),
        flat_cluster(16),
    ],
)
@pytest.mark.parametrize("B", [8, 32])
def test_lazy_pricing_picks_and_builds_what_pricing_everything_does(gd, cd, B):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    ref, n_built, least = _exhaustive_2bw(g, cl, B)
    if ref is None:
        with pytest.raises(InfeasibleError) as err:
            plan_pipedream_2bw(g, cl, B)
        assert err.value.required_memory_bytes == least
        return
    ours = plan_pipedream_2bw(g, cl, B)
    assert ours.stages == ref.stages
    assert ours.predicted.iteration_time == ref.predicted.iteration_time
    extra = ours.search.extra
    assert extra["simulated"] == n_built  # the same plans were built
    assert (
        extra["simulated"]
        <= extra["within_memory"]
        <= extra["priced"]
        <= extra["memory_checked"]
        <= extra["configurations"]
    )


def test_equal_partition_matches_the_direct_scan():
    import random

    import numpy as np

    from gpp_solver.planners.sequential.equal_partition import _equal_partition_loop

    rng = random.Random(7)
    for _ in range(3000):
        n = rng.randint(1, 25)
        pick = rng.random()
        if pick < 0.3:
            ws = [float(rng.randint(0, 3)) for _ in range(n)]
        elif pick < 0.5:
            ws = [rng.choice([0.0, 1e-17, 0.1, 0.3, 1.0, 1e16]) for _ in range(n)]
        elif pick < 0.6:
            ws = [rng.uniform(-1.0, 2.0) for _ in range(n)]
        else:
            ws = [rng.random() ** 3 for _ in range(n)]
        prefix = np.concatenate([[0.0], np.cumsum(ws)])
        for w in range(1, n + 1):
            assert equal_partition(ws, w) == _equal_partition_loop(prefix, n, w)


def test_equal_partition_fast_path_matches_the_direct_scan_on_long_inputs():
    """Long weight lists with runs of zero-cost nodes (ties between equal prefix sums) and mixed
    magnitudes (ties from rounding): the vectorised first minimisers equal the scan's cuts."""
    import random

    import numpy as np

    from gpp_solver.planners.sequential.equal_partition import _equal_partition_loop

    rng = random.Random(11)
    for _ in range(150):
        n = rng.randint(20, 300)
        kind = rng.random()
        if kind < 0.4:
            ws = [0.0 if rng.random() < 0.4 else rng.random() for _ in range(n)]
        elif kind < 0.7:
            ws = [rng.choice([0.0, 0.0, 1e-17, 0.1, 0.3, 1.0, 1e16]) for _ in range(n)]
        else:
            ws = [float(rng.randint(0, 2)) for _ in range(n)]
        prefix = np.concatenate([[0.0], np.cumsum(ws)])
        for w in sorted({1, 2, n // 7 + 1, n // 2, n - 1, n, rng.randint(1, n)}):
            if w >= 1:
                assert equal_partition(ws, w) == _equal_partition_loop(prefix, n, w)
