"""Split backward (``docs/zero-bubble.md``): W actions in the format, cost model, validator,
simulator, CP-SAT model, W placement and the planners' ``schedule`` option."""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_graphs import random_dag_edges

import gpp_solver as gs
from gpp_solver.action import Action, parse_order
from gpp_solver.cost.memory import stage_memory
from gpp_solver.cost.model import in_flight_from_order, stage_costs
from gpp_solver.errors import InvalidGraphError, InvalidInputError, InvalidPlanError
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.plan.zero_bubble import Durations, zero_bubble_orders

REPO = Path(__file__).resolve().parents[2]
INFO = gs.SearchInfo(0.0, "feasible")


def _chain_plan(chain, cluster_dict, schedule, n_stages=4, B=8, b=1):
    g = gs.graph_from_dict(chain)
    c = gs.cluster_from_dict(cluster_dict)
    specs = [StageSpec((f"n{i}",), (i,), b) for i in range(n_stages)]
    return g, c, build_plan(g, c, specs, B, planner="manual", search=INFO, schedule=schedule)


# ------------------------------------------------------------------------------------ format
def test_w_action_text_and_plan_json_round_trip(chain, cluster_dict):
    assert Action.parse("W3") == ("W", 3) and str(Action.parse("W3")) == "W3"
    with pytest.raises(InvalidPlanError, match="F, B or W"):
        Action.parse("X3")
    g, c, p = _chain_plan(chain, cluster_dict, "zb")
    d = gs.plan_to_dict(p)
    assert any(a[0] == "W" for s in d["stages"] for a in s["schedule"]["order"])
    q = gs.plan_from_dict(json.loads(json.dumps(d)))
    assert q == p and gs.plan_to_dict(q) == d
    gs.validate(q, g, c)


def test_bw_weight_time_read_written_and_checked(chain):
    d = copy.deepcopy(chain)
    d["nodes"][0]["bw_weight_time"] = [0.5, 1.0]
    g = gs.graph_from_dict(d)
    assert g.node("n0").bw_weight_time == (0.5, 1.0) and g.node("n1").bw_weight_time is None
    assert gs.graph_from_dict(gs.graph_to_dict(g)) == g
    bad = copy.deepcopy(d)
    bad["nodes"][0]["bw_weight_time"] = [0.5, 3.5]  # bw_time is [2, 3]
    with pytest.raises(InvalidGraphError, match=r"bw_weight_time\[1\] = 3.5 exceeds bw_time\[1\]"):
        gs.graph_from_dict(bad)
    bad["nodes"][0]["bw_weight_time"] = [0.5]
    with pytest.raises(InvalidGraphError, match="bw_weight_time has 1 entries"):
        gs.graph_from_dict(bad)


def test_weight_gradient_time_given_or_estimated(chain, cluster_dict):
    d = copy.deepcopy(chain)
    d["nodes"][0]["bw_weight_time"] = [0.5, 1.0]  # measured at b = 1, 2: 0.75 at b = 1.5 (linear)
    d["nodes"][1]["weight_bytes"] = 0  # no weights: nothing to split off
    g = gs.graph_from_dict(d)
    c = gs.cluster_from_dict(cluster_dict)
    specs = [StageSpec((f"n{i}",), (i,), 2) for i in range(4)]
    costs = stage_costs(g, c, specs, 8)
    assert costs[0].backward_weight == pytest.approx(1.0)  # measured, at b = 2
    assert costs[1].backward_weight == 0.0  # no weights
    assert costs[2].backward_weight == pytest.approx(0.5 * 3.0)  # estimate: half of bw_time (3 at b = 2)
    for cst in costs:
        assert cst.backward_input + cst.backward_weight == pytest.approx(cst.backward)


# -------------------------------------------------------------------------------- validator
def test_in_flight_counts_until_w():
    assert in_flight_from_order(parse_order("F0 F1 B0 F2 W0 B1 W1 B2 W2"), 4) == 12
    assert in_flight_from_order(parse_order("F0 F1 B0 W0 F2 B1 W1 B2 W2"), 4) == 8
    assert in_flight_from_order(parse_order("F0 F1 B0 F2 B1 B2"), 4) == 8


