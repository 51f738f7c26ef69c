"""Re-run the measured figures of docs/results.md that do not depend on the machine, and check they still hold.

    python benchmarks/check_results.py              # the cheap cells (seconds): fast planners, 4 and 8 devices
    python benchmarks/check_results.py --full       # every cell of both tables, gpp and piper too (minutes)
    python benchmarks/check_results.py --list       # what is checked, and what is not (timings, benchmarks)

What a plan looks like and what the simulator predicts for it (micro-batch size, stages, depth,
devices used, TPS, simulated throughput) depend only on the code, not on the machine's speed, as
long as the planner finished (status not ``time-limit``).  This script reads the two tables of
``docs/results.md`` made of such figures, re-plans their cells and compares:

* **Search time of the GraphPipe planner** (``benchmarks/search_time.py``): the plan columns of the
  default ``graphpipe`` (``b``, stages, depth, devices used exactly; TPS and throughput within
  ``--rtol``).  The timing columns are not checked (they depend on the machine and its load).
* **Graph vs sequential pipelines** (``benchmarks/gpp_vs_spp.py``): each planner's simulated
  throughput (within ``--rtol``) or its status (``search-space-too-large``).  By default only the
  planners that take well under a second (``graphpipe``, ``graphpipe Alg. 1``, ``pipedream``,
  ``pipedream-2bw``, ``alpa``) at 4 and 8 devices; ``--full`` adds ``gpp`` and ``piper`` and every
  device count (their cells may end ``time-limit`` on a loaded machine: such a cell is reported, not
  failed).  Search seconds and their ratios are not checked.

The other measured figures (the optimality gap, CP-SAT tightening, the runtime) are benchmarks:
``docs/results.md`` names the command and the commit that produced them; they are not re-run here.

Exit 0 when every checked figure holds, 1 otherwise (each difference printed).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results.md"
sys.path.insert(0, str(Path(__file__).resolve().parent))

CHEAP = ("graphpipe", "graphpipe Alg. 1", "pipedream", "pipedream-2bw", "alpa")
CHEAP_DEVICES = (4, 8)


def table_after(text: str, marker: str) -> list[dict[str, str]]:
    """The first markdown table after the line containing ``marker``, as one dict per row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if marker in line)
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    head, body = rows[0], [r for r in rows[2:]]
    return [dict(zip(head, r)) for r in body]


def close(a: float, b: float, rtol: float) -> bool:
    return math.isclose(a, b, rel_tol=rtol)


def wanted_cell(model: str, devices: int, full: bool, only: list[str] | None) -> bool:
    if only is not None:
        return f"{model}:{devices}" in only
    return full or devices in CHEAP_DEVICES


def check_search_time(text: str, rtol: float, full: bool, only: list[str] | None = None) -> list[str]:
    from search_time import PER_DEVICE

    from gpp_solver.formats.cluster import v100_cluster
    from gpp_solver.planners.graphpipe.planner import plan_graphpipe
    from gpp_solver.workloads import build_model

    bad = []
    for row in table_after(text, "python benchmarks/search_time.py"):
        model, d = row["model"], int(row["GPUs"])
        if not wanted_cell(model, d, full, only):
            continue
        B = int(row["B"])
        assert B == PER_DEVICE[model] * d, (model, d, B)
        plan = plan_graphpipe(build_model(model), v100_cluster(d), B, progress=False)
        got = {
            "b": str(plan.stages[0].micro_batch_size),
            "stages": str(len(plan.stages)),
            "depth": str(plan.depth),
            "devices used": str(plan.devices_used),
        }
        for k, v in got.items():
            if row[k] != v:
                bad.append(f"search_time {model} {d}: {k} results {row[k]} now {v}")
        for k, v in (
            ("TPS (s)", plan.predicted.time_per_sample),
            ("throughput (samples/s)", plan.predicted.throughput),
        ):
            if not close(float(row[k]), v, rtol):
                bad.append(f"search_time {model} {d}: {k} results {row[k]} now {v:.6g}")
        print(f"search_time {model:10s} {d:3d}: checked", file=sys.stderr)
    return bad


def check_gpp_vs_spp(text: str, rtol: float, full: bool, only: list[str] | None = None) -> list[str]:
    from gpp_vs_spp import run

    bad = []
    for row in table_after(text, "python benchmarks/gpp_vs_spp.py"):
        m = re.fullmatch(r"(\S+)(?: \((\d+) branches\))?", row["workload"])
        model, branches = m.group(1), m.group(2)
        d = int(row["devices"])
        if not wanted_cell(row["workload"].replace(" ", ""), d, full, only):
            continue
        planners = [c[: -len(" tput (s)")] for c in row if c.endswith(" tput (s)")]
        wanted = [p for p in planners if full or p in CHEAP]
        params = {"branches": int(branches)} if branches else {}
        t0 = time.perf_counter()
        rows = run(model, d, [p for p in wanted if p != "graphpipe Alg. 1"] or ["graphpipe"], 60.0, **params)
        for p in wanted:
            cell = row[f"{p} tput (s)"]
            listed = cell.split(" (")[0]
            r = rows.get(p)
            if r is None:
                continue
            if r.status == "time-limit":
                print(
                    f"gpp_vs_spp {row['workload']} {d} {p}: time-limit on this machine, not compared", file=sys.stderr
                )
                continue
            if r.throughput is None:
                if listed != r.status:
                    bad.append(f"gpp_vs_spp {row['workload']} {d} {p}: results {listed} now {r.status}")
            elif not re.fullmatch(r"[0-9.e+]+", listed) or not close(float(listed), r.throughput, rtol):
                bad.append(f"gpp_vs_spp {row['workload']} {d} {p}: results {listed} now {r.throughput:.4g}")
        print(
            f"gpp_vs_spp {row['workload']:24s} {d:3d}: checked {', '.join(wanted)} in {time.perf_counter() - t0:.1f} s",
            file=sys.stderr,
        )
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every cell, gpp and piper included (minutes)")
    ap.add_argument(
        "--rtol",
        type=float,
        default=2e-3,
        help="relative tolerance of TPS and throughput (default 2e-3: the tables print 4 digits)",
    )
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="MODEL:DEVICES",
        default=None,
        help="only these cells, e.g. mmt:4 'candle-uno(2branches):16' (default: all cheap ones)",
    )
    ap.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="the results page to check (default: this checkout's docs/results.md)",
    )
    ap.add_argument("--list", action="store_true", help="print what is checked and exit")
    args = ap.parse_args(argv)
    if args.list:
        print(__doc__)
        return 0
    text = args.results.read_text()
    bad = check_search_time(text, args.rtol, args.full, args.only) + check_gpp_vs_spp(
        text, args.rtol, args.full, args.only
    )
    for line in bad:
        print("DIFFERS:", line)
    print(f"{'all checked figures hold' if not bad else f'{len(bad)} figures differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
