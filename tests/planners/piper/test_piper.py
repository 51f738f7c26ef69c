"""Piper baseline: fidelity to the published code's figures, plans valid under the shared model,
memory, the downset-count refusal, determinism, and the DP against a brute-force oracle."""

from __future__ import annotations

import functools
import itertools
import math
import time

import numpy as np
import pytest

import gpp_solver as gs
from gpp_solver.errors import InfeasibleError, SearchSpaceTooLargeError, SolverError
from gpp_solver.planners.piper.cost import StageCostKernel
from gpp_solver.planners.piper.dp import run_dp
from gpp_solver.planners.piper.knapsack import HardInstances, solve_hard
from gpp_solver.planners.piper.planner import build_instance, count_downsets, plan_piper
from gpp_solver.types import Cluster

GiB = 2**30


def piper_cluster(k: int, mem_gb: float) -> Cluster:
    """The published experiments' setting: flat network of 25 GiB/s."""
    return Cluster(devices=k, memory_bytes=mem_gb * GiB, inter_node_bandwidth=25 * GiB)


def piper_graph(data_dir, name: str):
    from gpp_solver.formats.importers import import_piper

    return import_piper(data_dir / "piper" / f"{name}.json")


def piper_tps(graph, k: int, mem_gb: float, n: int) -> float:
    inst = build_instance(graph, piper_cluster(k, mem_gb), n, mode="piper")
    return run_dp(inst, count_downsets(graph)).value


# -- fidelity (figures measured with the original C++ implementation) ---------------------------


def test_resnet_k16_2gb_matches_published_code(data_dir):
    assert piper_tps(piper_graph(data_dir, "resnet"), 16, 2.0, 7680) == pytest.approx(76.5213, rel=1e-4)


@pytest.mark.slow
def test_resnet_k64_4gb_matches_published_code(data_dir):
    assert piper_tps(piper_graph(data_dir, "resnet"), 64, 4.0, 7680) == pytest.approx(8.66677, rel=1e-4)


@pytest.mark.slow
def test_gnmt_k8_matches_published_code(data_dir):
    g = piper_graph(data_dir, "gnmt")
    assert len(count_downsets(g)) == 17914
    assert piper_tps(g, 8, 1.2, 256) == pytest.approx(68.5656, rel=1e-4)


@pytest.mark.slow
def test_resnet_plan_in_piper_mode_is_valid(data_dir):
    g = piper_graph(data_dir, "resnet")
    c = piper_cluster(16, 2.0)
    p = plan_piper(g, c, 7680, mode="piper")
    gs.validate(p, g, c)
    assert p.search.extra["piper_tps"] == pytest.approx(76.5213, rel=1e-4)
    assert p.devices_used <= 16


# -- small graphs -------------------------------------------------------------------------------


def tmpc_chain(n: int = 4) -> dict:
    """A chain whose nodes offer t=1 plain, t=1 with recomputation (less memory, slower) and t=2."""
    nodes = []
    for i in range(n):
        f = 1.0 + 0.25 * i
        nodes.append(
            {
                "id": f"n{i}",
                "fw_time": [f],
                "bw_time": [2 * f],
                "weight_bytes": 50.0,
                "activation_bytes": 40.0,
                "output_bytes": 4.0,
                "tmpc": [
                    {
                        "t": 1,
                        "recompute": False,
                        "fw_time": [f],
                        "bw_time": [2 * f],
                        "weight_bytes": 50.0,
                        "activation_bytes": 40.0,
                    },
                    {
                        "t": 1,
                        "recompute": True,
                        "fw_time": [f],
                        "bw_time": [3 * f],
                        "weight_bytes": 50.0,
                        "activation_bytes": 4.0,
                    },
                    {
                        "t": 2,
                        "recompute": False,
                        "fw_time": [0.6 * f],
                        "bw_time": [1.2 * f],
                        "weight_bytes": 25.0,
                        "activation_bytes": 20.0,
                    },
                ],
            }
        )
    edges = [{"src": f"n{i}", "dst": f"n{i + 1}"} for i in range(n - 1)]
    return {"format": "gpp-graph/1", "name": f"tmpc{n}", "micro_batch_sizes": [1], "nodes": nodes, "edges": edges}