@pytest.fixture
def zb_setup(chain, cluster_dict):
    g, c, p = _chain_plan(chain, cluster_dict, "zb")
    gs.validate(p, g, c)
    return g, c, gs.plan_to_dict(p)


def _refused(setup, order_text, message, stage=0):
    g, c, d = setup
    d = copy.deepcopy(d)
    order = parse_order(order_text)
    d["stages"][stage]["schedule"]["order"] = [a.to_json() for a in order]
    d["stages"][stage]["in_flight_samples"] = in_flight_from_order(order, d["stages"][stage]["micro_batch_size"])
    with pytest.raises(InvalidPlanError, match=message):
        gs.validate(gs.plan_from_dict(d), g, c)


ALL_F = " ".join(f"F{j}" for j in range(8))


def test_validator_refuses_w_before_its_b(zb_setup):
    _refused(
        zb_setup,
        ALL_F + " W0 " + " ".join(f"B{j}" for j in range(8)) + " " + " ".join(f"W{j}" for j in range(1, 8)),
        r"W0 before B0 \(C4",
    )


def test_validator_refuses_missing_w(zb_setup):
    bw = " ".join(f"B{j} W{j}" for j in range(7))
    _refused(zb_setup, ALL_F + " " + bw + " B7", "has 7 weight gradients W but 8 micro-batches")


def test_validator_refuses_w_out_of_order(zb_setup):
    _refused(
        zb_setup,
        ALL_F + " " + " ".join(f"B{j}" for j in range(8)) + " W1 W0 " + " ".join(f"W{j}" for j in range(2, 8)),
        r"W1 out of order, expected W0",
    )


def test_validator_memory_counts_activations_until_w(chain, cluster_dict):
    """The same F/B order fits with W right after each B and breaks the limit with W deferred."""
    g = gs.graph_from_dict(chain)
    c0 = gs.cluster_from_dict(cluster_dict)
    s = StageSpec(("n0", "n1", "n2", "n3"), (0,), 1)
    base = build_plan(g, c0, [s], 8, planner="manual", search=INFO)
    eager = parse_order(" ".join(f"F{j} B{j} W{j}" for j in range(8)))
    late = parse_order(" ".join(f"F{j} B{j}" for j in range(8)) + " " + " ".join(f"W{j}" for j in range(8)))
    m1 = stage_memory(g, c0, s, 1)
    c = c0.with_(memory_bytes=m1 * 1.01)  # room for one micro-batch in flight
    gs.validate(build_plan(g, c, [StageSpec(s.nodes, s.devices, 1, order=eager)], 8, planner="m", search=INFO), g, c)
    with pytest.raises(InvalidPlanError, match="memory limit"):
        gs.validate(build_plan(g, c, [StageSpec(s.nodes, s.devices, 1, order=late)], 8, planner="m", search=INFO), g, c)
    assert base.stages[0].in_flight_samples == 1


# -------------------------------------------------------------------------------- simulator
def test_simulator_times_b_and_w_by_hand():
    """Two stages, one micro-batch: F 1 each, B 4 each of which W 1.5; edge 0 -> 1.
    Split: F0@0-1, F1@1-2, B1@2-4.5, W1@4.5-6, B0@4.5-7, W0@7-8.5 -> 8.5 (+ all-reduce 0).
    Whole backward: B1@2-6, B0@6-10 -> 10."""
    mb, fw, bw, w, ar = {0: 1, 1: 1}, {0: 1.0, 1: 1.0}, {0: 4.0, 1: 4.0}, {0: 1.5, 1: 1.5}, {0: 0.0, 1: 0.0}
    split = {0: parse_order("F0 B0 W0"), 1: parse_order("F0 B0 W0")}
    whole = {0: parse_order("F0 B0"), 1: parse_order("F0 B0")}
    t, tasks = simulate_orders(split, mb, fw, bw, ar, [(0, 1)], 1, weight=w)
    assert t == pytest.approx(8.5)
    assert {(x.stage, x.kind): (x.start, x.end) for x in tasks}[(0, "B")] == pytest.approx((4.5, 7.0))
    assert simulate_orders(whole, mb, fw, bw, ar, [(0, 1)], 1, weight=w)[0] == pytest.approx(10.0)


