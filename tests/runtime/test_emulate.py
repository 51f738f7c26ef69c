"""gpp_runtime.emulate: the graph as an fx-traceable module whose operators sleep their profiled times."""

from __future__ import annotations

import time

import pytest
import torch

from gpp_runtime.capture.fx_graph import trace
from gpp_runtime.emulate import Sleeper, build_model, make_workload, realised_graph
from gpp_solver import SearchInfo, StageSpec, as_cluster, as_graph, build_plan
from gpp_solver.cost.model import interp_time
from gpp_solver.errors import InvalidInputError


def _node(nid, fw, bw, out=64.0, w=16.0):
    return {"id": nid, "fw_time": fw, "bw_time": bw, "weight_bytes": w, "activation_bytes": 8.0, "output_bytes": out}


def diamond(scale: float = 1.0) -> dict:
    """a -> (b.x, c) -> d, ids with dots as a profiled model's modules have; sizes 1, 4."""
    s = scale
    return {
        "format": "gpp-graph/1",
        "name": "diamond",
        "micro_batch_sizes": [1, 4],
        "nodes": [
            _node("a", [0.002 * s, 0.005 * s], [0.004 * s, 0.010 * s]),
            _node("b.x", [0.003 * s, 0.006 * s], [0.006 * s, 0.012 * s], out=1e9, w=1e9),
            _node("c", [0.001 * s, 0.002 * s], [0.002 * s, 0.004 * s], out=0.0, w=0.0),
            _node("d", [0.004 * s, 0.008 * s], [0.008 * s, 0.016 * s]),
        ],
        "edges": [
            {"src": "a", "dst": "b.x"},
            {"src": "a", "dst": "c", "bytes": 4096.0},
            {"src": "b.x", "dst": "d"},
            {"src": "c", "dst": "d"},
        ],
    }


def test_fx_trace_names_every_node_and_edge():
    mg = trace(build_model(diamond()))
    assert [mg.ids[n] for n in mg.nodes] == ["a", "b.x", "c", "d"]
    assert sorted(mg.edges()) == [("a", "b.x"), ("a", "c"), ("b.x", "d"), ("c", "d")]
    assert all(n.op == "call_module" for n in mg.nodes)


def test_tensors_and_parameters_follow_the_realised_bytes():
    g = diamond()
    m = build_model(g, max_output_bytes=1024, max_weight_bytes=256)
    y = m(torch.zeros(3, 1))
    assert tuple(y.shape) == (3, 16)  # d: 64 bytes per sample = 16 floats
    assert m.get_submodule("b.x").width == 256 and m.get_submodule("b.x").weight.numel() == 64  # capped
    assert m.get_submodule("c").width == 1 and m.get_submodule("c").weight.numel() == 1  # at least one
    r = realised_graph(g, max_output_bytes=1024, max_weight_bytes=256)
    byid = {n["id"]: n for n in r["nodes"]}
    assert byid["b.x"]["output_bytes"] == 1024 and byid["b.x"]["weight_bytes"] == 256
    assert byid["c"]["output_bytes"] == 4 and all("bytes" not in e for e in r["edges"])


def test_forward_and_backward_sleep_the_interpolated_times():
    g = diamond(scale=10.0)  # 30-160 ms per pass: well above scheduler noise
    m = build_model(g)
    sizes = g["micro_batch_sizes"]
    for rows in (2, 8):  # between the measured sizes, and above the largest (linear)
        want_f = sum(interp_time(n["fw_time"], sizes, rows) for n in g["nodes"])
        want_b = sum(interp_time(n["bw_time"], sizes, rows) for n in g["nodes"])
        t0 = time.perf_counter()
        y = m(torch.zeros(rows, 1))
        t1 = time.perf_counter()
        y.sum().backward()
        t2 = time.perf_counter()
        assert want_f * 0.95 <= t1 - t0 <= want_f * 1.5 + 0.02
        assert want_b * 0.95 <= t2 - t1 <= want_b * 1.5 + 0.02


