"""Benchmark: is a profile stable from run to run, and does re-profiling give the same plan?

    python benchmarks/profile_stability.py                       # the default models, 3 profiles each
    python benchmarks/profile_stability.py --runs 5 --models examples.real_models:resnet18@8
    python benchmarks/profile_stability.py --quick               # smoke run (seconds)

For each model, profile it ``--runs`` times exactly as ``benchmarks/cost_model_fidelity.py --mode
cpu`` does (``gpp_runtime.profile --concurrent C``, one pinned profiler per core, one thread each: see
``benchmarks/fidelity_cpu.py``), then for every profile:

- the one-device iteration time the cost model predicts for the mini-batch (every node's forward
  and backward, the per-node overhead, the optimizer step), and its spread over the runs
  (``(max - min) / median``);
- each node's forward + backward time at the mini-batch against its median over the runs: the
  largest relative deviation, over the nodes that carry at least 1% of the model's time;
- the within-run spread the profile itself records (``extra.time_spread``: the fastest and slowest
  timed run of each node), summed over the nodes, relative to the summed median;
- the plan of every ``--planners`` on every ``--devices`` count, planned on the same measured cluster:
  whether every run's profile gives the same plan (stages, devices, micro-batches and orders).
- where a cell's plan changed, what planning from another profile costs: each profile's plan priced
  by the simulator under every other profile, against that profile's own plan, the largest excess
  (``cross_regret``; a near-tie between plans shows as a few tenths of a percent).

Run it alone on a quiet machine: a profile taken beside other work measures the other work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fidelity_cpu  # noqa: E402
from benchmarks.cost_model_fidelity import planning_cluster, probe, signature  # noqa: E402
from gpp_solver import GppError, cluster_from_dict, load_cluster, simulate, solve  # noqa: E402
from gpp_solver.cost.model import interp_time  # noqa: E402
from gpp_solver.formats.graph import as_graph  # noqa: E402

MODELS = (
    "examples.real_models:two_tower@32,examples.real_models:bert_tiny@32,examples.sequential:bench@128,"
    "examples.real_models:resnet18@8,examples.real_models:clip_tiny@32"
)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=None, help=f"MODULE:FN@BATCH,... (default {MODELS})")
    ap.add_argument("--runs", type=int, default=3, help="profiles per model (>= 2)")
    ap.add_argument("--devices", default="2", help="device counts to plan for")
    ap.add_argument("--planners", default="graphpipe,pipedream,gpp")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--cluster", default=None, help="use this gpp-cluster/1 instead of probing")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--quick", action="store_true", help="one tiny model, 2 runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.models, args.runs, args.planners = "examples.sequential:workload@8", 2, "graphpipe"
    if args.runs < 2:
        ap.error("--runs: at least 2 profiles are needed to compare")
    try:
        args.specs = fidelity_cpu.model_specs(args.models or MODELS, None, False)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        args.device_counts = [int(x) for x in args.devices.split(",")]
    except ValueError:
        ap.error(f"--devices must be comma-separated integers, got {args.devices!r}")
    if any(n < 1 for n in args.device_counts):
        ap.error(f"--devices must be positive, got {args.devices!r}")
    # cpu_models reads these (the fidelity benchmark's arguments)
    args.fill_cores, args.backend, args.batch = "unused", "gloo", None
    return args


def one_device_time(g: dict, batch: int) -> float:
    """The cost model's iteration time of the whole model on one device at ``batch`` samples, one
    micro-batch: every node's forward and backward, their overheads, the optimizer step and the
    step's fixed work."""
    sizes, over = g["micro_batch_sizes"], g.get("op_overhead", {"fw": 0.0, "bw": 0.0})
    compute = sum(interp_time(n["fw_time"], sizes, batch) + interp_time(n["bw_time"], sizes, batch) for n in g["nodes"])
    weights = sum(n["weight_bytes"] for n in g["nodes"])
    step = g.get("optimizer_time_per_byte", 0.0) * weights + g.get("step_time_fixed", 0.0)
    return compute + len(g["nodes"]) * (over["fw"] + over["bw"]) + step


def node_deviation(graphs: list[dict], batch: int) -> float:
    """Largest ``|t / median - 1|`` of a node's forward + backward at ``batch`` over the runs, among
    the nodes that carry at least 1% of the model's time."""
    sizes = graphs[0]["micro_batch_sizes"]
    per_node = [
        [interp_time(n["fw_time"], sizes, batch) + interp_time(n["bw_time"], sizes, batch) for n in g["nodes"]]
        for g in graphs
    ]
    total = statistics.median(sum(ts) for ts in per_node)
    worst = 0.0
    for ts in zip(*per_node):
        med = statistics.median(ts)
        if med >= 0.01 * total:
            worst = max(worst, max(abs(t / med - 1) for t in ts))
    return worst