def test_cp_sat_agrees_with_simulator_on_w_orders(chain, cluster_dict):
    from gpp_solver.cp_schedule import tighten, verify_orders

    g, c, p = _chain_plan(chain, cluster_dict, "zb")
    assert any(a.kind == "W" for s in p.stages for a in s.schedule.order)
    r = verify_orders(p, g, c)
    assert r.feasible and r.makespan == pytest.approx(p.predicted.iteration_time, rel=1e-12)
    # the tick model is off by at most one tick per action on the critical path
    assert abs(r.makespan_cp - r.makespan) <= r.unit * sum(len(s.schedule.order) for s in p.stages)
    t = tighten(p, g, c, time_limit=5.0)
    gs.validate(t.plan, g, c)
    assert t.plan.predicted.iteration_time <= p.predicted.iteration_time * (1 + 1e-9)


# ---------------------------------------------------------------------------- W placement
def test_zb_same_memory_never_slower_and_faster_on_a_chain(chain, cluster_dict):
    g, c, p1 = _chain_plan(chain, cluster_dict, "1f1b")
    _, _, pz = _chain_plan(chain, cluster_dict, "zb")
    gs.validate(pz, g, c)
    assert all(any(a.kind == "W" for a in s.schedule.order) for s in pz.stages)
    # ZB-H1's rule: a stage may hold more than its own 1F1B count, the pipeline's peak memory does not grow
    assert pz.predicted.peak_memory_bytes <= p1.predicted.peak_memory_bytes * (1 + 1e-12)
    assert pz.predicted.iteration_time < p1.predicted.iteration_time * 0.95
    rec = pz.search.extra["schedule"]
    assert rec["chosen"] == "zb" and rec["iteration_time_1f1b"] == pytest.approx(p1.predicted.iteration_time)
    assert "schedule" not in p1.search.extra  # 1f1b plans are those of the code without the option


@pytest.mark.parametrize("seed", range(12))
def test_zb_on_random_dags_valid_same_memory_not_slower(seed, cluster_dict):
    """Random DAGs cut into random convex stages (topological prefixes), random micro-batch sizes per
    stage: the W placement never deadlocks, never raises the peak memory, never loses to the kFkB orders."""
    rng = random.Random(seed)
    n = rng.randint(4, 9)
    edges = random_dag_edges(rng, n, 0.5, 0.35)
    nodes = [
        {
            "id": f"v{i}",
            "fw_time": [rng.uniform(0.5, 2), rng.uniform(1, 4)],
            "bw_time": [rng.uniform(1, 4), rng.uniform(2, 8)],
            "weight_bytes": rng.choice([0, 100]),
            "activation_bytes": 10,
            "output_bytes": 5,
        }
        for i in range(n)
    ]
    g = gs.graph_from_dict(
        {
            "format": "gpp-graph/1",
            "name": "r",
            "micro_batch_sizes": [1, 2],
            "nodes": nodes,
            "edges": [{"src": f"v{a}", "dst": f"v{b}"} for a, b in sorted(edges)],
        }
    )
    c = gs.cluster_from_dict({**cluster_dict, "devices": n, "memory_bytes": 1e12})
    topo = list(g.topo_order)
    cuts = sorted(rng.sample(range(1, n), rng.randint(1, min(4, n - 1))))
    parts = [topo[a:b] for a, b in zip([0] + cuts, cuts + [n])]
    specs = [StageSpec(tuple(p), (i,), rng.choice([1, 2, 4])) for i, p in enumerate(parts)]
    B = 8
    p1 = build_plan(g, c, specs, B, planner="m", search=INFO)
    for schedule in ("zb", "auto"):
        pz = build_plan(g, c, specs, B, planner="m", search=INFO, schedule=schedule)
        gs.validate(pz, g, c)
        assert pz.predicted.iteration_time <= p1.predicted.iteration_time * (1 + 1e-12)
        assert pz.predicted.peak_memory_bytes <= p1.predicted.peak_memory_bytes * (1 + 1e-12)
        if schedule == "auto" and pz.predicted.iteration_time >= p1.predicted.iteration_time:
            assert pz.stages == p1.stages  # auto keeps the kFkB orders unless W is faster


