"""What CP-SAT tightening of the stage orders buys on the paper's workloads (a markdown table).

For each workload (``gpp_solver.workloads.build_model``) on a V100 cluster, the GraphPipe planner's
plan (``gpp_solver.planners.graphpipe.planner.plan_graphpipe``, equal micro-batch sizes, Algorithm 2 kFkB
orders) is tightened with :func:`gpp_solver.cp_schedule.tighten`; a second row re-prices the same
partition with every other stage's micro-batch size halved (where ``b % d`` allows), the setting
where Algorithm 2's orders leave the most room.  Iteration times are the simulator's (exact under
the cost model), before and after; "bound" is CP-SAT's lower bound for tick-rounded durations.

    python benchmarks/cp_tighten.py [--devices 8] [--samples-per-device 16] [--time-limit 10]
                                    [--models mmt,dlrm,candle-uno,transformer] [--workers 1]
"""

from __future__ import annotations

import argparse
import sys
import time

from gpp_solver.cp_schedule import MAX_ACTIONS, tighten
from gpp_solver.formats.cluster import v100_cluster
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.plan.validate import validate
from gpp_solver.types import Plan, SearchInfo
from gpp_solver.workloads import build_model

GiB = 2**30


def planner():
    """The GraphPipe planner (registry name ``graphpipe``, or the module that implements it)."""
    try:
        from gpp_solver.planners.registry import get_planner

        return get_planner("graphpipe")
    except Exception:  # noqa: BLE001 - registry entry not importable yet: use the module directly
        from gpp_solver.planners.graphpipe.planner import plan_graphpipe

        return plan_graphpipe


def mixed_b(plan: Plan, graph, cluster) -> Plan | None:
    """The same partition with every other stage's micro-batch size halved (None if none can be)."""
    specs, changed = [], False
    for s in plan.stages:
        b = s.micro_batch_size
        d = len(s.devices) // s.tensor_parallel
        if s.id % 2 == 1 and b % 2 == 0 and (b // 2) % d == 0:
            b //= 2
            changed = True
        specs.append(StageSpec(s.nodes, s.devices, b, k=1, tensor_parallel=s.tensor_parallel, tmpc=s.tmpc))
    if not changed:
        return None
    return build_plan(
        graph,
        cluster,
        specs,
        plan.mini_batch_size,
        planner=plan.planner + "+mixed-b",
        search=SearchInfo(0.0, "feasible"),
    )


def row(name: str, devices: int, label: str, plan: Plan, graph, cluster, args) -> str:
    validate(plan, graph, cluster)
    r = tighten(
        plan, graph, cluster, time_limit=args.time_limit, seed=0, workers=args.workers, max_actions=args.max_actions
    )
    validate(r.plan, graph, cluster)
    ns = sorted({plan.mini_batch_size // s.micro_batch_size for s in plan.stages})
    n_text = str(ns[0]) if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    gain = 100.0 * (r.makespan_before - r.makespan_after) / r.makespan_before
    bound = "" if r.lower_bound is None else f"{r.lower_bound * 1e3:.3f}"
    return (
        f"| {name} | {devices} | {plan.mini_batch_size} | {label} | {len(plan.stages)} | {plan.depth} | "
        f"{n_text} | {r.actions} | {r.status} | {r.memory_status} | {r.makespan_before * 1e3:.3f} | {r.makespan_after * 1e3:.3f} | "
        f"{gain:.2f} | {bound} | {plan.predicted.peak_memory_bytes / GiB:.2f} | "
        f"{r.plan.predicted.peak_memory_bytes / GiB:.2f} | {r.seconds:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[8])
    ap.add_argument("--samples-per-device", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max-actions", type=int, default=MAX_ACTIONS)
    ap.add_argument("--models", default="mmt,dlrm,candle-uno,transformer")
    args = ap.parse_args(argv)
    plan_fn = planner()
    print(
        f"CP-SAT order tightening, time limit {args.time_limit:g} s, {args.workers} worker(s), "
        f"V100 cluster (4 per node), B = {args.samples_per_device} x devices\n"
    )
    print(
        "| workload | devices | B | plan | stages | depth | micro-batches | actions | CP-SAT | memory phase | "
        "iter before (ms) | iter after (ms) | gain % | bound (ms) | peak mem before (GiB) | after (GiB) | CP s |"
    )
    print("|" + "---|" * 17)
    t0 = time.perf_counter()
    for name in args.models.split(","):
        graph = build_model(name)
        for devices in args.devices:
            cluster = v100_cluster(devices)
            B = args.samples_per_device * devices
            try:
                plan = plan_fn(graph, cluster, B, time_limit=60.0, progress=False)
            except Exception as exc:  # noqa: BLE001 - report and go on with the next workload
                print(f"| {name} | {devices} | {B} | planner failed: {type(exc).__name__}: {exc} |" + " |" * 13)
                continue
            print(row(name, devices, "graphpipe", plan, graph, cluster, args), flush=True)
            mixed = mixed_b(plan, graph, cluster)
            if mixed is not None:
                try:
                    validate(mixed, graph, cluster)
                except Exception as exc:  # noqa: BLE001 - e.g. halved b breaks memory
                    print(f"| {name} | {devices} | {B} | mixed b invalid: {exc} |" + " |" * 13)
                    continue
                print(row(name, devices, "same partition, mixed b", mixed, graph, cluster, args), flush=True)
    print(f"\n(total {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
