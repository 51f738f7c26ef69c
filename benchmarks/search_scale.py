"""Search time and peak memory of every planner against operators and devices, with growth exponents.

    python benchmarks/search_scale.py --quick                 # a small subset (minutes)
    python benchmarks/search_scale.py --timeout 120 --plot scale.png   # the full grid (hours)
    python benchmarks/search_scale.py --planners gpp,graphpipe --devices 8,64 --workloads transformer-12,mmt-4x4
    python benchmarks/search_scale.py --planners gpp,graphpipe --devices 64,1024 \
        --workloads transformer-333,transformer-3333,mmt-25x66 --time-limit 20 --timeout 300   # large graphs
    python benchmarks/search_scale.py --planners gpp,graphpipe --devices 64,1024 \
        --workloads mmt-25x66,graph-out/gpt2_deep.json --time-limit 5,20,120 --timeout 400   # a limit sweep

Workloads (operators = graph nodes): ``transformer-L`` (``build_model("transformer", layers=L)``,
12..96 layers: 38..290 nodes), ``mmt-BxL`` (B branches of L layers: 4x4 .. 16x16), and PipeDream's
published profiles under the repository's ``data/pipedream`` (``pd-NAME``, e.g. ``pd-inception_v3``,
``pd-nasnetalarge``: NASNet-A large, 1,251 operators; see ``data/README.md``) or
``pd-/path/to/x.graph.txt`` for a profile elsewhere (batch size 128 as the profiles were taken), and
``graph-/path/to/graph.json`` for a ``gpp-graph/1`` file (e.g. a model ``gpp_runtime.profile`` traced;
its label is the file's name).  Cluster:
``v100_cluster(D)`` (4 GPUs of 16 GiB per node).  Mini-batch ``B = 16 * D``, at least 64.

Each cell (workload, devices, planner, time limit: ``--time-limit`` takes several) runs in its own subprocess (a fresh interpreter, so one
cell's memory cannot leak into the next) under ``--timeout`` seconds and the planner's own
``--time-limit``; it reports the planner's wall seconds and the process's peak resident memory
(``resource.getrusage``, interpreter and imports included: about 100 MB is the floor), the plan's
predicted throughput (mini-batch over predicted iteration time, samples/s), and ``over``: seconds
past the time limit; the cells that return later than the limit + max(1 s, 5%) are listed.  Statuses:
the plan's ``search.status``, ``timeout`` (killed), ``error: ...`` (e.g. a planner refusing the
size).  The growth exponent is the least-squares slope of log(seconds) on log(operators) (per
planner and device count) and on log(devices) (per planner and workload), over finished cells.
Figures depend on the machine's load: measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

DATA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "pipedream"))
PLANNERS = ("gpp", "graphpipe", "pipedream", "pipedream-2bw", "alpa", "piper", "milp", "exact")
FULL_WORKLOADS = (
    "transformer-12",
    "transformer-24",
    "transformer-48",
    "transformer-96",
    "mmt-4x4",
    "mmt-8x8",
    "mmt-16x16",
    "pd-inception_v3",
    "pd-nasnetalarge",
)
FULL_DEVICES = (8, 32, 128, 512, 1024)
QUICK_WORKLOADS = ("transformer-12", "transformer-24", "mmt-4x4")
QUICK_DEVICES = (8, 32)
QUICK_PLANNERS = ("graphpipe", "pipedream", "gpp")


def pd_path(name: str) -> str:
    """The profile file of ``pd-NAME`` (a name under ``DATA``) or ``pd-/a/path`` (a path as given)."""
    rest = name[3:]
    return rest if os.sep in rest else os.path.join(DATA, rest + ".graph.txt")


def label(name: str) -> str:
    """The workload's name in tables: ``pd-/some/dir/nasnetalarge.graph.txt`` reads ``pd-nasnetalarge``."""
    if name.startswith("pd-") and os.sep in name:
        return "pd-" + os.path.basename(name).split(".")[0]
    if name.startswith("graph-"):
        return os.path.basename(name[6:]).split(".")[0]
    return name