def test_zero_bubble_orders_greedy_beats_eager_somewhere():
    """A 4-stage chain, F = B_in = W = 1, 8 micro-batches: with ZB-H1's memory rule (every stage may
    hold as many as the first stage's 1F1B peak, 4) the placement beats W right after B (30) and
    reaches the paper's ZB-H1 figure n (F + B + W) + (p - 1)(F + B - W) = 24 + 3."""
    from gpp_solver.plan.schedule import kfkb_order
    from gpp_solver.plan.zero_bubble import eager_w

    S, n = 4, 8
    d = Durations(
        {s: 1 for s in range(S)},
        {s: 1.0 for s in range(S)},
        {s: 2.0 for s in range(S)},
        {s: 1.0 for s in range(S)},
        {s: 0.0 for s in range(S)},
        tuple((s, s + 1) for s in range(S - 1)),
        {s: S for s in range(S)},
    )
    orders = {s: kfkb_order(n, S - s) for s in range(S)}
    best, t = zero_bubble_orders(orders, d)
    eager = d.makespan({s: eager_w(o) for s, o in orders.items()})
    assert eager == pytest.approx(30.0) and t == pytest.approx(27.0) and t == pytest.approx(d.makespan(best))
    assert all(in_flight_from_order(best[s], 1) <= S for s in range(S))


# ------------------------------------------------------------------------------- planners
@pytest.mark.parametrize("planner", ["graphpipe", "gpp"])
def test_planner_schedule_option(planner, diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    kw = {"time_limit": 20} if planner == "gpp" else {}
    p1 = gs.solve(g, c, mini_batch_size=8, planner=planner, schedule="1f1b", **kw)
    pz = gs.solve(g, c, mini_batch_size=8, planner=planner, schedule="zb", **kw)
    pa = gs.solve(g, c, mini_batch_size=8, planner=planner, schedule="auto", **kw)
    assert not any(a.kind == "W" for s in p1.stages for a in s.schedule.order)
    for p in (pz, pa):
        gs.validate(p, g, c)
        assert p.predicted.iteration_time <= p1.predicted.iteration_time * (1 + 1e-9)
        assert p.predicted.peak_memory_bytes <= c.memory_bytes
        assert p.search.extra["schedule"]["requested"] in ("zb", "auto")
    if len(pz.stages) > 1:
        assert any(a.kind == "W" for s in pz.stages for a in s.schedule.order)
    with pytest.raises(InvalidInputError, match="schedule must be one of 1f1b, zb, auto"):
        gs.solve(g, c, mini_batch_size=8, planner=planner, schedule="zb-h2")


def test_graphpipe_1f1b_is_the_default_plan(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    a = gs.plan_to_dict(gs.solve(g, c, mini_batch_size=8, planner="graphpipe"))
    b = gs.plan_to_dict(gs.solve(g, c, mini_batch_size=8, planner="graphpipe", schedule="1f1b"))
    a["search"].pop("seconds"), b["search"].pop("seconds")
    assert a == b


def test_cli_schedule(tmp_path, chain, cluster_dict):
    (tmp_path / "g.json").write_text(json.dumps(chain))
    (tmp_path / "c.json").write_text(json.dumps(cluster_dict))

    def run(*extra):
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "gpp_solver",
                "plan",
                str(tmp_path / "g.json"),
                "--cluster",
                str(tmp_path / "c.json"),
                "--batch",
                "8",
                "--quiet",
                *extra,
            ],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )

    r = run("--planner", "graphpipe", "--schedule", "zb", "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert "schedule zb (asked zb" in r.stdout
    plan = json.loads((tmp_path / "p.json").read_text())
    assert any(a[0] == "W" for s in plan["stages"] for a in s["schedule"]["order"])
    r = run("--planner", "pipedream", "--schedule", "zb")
    assert r.returncode == 2 and "has no option 'schedule'" in r.stderr
    r = run("--schedule", "zb2")
    assert r.returncode == 2 and "invalid choice" in r.stderr