def test_graph_without_tmpcs_gives_a_valid_plan(diamond, cluster_dict):
    g, c = gs.graph_from_dict(diamond), gs.cluster_from_dict(cluster_dict)
    p = plan_piper(g, c, 8)
    gs.validate(p, g, c)
    assert p.planner == "piper" and p.search.status == "feasible"
    assert sorted(v for s in p.stages for v in s.nodes) == sorted(g.ids)
    assert all(s.tensor_parallel == 1 and not s.tmpc for s in p.stages)
    assert p.devices_used <= c.devices


def test_registry_finds_piper():
    from gpp_solver.planners.registry import get_planner

    assert get_planner("piper") is plan_piper


def test_tensor_parallel_used_when_devices_outnumber_micro_batches():
    # N = 1 micro-batch: data parallelism is impossible (d | N), only t = 2 can use more devices
    g = gs.graph_from_dict(tmpc_chain())
    c = Cluster(devices=2, memory_bytes=1e6, inter_node_bandwidth=1e6)
    p = plan_piper(g, c, 1)
    gs.validate(p, g, c)
    assert any(s.tensor_parallel == 2 for s in p.stages)
    for s in p.stages:
        if s.tensor_parallel == 2:
            assert all(g.node(v).tmpc[s.tmpc[v]].t == 2 for v in s.nodes)


def test_memory_limit_respected_and_recomputation_chosen_when_tight():
    g = gs.graph_from_dict(tmpc_chain())
    roomy = Cluster(devices=1, memory_bytes=1e6, inter_node_bandwidth=1e6)
    free = run_dp(build_instance(g, roomy, 4, mode="piper"), count_downsets(g))
    # one device, s = 1: all four nodes in one stage, memory sum(a) + sum(b) = 160 + 4*50*4
    tight = roomy.with_(memory_bytes=4 * 50 * 4 + 40 * 2 + 4 * 2)
    inst = build_instance(g, tight, 4, mode="piper")
    res = run_dp(inst, count_downsets(g))
    assert np.isfinite(res.value) and res.value > free.value
    labels = [lab for st in res.stages for lab in st.slots]
    assert labels.count(1) >= 1  # some node recomputes
    assert all(lab == -1 for st in free.stages for lab in st.slots)  # -1: the node's own figures
    # Piper's memory model holds for every stage of the answer
    s_left = res.s
    opt = inst.degrees[0]
    for st in res.stages:
        y = math.ceil(s_left / st.d)
        slot = [int(np.flatnonzero(opt.label[v] == lab)[0]) for v, lab in zip(st.nodes, st.slots)]
        used = sum(opt.a[v, l] * y + opt.b[v, l] for v, l in zip(st.nodes, slot))
        assert used <= tight.memory_bytes
        s_left -= st.d
    p = plan_piper(g, Cluster(devices=4, memory_bytes=700.0, inter_node_bandwidth=1e6), 4)
    assert p.predicted.peak_memory_bytes <= 700.0


def test_required_memory_is_exact_under_piper_model():
    g = gs.graph_from_dict(tmpc_chain(5))
    c = Cluster(devices=3, memory_bytes=1.0, inter_node_bandwidth=1e6)
    ds = count_downsets(g)
    need = run_dp(build_instance(g, c, 6, mode="piper"), ds, objective="memory").value
    assert np.isfinite(run_dp(build_instance(g, c, 6, mode="piper", memory=need), ds).value)
    assert not np.isfinite(run_dp(build_instance(g, c, 6, mode="piper", memory=need * 0.999), ds).value)
    with pytest.raises(InfeasibleError) as err:
        plan_piper(g, c, 6, mode="piper")
    assert err.value.required_memory_bytes == pytest.approx(need)