def workload_error(name: str) -> str | None:
    """Why ``name`` is not a workload this script knows (``None`` when it is)."""
    import re

    if re.fullmatch(r"transformer-[1-9][0-9]*", name) or re.fullmatch(r"mmt-[1-9][0-9]*x[1-9][0-9]*", name):
        return None
    if name.startswith("pd-"):
        return None if os.path.exists(pd_path(name)) else f"no profile file {pd_path(name)!r} for workload {name!r}"
    if name.startswith("graph-"):
        return None if os.path.isfile(name[6:]) else f"no graph file {name[6:]!r} for workload {name!r}"
    return f"unknown workload {name!r} (transformer-L, mmt-BxL, pd-NAME, pd-/path/to/x.graph.txt or graph-/path/to/graph.json)"


def build_workload(name: str):
    from gpp_solver.workloads import build_model

    if name.startswith("transformer-"):
        return build_model("transformer", layers=int(name.split("-")[1]))
    if name.startswith("mmt-"):
        branches, layers = name.split("-")[1].split("x")
        return build_model("mmt", branches=int(branches), layers=int(layers))
    if name.startswith("pd-"):
        from gpp_solver.formats.pipedream import import_pipedream

        return import_pipedream(pd_path(name), batch_size=128)
    if name.startswith("graph-"):
        from gpp_solver.formats.graph import load_graph

        return load_graph(name[6:])
    raise SystemExit(f"unknown workload {name!r}")


