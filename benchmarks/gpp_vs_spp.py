"""Graph pipelines vs sequential pipelines: every planner on the paper's workloads.

    python benchmarks/gpp_vs_spp.py                 # mmt, dlrm, candle-uno at 4/8/16/32 devices + transformer
    python benchmarks/gpp_vs_spp.py --devices 4 8   # fewer cells
    python benchmarks/gpp_vs_spp.py --branches      # also candle-uno with 2..16 branches (Fig. 7 left)
    python benchmarks/gpp_vs_spp.py --planners gpp graphpipe   # a subset of the planners

Workloads from ``gpp_solver.workloads.build_model`` at the paper's sizes, on ``v100_cluster(n)`` (V100
16 GiB, 4 per node), mini-batch per GraphPipe A.2 (MMT and Transformer 16, DLRM 64, CANDLE-Uno 1024
samples per device).  Every plan is validated and simulated under the shared cost model; the table
prints simulated throughput (samples/s) and search seconds per planner, and the ratios of
``graphpipe`` and ``gpp`` to ``pipedream-2bw`` (the sequential planner the paper measured against) and
to the free-partition ``pipedream`` DP (GraphPipe Fig. 6, Table 1, A.3).  The column
``graphpipe Alg. 1`` is the GraphPipe planner without its depth sweep (``depth_tradeoff=False``):
the paper's objective alone, the least bottleneck TPS per micro-batch size. Every planner's plan
runs 1F1B-family orders, ``gpp``'s too (``--gpp-schedule 1f1b``, the default here; ``auto`` lets it
place zero-bubble weight-gradient actions as its own default does: ``benchmarks/zero_bubble.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from gpp_solver.compare import compare, row_from_plan
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.planners.registry import available_planners, get_planner
from gpp_solver.workloads import build_model

PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024, "transformer": 16}
PLANNERS = ["gpp", "graphpipe", "pipedream", "pipedream-2bw", "piper", "alpa"]


ALG1 = "graphpipe Alg. 1"


#: ``gpp``'s micro-batch orders in this comparison: 1F1B, as every other planner's (the table
#: compares partitions; ``benchmarks/zero_bubble.py`` measures the zero-bubble schedules)
GPP_SCHEDULE = "1f1b"


def run(model: str, devices: int, planners: list[str], time_limit: float, gpp_schedule: str = GPP_SCHEDULE, **params):
    g = build_model(model, **params)
    c = v100_cluster(devices)
    B = PER_DEVICE[model] * devices
    rows, plans = compare(g, c, B, [p for p in planners if p != "gpp"], time_limit=time_limit)
    if "gpp" in planners:
        gpp_rows, _ = compare(g, c, B, ["gpp"], time_limit=time_limit, schedule=gpp_schedule)
        rows = gpp_rows + rows
    out = {r.planner: r for r in rows}
    if "graphpipe" in planners:  # the paper's objective alone: the least TPS per micro-batch size
        t0 = time.perf_counter()
        plan = get_planner("graphpipe")(g, c, B, time_limit=time_limit, depth_tradeoff=False)
        out[ALG1] = row_from_plan(plan, g, c, time.perf_counter() - t0, name=ALG1)
    return out


def fmt_tp(r) -> str:
    return f"{r.throughput:.4g}" if r and r.throughput else (r.status if r else "—")


def ratio(rows, a: str, b: str) -> float | None:
    ra, rb = rows.get(a), rows.get(b)
    if ra and rb and ra.throughput and rb.throughput:
        return ra.throughput / rb.throughput
    return None


def time_ratio(rows, a: str, b: str) -> float | None:
    """Search-time ratio (Table 1's comparison), only where ``a`` produced a plan."""
    ra, rb = rows.get(a), rows.get(b)
    if ra and rb and ra.throughput and rb.search_seconds > 0:
        return ra.search_seconds / rb.search_seconds
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--models", nargs="+", default=["mmt", "dlrm", "candle-uno", "transformer"])
    ap.add_argument("--branches", action="store_true", help="also candle-uno with 2..16 branches at 16 devices")
    ap.add_argument("--time-limit", type=float, default=60.0, help="per planner and cell (seconds)")
    ap.add_argument(
        "--gpp-schedule", choices=("1f1b", "zb", "auto"), default=GPP_SCHEDULE, help="gpp's micro-batch orders"
    )
    ap.add_argument(
        "--planners",
        nargs="+",
        default=PLANNERS,
        choices=PLANNERS,
        help="a subset of the planners (the ratio columns need theirs)",
    )
    args = ap.parse_args(argv)
    planners = [p for p in args.planners if p in available_planners()]
    print(f"planners: {', '.join(planners)}; date {time.strftime('%Y-%m-%d')}\n")
    columns = planners + ([ALG1] if "graphpipe" in planners else [])
    head = (
        "| workload | devices | "
        + " | ".join(f"{p} tput (s)" for p in columns)
        + " | graphpipe / 2bw | Alg. 1 / 2bw | graphpipe / pipedream | gpp / best other "
        + "| search s: pipedream / graphpipe | piper / graphpipe |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    gp_2bw: dict[str, list[float]] = {}
    alg1_2bw: dict[str, list[float]] = {}
    cells = [(m, d, {}) for m in args.models for d in args.devices]
    if args.branches:
        cells += [("candle-uno", 16, {"branches": k}) for k in (2, 4, 8, 16)]
    for model, devices, params in cells:
        rows = run(model, devices, planners, args.time_limit, args.gpp_schedule, **params)
        label = model + (f" ({params['branches']} branches)" if params else "")
        cols = [f"{fmt_tp(rows.get(p))} ({rows[p].search_seconds:.2f})" if p in rows else "—" for p in columns]
        r1, r2 = ratio(rows, "graphpipe", "pipedream-2bw"), ratio(rows, "graphpipe", "pipedream")
        r4 = ratio(rows, ALG1, "pipedream-2bw")
        others = [r.throughput for p, r in rows.items() if p not in ("gpp", ALG1) and r.throughput]
        r3 = rows["gpp"].throughput / max(others) if "gpp" in rows and rows["gpp"].throughput and others else None
        kind = "sequential" if model == "transformer" else "multi-branch"
        if r1 is not None and not params:
            gp_2bw.setdefault(kind, []).append(r1)
        if r4 is not None and not params:
            alg1_2bw.setdefault(kind, []).append(r4)

        def f(x):
            return "—" if x is None else f"{x:.2f}x"

        s1, s2 = time_ratio(rows, "pipedream", "graphpipe"), time_ratio(rows, "piper", "graphpipe")
        print(
            f"| {label} | {devices} | " + " | ".join(cols) + f" | {f(r1)} | {f(r4)} | {f(r2)} | {f(r3)} "
            f"| {f(s1)} | {f(s2)} |"
        )
        sys.stdout.flush()
    print()
    for name, table in (("graphpipe", gp_2bw), (ALG1, alg1_2bw)):
        for kind, xs in table.items():
            print(
                f"{name} / pipedream-2bw simulated throughput on {kind} workloads: mean {statistics.mean(xs):.3f}x, "
                f"min {min(xs):.2f}x, max {max(xs):.2f}x over {len(xs)} cells"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
