"""Plan quality of the ``gpp`` planner against every other installed planner (markdown tables).

Part 1 — the paper's workloads (``gpp_solver.workloads.build_model``) on ``v100_cluster(n)``; the
mini-batch is GraphPipe A.2's samples per device times devices (MMT 16, DLRM 64, CANDLE-Uno 1024;
the plain Transformer, which A.2 does not list, 16 like MMT).  ``gpp`` runs stand-alone with its
default time limit (10 s, its seed planners included) twice: default objective (simulated
iteration time) and ``gpp[TPS]`` (``objective="time_per_sample"``); the other planners run with
``--time-limit``.  For every planner: status, search seconds, bottleneck TPS, simulated iteration
time and throughput, stages / devices used / b, and the TPS gap to two lower bounds at the plan's
micro-batch size ``b``: the plain perfect-balance bound (total compute per sample / devices,
:func:`perfect_balance_tps`) and the node bound (:func:`node_bound_tps`: the least TPS of a stage
holding the heaviest node, with its all-reduce and its neighbours' compute or transfers), and the
TPS gap to the *relaxed bound* (:func:`gpp_solver.oracles.tps_bound.relaxed_tps_bound`: a MILP relaxation
that charges every stage its transfers and every replicated stage its all-reduce; status in
brackets when the MILP time limit ``--bound-time-limit`` left only a dual bound).  After each
workload table, one line per cell: at ``gpp[TPS]``'s ``b`` and over every micro-batch size, whether
``1.1 x perfect balance`` is below the relaxed bound (the 10% target provably unreachable).

Part 2 — random tiny graphs (``gpp_solver.oracles.brute_force.random_graph``: chains, diamonds,
series-parallel and general DAGs, 6-8 nodes, 4 devices): the gap of ``gpp``'s bottleneck TPS
(``objective="time_per_sample"``) and of GraphPipe's to the exact optimum of the brute-force
oracle, and of ``gpp``'s default plan's simulated iteration time to the oracle plan's.

    python benchmarks/gpp_quality.py [--models mmt,dlrm,candle-uno,transformer] [--devices 4,8,16,32]
        [--planners graphpipe,pipedream,...] [--time-limit 60] [--gpp-time-limit S] [--gap-instances 40] [--seed 0]
        [--bound-time-limit 20] [--skip-all-b] [--skip-workloads] [--skip-gap]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from gpp_solver.cost.model import stage_costs
from gpp_solver.cost.tables import CostTables
from gpp_solver.errors import GppError, SolverError
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.oracles.stage_degrees import degrees as _degrees
from gpp_solver.oracles.tps_bound import TpsBound, perfect_balance_tps, relaxed_tps_bound
from gpp_solver.plan.build import StageSpec
from gpp_solver.plan.validate import validate
from gpp_solver.planners.gpp.planner import plan_gpp
from gpp_solver.planners.gpp.seeds import seed_fn
from gpp_solver.planners.registry import REGISTRY
from gpp_solver.types import Cluster, Graph, Plan
from gpp_solver.workloads import build_model

SAMPLES_PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024, "transformer": 16}
OTHERS = ("graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper")
BOUND_TIME_LIMIT = [20.0]  # seconds per relaxed-bound MILP (--bound-time-limit)
_RELAXED: dict[tuple[str, int, int, int], TpsBound | None] = {}


def relaxed_bound(graph: Graph, cluster: Cluster, b: int, B: int) -> TpsBound | None:
    """:func:`relaxed_tps_bound` at ``b``, cached per (graph, devices, b, B); ``None`` without HiGHS."""
    key = (graph.name, cluster.devices, b, B)
    if key not in _RELAXED:
        try:
            _RELAXED[key] = relaxed_tps_bound(graph, cluster, b, B, time_limit=BOUND_TIME_LIMIT[0])
        except SolverError as exc:
            print(f"relaxed bound unavailable: {exc}", file=sys.stderr)
            _RELAXED[key] = None
    return _RELAXED[key]


def node_bound_tps(graph: Graph, cluster: Cluster, b: int, B: int) -> float:
    """No stage is faster than the one holding the heaviest node: for every node ``v`` and degree
    ``d | b`` a lower bound on the TPS of a stage ``S`` containing ``v`` at degree ``d``; the bound
    is ``max_v min_d`` of it.  ``S`` pays ``v``'s compute at ``b/d`` and all-reduce (intra-node
    bandwidth only when ``d`` fits in a node); for each in-neighbour ``u`` either one transfer of
    the edge's bytes, or ``u``'s own compute and all-reduce plus, for each of ``u``'s in-neighbours
    not yet counted, its compute or a transfer; for the out-neighbours the cheapest single transfer
    or all of them joining.  Transfers run at the intra-node bandwidth unless ``S`` fills whole
    nodes (``d >= devices_per_node``: no other stage shares its node).  Each node and transfer is
    counted at most once, so this is a true lower bound of the cost model."""
    t = CostTables(graph)
    c = cluster
    intra = c.intra_node_bandwidth if c.intra_node_bandwidth is not None else c.inter_node_bandwidth
    dpn = c.devices_per_node
    ds = _degrees(b, c.devices)
    comp = {d: t.compute_at(b / d) for d in ds}
    idx = graph.index
    w = t.weight
    preds: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(graph.nodes))}
    succs: dict[int, list[tuple[int, float]]] = {i: [] for i in range(len(graph.nodes))}
    for (u, v), nb in graph.edge_bytes_map.items():
        preds[idx[v]].append((idx[u], nb))
        succs[idx[u]].append((idx[v], nb))

    def ar_bw(d: int) -> float:
        return intra if dpn is not None and d <= dpn else c.inter_node_bandwidth

    def x_bw(d: int) -> float:
        return intra if dpn is not None and d < dpn else c.inter_node_bandwidth

    def own(u: int, d: int) -> float:
        return comp[d][u] / b + (2 * (d - 1) / d * w[u] / ar_bw(d)) / B

    def xfer(nb: float, d: int) -> float:
        return 2 * (c.latency + nb * (b / d) / x_bw(d)) / b

    def stage_lb(v: int, d: int) -> float:
        claimed = {v} | {u for u, _ in preds[v]} | {x for x, _ in succs[v]}
        total = own(v, d)
        for u, nb in preds[v]:
            join = own(u, d)
            for x, nb2 in preds[u]:
                if x not in claimed:
                    claimed.add(x)
                    join += min(own(x, d), xfer(nb2, d))
            total += min(join, xfer(nb, d))
        if succs[v]:
            total += min(sum(own(x, d) for x, _ in succs[v]), min(xfer(nb, d) for _, nb in succs[v]))
        return total

    return max(min(stage_lb(v, d) for d in ds) for v in range(len(graph.nodes)))


def plan_row(
    name: str, plan: Plan | None, seconds: float, graph: Graph, cluster: Cluster, note: str = ""
) -> dict[str, Any]:
    if plan is None:
        return {"planner": name, "status": note, "seconds": seconds}
    bs = sorted({s.micro_batch_size for s in plan.stages})
    bound = perfect_balance_tps(graph, bs[0], cluster.devices)
    specs = [
        StageSpec(
            s.nodes, s.devices, s.micro_batch_size, k=s.schedule.k, tensor_parallel=s.tensor_parallel, tmpc=s.tmpc
        )
        for s in plan.stages
    ]
    worst = max(stage_costs(graph, cluster, specs, plan.mini_batch_size), key=lambda sc: sc.time_per_sample)
    comp_share = worst.compute / worst.micro_batch_size / worst.time_per_sample
    bound2 = max(bound, node_bound_tps(graph, cluster, bs[0], plan.mini_batch_size))
    relaxed = relaxed_bound(graph, cluster, bs[0], plan.mini_batch_size) if len(bs) == 1 else None
    return {
        "relaxed": relaxed,
        "gap3": None if relaxed is None else plan.predicted.time_per_sample / relaxed.value - 1,
        "gap2": plan.predicted.time_per_sample / bound2 - 1,
        "planner": name,
        "status": plan.search.status,
        "seconds": seconds,
        "tps": plan.predicted.time_per_sample,
        "iter": plan.predicted.iteration_time,
        "thr": plan.predicted.throughput,
        "stages": len(plan.stages),
        "devices": plan.devices_used,
        "b": bs[0] if len(bs) == 1 else f"{bs}",
        "comp_share": comp_share,
        "gap": plan.predicted.time_per_sample / bound - 1,
    }


def run_workload(
    model: str, devices: int, planners: list[str], time_limit: float, gpp_time_limit: float | None
) -> list[dict[str, Any]]:
    """Rows: ``gpp`` (default objective), ``gpp[TPS]`` (objective ``time_per_sample``), then the others.
    ``gpp`` runs stand-alone (its own seed planners inside its time limit)."""
    graph = build_model(model)
    cluster = v100_cluster(devices)
    B = SAMPLES_PER_DEVICE[model] * devices
    rows = []
    for name in planners:
        fn = seed_fn(name)
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
        rows.append(plan_row(name, p, time.perf_counter() - t0, graph, cluster))
    own = []
    for label, objective in (("gpp", "iteration_time"), ("gpp[TPS]", "time_per_sample")):
        t0 = time.perf_counter()
        p = plan_gpp(graph, cluster, B, time_limit=gpp_time_limit, objective=objective)
        sec = time.perf_counter() - t0
        validate(p, graph, cluster)
        r = plan_row(label, p, sec, graph, cluster)
        r["extra"] = p.search.extra
        own.append(r)
    return own + rows


def fmt(v: Any, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def workload_table(model: str, devices: int, rows: list[dict[str, Any]]) -> str:
    others = [r for r in rows if not r["planner"].startswith("gpp") and "thr" in r]
    best_other = max((r["thr"] for r in others), default=None)
    out = [
        f"### {model}, {devices} devices (B = {SAMPLES_PER_DEVICE[model] * devices})",
        "",
        "| planner | status | search s | TPS s | sim. iteration s | throughput /s | vs best other | stages | devices "
        "| b | TPS gap to plain bound | to node bound | relaxed bound s | to relaxed bound |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        rel = None if best_other is None or "thr" not in r else r["thr"] / best_other
        out.append(
            f"| {r['planner']} | {r['status']} | {fmt(r['seconds'], '.2f')} | {fmt(r.get('tps'), '.4g')} | "
            f"{fmt(r.get('iter'), '.4g')} | {fmt(r.get('thr'), '.5g')} | {fmt(rel, '.3f')} | "
            f"{fmt(r.get('stages'), 'd')} | {fmt(r.get('devices'), 'd')} | {r.get('b', '—')} | "
            f"{fmt(None if 'gap' not in r else 100 * r['gap'], '.1f')}% | "
            f"{fmt(None if 'gap2' not in r else 100 * r['gap2'], '.1f')}% | {relaxed_cell(r.get('relaxed'))} | "
            f"{fmt(None if r.get('gap3') is None else 100 * r['gap3'], '.1f')}% |"
        )
    return "\n".join(out)


def relaxed_cell(r: TpsBound | None) -> str:
    if r is None:
        return "—"
    return f"{r.value:.4g}" + ("" if r.status == "optimal" else f" ({r.status})")


def unreachable_lines(model: str, devices: int, rows: list[dict[str, Any]], all_b: bool) -> str:
    """Is ``1.1 x perfect balance`` below the relaxed bound (the 10% target provably unreachable)?
    At ``gpp[TPS]``'s ``b``, and (``all_b``) at every power-of-two ``b`` dividing ``B``."""
    graph, cluster = build_model(model), v100_cluster(devices)
    B = SAMPLES_PER_DEVICE[model] * devices
    t = next((r for r in rows if r["planner"] == "gpp[TPS]"), None)
    out = []
    if t is not None and t.get("relaxed") is not None:
        r = t["relaxed"]
        verdict = (
            "yes: the 10% target is provably unreachable" if 1.1 * r.perfect_balance < r.value else "no (not proven)"
        )
        out.append(
            f"- b = {r.micro_batch_size} (gpp[TPS]'s): perfect balance {r.perfect_balance:.4g}, relaxed bound "
            f"{relaxed_cell(r)} (+{100 * (r.value / r.perfect_balance - 1):.1f}%), gpp[TPS] TPS {t['tps']:.4g}; "
            f"1.1 x perfect balance < relaxed bound: {verdict}"
        )
    if all_b:
        from gpp_solver.cost.micro_batch import powers_of_two_dividing

        bounds = [r for r in (relaxed_bound(graph, cluster, b, B) for b in powers_of_two_dividing(B)) if r is not None]
        if not bounds:
            return "\n".join(out)
        best = min(bounds, key=lambda r: r.value)
        out_of = [r.micro_batch_size for r in bounds if not 1.1 * r.perfect_balance < r.value]
        unproven = [r.micro_batch_size for r in bounds if r.status != "optimal"]
        gpp_tps = "" if t is None else f"; gpp[TPS] TPS / least relaxed bound = {t['tps'] / best.value:.3f}"
        out.append(
            f"- every b (1..{bounds[-1].micro_batch_size}): least relaxed bound {best.value:.4g} at b = "
            f"{best.micro_batch_size}{gpp_tps}; 10% target provably unreachable at "
            f"{len(bounds) - len(out_of)}/{len(bounds)} sizes"
            + (f" (not at b = {out_of})" if out_of else "")
            + (f"; MILP stopped by the time limit (dual bound) at b = {unproven}" if unproven else "")
        )
    return "\n".join(out)


