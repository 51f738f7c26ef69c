"""The event simulator against closed forms, hand timelines, a longest-path oracle; deadlock; traces."""

from __future__ import annotations

import json
import random

import networkx as nx
import pytest

import gpp_solver as gs
from gpp_solver.errors import DeadlockError
from gpp_solver.plan.build import StageSpec
from gpp_solver.plan.schedule import kfkb_order
from gpp_solver.plan.simulate import simulate_orders
from gpp_solver.plan.trace import grid_text, order_grid, to_chrome_trace, write_trace

SEARCH = gs.SearchInfo(0.0, "feasible")


def flat_cluster(devices: int, latency: float = 0.0) -> gs.Cluster:
    return gs.cluster_from_dict(
        {"devices": devices, "memory_bytes": 1e12, "inter_node_bandwidth": 1e3, "latency": latency}
    )


def uniform_chain(p: int, f: float, g: float, w: float = 0.0) -> gs.Graph:
    """``p`` nodes, each ``f`` forward and ``g`` backward per sample, no communication."""
    return gs.graph_from_dict(
        {
            "name": f"u{p}",
            "micro_batch_sizes": [1],
            "nodes": [
                {
                    "id": f"n{i}",
                    "fw_time": [f],
                    "bw_time": [g],
                    "weight_bytes": w,
                    "activation_bytes": 1.0,
                    "output_bytes": 0.0,
                }
                for i in range(p)
            ],
            "edges": [{"src": f"n{i}", "dst": f"n{i + 1}"} for i in range(p - 1)],
        }
    )


def one_node_per_stage(graph: gs.Graph, cluster: gs.Cluster, b: int, B: int, devices=None) -> gs.Plan:
    devices = devices or [(i,) for i in range(len(graph.ids))]
    return gs.build_plan(
        graph,
        cluster,
        [StageSpec((v,), devices[i], b) for i, v in enumerate(graph.ids)],
        B,
        planner="manual",
        search=SEARCH,
    )


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("n", [1, 2, 4, 7])
@pytest.mark.parametrize("f,g", [(1.0, 2.0), (3.0, 1.0)])
def test_1f1b_chain_closed_form(p, n, f, g):
    """1F1B on p equal stages: makespan = (n + p - 1)(f + g), for n < p too.

    Micro-batch 0 crosses all p stages forward and back: p(f + g); after it, stage 0 still runs its
    other n - 1 forwards and backwards, and 1F1B keeps it busy from then on, each stage's B j
    returning exactly when it could start: (p + n - 1)(f + g).  With n < p stage 0's warm-up is
    capped at n and the same count holds.
    """
    graph = uniform_chain(p, f, g)
    plan = one_node_per_stage(graph, flat_cluster(p), 1, n)
    sim = gs.simulate(plan, graph, flat_cluster(p))
    assert sim.iteration_time == pytest.approx((n + p - 1) * (f + g))
    assert sim.throughput == pytest.approx(n / sim.iteration_time)
    for st, stats in zip(plan.stages, sim.stages):
        assert stats.busy == pytest.approx(n * (f + g))
        assert stats.idle == pytest.approx(sim.iteration_time - n * (f + g))
        assert stats.idle_fraction == pytest.approx(1 - n * (f + g) / sim.iteration_time)
        depth_from_sink = p - 1 - st.id
        assert stats.peak_in_flight_samples == min(n, depth_from_sink + 1)  # GraphPipe: (j + 1) * b


def test_gpipe_order_closed_form():
    """All forwards then all backwards on p stages: (n + p - 1)(f + g) as well (f, g equal)."""
    p, n, f, g = 3, 5, 1.0, 2.0
    orders = {i: tuple([("F", j) for j in range(n)] + [("B", j) for j in range(n)]) for i in range(p)}
    mk, _ = simulate_orders(
        orders,
        {i: 1 for i in range(p)},
        {i: f for i in range(p)},
        {i: g for i in range(p)},
        {i: 0.0 for i in range(p)},
        [(i, i + 1) for i in range(p - 1)],
        n,
    )
    assert mk == pytest.approx((n + p - 1) * (f + g))


