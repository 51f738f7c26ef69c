"""Plan quality of the ``gpp`` planner against every other installed planner (markdown tables).

Part 1 — the paper's workloads (``gpp_solver.models.build_model``) on ``v100_cluster(n)``; the
mini-batch is GraphPipe A.2's samples per device times devices (MMT 16, DLRM 64, CANDLE-Uno 1024;
the plain Transformer, which A.2 does not list, 16 like MMT).  For every planner: status, search
seconds, bottleneck TPS, simulated iteration time and throughput, stages / devices used / b, and
the TPS gap to the perfect-balance bound ``sum_v (f_v(b) + g_v(b)) / b / devices`` at the plan's
micro-batch size ``b`` (no plan of that ``b`` can have a lower TPS), and to the larger of that and the
heaviest node's own best TPS (no stage is faster than its heaviest node alone).  The other planners run
first; their plans are handed to ``gpp`` as seeds (``seed_plans=``), so ``gpp``'s search seconds
are reported twice: its own, and its own plus those seed planners' (what a stand-alone call costs).

Part 2 — random tiny graphs (``gpp_solver.oracle.random_graph``: chains, diamonds,
series-parallel and general DAGs, 6-8 nodes, 4 devices): the gap of ``gpp``'s bottleneck TPS
(``objective="time_per_sample"``) and of GraphPipe's to the exact optimum of the brute-force
oracle, and of ``gpp``'s default plan's simulated iteration time to the oracle plan's.

    python benchmarks/gpp_quality.py [--models mmt,dlrm,candle-uno,transformer] [--devices 4,8,16,32]
        [--planners graphpipe,pipedream,...] [--time-limit 60] [--gap-instances 40] [--seed 0]
        [--skip-workloads] [--skip-gap]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from gpp_solver.cluster import v100_cluster
from gpp_solver.cost import CostTables
from gpp_solver.errors import GppError
from gpp_solver.gpp_planner import _seed_fn, plan_gpp
from gpp_solver.models import build_model
from gpp_solver.planners import REGISTRY
from gpp_solver.types import Cluster, Graph, Plan
from gpp_solver.validate import validate

SAMPLES_PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024, "transformer": 16}
OTHERS = ("graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper")


def perfect_balance_tps(graph: Graph, b: int, devices: int) -> float:
    """Total compute per sample at micro-batch ``b`` (one replica, the cheapest per sample) / devices."""
    return float(CostTables(graph).compute_at(float(b)).sum()) / b / devices


def node_bound_tps(graph: Graph, cluster: Cluster, b: int, B: int) -> float:
    """No stage is faster than its heaviest node alone: ``max_v min_d (f_v(b/d) + g_v(b/d)) / b +
    A_v(d) / B`` over ``d | b``, ``d <= devices`` (communication ignored, the faster bandwidth)."""
    t = CostTables(graph)
    bw = max(cluster.inter_node_bandwidth, cluster.intra_node_bandwidth or 0.0)
    best = 0.0
    ds = [d for d in range(1, cluster.devices + 1) if b % d == 0]
    per_d = {d: t.compute_at(b / d) for d in ds}
    for i, w in enumerate(t.weight):
        best = max(best, min(per_d[d][i] / b + (2 * (d - 1) / d * w / bw) / B for d in ds))
    return best


def plan_row(name: str, plan: Plan | None, seconds: float, graph: Graph, cluster: Cluster, note: str = "",
             own: float | None = None) -> dict[str, Any]:
    if plan is None:
        return {"planner": name, "status": note, "seconds": seconds}
    bs = sorted({s.micro_batch_size for s in plan.stages})
    bound = perfect_balance_tps(graph, bs[0], cluster.devices)
    bound2 = max(bound, node_bound_tps(graph, cluster, bs[0], plan.mini_batch_size))
    return {"gap2": plan.predicted.time_per_sample / bound2 - 1, "planner": name, "status": plan.search.status, "seconds": seconds, "own": own,
            "tps": plan.predicted.time_per_sample, "iter": plan.predicted.iteration_time,
            "thr": plan.predicted.throughput, "stages": len(plan.stages), "devices": plan.devices_used,
            "b": bs[0] if len(bs) == 1 else f"{bs}", "gap": plan.predicted.time_per_sample / bound - 1}


def run_workload(model: str, devices: int, planners: list[str], time_limit: float) -> list[dict[str, Any]]:
    graph = build_model(model)
    cluster = v100_cluster(devices)
    B = SAMPLES_PER_DEVICE[model] * devices
    rows, plans = [], {}
    for name in planners:
        fn = _seed_fn(name)
        if fn is None:
            rows.append({"planner": name, "status": "missing", "seconds": 0.0})
            continue
        t0 = time.perf_counter()
        try:
            p = fn(graph, cluster, B, time_limit=time_limit)
            validate(p, graph, cluster)
        except (GppError, ValueError) as exc:
            rows.append(plan_row(name, None, time.perf_counter() - t0, graph, cluster, f"{type(exc).__name__}"))
            continue
        sec = time.perf_counter() - t0
        plans[name] = p
        rows.append(plan_row(name, p, sec, graph, cluster))
    seeds_seconds = sum(r["seconds"] for r in rows if r["planner"] in plans and r["planner"] in
                        ("graphpipe", "pipedream", "pipedream-2bw", "alpa"))
    t0 = time.perf_counter()
    p = plan_gpp(graph, cluster, B, time_limit=time_limit,
                 seed_plans={k: v for k, v in plans.items() if k in ("graphpipe", "pipedream", "pipedream-2bw", "alpa")})
    own = time.perf_counter() - t0
    validate(p, graph, cluster)
    rows.insert(0, plan_row("gpp", p, own + seeds_seconds, graph, cluster, own=own))
    rows[0]["extra"] = p.search.extra
    return rows


def fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def workload_table(model: str, devices: int, rows: list[dict[str, Any]]) -> str:
    best_other = max((r["thr"] for r in rows[1:] if "thr" in r), default=None)
    out = [f"### {model}, {devices} devices (B = {SAMPLES_PER_DEVICE[model] * devices})", "",
           "| planner | status | search s | TPS s | sim. iteration s | throughput /s | vs best other | stages | devices "
           "| b | TPS gap to bound | gap to max(bound, node bound) |", "|" + "---|" * 12]
    for r in rows:
        rel = None if best_other is None or "thr" not in r else r["thr"] / best_other
        secs = fmt(r["seconds"], ".2f") + (f" ({r['own']:.2f} own)" if r.get("own") is not None else "")
        out.append(f"| {r['planner']} | {r['status']} | {secs} | {fmt(r.get('tps'), '.4g')} | "
                   f"{fmt(r.get('iter'), '.4g')} | {fmt(r.get('thr'), '.5g')} | {fmt(rel, '.3f')} | "
                   f"{fmt(r.get('stages'), 'd')} | {fmt(r.get('devices'), 'd')} | {r.get('b', '—')} | "
                   f"{fmt(None if 'gap' not in r else 100 * r['gap'], '.1f')}% | "
                   f"{fmt(None if 'gap2' not in r else 100 * r['gap2'], '.1f')}% |")
    return "\n".join(out)


def summary_table(results: dict[tuple[str, int], list[dict[str, Any]]]) -> str:
    out = ["| workload | devices | gpp throughput / best other | gpp TPS gap to bound | gap to max(bound, node) "
           "| gpp own s | gpp + seeds s | seed | moves | TPS before → after |", "|" + "---|" * 10]
    for (model, devices), rows in results.items():
        g = rows[0]
        best_other = max((r["thr"] for r in rows[1:] if "thr" in r), default=None)
        ex = g.get("extra", {})
        out.append(f"| {model} | {devices} | {fmt(None if best_other is None else g['thr'] / best_other, '.3f')} | "
                   f"{100 * g['gap']:.1f}% | {100 * g['gap2']:.1f}% | {g['own']:.2f} | {g['seconds']:.2f} | {ex.get('seed_planner')} | "
                   f"{ex.get('moves')} | {ex.get('tps_before', 0):.4g} → {ex.get('tps_after', 0):.4g} |")
    return "\n".join(out)


def optimality_gap(instances: int, seed: int) -> str:
    from gpp_solver.oracle import best_plan_bruteforce, random_cluster, random_graph
    rng = random.Random(seed)
    gp = _seed_fn("graphpipe")
    gaps, gp_gaps, sim_rel, rows = [], [], [], []
    for i in range(instances):
        kind = ("chain", "diamond", "sp", "dag")[i % 4]
        n = rng.randint(6, 8)
        g = random_graph(rng, kind, n, name=f"{kind}-{n}-{i}")
        c = random_cluster(rng, 4, placement=rng.random() < 0.5)
        B = 16
        opt, oplan = best_plan_bruteforce(g, c, B)
        if oplan is None:
            continue
        p = plan_gpp(g, c, B, objective="time_per_sample", tighten=False)
        gaps.append(p.predicted.time_per_sample / opt - 1)
        if gp is not None:
            gp_gaps.append(gp(g, c, B).predicted.time_per_sample / opt - 1)
        d = plan_gpp(g, c, B)
        sim_rel.append(d.predicted.iteration_time / oplan.predicted.iteration_time - 1)
    def stats(xs: list[float]) -> str:
        if not xs:
            return "— | — | —"
        hits = sum(x <= 1e-9 for x in xs)
        return f"{100 * statistics.mean(xs):.2f}% | {100 * max(xs):.2f}% | {hits}/{len(xs)}"
    out = [f"Random tiny graphs: {len(gaps)} instances (chain/diamond/sp/dag, 6-8 nodes, 4 devices, B = 16), "
           "gap to the brute-force optimum of the bottleneck TPS", "",
           "| measure | mean | worst | at the optimum |", "|---|---|---|---|",
           f"| gpp TPS (objective=time_per_sample) | {stats(gaps)} |",
           f"| graphpipe TPS | {stats(gp_gaps)} |",
           f"| gpp default plan: simulated iteration time vs the TPS-optimal plan's (negative = faster) | "
           f"{100 * statistics.mean(sim_rel):+.2f}% | {100 * max(sim_rel):+.2f}% | — |" if sim_rel else ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mmt,dlrm,candle-uno,transformer")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--planners", default=",".join(OTHERS))
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--gap-instances", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-workloads", action="store_true")
    ap.add_argument("--skip-gap", action="store_true")
    a = ap.parse_args(argv)
    planners = [p for p in a.planners.split(",") if p and p != "gpp" and (p in REGISTRY or p == "graphpipe")]
    if not a.skip_workloads:
        results = {}
        for model in a.models.split(","):
            for devices in (int(x) for x in a.devices.split(",")):
                rows = run_workload(model, devices, planners, a.time_limit)
                results[(model, devices)] = rows
                print(workload_table(model, devices, rows) + "\n", flush=True)
        print("### Summary\n\n" + summary_table(results) + "\n", flush=True)
    if not a.skip_gap:
        print(optimality_gap(a.gap_instances, a.seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
