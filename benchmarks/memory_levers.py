"""Memory levers on the paper's workloads: ``gpp`` with its levers (recomputation and the optimizer
state sharded, each ``auto``) against ``gpp`` without (both ``off``), with the memory cut below
what the unconstrained plan needs.

    python benchmarks/memory_levers.py                        # mmt, dlrm, candle-uno, transformer at 8 and 16 devices
    python benchmarks/memory_levers.py --models mmt --devices 8 --fractions 0.5

Workloads from ``gpp_solver.workloads.build_model`` at the paper's sizes on ``v100_cluster(n)``
(mini-batches as ``benchmarks/gpp_vs_spp.py``). Per model and device count: ``M0``, the peak of
``gpp``'s plan with unlimited memory (levers off), then at each fraction ``f`` of ``M0`` the plan
with levers and the plan without; simulated throughput (samples/s) of each, the stages that
recompute or shard, and the share of the throughput the cut cost that the levers won back,
``(with - without) / (unconstrained - without)`` (a cell where the plan without has none counts
its throughput as 0). Simulated under the cost model (``docs/cost-model.md``), so the figures
depend on the code alone when no search stops for time (the status column says).

Targets (issue's): every cell gets a plan with levers; never below the plan without; on average at
least half of what the cut costs won back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpp_solver import GppError, simulate, solve  # noqa: E402
from gpp_solver.formats.cluster import v100_cluster  # noqa: E402
from gpp_solver.workloads import build_model  # noqa: E402

PER_DEVICE = {"mmt": 16, "dlrm": 64, "candle-uno": 1024, "transformer": 16}
OFF = {"recompute": "off", "zero": "off"}


def _plan(graph, cluster, B: int, time_limit: float, **levers):
    try:
        plan = solve(graph, cluster, mini_batch_size=B, planner="gpp", time_limit=time_limit, **levers)
    except GppError as exc:
        return None, str(exc).splitlines()[0][:80]
    return plan, simulate(plan, graph, cluster).throughput


def cells(model: str, devices: int, fractions: list[float], time_limit: float) -> list[dict]:
    graph, cluster = build_model(model), v100_cluster(devices)
    B = PER_DEVICE[model] * devices
    free, free_tp = _plan(graph, replace(cluster, memory_bytes=1e15), B, time_limit, **OFF)
    if free is None:
        return [{"model": model, "devices": devices, "error": free_tp}]
    m0 = free.predicted.peak_memory_bytes
    rows = []
    for f in fractions:
        c = replace(cluster, memory_bytes=m0 * f)
        with_plan, with_tp = _plan(graph, c, B, time_limit)
        without_plan, without_tp = _plan(graph, c, B, time_limit, **OFF)
        row = {"model": model, "devices": devices, "fraction": f, "unconstrained": free_tp}
        row["with"] = with_tp if with_plan is not None else None
        row["without"] = without_tp if without_plan is not None else None
        row["status"] = "/".join(p.search.status.value for p in (with_plan, without_plan) if p is not None)
        if with_plan is not None:
            row["recompute"] = [s.id for s in with_plan.stages if s.recompute]
            row["zero"] = [s.id for s in with_plan.stages if s.zero]
            base = row["without"] or 0.0
            row["won_back"] = (with_tp - base) / (free_tp - base) if free_tp > base else None
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    out = [
        "| model | devices | memory | unconstrained | without levers | with levers | won back | recompute | zero | status |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['model']} | {r['devices']} | | {r['error']} | | | | | | |")
            continue

        def tp(x):
            return "no plan" if x is None else f"{x:.1f}"

        won = "" if r.get("won_back") is None else f"{r['won_back']:.2f}"
        out.append(
            f"| {r['model']} | {r['devices']} | {r['fraction']:.0%} | {r['unconstrained']:.1f} | {tp(r['without'])} | "
            f"{tp(r['with'])} | {won} | {r.get('recompute', '')} | {r.get('zero', '')} | {r['status']} |"
        )
    planned = [r for r in rows if "error" not in r]
    worse = [r for r in planned if r["with"] is not None and r["without"] is not None and r["with"] < r["without"]]
    gained = [r["won_back"] for r in planned if r.get("won_back") is not None]
    out.append("")
    out.append(
        f"cells {len(planned)}; with levers a plan in {sum(r['with'] is not None for r in planned)}, without in "
        f"{sum(r['without'] is not None for r in planned)}; with below without in {len(worse)}; "
        f"mean won back {statistics.mean(gained) if gained else float('nan'):.2f}"
    )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mmt,dlrm,candle-uno,transformer")
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--fractions", default="0.7,0.5,0.35")
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args(argv)
    fractions = [float(x) for x in args.fractions.split(",") if x]
    rows = []
    for model in args.models.split(","):
        if model not in PER_DEVICE:
            ap.error(f"--models: unknown model {model!r}; one of {', '.join(PER_DEVICE)}")
        for n in args.devices:
            rows += cells(model, n, fractions, args.time_limit)
            print(f"{model} at {n} devices done", file=sys.stderr, flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