def test_allreduce_tail_of_source_and_sink():
    """A(S) = 2 (d-1)/d W / bw runs after the stage's last backward and can end the iteration."""
    p, n, f, g, bw = 3, 4, 1.0, 2.0, 1e3
    cluster = flat_cluster(4)
    # replicated source (d = 2): the source finishes last in a chain, so the tail adds exactly A
    no_w = uniform_chain(p, f, g, w=0.0)
    with_w = uniform_chain(p, f, g, w=3000.0)
    devices = [(0, 1), (2,), (3,)]
    sim0 = gs.simulate(one_node_per_stage(no_w, cluster, 2, 2 * n, devices), no_w, cluster)
    sim1 = gs.simulate(one_node_per_stage(with_w, cluster, 2, 2 * n, devices), with_w, cluster)
    A = 2 * (2 - 1) / 2 * 3000.0 / bw
    assert sim1.stages[0].allreduce == pytest.approx(A) and sim1.stages[1].allreduce == 0.0
    assert sim1.iteration_time == pytest.approx(sim0.iteration_time + A)
    assert sim1.allreduce_span(0) == pytest.approx((sim0.iteration_time, sim1.iteration_time))
    assert sim1.stages[0].busy == pytest.approx(n * (f + g) + A)
    # replicated sink: its tail overlaps the other stages' last backwards and ends the iteration only
    # when longer than them
    for W, tail_decides in [(3000.0, False), (30000.0, True)]:
        graph = uniform_chain(p, f, g, w=W)
        sim = gs.simulate(one_node_per_stage(graph, cluster, 2, 2 * n, [(0,), (1,), (2, 3)]), graph, cluster)
        A = W / bw
        end_sink = max(t.end for t in sim.tasks if t.stage == 2)
        end_all = max(t.end for t in sim.tasks)
        assert sim.iteration_time == pytest.approx(max(end_sink + A, end_all))
        assert (end_sink + A > end_all) == tail_decides


def test_unequal_micro_batches_producer_2_consumer_4():
    """Hand timeline: producer b=2 (F=1, B=2), consumer b=4 (F=3, B=5), B=8."""
    orders = {0: kfkb_order(4, 4), 1: kfkb_order(2, 1)}
    mk, tasks = simulate_orders(orders, {0: 2, 1: 4}, {0: 1.0, 1: 3.0}, {0: 2.0, 1: 5.0}, {0: 0.0, 1: 0.0}, [(0, 1)], 8)
    at = {(t.stage, t.kind, t.micro_batch): (t.start, t.end) for t in tasks}
    assert at[(1, "F", 0)] == (2.0, 5.0)  # waits for producer F0 and F1 (samples 0..3)
    assert at[(1, "B", 0)] == (5.0, 10.0)
    assert at[(1, "F", 1)] == (10.0, 13.0)
    assert at[(0, "B", 0)] == (10.0, 12.0)  # both producer B0, B1 wait for consumer B0
    assert at[(0, "B", 1)] == (12.0, 14.0)
    assert at[(0, "B", 2)] == (18.0, 20.0)  # B2 waits for consumer B1 (ends 18)
    assert mk == pytest.approx(22.0)


def test_unequal_micro_batches_producer_4_consumer_2():
    """Consumer b=2 needs only the producer micro-batch holding its samples (part of one)."""
    orders = {0: kfkb_order(2, 2), 1: kfkb_order(4, 4)}
    mk, tasks = simulate_orders(orders, {0: 4, 1: 2}, {0: 2.0, 1: 1.0}, {0: 4.0, 1: 1.0}, {0: 0.0, 1: 0.0}, [(0, 1)], 8)
    at = {(t.stage, t.kind, t.micro_batch): (t.start, t.end) for t in tasks}
    assert at[(1, "F", 0)][0] == 2.0 and at[(1, "F", 1)][0] == 3.0  # both after producer F0 only
    assert at[(1, "F", 2)][0] == 4.0  # samples 4..5: producer F1
    assert at[(1, "F", 3)][0] == 5.0
    assert at[(0, "B", 0)] == (8.0, 12.0)  # after consumer B0 and B1 (ends 8)
    assert mk == max(t.end for t in tasks)


