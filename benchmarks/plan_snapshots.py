"""Plan a fixed set of instances with every planner and write each plan's JSON (timing fields removed)
to one directory, so that two checkouts' plans can be compared file by file (``diff -r``).

    python benchmarks/plan_snapshots.py OUT_DIR [--only SUBSTRING]

Instances: the paper's workloads (mmt, dlrm, candle-uno, transformer) on 4, 8 and 16 V100s with the
heuristic planners; tiny graphs on 2 and 4 devices with every planner (exact ones included); PipeDream
profiles (alexnet, gnmt) on 4 and 8 devices.  Every planner gets a time limit of
:data:`TIME_LIMIT` seconds.  A planner that refuses an instance writes its error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from tiny_graphs import chain_dict, diamond_dict  # noqa: E402

from gpp_solver import solve  # noqa: E402
from gpp_solver.errors import GppError  # noqa: E402
from gpp_solver.formats.graph import graph_from_dict  # noqa: E402
from gpp_solver.formats.importers import import_pipedream  # noqa: E402
from gpp_solver.formats.plan_json import plan_to_dict  # noqa: E402
from gpp_solver.workloads import build_model  # noqa: E402

HEURISTIC = ("gpp", "graphpipe", "pipedream", "pipedream-2bw", "piper", "alpa")
EVERY = HEURISTIC + ("milp", "exact")
#: generous, so that no planner's result depends on the machine's load (gpp's default is a few seconds)
TIME_LIMIT = 600.0
DATA = ROOT / "data"  # the published profiles (data/README.md)


def _strip(v):
    """The plan's record without what depends on the clock."""
    if isinstance(v, dict):
        return {
            k: _strip(x)
            for k, x in v.items()
            if not isinstance(k, str)
            or not (
                k == "seconds"
                or k.endswith("_seconds")
                or k.endswith("_s")
                or "elapsed" in k
                or k.startswith("time_")
                and k != "time_per_sample"
            )
        }
    if isinstance(v, list):
        return [_strip(x) for x in v]
    return v


def instances():
    for model in ("mmt", "dlrm", "candle-uno", "transformer"):
        g = build_model(model)
        for d in (4, 8, 16):
            yield f"{model}@{d}", g, f"v100:{d}", HEURISTIC
    tiny = {"diamond": diamond_dict(), "chain6": chain_dict(6, [1.0, 2.0, 1.5, 3.0, 1.0, 2.5])}
    for name, doc in tiny.items():
        g = graph_from_dict(doc)
        for d in (2, 4):
            yield f"{name}@{d}", g, f"v100:{d}", EVERY
    for name in ("alexnet", "gnmt"):
        g = import_pipedream(DATA / "pipedream" / f"{name}.graph.txt", batch_size=1)
        for d in (4, 8):
            yield f"pd-{name}@{d}", g, f"v100:{d}", HEURISTIC


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, g, cluster, planners in instances():
        for planner in planners:
            key = f"{name}-{planner}"
            if args.only not in key:
                continue
            t = time.perf_counter()
            try:
                doc = _strip(plan_to_dict(solve(g, cluster, planner=planner, time_limit=TIME_LIMIT)))
            except GppError as e:
                doc = {"error": type(e).__name__, "message": str(e)}
            (args.out / f"{key}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            print(f"{key}: {time.perf_counter() - t:.2f} s", flush=True)


if __name__ == "__main__":
    main()
