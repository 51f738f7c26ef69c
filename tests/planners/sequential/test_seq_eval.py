"""Numpy pricing of sequential candidates: exact memory and per-micro-batch time, a true lower bound
on the simulated iteration time, and pruned searches that return what exhaustive ones return."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import CLUSTER, chain_dict, diamond_dict
from test_pipedream import branchy_dict, flat_cluster

from gpp_solver.cost.model import stage_costs
from gpp_solver.formats.cluster import cluster_from_dict
from gpp_solver.formats.graph import graph_from_dict
from gpp_solver.plan.build import build_plan
from gpp_solver.planners.sequential.common import attach_detached, candidate_micro_batches, pipedream_core
from gpp_solver.planners.sequential.equal_partition import equal_partition
from gpp_solver.planners.sequential.pipedream_2bw import plan_pipedream_2bw
from gpp_solver.planners.sequential.seq_eval import SequentialPricer, select_by_simulation
from gpp_solver.types import SearchInfo


def _with_inputs(gd: dict) -> dict:
    """Add a zero-cost input feeding the first and the last node (a transfer that skips stages)."""
    gd = {**gd, "nodes": list(gd["nodes"]), "edges": list(gd["edges"])}
    first, last = gd["nodes"][0]["id"], gd["nodes"][-1]["id"]
    gd["nodes"].insert(
        0,
        {
            "id": "in",
            "fw_time": [0.0, 0.0],
            "bw_time": [0.0, 0.0],
            "weight_bytes": 0.0,
            "activation_bytes": 5.0,
            "output_bytes": 7.0,
        },
    )
    gd["edges"] += [{"src": "in", "dst": first}, {"src": "in", "dst": last}]
    return gd


@pytest.mark.parametrize(
    "gd", [chain_dict(6), diamond_dict(), branchy_dict(), _with_inputs(chain_dict(5)), _with_inputs(branchy_dict())]
)
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(4)])
def test_pricing_matches_the_built_plan_and_bounds_its_simulation(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    core, inputs, sinks = pipedream_core(g)
    order = [v for v in g.topo_order if v in set(core)]
    B = 8
    pricer = SequentialPricer(g, cl, B, order, inputs, sinks)
    rng = random.Random(0)
    for _ in range(25):
        w = rng.randint(1, min(len(order), cl.devices))
        cuts = sorted(rng.sample(range(1, len(order)), w - 1)) if w > 1 else []
        cuts = [0, *cuts, len(order)]
        b = rng.choice([1, 2, 4, 8])
        sizes = [rng.choice([s for s in (1, 2) if b % s == 0]) for _ in range(w)]
        if sum(sizes) > cl.devices:
            continue
        devs, dev = [], 0
        for s in sizes:
            devs.append(tuple(range(dev, dev + s)))
            dev += s
        rows = [(order[cuts[i] : cuts[i + 1]], devs[i], b) for i in range(w)]
        plan = build_plan(
            g, cl, attach_detached(g, rows, inputs, sinks), B, planner="t", search=SearchInfo(0.0, "feasible")
        )
        pr = pricer.price(np.repeat(np.arange(w), np.diff(cuts)), devs, b)
        assert pr.lower_bound <= plan.predicted.iteration_time * (1 + 1e-12)
        by_devices = {st.devices: st for st in plan.stages}
        costs = {st.devices: c for st, c in zip(plan.stages, stage_costs(g, cl, plan.stages, B))}
        for i, dv in enumerate(devs):
            assert pr.memory[i] == pytest.approx(by_devices[dv].predicted.memory_bytes, rel=1e-12)
            assert pr.per_micro_batch[i] == pytest.approx(costs[dv].per_micro_batch, rel=1e-12)
        if len(plan.stages) == 1:
            assert pr.lower_bound == pytest.approx(plan.predicted.iteration_time, rel=1e-12)


def test_select_by_simulation_stops_at_the_bound_and_reports_the_deadline():
    class P:  # the least a plan needs here
        def __init__(self, t):
            self.predicted = type("X", (), {"iteration_time": t})()

    times = [5.0, 3.8, 4.0, 10.0]
    lower = [4.0, 2.0, 3.5, 9.0]
    calls = []
    built, complete = select_by_simulation(lower, lambda i: calls.append(i) or P(times[i]))
    assert complete and calls == [1, 2] and set(built) == {1, 2}
    built, complete = select_by_simulation(lower, lambda i: None if i == 1 else P(times[i]))
    assert complete and set(built) == {2, 0}  # a rejected candidate does not tighten the bound
    built, complete = select_by_simulation(lower, lambda i: P(times[i]), deadline=0.0)
    assert not complete and set(built) == {1}


@pytest.mark.parametrize(
    "gd", [chain_dict(6, [1.0, 3.0, 0.5, 2.0, 1.5, 2.5]), branchy_dict(), _with_inputs(branchy_dict())]
)
@pytest.mark.parametrize("cd", [CLUSTER, flat_cluster(4, memory=3000.0)])
def test_2bw_equals_the_exhaustive_search(gd, cd):
    g, cl = graph_from_dict(gd), cluster_from_dict(cd)
    B = 8
    core, inputs, sinks = pipedream_core(g)
    order = [v for v in g.topo_order if v in set(core)]
    best, best_key = None, None
    for b in candidate_micro_batches(B):
        for w in range(1, min(cl.devices, len(order)) + 1):
            for d in range(1, cl.devices // w + 1):
                if b % d:
                    continue
                x = b / d
                from gpp_solver.cost.model import interp_time

                wts = [
                    interp_time(g.node(v).fw_time, g.micro_batch_sizes, x)
                    + interp_time(g.node(v).bw_time, g.micro_batch_sizes, x)
                    for v in order
                ]
                cuts = equal_partition(wts, w)
                rows = [(order[cuts[i] : cuts[i + 1]], tuple(range(i * d, (i + 1) * d)), b) for i in range(w)]
                plan = build_plan(
                    g,
                    cl,
                    attach_detached(g, rows, inputs, sinks),
                    B,
                    planner="pipedream-2bw",
                    search=SearchInfo(0.0, "feasible"),
                )
                need = max(
                    st.predicted.memory_bytes + sum(g.node(v).weight_bytes for v in st.nodes) for st in plan.stages
                )
                key = (plan.predicted.iteration_time, w * d, w, b)
                if need <= cl.memory_bytes and (best_key is None or key < best_key):
                    best, best_key = plan, key
    ours = plan_pipedream_2bw(g, cl, B)
    assert ours.stages == best.stages
    assert ours.search.extra["simulated"] <= ours.search.extra["within_memory"]