def run_cell(workload: str, devices: int, planner: str, time_limit: float) -> dict:
    """Run one cell in this process (the child side) and return its figures."""
    import resource

    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.planners.registry import get_planner

    graph = build_workload(workload)
    B = max(64, 16 * devices)
    out = {"workload": workload, "devices": devices, "planner": planner, "operators": len(graph.nodes)}
    t0 = time.perf_counter()
    try:
        plan = get_planner(planner)(graph, v100_cluster(devices), B, time_limit=time_limit)
        it = plan.predicted.iteration_time
        out.update(status=plan.search.status, iteration_time=it, throughput=B / it if it > 0 else math.nan)
    except Exception as exc:  # noqa: BLE001 - recorded, the grid goes on
        out["status"] = f"error: {type(exc).__name__}"
    out["seconds"] = time.perf_counter() - t0
    out["time_limit"] = time_limit
    out["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def cell_subprocess(workload: str, devices: int, planner: str, time_limit: float, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--cell", workload, str(devices), planner, str(time_limit)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {
            "workload": workload,
            "devices": devices,
            "planner": planner,
            "status": "timeout",
            "seconds": timeout,
            "peak_mb": math.nan,
            "operators": None,
        }
    last = r.stdout.strip().splitlines()[-1:] or [""]
    try:
        return json.loads(last[0])
    except json.JSONDecodeError:
        return {
            "workload": workload,
            "devices": devices,
            "planner": planner,
            "operators": None,
            "status": f"crashed (exit {r.returncode}): {r.stderr.strip()[-120:]}",
            "seconds": math.nan,
            "peak_mb": math.nan,
        }


def slope(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log(y) on log(x); ``None`` with fewer than two distinct x."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)


def finished(r: dict) -> bool:
    return not str(r["status"]).startswith(("timeout", "error", "crashed")) and r.get("operators")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"a small subset: {', '.join(QUICK_WORKLOADS)} on {QUICK_DEVICES} devices, {', '.join(QUICK_PLANNERS)}",
    )
    ap.add_argument("--workloads", help="comma-separated workload names")
    ap.add_argument("--devices", help="comma-separated device counts")
    ap.add_argument("--planners", help="comma-separated planner names")
    ap.add_argument(
        "--time-limit", default="60", help="each planner's own time limit (s); comma-separated: a sweep over limits"
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="kill a cell after this many seconds")
    ap.add_argument("--plot", help="write a log-log plot (PNG) of seconds against operators and devices")
    ap.add_argument("--json", help="write every cell's figures here")
    ap.add_argument("--cell", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.cell:
        w, d, p, tl = a.cell
        bad = workload_error(w)
        if bad:
            ap.error(bad)
        if p not in PLANNERS:
            ap.error(f"unknown planner {p!r} (one of {', '.join(PLANNERS)})")
        try:
            d, tl = int(d), float(tl)
        except ValueError:
            ap.error(f"--cell takes WORKLOAD DEVICES PLANNER TIME_LIMIT, got {' '.join(a.cell)!r}")
        if d < 1 or not tl > 0:
            ap.error(f"--cell needs positive devices and time limit, got {d} and {tl}")
        from gpp_solver.errors import InvalidInputError

        try:
            print(json.dumps(run_cell(w, d, p, tl)))
        except InvalidInputError as exc:  # a graph file that is not a gpp graph
            ap.error(str(exc))
        return
    if a.workloads:  # given: every one must be known (exit 2 otherwise)
        workloads = a.workloads.split(",")
        bad = [e for e in map(workload_error, workloads) if e]
        if bad:
            ap.error(bad[0])
    else:  # the default grid: PipeDream profiles that are not here are left out
        workloads = [w for w in (QUICK_WORKLOADS if a.quick else FULL_WORKLOADS) if workload_error(w) is None]
    try:
        devices = (
            [int(x) for x in a.devices.split(",")] if a.devices else list(QUICK_DEVICES if a.quick else FULL_DEVICES)
        )
    except ValueError:
        ap.error(f"--devices must be comma-separated integers, got {a.devices!r}")
    if any(d < 1 for d in devices):
        ap.error(f"--devices must be positive, got {a.devices!r}")
    try:
        limits = [float(x) for x in a.time_limit.split(",")]
    except ValueError:
        ap.error(f"--time-limit must be comma-separated seconds, got {a.time_limit!r}")
    if not all(t > 0 for t in limits):
        ap.error(f"--time-limit must be positive, got {a.time_limit!r}")
    planners = a.planners.split(",") if a.planners else list(QUICK_PLANNERS if a.quick else PLANNERS)
    unknown = [p for p in planners if p not in PLANNERS]
    if unknown:
        ap.error(f"unknown planner {unknown[0]!r} (one of {', '.join(PLANNERS)})")
    rows = []
    print(
        f"{'workload':18} {'ops':>5} {'D':>5} {'planner':14} {'limit':>6} {'seconds':>8} {'over':>6} {'samples/s':>10} "
        f"{'peak MB':>8}  status",
        flush=True,
    )
    for w in workloads:
        for d in devices:
            for p in planners:
                for tl in limits:
                    r = cell_subprocess(w, d, p, tl, a.timeout)
                    r["time_limit"] = tl
                    rows.append(r)
                    over = r["seconds"] - tl
                    print(
                        f"{label(w):18} {r.get('operators') or '':>5} {d:>5} {p:14} {tl:6g} {r['seconds']:8.2f} "
                        f"{over if over > 0 else 0:6.2f} {r.get('throughput', math.nan):10.1f} "
                        f"{r['peak_mb']:8.0f}  {r['status']}",
                        flush=True,
                    )
    late = [r for r in rows if r["seconds"] > r["time_limit"] + max(1.0, 0.05 * r["time_limit"])]
    print(
        f"\ncells past the time limit + max(1 s, 5%): {len(late)} of {len(rows)}"
        + "".join(
            f"\n  {label(r['workload'])} D={r['devices']} {r['planner']} limit {r['time_limit']:g}: {r['seconds']:.1f} s"
            for r in late
        )
    )
    longest = [r for r in rows if r["time_limit"] == max(limits)]  # growth and plot: the longest limit's cells
    print("\ngrowth exponents (seconds ~ x^k, least squares on log-log, finished cells only)")
    for p in planners:
        for d in devices:
            c = [r for r in longest if r["planner"] == p and r["devices"] == d and finished(r)]
            k = slope([r["operators"] for r in c], [r["seconds"] for r in c])
            if k is not None:
                print(f"  {p:14} D={d:<5} vs operators: k = {k:.2f}  ({len(c)} cells)")
        for w in workloads:
            c = [r for r in longest if r["planner"] == p and r["workload"] == w and finished(r)]
            k = slope([r["devices"] for r in c], [r["seconds"] for r in c])
            if k is not None:
                print(f"  {p:14} {label(w):18} vs devices: k = {k:.2f}  ({len(c)} cells)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
        for p in planners:
            c = sorted(
                (r for r in longest if r["planner"] == p and r["devices"] == max(devices) and finished(r)),
                key=lambda r: r["operators"],
            )
            ax1.plot([r["operators"] for r in c], [r["seconds"] for r in c], "o-", label=p)
            c = sorted(
                (r for r in longest if r["planner"] == p and r["workload"] == workloads[-1] and finished(r)),
                key=lambda r: r["devices"],
            )
            ax2.plot([r["devices"] for r in c], [r["seconds"] for r in c], "o-", label=p)
        for ax, xl, t in ((ax1, "operators", f"D = {max(devices)}"), (ax2, "devices", label(workloads[-1]))):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(xl)
            ax.set_ylabel("search seconds")
            ax.set_title(t)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=120)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