def within_run_spread(g: dict) -> float:
    """Summed (slowest - fastest) timed run over the nodes at the largest profiled size, relative to
    the summed median forward + backward there."""
    i = len(g["micro_batch_sizes"]) - 1
    spread = sum(hi - lo for n in g["nodes"] for k in ("fw", "bw") for lo, hi in [n["extra"]["time_spread"][k][i]])
    med = sum(n["fw_time"][i] + n["bw_time"][i] for n in g["nodes"])
    return spread / med if med else 0.0


def plans_of(g: dict, cluster, batch: int, args) -> dict[str, object]:
    """Each (planner, devices) cell's plan from one profile, or the one-line reason it has none."""
    out: dict[str, object] = {}
    graph = as_graph(g)
    for n in args.device_counts:
        cdoc = planning_cluster(cluster, n, "cpu")
        for planner in args.planners.split(","):
            try:
                out[f"{planner}@{n}"] = solve(
                    graph, cdoc, mini_batch_size=batch, planner=planner, time_limit=args.time_limit
                )
            except GppError as exc:
                out[f"{planner}@{n}"] = f"no plan: {str(exc).splitlines()[0]}"
    return out


def cross_regret(graphs: list[dict], plans: list[object], cluster_doc: dict) -> float | None:
    """What planning from another profile costs: the largest ``T_r(plan_s) / T_r(plan_r) - 1`` over
    the profiles ``r`` and ``s`` of one cell, each plan priced by the simulator under profile ``r``
    (0 when every profile gave the same plan; None when a profile gave none)."""
    if any(isinstance(p, str) for p in plans):
        return None
    cluster, worst = cluster_from_dict(cluster_doc), 0.0
    for g, own in zip(graphs, plans):
        graph = as_graph(g)
        base = simulate(own, graph, cluster).iteration_time
        for other in plans:
            if other is not own and signature(other) != signature(own):
                worst = max(worst, simulate(other, graph, cluster).iteration_time / base - 1)
    return worst


def run(args) -> list[dict]:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="profile-stability-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = load_cluster(args.cluster or probe(max(args.device_counts + [2]), "gloo", work, args.quick))
    rows = []
    for spec, batch in args.specs:
        graphs = []
        for r in range(args.runs):
            args.models = f"{spec}@{batch}"
            run_dir = work / f"run{r}"
            run_dir.mkdir(exist_ok=True)
            graphs.append(fidelity_cpu.cpu_models(args, run_dir)[0][1])
        times = [one_device_time(g, batch) for g in graphs]
        plans = [plans_of(g, cluster, batch, args) for g in graphs]
        sigs = [{k: v if isinstance(v, str) else signature(v) for k, v in p.items()} for p in plans]
        same = {k: all(s[k] == sigs[0][k] for s in sigs) for k in sigs[0]}
        regret = {
            k: cross_regret(graphs, [p[k] for p in plans], planning_cluster(cluster, int(k.split("@")[1]), "cpu"))
            for k in sigs[0]
        }
        rows.append(
            {
                "model": f"{spec}@{batch}",
                "runs": args.runs,
                "one_device_seconds": times,
                "spread": (max(times) - min(times)) / statistics.median(times),
                "node_deviation": node_deviation(graphs, batch),
                "within_run_spread": statistics.median(within_run_spread(g) for g in graphs),
                "same_plan": same,
                "cross_regret": regret,
            }
        )
    return rows


def table(rows: list[dict], args) -> str:
    lines = [
        f"profile stability: {args.runs} profiles per model, planners {args.planners} on "
        f"{args.devices} devices, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        "",
        "| model | one-device predicted ms (each run) | spread | worst node | within-run spread | "
        "same plan (if not: cost of another profile's plan) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        times = " / ".join(f"{t * 1e3:.2f}" for t in r["one_device_seconds"])
        same = ", ".join(
            f"{k} {'yes' if v else 'NO' + _regret(r['cross_regret'].get(k))}" for k, v in r["same_plan"].items()
        )
        lines.append(
            f"| {r['model']} | {times} | {r['spread']:.1%} | {r['node_deviation']:.1%} | "
            f"{r['within_run_spread']:.1%} | {same} |"
        )
    pairs = [v for r in rows for v in r["same_plan"].values()]
    regrets = [x for r in rows for x in r["cross_regret"].values() if x is not None]
    lines += [
        "",
        f"same plan from every profile: {sum(pairs)}/{len(pairs)} (model, planner, devices) cells; "
        f"largest one-device spread {max(r['spread'] for r in rows):.1%}; "
        f"largest cost of planning from another profile {max(regrets, default=0.0):+.1%}",
    ]
    return "\n".join(lines)


def _regret(x: float | None) -> str:
    """A changed cell's cost of planning from another profile, as the table shows it."""
    return "" if x is None else f" ({x:+.1%})"


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = run(args)
    print(table(rows, args))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
