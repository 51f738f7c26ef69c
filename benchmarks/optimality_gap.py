"""Optimality gap of every registered planner to the exact MILP on small random graphs.

    python benchmarks/optimality_gap.py                  # 10 graphs per class, 6-8 nodes, 4 devices
    python benchmarks/optimality_gap.py --per-class 20 --tight --placement --batch 64

Classes: ``chain``, ``SP`` (diamonds and random series-parallel graphs), ``non-SP`` (random DAGs
that are not series-parallel, several sources/sinks allowed) — ``gpp_solver.oracles.brute_force.random_graph``.
Cluster: 4 devices, flat network (``--placement``: two devices per node, faster intra-node link;
planners may place devices differently from the MILP's contiguous-in-topological-order rule, so
a negative gap is then possible).  Memory: 64 GB (loose); ``--tight``: activation-heavy graphs
with memory 1.5x the least any plan of the MILP's space needs.  Mini-batch ``--batch`` (default 8),
the planners' default micro-batch sizes (the MILP and the oracle: the powers of two dividing it).

Gap = planner TPS / MILP TPS - 1 (bottleneck time-per-sample of the cost model, the MILP's
objective; the MILP is proven optimal on every instance or the row says so).  Planners that choose
between plans by iteration time (GraphPipe picks ``b`` and the depth by simulated iteration time) trade TPS
for a shorter pipeline fill, so the simulated iteration-time ratio to the MILP plan is shown too.
``graphpipe@min-TPS-b`` runs GraphPipe's Algorithm 1 (no depth sweep) once per micro-batch size and
keeps the least TPS: its gap is that of the DP's search space alone.  ``gpp[TPS]`` is ``gpp`` with ``objective="time_per_sample"``
(the MILP's objective); plain ``gpp`` (default objective: simulated iteration time) is judged by
its iteration-time ratio to the MILP plan's (mean and worst).  A last table counts the instances
where ``gpp`` is worse than ``graphpipe``: ``gpp[TPS]`` by TPS, ``gpp`` by simulated iteration time.  The second table checks the MILP against the brute-force
oracle and times both.

``--workloads`` goes on with the paper's workloads at 4-32 devices:
every planner's simulated throughput, search time and TPS gap to the perfect-balance bound and to
the relaxed bound — ``benchmarks/gpp_quality.py --skip-gap --skip-all-b`` (run that script
directly for its other options, e.g. the relaxed bound over every micro-batch size).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time

from gpp_solver import graph_from_dict, graph_to_dict
from gpp_solver.cost.micro_batch import powers_of_two_dividing
from gpp_solver.errors import GppError, InfeasibleError
from gpp_solver.oracles.brute_force import (
    best_plan_bruteforce,
    min_peak_memory_bruteforce,
    random_cluster,
    random_graph,
)
from gpp_solver.planners.milp.planner import plan_milp
from gpp_solver.planners.registry import available_planners, get_planner
from gpp_solver.sp_tree import decompose
from gpp_solver.types import Status

CLASSES = {"chain": ("chain",), "SP": ("diamond", "sp"), "non-SP": ("dag",)}


def instances(cls: str, count: int, seed: int, placement: bool, tight: bool, B: int):
    """``count`` (graph, cluster) pairs of class ``cls``, deterministic in ``seed``."""
    rng = random.Random(f"{cls}-{seed}")
    out = []
    while len(out) < count:
        kind = rng.choice(CLASSES[cls])
        g = random_graph(rng, kind, rng.randint(6, 8), name=f"{cls}-{len(out)}")
        is_sp = decompose(g).is_series_parallel
        if (cls == "non-SP") == is_sp:
            continue
        c = random_cluster(rng, devices=4, placement=placement)
        if tight:
            d = graph_to_dict(g)
            for nd in d["nodes"]:
                nd["activation_bytes"] *= 20
                nd["weight_bytes"] /= 10
            g = graph_from_dict(d)
            c = c.with_(memory_bytes=1.5 * min_peak_memory_bruteforce(g, c, B))
        out.append((g, c))
    return out


def _graphpipe_min_tps(g, c, B: int, time_limit: float):
    """GraphPipe once per micro-batch size (sizes without a plan in memory skipped), least TPS kept."""
    fn, plans = get_planner("graphpipe"), []
    for b in powers_of_two_dividing(B):
        try:
            plans.append(fn(g, c, B, time_limit=time_limit, micro_batch_sizes=[b], depth_tradeoff=False))
        except InfeasibleError:
            continue
    if not plans:
        raise InfeasibleError("graphpipe: no micro-batch size admits a plan")
    return min(plans, key=lambda q: q.predicted.time_per_sample)


def fmt(x: float | None, pct: bool = True) -> str:
    if x is None:
        return "—"
    return f"{100 * x:+.2f}%" if pct else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=10, help="graphs per class (default 10)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placement", action="store_true", help="two devices per node instead of a flat network")
    ap.add_argument("--tight", action="store_true", help="activation-heavy graphs, memory 1.5x the least needed")
    ap.add_argument("--batch", type=int, default=8, help="mini-batch size B (default 8)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per planner call (default 60 s)")
    ap.add_argument("--planners", help="comma-separated names (default: every available planner but milp)")
    ap.add_argument(
        "--workloads",
        action="store_true",
        help="then the paper's workloads: every planner's throughput, search time and TPS gap to the "
        "perfect-balance and relaxed bounds (benchmarks/gpp_quality.py --skip-gap --skip-all-b)",
    )
    args = ap.parse_args(argv)
    B = args.batch
    logging.basicConfig(level=logging.ERROR)
    names = args.planners.split(",") if args.planners else [n for n in available_planners() if n != "milp"]
    best_b = "graphpipe" in names
    if best_b:  # GraphPipe run once per micro-batch size, keeping the least TPS (its search space alone)
        names.insert(names.index("graphpipe") + 1, "graphpipe@min-TPS-b")
    if "gpp" in names:  # gpp with the MILP's objective
        names.insert(names.index("gpp") + 1, "gpp[TPS]")
    vs_rows = []

    gap_rows, check_rows = [], []
    for cls in CLASSES:
        insts = instances(cls, args.per_class, args.seed, args.placement, args.tight, B)
        stats = {n: {"gap": [], "iter": [], "time": [], "fail": 0} for n in names}
        worse_tps = worse_iter = compared = 0
        milp_t, oracle_t, agree, proven = [], [], 0, 0
        for g, c in insts:
            t0 = time.perf_counter()
            ref = plan_milp(g, c, B, time_limit=args.time_limit)
            milp_t.append(time.perf_counter() - t0)
            proven += ref.search.status is Status.OPTIMAL_TIME_PER_SAMPLE
            t0 = time.perf_counter()
            want, _ = best_plan_bruteforce(g, c, B)
            oracle_t.append(time.perf_counter() - t0)
            agree += abs(ref.predicted.time_per_sample / want - 1) <= 1e-6
            got = {}
            for n in names:
                t0 = time.perf_counter()
                try:
                    if n == "graphpipe@min-TPS-b":
                        p = _graphpipe_min_tps(g, c, B, args.time_limit)
                    elif n == "gpp[TPS]":
                        p = get_planner("gpp")(g, c, B, time_limit=args.time_limit, objective="time_per_sample")
                    else:
                        p = get_planner(n)(g, c, B, time_limit=args.time_limit)
                except GppError as exc:
                    logging.getLogger("optimality_gap").warning("%s on %s: %s", n, g.name, exc)
                    stats[n]["fail"] += 1
                    continue
                stats[n]["time"].append(time.perf_counter() - t0)
                stats[n]["gap"].append(p.predicted.time_per_sample / ref.predicted.time_per_sample - 1)
                stats[n]["iter"].append(p.predicted.iteration_time / ref.predicted.iteration_time)
                got[n] = p
            if all(n in got for n in ("gpp", "gpp[TPS]", "graphpipe")):
                compared += 1
                gp = got["graphpipe"].predicted
                worse_tps += got["gpp[TPS]"].predicted.time_per_sample > gp.time_per_sample * (1 + 1e-9)
                worse_iter += got["gpp"].predicted.iteration_time > gp.iteration_time * (1 + 1e-9)
        for n in names:
            s = stats[n]
            gaps = s["gap"]
            gap_rows.append(
                (
                    n,
                    cls,
                    len(insts),
                    len(gaps),
                    fmt(statistics.mean(gaps)) if gaps else "—",
                    fmt(max(gaps)) if gaps else "—",
                    sum(x < -1e-6 for x in gaps),
                    fmt(statistics.mean(s["iter"]), pct=False) if gaps else "—",
                    fmt(max(s["iter"]), pct=False) if gaps else "—",
                    f"{statistics.mean(s['time']):.3f}" if s["time"] else "—",
                )
            )
        vs_rows.append((cls, compared, worse_tps, worse_iter))
        check_rows.append(
            (
                cls,
                len(insts),
                f"{proven}/{len(insts)}",
                f"{agree}/{len(insts)}",
                f"{statistics.mean(milp_t):.2f}",
                f"{max(milp_t):.2f}",
                f"{statistics.mean(oracle_t):.3f}",
                f"{max(oracle_t):.3f}",
            )
        )

    net = "two devices per node" if args.placement else "flat network"
    mem = "tight memory (1.5x least)" if args.tight else "64 GB memory"
    print(f"Gap to the MILP optimum (TPS), 6-8 nodes, 4 devices, {net}, {mem}, B={B}\n")
    print(
        "| planner | class | graphs | planned | mean TPS gap | worst TPS gap | below MILP | "
        "mean iter-time ratio | worst iter-time ratio | mean search s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in gap_rows:
        print("| " + " | ".join(map(str, r)) + " |")
    print("\nMILP vs brute-force oracle\n")
    print(
        "| class | graphs | MILP proven optimal | MILP = oracle | MILP mean s | MILP max s | oracle mean s | "
        "oracle max s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in check_rows:
        print("| " + " | ".join(map(str, r)) + " |")
    if any(r[1] for r in vs_rows):
        print("\ngpp worse than graphpipe (instances)\n")
        print("| class | compared | gpp[TPS] TPS > graphpipe TPS | gpp sim. iteration > graphpipe's |")
        print("|---|---|---|---|")
        for r in vs_rows:
            print("| " + " | ".join(map(str, r)) + " |")
    if args.workloads:
        import importlib.util
        from pathlib import Path

        spec = importlib.util.spec_from_file_location("gpp_quality", Path(__file__).with_name("gpp_quality.py"))
        quality = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(quality)
        print()
        sys.stdout.flush()
        return quality.main(["--skip-gap", "--skip-all-b", "--time-limit", str(args.time_limit)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
