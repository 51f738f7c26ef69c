"""The cost model against hand-computed numbers (docs/cost-model.md)."""

from __future__ import annotations

import pytest

import gpp_solver as gs
from gpp_solver.cost.memory import stage_memory
from gpp_solver.cost.model import (
    in_flight_from_order,
    interp_time,
    iteration_time_estimate,
    stage_costs,
    stage_transfers,
)
from gpp_solver.cost.time_terms import allreduce_time
from gpp_solver.plan.build import StageSpec


def test_interpolation_rule():
    sizes, times = (2, 4, 8), (1.0, 1.5, 2.5)
    assert interp_time(times, sizes, 1) == 1.0  # below the smallest: the smallest's time
    assert interp_time(times, sizes, 2) == 1.0
    assert interp_time(times, sizes, 3) == 1.25  # linear between
    assert interp_time(times, sizes, 6) == 2.0
    assert interp_time(times, sizes, 16) == 5.0  # above: constant time per sample
    assert interp_time((3.0,), (1,), 4) == 12.0


def test_allreduce_and_inflight():
    assert allreduce_time(100.0, 1, 10.0) == 0.0
    assert allreduce_time(100.0, 4, 10.0) == pytest.approx(2 * 3 / 4 * 100 / 10)
    order = [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert in_flight_from_order(order, 4) == 8


def test_stage_costs_by_hand(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)  # 2 devices per node: intra 1000, inter 100, latency 0.01
    specs = [StageSpec(("a",), (0, 1), 4), StageSpec(("b", "c"), (2,), 4), StageSpec(("d",), (3,), 4)]
    costs = stage_costs(g, c, specs, 8)
    # stage 0: b=4, d=2 -> 2 samples per replica: f=1.5, g=3.0
    assert costs[0].compute_fw == 1.5 and costs[0].compute_bw == 3.0
    # transfers of 'a': one into stage 1 (b and c are one transfer of max bytes 5), devices 0,1,2 span nodes
    assert costs[0].comm_fw == pytest.approx(0.01 + 5 * 2 / 100)
    # all-reduce of 100 bytes among 2 replicas inside node 0 (intra 1000)
    assert costs[0].allreduce == pytest.approx(2 * 1 / 2 * 100 / 1000)
    assert costs[0].time_per_sample == pytest.approx((4.5 + 2 * 0.11) / 4 + 0.1 / 8)
    # stage 1: b=4, d=1: b and c each at 4 samples = 2x the time at 2 (linear above the largest size)
    assert costs[1].compute_fw == pytest.approx(2 * 3.0)
    # in: a->{b,c} one transfer; out: b->d and c->d two transfers; devices 2 and 3 share node 1
    inter = 0.01 + 5 * 4 / 100
    intra = 0.01 + 5 * 4 / 1000
    assert costs[1].comm_fw == pytest.approx(inter + 2 * intra)
    assert costs[1].time_per_sample == pytest.approx((18.0 + 2 * (inter + 2 * intra)) / 4)
    tr = stage_transfers(g, {"a": 0, "b": 1, "c": 1, "d": 2})
    assert sorted(tr[1]) == [(0, 5.0), (2, 5.0), (2, 5.0)]


def test_memory_by_hand(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    spec = StageSpec(("b", "c"), (2, 3), 4)
    # 4 * (100 + 100) weights + 12 in-flight samples / 2 replicas * (10 + 10) activation bytes
    assert stage_memory(g, c, spec, 12) == 4 * 200 + 6 * 20


def test_iteration_estimate(chain, cluster_dict):
    g = gs.graph_from_dict(chain)
    c = gs.cluster_from_dict(
        {**cluster_dict, "latency": 0.0, "inter_node_bandwidth": 1e12, "intra_node_bandwidth": 1e12}
    )
    specs = [StageSpec((f"n{i}",), (i,), 1) for i in range(4)]
    costs = stage_costs(g, c, specs, 8)
    est = iteration_time_estimate(costs, [(0, 1), (1, 2), (2, 3)], 8)
    per = costs[0].per_micro_batch
    assert est == pytest.approx(4 * per + 7 * per, rel=1e-6)


def test_tmpc_replaces_node_figures(diamond, cluster_dict):
    diamond["nodes"][1]["tmpc"] = [
        {
            "t": 2,
            "recompute": False,
            "fw_time": [0.5, 0.75],
            "bw_time": [1.0, 1.5],
            "weight_bytes": 50,
            "activation_bytes": 5,
        }
    ]
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    spec = StageSpec(("b",), (0, 1), 2, tensor_parallel=2, tmpc={"b": 0})
    cost = stage_costs(g, c, [StageSpec(("a",), (2,), 2), spec, StageSpec(("c", "d"), (3,), 2)], 2)[1]
    assert cost.data_parallel == 1 and cost.compute_fw == 0.75
    assert stage_memory(g, c, spec, 2) == 4 * 50 + 2 * 5
