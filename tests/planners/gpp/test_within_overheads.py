"""``gpp`` under the runtime's memory overheads (``planners/gpp/overheads.py``): never slower
(predicted) than any other planner's plan that fits the whole memory model, from roomy memory to
the tightest that a planner solves; with no plan, the error states the memory a plan needs."""

from __future__ import annotations

from dataclasses import replace

import pytest

import gpp_solver as gs
from gpp_solver.cost.memory import overheads_priced
from gpp_solver.errors import GppError, InfeasibleError
from gpp_solver.formats.machines import machine_cluster
from gpp_solver.workloads import build_model

OTHERS = ("graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper")


def _plan(graph, cluster, B, planner):
    try:
        return gs.solve(graph, cluster, mini_batch_size=B, planner=planner)
    except GppError:
        return None


def test_on_a_diamond_from_roomy_to_the_tightest(diamond, cluster_dict):
    cluster = gs.cluster_from_dict({**cluster_dict, "memory_overheads": True})
    _conformance(gs.graph_from_dict(diamond), cluster, 8)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "params", "devices", "B"),
    [("candle-uno", {"branches": 2, "layers": 2}, 4, 32), ("mmt", {"branches": 2, "layers": 1}, 4, 16)],
)
def test_on_paper_workloads_from_roomy_to_the_tightest(name, params, devices, B):
    cluster = replace(machine_cluster("v100", devices), memory_overheads=True)
    _conformance(build_model(name, **params), cluster, B)


def _conformance(graph, cluster, B):
    """gpp at five memories from roomy to the tightest it solves: a plan that fits, never slower than
    another planner's nor than its own plan with less memory; below the tightest no planner has one and the error names what a plan needs."""
    roomy = gs.solve(graph, replace(cluster, memory_bytes=1e13), mini_batch_size=B).predicted.peak_memory_bytes
    fits, fails = roomy, roomy / 2
    while _plan(graph, replace(cluster, memory_bytes=fails), B, "gpp") is not None:
        fits, fails = fails, fails / 2
    for _ in range(5):  # the tightest memory gpp solves, within 3%
        mid = (fits + fails) / 2
        if _plan(graph, replace(cluster, memory_bytes=mid), B, "gpp") is None:
            fails = mid
        else:
            fits = mid
    times = []  # gpp's iteration times, most memory first
    for memory in [fits + (roomy * 1.05 - fits) * f for f in (1.0, 0.5, 0.2, 0.05, 0.0)]:
        c = replace(cluster, memory_bytes=memory)
        mine = _plan(graph, c, B, "gpp")
        assert mine is not None, memory
        times.append(mine.predicted.iteration_time)
        gs.validate(mine, graph, c)
        assert mine.planner == "gpp" and mine.predicted.peak_memory_bytes <= memory * (1 + 1e-9)
        for n in OTHERS:
            p = _plan(graph, c, B, n)
            assert p is None or mine.predicted.iteration_time <= p.predicted.iteration_time * (1 + 1e-9), (memory, n)
    assert all(t <= min(times[i:]) * (1 + 1e-9) for i, t in enumerate(times)), times
    below = replace(cluster, memory_bytes=fails)
    for n in OTHERS:  # where gpp finds none, neither does another planner
        assert _plan(graph, below, B, n) is None, n
    with pytest.raises(InfeasibleError) as err:
        gs.solve(graph, below, mini_batch_size=B)
    need = err.value.required_memory_bytes
    assert need is not None and need > fails and f"{need:.6g}" in str(err.value)
    plan = gs.solve(graph, replace(cluster, memory_bytes=need), mini_batch_size=B)
    assert plan.predicted.peak_memory_bytes <= need * (1 + 1e-9)


def _recording(monkeypatch, stop):
    """The portfolio's planners, each called as it is, recorded in order; ``stop(name, calls)`` says
    whether that call is stopped for time (TimeLimitError) as a planner past its share would be."""
    from gpp_solver.planners.gpp import overheads
    from gpp_solver.planners.registry import get_planner

    calls: list[str] = []

    def fake_get(name):
        real = get_planner(name)

        def run(*args, **kwargs):
            calls.append(name)
            if stop(name, calls):
                raise gs.TimeLimitError(f"{name}: stopped for time")
            return real(*args, **kwargs)

        return run

    monkeypatch.setattr(overheads, "get_planner", fake_get)
    return calls


def test_portfolio_runs_the_quick_planners_first_and_a_stopped_one_again(monkeypatch, diamond, cluster_dict):
    cluster = gs.cluster_from_dict({**cluster_dict, "memory_overheads": True})
    calls = _recording(monkeypatch, lambda name, calls: name == "graphpipe" and calls.count(name) == 1)
    plan = gs.solve(gs.graph_from_dict(diamond), cluster, mini_batch_size=8, time_limit=30)
    firsts = list(dict.fromkeys(calls))
    assert firsts[:2] == ["gpp", "pipedream-2bw"] and firsts[-1] == "piper"
    # stopped at its first call, graphpipe runs again (its rounds: ``plan_within_overheads``) after the others
    again = [i for i, name in enumerate(calls) if name == "graphpipe"][1:]
    assert again and min(again) > calls.index("piper")
    assert "graphpipe" in [c["planner"] for c in plan.search.extra["overheads"]["candidates"]]
    assert plan.search.status != gs.Status.TIME_LIMIT  # every planner ran to its end in the end


def test_portfolio_planner_stopped_for_time_twice_makes_the_status_time_limit(monkeypatch, diamond, cluster_dict):
    cluster = gs.cluster_from_dict({**cluster_dict, "memory_overheads": True})
    calls = _recording(monkeypatch, lambda name, calls: name == "alpa")
    plan = gs.solve(gs.graph_from_dict(diamond), cluster, mini_batch_size=8, time_limit=30)
    assert calls.count("alpa") == 2
    assert plan.search.status == gs.Status.TIME_LIMIT
    assert "alpa" not in [c["planner"] for c in plan.search.extra["overheads"]["candidates"]]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("spec", "sizes", "B"),
    [("examples.two_branch:bench", [8, 16, 32], 64), ("examples.real_models:two_tower", [4, 8, 16], 32)],
)
def test_on_a_profiled_graph_from_roomy_to_the_tightest(spec, sizes, B):
    """A model profiled by the runtime, on a cluster that does not state ``memory_overheads`` (so
    they are priced, the graph being profiled), 2 devices."""
    pytest.importorskip("torch")
    from gpp_runtime.capture.fx_graph import load_workload
    from gpp_runtime.capture.profiler import profile

    graph = gs.graph_from_dict(profile(load_workload(spec), sizes, warmup=0, repeats=1, name=spec))
    cluster = gs.cluster_from_dict(
        {"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9}
    )
    assert overheads_priced(cluster, graph)
    _conformance(graph, cluster, B)
