"""GraphPipe Table 1 grid: search time of the GraphPipe planner beside the paper's figures.

    python benchmarks/search_time.py            # 4/8/16/32 devices (the paper's grid)
    python benchmarks/search_time.py --large    # also 1024 devices
    python benchmarks/search_time.py --profile mmt:32   # cProfile one cell

Workloads: ``gpp_solver.workloads.build_model`` (``mmt`` = 4 branches x 8 layers, ``dlrm``,
``candle-uno``) with GraphPipe A.2's mini-batch sizes (MMT 16, DLRM 64, CANDLE-Uno 1024 samples
per device).  Cluster: ``gpp_solver.formats.cluster.v100_cluster`` — 4 GPUs per node, 16 GiB each (V100),
intra-node 50e9 B/s (NVLink-ish), inter-node 12.5e9 B/s (100 Gb/s InfiniBand), latency 1e-5 s,
optimizer_state_factor 4.  Search time is the wall time of ``plan_graphpipe`` (decomposition,
every micro-batch size, traceback and ``build_plan`` with its simulation), without the final
``validate``, best of ``--repeat`` runs (default 3) on a shared machine.  The paper's figures are GraphPipe's column of Table 1 (Apple M1 Max, seconds).

Two timings per cell: the paper's search (Algorithm 1: the least TPS per micro-batch size,
``depth_tradeoff=False``, what Table 1 times) and the planner's default, which adds the depth sweep
(the least TPS per bound on the stage graph's depth too, see :mod:`gpp_solver.planners.graphpipe.planner`).
The plan columns describe the default's plan.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.planners.graphpipe.planner import plan_graphpipe
from gpp_solver.workloads import build_model

PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024}
PAPER = {  # GraphPipe, Table 1 (seconds)
    "mmt": {4: 0.12, 8: 0.76, 16: 3.00, 32: 10.11},
    "dlrm": {4: 0.33, 8: 2.73, 16: 13.28, 32: 54.6},
    "candle-uno": {4: 0.19, 8: 1.43, 16: 6.14, 32: 22.37},
}


def run_cell(model: str, devices: int, repeat: int = 1, depth_tradeoff: bool = True):
    """Best wall time of ``repeat`` runs (the machine is shared; the minimum is the least noisy)."""
    g = build_model(model)
    c = v100_cluster(devices)
    B = PER_DEVICE[model] * devices
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        plan = plan_graphpipe(g, c, B, progress=False, validate_plan=False, depth_tradeoff=depth_tradeoff)
        best = min(best, time.perf_counter() - t0)
    return best, plan, B


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="also plan for 1024 devices")
    ap.add_argument("--profile", metavar="MODEL:DEVICES", help="cProfile one cell and print the top entries")
    ap.add_argument("--devices", type=int, nargs="+", help="device counts to run (default: 4 8 16 32)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the best time is shown (default 3)")
    args = ap.parse_args(argv)
    if args.profile:
        model, dev = args.profile.split(":")
        run_cell(model, int(dev))  # warm-up: imports and first-call costs are not search time
        prof = cProfile.Profile()
        prof.enable()
        run_cell(model, int(dev))
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("cumulative").print_stats(30)
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(15)
        return 0
    grid = (args.devices or [4, 8, 16, 32]) + ([1024] if args.large else [])
    print(
        "| model | GPUs | B | Algorithm 1 s (ours) | paper GraphPipe s | ours / paper | default s (depth sweep) "
        "| default / paper | b | stages | depth | devices used | TPS (s) | throughput (samples/s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in ("mmt", "dlrm", "candle-uno"):
        for d in grid:
            alg1, _, _ = run_cell(model, d, args.repeat, depth_tradeoff=False)
            secs, plan, B = run_cell(model, d, args.repeat)
            paper = PAPER[model].get(d)
            ratio = f"{alg1 / paper:.3f}" if paper else "-"
            ratio2 = f"{secs / paper:.3f}" if paper else "-"
            print(
                f"| {model} | {d} | {B} | {alg1:.3f} | {paper if paper else '-'} | {ratio} | {secs:.3f} | {ratio2} "
                f"| {plan.stages[0].micro_batch_size} | {len(plan.stages)} | {plan.depth} | {plan.devices_used} "
                f"| {plan.predicted.time_per_sample:.4g} | {plan.predicted.throughput:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
