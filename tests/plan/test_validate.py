"""One test per kind of plan violation; the validator names the first one."""

from __future__ import annotations

import copy

import pytest

import gpp_solver as gs
from gpp_solver.errors import DeadlockError, InvalidPlanError
from gpp_solver.plan.build import StageSpec


@pytest.fixture
def setup(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    p = gs.build_plan(
        g,
        c,
        [
            StageSpec(("a",), (0,), 2),
            StageSpec(("b",), (1,), 2),
            StageSpec(("c",), (2,), 2),
            StageSpec(("d",), (3,), 2),
        ],
        8,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
    gs.validate(p, g, c)
    return g, c, gs.plan_to_dict(p)


def check(setup, mutate, message, error=InvalidPlanError):
    g, c, d = setup
    d = copy.deepcopy(d)
    mutate(d)
    with pytest.raises(error, match=message):
        gs.validate(gs.plan_from_dict(d), g, c)


def test_valid_plan_round_trips(setup):
    g, c, d = setup
    p = gs.plan_from_dict(d)
    assert gs.plan_to_dict(p) == d
    gs.validate(p, g, c)


def test_node_in_two_stages(setup):
    check(setup, lambda d: d["stages"][1]["nodes"].append("a"), "node 'a' is in stage 0 and in stage 1")


def test_node_in_no_stage(setup):
    check(
        setup,
        lambda d: d["stages"][3]["nodes"].clear() or d["stages"][3]["nodes"].append("a"),
        "node 'a' is in stage 0 and in stage 3",
    )


def test_missing_node(setup):
    def m(d):
        d["stages"][2]["nodes"] = ["b"]
        d["stages"][1]["nodes"] = ["c"]
        d["stages"][2]["nodes"] = []

    check(setup, m, "stage 2 has no nodes")


def test_uncovered_node(setup):
    def m(d):
        d["stages"][2]["nodes"] = ["d"]
        d["stages"][3]["nodes"] = ["d"]

    check(setup, m, "node 'd' is in stage 2 and in stage 3")


def test_unknown_node(setup):
    check(setup, lambda d: d["stages"][0]["nodes"].append("zz"), "node 'zz' which is not in graph")


def test_not_convex(setup):
    def m(d):
        d["stages"][0]["nodes"] = ["a", "d"]
        d["stages"][3]["nodes"] = []
        del d["stages"][3]
        d["edges"] = [[0, 1], [0, 2], [1, 0], [2, 0]]

    check(setup, m, "stage 0 is not convex")


def test_missing_stage_edge(setup):
    check(setup, lambda d: d["edges"].remove([1, 3]), r"plan edge \[1, 3\] is missing \(C2\)")


def test_extra_stage_edge(setup):
    check(setup, lambda d: d["edges"].append([0, 3]), r"plan edge \[0, 3\] corresponds to no graph edge")


def test_edge_to_unknown_stage(setup):
    check(setup, lambda d: d["edges"].append([0, 9]), "names a stage that does not exist")


def test_device_out_of_range(setup):
    check(setup, lambda d: d["stages"][0].update(devices=[7]), "uses device 7 but the cluster has 4")


def test_device_shared(setup):
    check(setup, lambda d: d["stages"][1].update(devices=[0]), "device 0 is in stage 0 and in stage 1")


def test_no_devices(setup):
    check(setup, lambda d: d["stages"][1].update(devices=[]), r"stage 1 has no devices \(C3\)")


def test_b_divisible_by_d(setup):
    def m(d):
        d["stages"][0]["devices"] = [0]
        d["stages"][3]["devices"] = [3]
        d["stages"][1]["devices"] = [1]
        d["stages"][2]["micro_batch_size"] = 1
        d["stages"][2]["devices"] = [2]
        d["stages"][0]["devices"] = [0]
        d["stages"][1]["micro_batch_size"] = 3

    check(setup, m, r"`B % b == 0` must hold, but got \(B=8, b=3\)")


def test_b_mod_d(setup):
    def m(d):
        d["stages"][0]["devices"] = [0]
        d["stages"][1]["devices"] = [1]
        d["stages"][2]["devices"] = [2, 3]
        d["stages"][3]["devices"] = []
        d["stages"][2]["micro_batch_size"] = 1

    check(setup, m, r"`b % d == 0` must hold, but got \(b=1, d=2\)")


def test_forward_out_of_order(setup):
    def m(d):
        o = d["stages"][3]["schedule"]["order"]
        o[0], o[2] = o[2], o[0]

    check(setup, m, r"stage 3 schedule step 0: F1 out of order.*\[F1\]<-")


def test_backward_before_forward(setup):
    def m(d):
        d["stages"][3]["schedule"]["order"] = [["B", 0], ["F", 0]] + d["stages"][3]["schedule"]["order"][2:]

    check(setup, m, r"B0 before F0 \(C4: F j before B j\)")


def test_backward_out_of_order(setup):
    def m(d):
        o = d["stages"][3]["schedule"]["order"]
        o[1], o[3] = o[3], o[1]

    check(setup, m, "B1 out of order, expected B0")


def test_missing_micro_batches(setup):
    check(
        setup,
        lambda d: d["stages"][3]["schedule"]["order"].__delitem__(slice(-2, None)),
        "has 3 forwards and 3 backwards, expected 4",
    )


def test_in_flight_mismatch(setup):
    check(
        setup,
        lambda d: d["stages"][0].update(in_flight_samples=2),
        "in_flight_samples is 2 but its order holds up to 6",
    )


def test_memory_limit(setup):
    g, c, d = setup
    tight = c.with_(memory_bytes=450.0)
    with pytest.raises(InvalidPlanError, match="stage 0 needs 460 bytes per device"):
        gs.validate(gs.plan_from_dict(d), g, tight)


def test_predicted_tps_mismatch(setup):
    check(
        setup,
        lambda d: d["stages"][1]["predicted"].update(time_per_sample=1.0),
        "stage 1: predicted time_per_sample 1 differs",
    )


def test_predicted_iteration_time_mismatch(setup):
    check(setup, lambda d: d["predicted"].update(iteration_time=1.0), "predicted.iteration_time 1 differs")


def test_deadlock(setup):
    def m(d):
        # stage 0 wants B0 (needs successors' B0) before its F1; successors want F1 before their B0
        d["stages"][0]["schedule"]["order"] = [
            ["F", 0],
            ["B", 0],
            ["F", 1],
            ["B", 1],
            ["F", 2],
            ["B", 2],
            ["F", 3],
            ["B", 3],
        ]
        d["stages"][0]["in_flight_samples"] = 2
        for s in (1, 2):
            d["stages"][s]["schedule"]["order"] = [["F", j] for j in range(4)] + [["B", j] for j in range(4)]
            d["stages"][s]["in_flight_samples"] = 8

    check(setup, m, "deadlocks: stage 0 at B0", DeadlockError)