def oracle_makespan(orders, b, fw, bw, ar, edges):
    """Longest path over the action DAG (order chains + covering dependencies), a second method."""
    g = nx.DiGraph()
    dur = {}
    for s, order in orders.items():
        for k, j in order:
            dur[(s, k, j)] = fw[s] if k == "F" else bw[s]
        g.add_edges_from(zip(order, order[1:]))
        nx.relabel_nodes(g, {a: (s, *a) for a in order if a in g}, copy=False)
    for p, s in edges:
        for j in range(len(orders[s]) // 2):
            for q in range(j * b[s] // b[p], ((j + 1) * b[s] - 1) // b[p] + 1):
                g.add_edge((p, "F", q), (s, "F", j))
        for j in range(len(orders[p]) // 2):
            for q in range(j * b[p] // b[s], ((j + 1) * b[p] - 1) // b[s] + 1):
                g.add_edge((s, "B", q), (p, "B", j))
    finish = {}
    for v in nx.topological_sort(g):
        finish[v] = max((finish[u] for u in g.predecessors(v)), default=0.0) + dur[v]
    return max(finish[(s, "B", len(o) // 2 - 1)] + ar[s] for s, o in orders.items())


def test_diamond_hand_value_and_oracle(diamond, cluster_dict):
    graph = gs.graph_from_dict(diamond)
    cluster = gs.cluster_from_dict(cluster_dict)
    # n = 1: the critical path is a, max(b, c), d forward and back
    plan = gs.build_plan(
        graph, cluster, [StageSpec((v,), (i,), 2) for i, v in enumerate("abcd")], 2, planner="manual", search=SEARCH
    )
    costs = gs.cost.stage_costs(graph, cluster, plan.stages, 2)
    F = {s.nodes[0]: c.forward for s, c in zip(plan.stages, costs)}
    Bk = {s.nodes[0]: c.backward for s, c in zip(plan.stages, costs)}
    want = F["a"] + max(F["b"], F["c"]) + F["d"] + Bk["d"] + max(Bk["b"], Bk["c"]) + Bk["a"]
    assert gs.simulate(plan, graph, cluster).iteration_time == pytest.approx(want)


@pytest.mark.parametrize("seed", range(6))
def test_random_dags_agree_with_longest_path_oracle(seed):
    rng = random.Random(seed)
    S = rng.randint(2, 5)
    edges = sorted({(a, b) for b in range(1, S) for a in rng.sample(range(b), rng.randint(1, b))})
    b = {s: rng.choice([1, 2, 4]) for s in range(S)}
    B = 8
    fw = {s: rng.uniform(0.5, 3) for s in range(S)}
    bw = {s: rng.uniform(0.5, 3) for s in range(S)}
    ar = {s: rng.choice([0.0, rng.uniform(0, 5)]) for s in range(S)}
    orders = {s: tuple([("F", j) for j in range(B // b[s])] + [("B", j) for j in range(B // b[s])]) for s in range(S)}
    mk, tasks = simulate_orders(orders, b, fw, bw, ar, edges, B)
    assert mk == pytest.approx(oracle_makespan(orders, b, fw, bw, ar, edges))
    for s in range(S):  # a stage never runs two actions at once
        spans = sorted((t.start, t.end) for t in tasks if t.stage == s)
        assert all(e0 <= s1 + 1e-12 for (_, e0), (s1, _) in zip(spans, spans[1:]))


def test_deadlock_names_waiting_stages():
    orders = {0: (("F", 0), ("B", 0), ("F", 1), ("B", 1)), 1: (("F", 0), ("F", 1), ("B", 0), ("B", 1))}
    with pytest.raises(DeadlockError, match=r"stage 0 at B0 \(step 1\) waits for B0 of stage 1") as info:
        simulate_orders(orders, {0: 1, 1: 1}, {0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0}, [(0, 1)], 2)
    assert "stage 1 at F1 (step 1) waits for F1 of stage 0" in str(info.value)
    assert info.value.waiting == ((0, "B", 0, 1), (1, "F", 1, 1))
    assert "B0<" in str(info.value) and "F1<" in str(info.value)  # the grid marks the stuck steps


def test_deadlock_through_simulate_and_validate(diamond, cluster_dict):
    graph = gs.graph_from_dict(diamond)
    cluster = gs.cluster_from_dict(cluster_dict)
    plan = gs.build_plan(
        graph, cluster, [StageSpec((v,), (i,), 2) for i, v in enumerate("abcd")], 4, planner="manual", search=SEARCH
    )
    d = gs.plan_to_dict(plan)
    d["stages"][0]["schedule"]["order"] = [["F", 0], ["B", 0], ["F", 1], ["B", 1]]  # source waits for B0
    d["stages"][3]["schedule"]["order"] = [["F", 0], ["F", 1], ["B", 0], ["B", 1]]  # sink wants F1 first
    bad = gs.plan_from_dict(d)
    with pytest.raises(DeadlockError, match="stage 0 at B0"):
        gs.simulate(bad, graph, cluster)


def test_chrome_trace_and_grid(tmp_path, diamond, cluster_dict):
    graph = gs.graph_from_dict(diamond)
    cluster = gs.cluster_from_dict(cluster_dict)
    plan = gs.build_plan(
        graph,
        cluster,
        [StageSpec(("a",), (0, 1), 2), StageSpec(("b",), (2,), 2), StageSpec(("c", "d"), (3,), 2)],
        8,
        planner="manual",
        search=SEARCH,
    )
    sim = gs.simulate(plan, graph, cluster)
    trace = to_chrome_trace(sim, plan)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len([e for e in xs if e["name"] != "allreduce"]) == 2 * 4 * 3
    ar = [e for e in xs if e["name"] == "allreduce"]
    assert [e["pid"] for e in ar] == [0] and ar[0]["dur"] == pytest.approx(sim.stages[0].allreduce * 1e6)
    assert max(e["ts"] + e["dur"] for e in xs) == pytest.approx(sim.iteration_time * 1e6)
    f3 = next(e for e in xs if e["pid"] == 2 and e["name"] == "F3")
    t = next(t for t in sim.tasks if (t.stage, t.kind, t.micro_batch) == (2, "F", 3))
    assert (f3["ts"], f3["dur"]) == (pytest.approx(t.start * 1e6), pytest.approx((t.end - t.start) * 1e6))
    assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "M"} == {0, 1, 2}
    path = write_trace(sim, plan, tmp_path / "t.json")
    assert json.loads(path.read_text()) == json.loads(json.dumps(trace))
    text = grid_text(plan, sim, width=40)
    lines = text.splitlines()
    for s in plan.stages:
        row = next(line for line in lines if line.startswith(f"stage {s.id} ") and "|" not in line)
        assert row.split()[2:] == s.schedule.text().split()
        gantt = next(line for line in lines if line.startswith(f"stage {s.id} ") and "|" in line)
        assert len(gantt.split("|")[1]) == 40


def test_order_grid_window():
    orders = {0: kfkb_order(100, 1)}
    text = order_grid(orders, marks={(0, 150)}, max_steps=20)
    assert "F75<" in text and "(steps 140..159 of 200)" in text


def test_the_figures_alone_and_given_memory_are_the_full_simulations():
    """``simulate(record=False, memory=...)`` (what ``validate`` runs: no timed tasks, each stage's
    memory priced once) gives every figure of the full simulation, on zero-bubble orders too."""
    from gpp_solver.cost.memory import order_memory
    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.plan.simulate import simulate
    from gpp_solver.planners.registry import get_planner
    from gpp_solver.workloads import build_model

    g = build_model("mmt", branches=2, layers=3)
    c = v100_cluster(8)
    plan = get_planner("graphpipe")(g, c, 64, schedule="zb")
    assert any(a[0] == "W" for s in plan.stages for a in s.schedule.order)
    full = simulate(plan, g, c)
    memory = {s.id: order_memory(g, c, s, s.schedule.order, plan.stages) for s in plan.stages}
    lean = simulate(plan, g, c, record=False, memory=memory)
    assert full.tasks and not lean.tasks
    assert (lean.iteration_time, lean.throughput, lean.stages) == (full.iteration_time, full.throughput, full.stages)
