"""Benchmark: re-price the measured ranks of a fidelity run with the current memory rule.

    python benchmarks/fidelity_heldout.py --set dev --workdir out/dev   # trains, keeps its files
    python benchmarks/reprice_memory.py out/dev                           # no training

A run of ``benchmarks/fidelity_heldout.py`` with ``--workdir`` keeps,
per trained plan, its graph, cluster and plan files and each training run's metrics (every rank's
measured peak). Memory does not depend on the host's speed, so a change to the memory rule can be
judged on those measured peaks without training again: each rank's prediction is re-computed with
the cost model of this checkout (``order_memory``: the stage's order, the plan's stages, the
cluster the plan was made for) and set beside its measured peak, apart per set of models (the part
of the label before ``:``: ``dev``, ``held-out``, ...), against the targets of ``fidelity_heldout``
(no rank above 1.05x its prediction, no prediction above 1.25x the measurement). A change judged
here on the development set must still be measured again on the held-out set: re-pricing old
measurements of the held-out seeds while changing the rule would tune on them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpp_solver.cost.memory import order_memory  # noqa: E402
from gpp_solver.formats.cluster import cluster_from_dict  # noqa: E402
from gpp_solver.formats.graph import graph_from_dict  # noqa: E402
from gpp_solver.formats.plan_json import plan_from_dict  # noqa: E402


def repriced(work: Path) -> list[dict]:
    """One row per measured rank of ``work``: label, stage, micro-batch, micro-batches a step,
    replicas, the order, measured and recorded and re-computed predictions."""
    graphs: dict[str, object] = {}
    rows = []
    for metrics in sorted(work.glob("metrics-*-run0.json")):
        label = metrics.name[len("metrics-") : -len("-run0.json")]  # MODEL-LIMIT-DEVICES-PLANNER
        parts = label.rsplit("-", 3)
        if len(parts) != 4:  # not a fidelity_heldout label
            continue
        model, limit, devices, _planner = parts
        plan_path, cluster_path = work / f"plan-{label}.json", work / f"cluster-{model}-{limit}-{devices}.json"
        if not plan_path.exists() or not cluster_path.exists():
            continue
        if model not in graphs:
            graphs[model] = graph_from_dict(json.loads((work / f"graph-{model}.json").read_text()))
        graph = graphs[model]
        cluster = cluster_from_dict(json.loads(cluster_path.read_text()))
        plan = plan_from_dict(json.loads(plan_path.read_text()))
        for r in json.loads(metrics.read_text()).get("ranks", []):
            s = plan.stages[r["stage"]]
            now = order_memory(graph, cluster, s, s.schedule.order, plan.stages)
            rows.append(
                {
                    "set": model.split(":")[0],
                    "plan": label,
                    "rank": r["rank"],
                    "stage": r["stage"],
                    "micro_batch": s.micro_batch_size,
                    "micro_batches": plan.mini_batch_size // s.micro_batch_size,
                    "replicas": len(s.devices),
                    "order": " ".join(f"{a.kind}{a.micro_batch}" for a in s.schedule.order[:8]),
                    "measured": r["peak_memory_bytes"],
                    "recorded": r["predicted_peak_memory_bytes"],
                    "repriced": now,
                    "limit": cluster.memory_bytes,
                }
            )
    return rows


def report(rows: list[dict], shown: int) -> str:
    out = []
    for name in sorted({r["set"] for r in rows}):
        mine = [r for r in rows if r["set"] == name]
        for key in ("recorded", "repriced"):
            ratios = sorted(r["measured"] / r[key] for r in mine)
            over = sum(x > 1.05 for x in ratios)
            under = sum(x < 0.8 for x in ratios)
            out.append(
                f"{name}: {len(mine)} ranks, measured / {key} prediction {ratios[0]:.3f}-{ratios[-1]:.3f}; "
                f"above 1.05: {over}; below 0.8 (prediction above 1.25x): {under}"
            )
        over_limit = sum(r["measured"] > r["limit"] for r in mine)
        out.append(f"{name}: ranks above the limit their plan was made for: {over_limit}")
        ends = sorted(mine, key=lambda r: r["measured"] / r["repriced"])
        for r in ends[:shown] + ends[-shown:]:
            out.append(
                f"  {r['measured'] / r['repriced']:.3f} (recorded {r['measured'] / r['recorded']:.3f}) {r['plan']} "
                f"stage {r['stage']}: b={r['micro_batch']} n={r['micro_batches']} d={r['replicas']} {r['order']}"
            )
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workdir", help="a fidelity run's --workdir")
    ap.add_argument("--show", type=int, default=3, help="ranks shown at each end of the ratios (default 3)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    if not work.is_dir():
        print(f"error: {work} is not a directory", file=sys.stderr)
        return 2
    rows = repriced(work)
    if not rows:
        print(f"error: {work} holds no metrics-*-run0.json with its plan and cluster", file=sys.stderr)
        return 2
    print(report(rows, args.show))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