def test_too_many_downsets_refused_fast():
    k = 40  # 40 parallel 2-node branches: 3^40 downsets
    nodes = [
        {"id": "src", "fw_time": [1.0], "bw_time": [1.0], "weight_bytes": 0, "activation_bytes": 0, "output_bytes": 1},
        {"id": "dst", "fw_time": [1.0], "bw_time": [1.0], "weight_bytes": 0, "activation_bytes": 0, "output_bytes": 1},
    ]
    edges = []
    for b in range(k):
        for j in range(2):
            nodes.append(
                {
                    "id": f"b{b}.{j}",
                    "fw_time": [1.0],
                    "bw_time": [1.0],
                    "weight_bytes": 0,
                    "activation_bytes": 0,
                    "output_bytes": 1,
                }
            )
        edges += [
            {"src": "src", "dst": f"b{b}.0"},
            {"src": f"b{b}.0", "dst": f"b{b}.1"},
            {"src": f"b{b}.1", "dst": "dst"},
        ]
    g = gs.graph_from_dict({"micro_batch_sizes": [1], "nodes": nodes, "edges": edges})
    c = Cluster(devices=4, memory_bytes=1e9, inter_node_bandwidth=1e9)
    start = time.monotonic()
    with pytest.raises(SearchSpaceTooLargeError, match="more than 20000 downsets; raise max_downsets"):
        plan_piper(g, c, 4)
    with pytest.raises(SearchSpaceTooLargeError, match="more than 500 downsets"):
        plan_piper(g, c, 4, max_downsets=500)
    assert time.monotonic() - start < 5.0


def test_time_limit_stops_with_solver_error(diamond, cluster_dict):
    g, c = gs.graph_from_dict(diamond), gs.cluster_from_dict(cluster_dict)
    with pytest.raises(SolverError, match="time limit"):
        plan_piper(g, c, 8, time_limit=0.0)


def test_deterministic(diamond, cluster_dict):
    g, c = gs.graph_from_dict(diamond), gs.cluster_from_dict(cluster_dict)
    a, b = gs.plan_to_dict(plan_piper(g, c, 8)), gs.plan_to_dict(plan_piper(g, c, 8))
    a["search"].pop("seconds"), b["search"].pop("seconds")
    assert a == b


# -- oracles --------------------------------------------------------------------------------------


def brute_force(inst, downsets) -> float:
    """Every chain of downsets, every (t, d) per stage, every TMPC choice; Piper's formulas."""
    n, K, N, S1 = inst.n, inst.devices, inst.micro_batches, inst.bound_s
    ds = [d for d in range(1, K + 1) if N % d == 0]
    by_t = {o.t: o for o in inst.degrees}

    def stage_cost(S, t, d, s):
        o = by_t[t]
        if not all(o.avail[v].any() for v in S):
            return math.inf
        y, best = math.ceil(s / d), math.inf
        for slots in itertools.product(*[np.flatnonzero(o.avail[v]) for v in S]):
            mem = sum(o.a[v, l] * y + o.b[v, l] for v, l in zip(S, slots))
            if mem > inst.memory:
                continue
            tot = 0.0
            for v, l in zip(S, slots):
                e = sum(
                    2 * (inst.c[j] + o.sfw[j, l])
                    for j in range(len(inst.c))
                    if inst.dst[j] == v and inst.src[j] not in S
                )
                e += sum(
                    2 * (inst.c[j] + o.sbw[j, l])
                    for j in range(len(inst.c))
                    if inst.src[j] == v and inst.dst[j] not in S
                )
                tot += (e / d + inst.resync_factor * (d - 1) * o.w[v, l] / d / N) / inst.bandwidth + o.p[v, l] / d
            best = min(best, tot)
        return best

    @functools.cache
    def rec(D, k, s):  # partition downset D on <= k devices, sum of d <= s
        if D == 0:
            return 0.0
        best = math.inf
        for Dp in downsets:
            if Dp & ~D or Dp == D:
                continue
            S = [v for v in range(n) if (D & ~Dp) >> v & 1]
            for t in by_t:
                for d in ds:
                    if d * t <= k and d <= s:
                        best = min(best, max(rec(Dp, k - d * t, s - d), stage_cost(S, t, d, s)))
        return best

    return rec(downsets[-1], K, S1)