def summary_table(results: dict[tuple[str, int], list[dict[str, Any]]]) -> str:
    out = [
        "| workload | devices | gpp sim. throughput / best other | gpp s | gpp TPS gap: plain / node bound "
        "| gpp[TPS] TPS / best other TPS | gpp[TPS] s | gpp[TPS] gap: plain / node bound | gpp[TPS] bottleneck: "
        "compute share | best other TPS gap: plain / node | gpp from |",
        "|" + "---|" * 11,
    ]
    for (model, devices), rows in results.items():
        g, t = rows[0], rows[1]
        others = [r for r in rows[2:] if "thr" in r]
        best_thr = max((r["thr"] for r in others), default=None)
        best_tps = min(others, key=lambda r: r["tps"], default=None)
        ex = g.get("extra", {})
        out.append(
            f"| {model} | {devices} | {fmt(None if best_thr is None else g['thr'] / best_thr, '.3f')} | "
            f"{g['seconds']:.2f} | {100 * g['gap']:.1f}% / {100 * g['gap2']:.1f}% | "
            f"{fmt(None if best_tps is None else t['tps'] / best_tps['tps'], '.3f')} | {t['seconds']:.2f} | "
            f"{100 * t['gap']:.1f}% / {100 * t['gap2']:.1f}% | {100 * t['comp_share']:.0f}% | "
            + (
                "— |"
                if best_tps is None
                else f"{100 * best_tps['gap']:.1f}% / {100 * best_tps['gap2']:.1f}% ({best_tps['planner']}) |"
            )
            + f" {ex.get('seed_planner')} b={ex.get('micro_batch_size')} |"
        )
    return "\n".join(out)