def test_workload_runs_and_refuses_graphs_it_cannot_build():
    wl = make_workload(diamond(scale=0.01))
    (x,), target = wl.sample(4, 0)
    loss = wl.loss(wl.model(x), target)
    loss.backward()
    assert float(loss.detach()) == 0.0
    two_sinks = diamond()
    two_sinks["edges"] = two_sinks["edges"][:3]  # c becomes a second sink
    with pytest.raises(InvalidInputError, match="2 sinks"):
        build_model(two_sinks)
    clash = diamond()
    clash["nodes"][0]["id"] = "b"  # "b" is a node and the parent of node "b.x"
    for e in clash["edges"]:
        e["src"] = "b" if e["src"] == "a" else e["src"]
    with pytest.raises(InvalidInputError, match="'b.x' cannot name a module"):
        build_model(clash)
    bad = diamond()
    bad["nodes"][2]["id"] = "forward"
    for e in bad["edges"]:
        e["src"], e["dst"] = [("forward" if v == "c" else v) for v in (e["src"], e["dst"])]
    with pytest.raises(InvalidInputError, match="'forward' cannot name a module"):
        build_model(bad)


def test_realised_graph_joins_several_sinks():
    g = diamond()
    g["edges"] = g["edges"][:3]  # c and d are sinks
    r = realised_graph(g)
    assert [n["id"] for n in r["nodes"]][-1] == "emulated_sink"
    assert {(e["src"], e["dst"]) for e in r["edges"]} >= {("c", "emulated_sink"), ("d", "emulated_sink")}
    mg = trace(build_model(r))
    assert mg.ids[mg.sink] == "emulated_sink"


def test_realised_graph_is_the_plain_model_the_emulation_runs():
    """An emulated operator sleeps its own times and nothing emulates the optimizer: the profile's
    calibrated terms are left out of what is emulated (and so of what the planners are given)."""
    g = diamond()
    g["op_overhead"], g["optimizer_time_per_byte"] = {"fw": 1e-4, "bw": 2e-4}, 1e-9
    r = realised_graph(g)
    assert "op_overhead" not in r and "optimizer_time_per_byte" not in r
    assert as_graph(r).op_overhead == (0.0, 0.0)


def test_sleeper_absorbs_dispatch_between_operators_but_never_credits_idle_time():
    s = Sleeper(reset_gap=0.05)  # wider than the default 1 ms: the test checks the rule, not the load
    t0 = time.perf_counter()
    for _ in range(40):  # 40 ops of 2 ms, each preceded by >= 0.5 ms of "dispatch"
        time.sleep(0.0005)
        s.sleep(0.002)
    took = time.perf_counter() - t0
    # a fixed-duration sleep takes over 40 * 2.5 ms = 100 ms (before its own oversleep); the
    # deadline keeps it at the profile plus the first dispatch and the last op's oversleep (debt)
    assert 0.080 <= took and took - s.debt < 0.095
    time.sleep(0.06)  # idle (a wait for a message) longer than reset_gap: never credited
    debt, t1 = s.debt, time.perf_counter()  # only the last op's oversleep is taken off
    s.sleep(0.005)
    assert time.perf_counter() - t1 >= 0.005 - debt - 1e-4


def test_allreduce_emulator_prices_the_stage_as_the_cost_model_does():
    g = realised_graph(diamond())
    cluster = {
        "format": "gpp-cluster/1",
        "devices": 4,
        "memory_bytes": 1e12,
        "devices_per_node": 4,
        "intra_node_bandwidth": 1e9,
        "inter_node_bandwidth": 1e8,
        "latency": 1e-5,
        "optimizer_state_factor": 4.0,
    }
    plan = build_plan(
        as_graph(g),
        as_cluster(cluster),
        [StageSpec(("a", "b.x"), (0, 1, 2), 2), StageSpec(("c", "d"), (3,), 2)],
        8,
        planner="x",
        search=SearchInfo(0.0, "feasible"),
    )
    seconds = make_workload(diamond(), cluster=cluster).emulate_allreduce
    w = sum(n["weight_bytes"] for n in g["nodes"] if n["id"] in ("a", "b.x"))
    assert seconds(plan, plan.stages[0]) == pytest.approx(2 * 2 / 3 * w / 1e9)
    assert seconds(plan, plan.stages[1]) == 0.0
    assert not hasattr(make_workload(diamond()), "emulate_allreduce")  # no cluster: the real all-reduce