@pytest.mark.parametrize("k,n_mb,mem", [(3, 4, 1e6), (4, 2, 700.0), (6, 6, 430.0), (8, 4, 425.0), (2, 6, 500.0)])
def test_dp_equals_brute_force_on_single_choice_tmpcs(diamond, k, n_mb, mem):
    # one TMPC per (node, t) makes the knapsack exact, so the DP must equal exhaustive search
    d = dict(diamond)
    for i, nd in enumerate(d["nodes"]):
        nd["tmpc"] = [
            {
                "t": 1,
                "recompute": False,
                "fw_time": nd["fw_time"],
                "bw_time": nd["bw_time"],
                "weight_bytes": nd["weight_bytes"],
                "activation_bytes": nd["activation_bytes"],
            },
            {
                "t": 2,
                "recompute": False,
                "fw_time": [x * (0.5 + 0.1 * i) for x in nd["fw_time"]],
                "bw_time": [x * 0.7 for x in nd["bw_time"]],
                "weight_bytes": 50.0,
                "activation_bytes": 6.0,
            },
        ]
    g = gs.graph_from_dict(d)
    inst = build_instance(g, Cluster(devices=k, memory_bytes=mem, inter_node_bandwidth=50.0), n_mb, mode="piper")
    ds = count_downsets(g)
    got = run_dp(inst, ds).value
    want = brute_force(inst, ds)
    assert (got == want == math.inf) or got == pytest.approx(want, rel=1e-12)


def test_sync_costs_path_agrees_with_fast_path():
    # tiny sync costs force the general (per-stage) path; it must agree with the shared-order path
    g = gs.graph_from_dict(tmpc_chain(5))
    c = Cluster(devices=4, memory_bytes=600.0, inter_node_bandwidth=10.0)
    inst = build_instance(g, c, 4, mode="piper")
    opt = inst.degrees[0]
    slow = type(inst)(**{**inst.__dict__, "degrees": (type(opt)(**{**opt.__dict__, "sfw": opt.sfw + 1e-9}),)})
    X = np.array([[int(b) for b in f"{m:05b}"[::-1]] for m in range(1, 32)], dtype=bool)
    for d in (1, 2, 4):
        a = StageCostKernel(inst).costs(inst.degrees[0], X, d).out
        b = StageCostKernel(slow).costs(slow.degrees[0], X, d).out
        assert np.allclose(a, b, rtol=1e-9, equal_nan=True) and (np.isinf(a) == np.isinf(b)).all()


def reference_fast_heuristic(tps, mem, limit):
    """The published KNAPSACK_FAST_HEURISTIC, one instance, written plainly."""
    n = len(tps)
    f = [int(np.argmin(tps[i])) for i in range(n)]
    need = sum(mem[i][f[i]] for i in range(n)) - limit
    if need <= 0:
        return sum(tps[i][f[i]] for i in range(n))
    if sum(min(mem[i]) for i in range(n)) > limit:
        return math.inf
    swaps = sorted(
        ((tps[i][l] - tps[i][f[i]]) / (mem[i][f[i]] - mem[i][l]), i, l)
        for i in range(n)
        for l in range(len(tps[i]))
        if mem[i][f[i]] - mem[i][l] > 1e-9
    )
    h = list(f)
    for _, i, l in swaps:
        need -= mem[i][h[i]] - mem[i][l]
        h[i] = l
        if need < 1e-9:
            break
    return sum(tps[i][h[i]] for i in range(n))


def test_knapsack_matches_reference_and_never_beats_optimum():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 7))
        tps = rng.uniform(1, 10, (n, 2))
        mem = rng.uniform(1, 10, (n, 2))
        mem[np.arange(n), np.argmin(tps, axis=1)] += rng.uniform(0, 5, n)  # faster tends to cost memory
        limit = float(rng.uniform(mem.min(axis=1).sum(), mem.max(axis=1).sum()))
        f = np.argmin(tps, axis=1)
        if mem[np.arange(n), f].sum() <= limit:
            continue
        got, choice = solve_hard(
            HardInstances(tps[None], mem[None], np.ones((1, n), bool), f[None], limit), want_choice=True
        )
        assert got[0] == pytest.approx(reference_fast_heuristic(tps, mem, limit))
        assert mem[np.arange(n), choice[0]].sum() <= limit + 1e-9
        opt = min(
            sum(tps[i, l] for i, l in enumerate(c))
            for c in itertools.product(range(2), repeat=n)
            if sum(mem[i, l] for i, l in enumerate(c)) <= limit
        )
        assert got[0] >= opt - 1e-12