def optimality_gap(instances: int, seed: int) -> str:
    from gpp_solver.oracles.brute_force import best_plan_bruteforce, random_cluster, random_graph

    rng = random.Random(seed)
    gp = seed_fn("graphpipe")
    gaps, gp_gaps, sim_rel = [], [], []
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

    out = [
        f"Random tiny graphs: {len(gaps)} instances (chain/diamond/sp/dag, 6-8 nodes, 4 devices, B = 16), "
        "gap to the brute-force optimum of the bottleneck TPS",
        "",
        "| measure | mean | worst | at the optimum |",
        "|---|---|---|---|",
        f"| gpp TPS (objective=time_per_sample) | {stats(gaps)} |",
        f"| graphpipe TPS | {stats(gp_gaps)} |",
        f"| gpp default plan: simulated iteration time vs the TPS-optimal plan's (negative = faster) | "
        f"{100 * statistics.mean(sim_rel):+.2f}% | {100 * max(sim_rel):+.2f}% | — |"
        if sim_rel
        else "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="mmt,dlrm,candle-uno,transformer")
    ap.add_argument("--devices", default="4,8,16,32")
    ap.add_argument("--planners", default=",".join(OTHERS))
    ap.add_argument("--time-limit", type=float, default=60.0, help="other planners' time limit")
    ap.add_argument("--gpp-time-limit", type=float, default=None, help="gpp's (default: its own, 10 s)")
    ap.add_argument("--gap-instances", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bound-time-limit", type=float, default=20.0, help="time limit of each relaxed-bound MILP")
    ap.add_argument("--skip-all-b", action="store_true", help="relaxed bound only at the plans' micro-batch sizes")
    ap.add_argument("--skip-workloads", action="store_true")
    ap.add_argument("--skip-gap", action="store_true")
    a = ap.parse_args(argv)
    BOUND_TIME_LIMIT[0] = a.bound_time_limit
    planners = [p for p in a.planners.split(",") if p and p != "gpp" and (p in REGISTRY or p == "graphpipe")]
    if not a.skip_workloads:
        results = {}
        for model in a.models.split(","):
            for devices in (int(x) for x in a.devices.split(",")):
                rows = run_workload(model, devices, planners, a.time_limit, a.gpp_time_limit)
                results[(model, devices)] = rows
                print(workload_table(model, devices, rows) + "\n", flush=True)
                print(unreachable_lines(model, devices, rows, not a.skip_all_b) + "\n", flush=True)
        print("### Summary\n\n" + summary_table(results) + "\n", flush=True)
    if not a.skip_gap:
        print(optimality_gap(a.gap_instances, a.seed), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