def reference_slow_heuristic(tps, mem, limit):
    """The published heuristic for more than two TMPCs per node (savings truncated to the need)."""
    n = len(tps)
    h = [int(np.argmin(tps[i])) for i in range(n)]
    need = sum(mem[i][h[i]] for i in range(n)) - limit
    while need > 1e-9:
        best = None
        for i in range(n):
            for l in range(len(tps[i])):
                saving = mem[i][h[i]] - mem[i][l]
                if saving > 1e-9:
                    r = (tps[i][l] - tps[i][h[i]]) / min(saving, need)
                    if best is None or r < best[0]:
                        best = (r, i, l)
        if best is None:
            return math.inf
        _, i, l = best
        need -= mem[i][h[i]] - mem[i][l]
        h[i] = l
    return sum(tps[i][h[i]] for i in range(n))


def test_knapsack_with_three_tmpcs_follows_the_slow_heuristic():
    rng = np.random.default_rng(1)
    checked = 0
    for _ in range(100):
        n = int(rng.integers(1, 5))
        tps = rng.uniform(1, 10, (n, 3))
        mem = 12 - tps + rng.uniform(0, 2, (n, 3))  # faster options use more memory
        limit = float(rng.uniform(mem.min(axis=1).sum(), mem.max(axis=1).sum()))
        f = np.argmin(tps, axis=1)
        if mem[np.arange(n), f].sum() <= limit:
            continue
        got, choice = solve_hard(
            HardInstances(tps[None], mem[None], np.ones((1, n), bool), f[None], limit), want_choice=True
        )
        assert got[0] == pytest.approx(reference_slow_heuristic(tps, mem, limit))
        if np.isfinite(got[0]):
            assert mem[np.arange(n), choice[0]].sum() <= limit + 1e-9
        checked += 1
    assert checked > 20


def test_sync_bytes_keyed_like_the_published_code():
    """``syncTimeFw`` is paid per in-edge from outside the stage (keyed by the predecessor),
    ``syncTimeBw`` per out-edge to outside (keyed by the successor), each twice (fw + bw)."""
    from gpp_solver.formats.importers import piper_dict

    def tm(fw, bw):
        return {
            "id": "vanilla",
            "timePerSample": 1.0,
            "parameterSize": 0.0,
            "memoryUsageA": 0.0,
            "memoryUsageB": 0.0,
            "syncTimeFw": fw,
            "syncTimeBw": bw,
        }

    doc = {
        "maxDevices": 2,
        "maxMemoryPerDevice": 1e9,
        "bandwidth": 1.0,
        "mbsInBatch": 1,
        "nodes": [
            {"id": 10, "name": "u", "TMPCs": {"1": [tm({}, {"11": 0.0})], "2": [tm({}, {"11": 7.0})]}},
            {"id": 11, "name": "v", "TMPCs": {"1": [tm({"10": 0.0}, {})], "2": [tm({"10": 5.0}, {})]}},
        ],
        "edges": [{"sourceId": 10, "destId": 11, "communicationCost": 3.0}],
    }
    g = gs.graph_from_dict(piper_dict(doc))
    inst = build_instance(g, Cluster(devices=2, memory_bytes=1e9, inter_node_bandwidth=1.0), 1, mode="piper")
    opt = next(o for o in inst.degrees if o.t == 2)
    ker = StageCostKernel(inst)

    def cost(rows):
        return ker.costs(opt, np.array(rows, dtype=bool), 1).out[:, 1]

    only_u, only_v, both = cost([[1, 0], [0, 1], [1, 1]])
    assert only_u == pytest.approx(1.0 + 2 * (3.0 + 7.0))  # out-edge to v: c + sbw keyed by v
    assert only_v == pytest.approx(1.0 + 2 * (3.0 + 5.0))  # in-edge from u: c + sfw keyed by u
    assert both == pytest.approx(2.0)  # internal edge: nothing to send
