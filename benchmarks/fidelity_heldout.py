"""Benchmark: do predictions hold on models the project has never seen, from roomy memory to the
tightest a planner solves?

    # the held-out seeds (evaluated, never tuned on), 2 CPU ranks
    python benchmarks/fidelity_heldout.py --set held-out --json out/heldout.json
    # the development seeds (may be looked at and tuned on)
    python benchmarks/fidelity_heldout.py --set dev

Models: ``benchmarks/model_suite.py``'s seeds (``--set``, or ``--seeds 3,1004``), each at its drawn
mini-batch, and with ``--set calibration`` or ``all`` the eight models the cost model was calibrated
on (``benchmarks/fidelity_cpu.py``); each set is reported apart. As README's CPU recipe does: ``gpp_runtime.profile --concurrent <cores> --threads 1``, one
``gpp_runtime.probe``, then per model and memory limit every planner of ``--planners`` plans on 1 and 2
devices, and each distinct plan trains ``--repeats`` times (rounds over all plans; its time is the
median run) with ``--graph --cluster --optimizer adam`` (the optimizer the cluster's state factor
4 prices), one pinned thread per rank; with ``--precision`` both profile and train in it.

Memory limits: the probe's (roomy), then ``--levels`` limits from the tightest memory ``gpp``
solves on 2 devices (a bisection) up to ``M1``, evenly on a log scale, ``M1`` the predicted peak of
``gpp``'s one-device plan with roomy memory (or ``M1 * f`` for each ``f`` of ``--fractions``); the
levels stop at the first that no planner solves, so plans with one micro-batch and with many,
pipelines and data parallelism are all measured.

Targets (per run, reported apart for each set):

- memory: no rank's measured peak above 1.05x its prediction, none above the limit its plan was
  made for, no prediction above 1.25x the measurement;
- time: each plan's measured / predicted within 10% of the run's median ratio for >= 80% of plans
  (the median ratio and the absolute errors beside it);
- ranking: >= 90% of pairs of one model predicted > 10% apart in the measured order;
- the default planner (``gpp``) at each memory limit at most 1.10x the best measured plan of any
  planner at that limit.
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

from benchmarks import cost_model_fidelity as cmf  # noqa: E402
from benchmarks import fidelity_cpu, model_suite  # noqa: E402
from gpp_solver import GppError, load_cluster, save_plan, simulate, solve  # noqa: E402
from gpp_solver.formats.cluster import cluster_from_dict  # noqa: E402
from gpp_solver.formats.graph import as_graph, graph_to_dict  # noqa: E402

PLANNERS = "gpp,graphpipe,pipedream,alpa"
#: gpp_runtime's precisions (gpp_runtime.capture.precision.PRECISIONS; named here so --help needs no torch)
PRECISION_CHOICES = ("float32", "bf16-autocast", "fp16-autocast", "bf16-model")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--set",
        choices=("dev", "held-out", "both", "calibration", "all"),
        default="held-out",
        help="the suite's dev or held-out seeds, both, the eight models the cost model was calibrated on "
        "(calibration), or all three (reported apart)",
    )
    ap.add_argument("--seeds", default=None, help="comma-separated seeds instead of --set")
    ap.add_argument(
        "--models",
        default=None,
        help="comma-separated MODULE:FUNCTION@BATCH models instead of --set (reported as the set 'extra')",
    )
    ap.add_argument(
        "--planners",
        default=PLANNERS,
        help=f"comma-separated planners (default {PLANNERS}); NAME@recompute=off (or on) passes solve's recompute",
    )
    ap.add_argument(
        "--levels",
        type=int,
        default=4,
        help="memory limits below roomy: from the tightest gpp solves up to M1, evenly on a log scale",
    )
    ap.add_argument("--fractions", default="", help="memory limits below roomy as fractions of M1 instead of --levels")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=1.5)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--cluster", default=None, help="a probed gpp-cluster/1 instead of probing")
    ap.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default="float32",
        help="profile and train every model in this precision (gpp_runtime's --precision; default float32)",
    )
    ap.add_argument(
        "--plan-only",
        action="store_true",
        help="profile and plan, train nothing: per memory limit and device count, gpp's predicted "
        "iteration over the best other planner's",
    )
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        args.seed_list = _seeds(args)
        args.fraction_list = [float(f) for f in args.fractions.split(",") if f]
    except ValueError as exc:
        ap.error(str(exc))
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.levels < 1:
        ap.error(f"--levels must be >= 1, got {args.levels}")
    # what cost_model_fidelity's helpers read
    args.mode, args.backend, args.fill_cores, args.quick = "cpu", "gloo", "unused", False
    args.steps, args.warmup_steps, args.batch = 6, 3, None
    args.device_counts = [1, 2]
    # the optimizer the ranks train with, and the precision
    args.profile_flags = ["--optimizer", "adam", "--precision", args.precision]
    return args


def _seeds(args) -> list[tuple[str, str, str, int]]:
    """``(set name, label, MODULE:FUNCTION, mini-batch)`` per model."""
    if args.models:
        out = []
        for entry in args.models.split(","):
            spec, _, batch = entry.partition("@")
            if ":" not in spec or not batch.isdigit():
                raise ValueError(f"--models: expected MODULE:FUNCTION@BATCH, got {entry!r}")
            out.append(("extra", f"extra:{_label(spec)}", spec, int(batch)))
        return out
    if args.seeds:
        seeds = []
        for s in args.seeds.split(","):
            if not s.strip().isdigit():
                raise ValueError(f"--seeds: expected whole numbers, got {s!r}")
            seeds.append(int(s))
        return [_suite_entry("held-out" if s in model_suite.HELD_OUT_SEEDS else "dev", s) for s in seeds]
    names = {"both": ("dev", "held-out"), "all": ("calibration", "dev", "held-out")}.get(args.set, (args.set,))
    out = []
    for name in names:
        if name == "calibration":  # the eight models the cost model was calibrated on (fidelity_cpu)
            out += [(name, f"{name}:{_label(spec)}", spec, b) for spec, b in fidelity_cpu.CPU_MODELS]
        else:
            seeds = model_suite.DEV_SEEDS if name == "dev" else model_suite.HELD_OUT_SEEDS
            out += [_suite_entry(name, s) for s in seeds]
    return out


def _label(spec: str) -> str:
    """A calibration model's label: its module's last part and its function (``two_branch.bench``;
    two of the eight are ``bench``, and each label names its own graph and plan files)."""
    module, fn = spec.split(":")
    return f"{module.rsplit('.', 1)[-1]}.{fn}"


def _suite_entry(name: str, seed: int) -> tuple[str, str, str, int]:
    ((spec, batch),) = model_suite.specs([seed])
    return name, f"{name}:{seed}", spec, batch


def _cluster(measured, devices: int, memory: float) -> dict:
    return dict(cmf.planning_cluster(measured, devices, "cpu"), memory_bytes=memory)


def _solve(graph, cdoc: dict, batch: int, planner: str, time_limit: float):
    """``planner``'s plan, or its one-line refusal; ``NAME@recompute=CHOICE`` passes the option."""
    name, _, option = planner.partition("@")
    options = {}
    if option:
        key, _, value = option.partition("=")
        options[key] = value
    try:
        return solve(graph, cdoc, mini_batch_size=batch, planner=name, time_limit=time_limit, **options)
    except GppError as exc:
        return str(exc).splitlines()[0][:120]


def tightest(graph, measured, devices: int, batch: int, m1: float, time_limit: float, steps: int = 8) -> float:
    """The least memory (to within ``m1``'s 100th root of 100) at which ``gpp`` finds a plan on
    ``devices``: a bisection on a log scale between ``m1 / 100`` and ``m1``."""
    lo, hi = m1 / 100, m1  # lo: assumed infeasible until shown otherwise; hi: solved
    if not isinstance(_solve(graph, _cluster(measured, devices, lo), batch, "gpp", time_limit), str):
        return lo
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        if isinstance(_solve(graph, _cluster(measured, devices, mid), batch, "gpp", time_limit), str):
            lo = mid
        else:
            hi = mid
    return hi


def plan_model(args, label, graph, spec, batch, measured, work: Path, jobs: dict, rows: list) -> None:
    """Every planner's plans for one model at each memory limit; distinct plans go to ``jobs``."""
    roomy = measured.memory_bytes
    one = _solve(graph, _cluster(measured, 1, roomy), batch, "gpp", args.time_limit)
    m1 = one.predicted.peak_memory_bytes if not isinstance(one, str) else roomy
    if args.fraction_list:
        fractions = args.fraction_list
    else:  # from the tightest memory gpp solves on the most devices up to M1, evenly on a log scale
        least = tightest(graph, measured, max(args.device_counts), batch, m1, args.time_limit)
        fractions = [(least / m1) ** (1 - k / args.levels) for k in range(args.levels)]
    limits = [("roomy", roomy)] + [(f"{f:.2g}", m1 * f) for f in fractions]
    gpath = work / f"graph-{label}.json"
    gpath.write_text(json.dumps(graph_to_dict(graph)))
    for name, limit in limits:
        solved = 0
        for n in args.device_counts:
            cdoc = _cluster(measured, n, limit)
            cpath = work / f"cluster-{label}-{name}-{n}.json"
            cpath.write_text(json.dumps(cdoc))
            for planner in args.planners.split(","):
                row = {"model": label, "limit": name, "limit_bytes": limit, "devices": n, "planner": planner}
                row["group"] = (label, batch)
                rows.append(row)
                plan = _solve(graph, cdoc, batch, planner, args.time_limit)
                if isinstance(plan, str):
                    row["error"] = f"no plan: {plan}"
                    continue
                solved += 1
                sim = simulate(plan, graph, cluster_from_dict(cdoc))
                row.update(
                    recompute_stages=[s.id for s in plan.stages if s.recompute],
                    predicted=sim.iteration_time,
                    stages=len(plan.stages),
                    used=sum(len(s.devices) for s in plan.stages),
                    micro_batch=sorted({s.micro_batch_size for s in plan.stages}),
                    data_parallel=any(len(s.devices) > 1 for s in plan.stages),
                )
                key = (label, cmf.signature(plan), json.dumps(cdoc, sort_keys=True))
                if key in jobs:
                    row["same_as"] = jobs[key]["row"]["id"]
                    jobs[key].setdefault("copies", []).append(row)
                    continue
                row["id"] = f"{label}-{name}-{n}-{planner}"
                path = work / f"plan-{row['id']}.json"
                save_plan(plan, path)
                priced = ["--graph", str(gpath), "--cluster", str(cpath), "--optimizer", "adam"]
                priced += ["--precision", args.precision]
                jobs[key] = dict(row=row, plan=plan, sim=sim, path=path, spec=spec, env={}, priced=priced)
        if not solved:
            break


def run(args) -> tuple[list[dict], dict]:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="heldout-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cpath = Path(args.cluster) if args.cluster else cmf.probe(2, "gloo", work, False)
    measured = load_cluster(cpath)
    args.models = ",".join(f"{spec}@{b}" for _set, _label, spec, b in args.seed_list)
    profiled = fidelity_cpu.cpu_models(args, work)
    rows: list[dict] = []
    jobs: dict = {}
    for (_set, label, _spec, _b), (_label, g, spec, _env, batch) in zip(args.seed_list, profiled):
        plan_model(args, label, as_graph(g), spec, batch, measured, work, jobs, rows)
    for repeat in range(0 if args.plan_only else args.repeats):
        for job in jobs.values():
            if "error" not in job["row"]:
                cmf._train_job(job, args, work, repeat)
    for job in jobs.values():
        cmf._measured(job)
        for copy in job.get("copies", []):
            copy.update({k: job["row"][k] for k in ("measured", "measured_runs", "memory", "error") if k in job["row"]})
    info = {
        "cluster": str(cpath),
        "seeds": args.seed_list,
        "planners": args.planners,
        "fractions": args.fraction_list,
        "repeats": args.repeats,
        "precision": args.precision,
        "workdir": str(work),
        "seconds": time.time() - t0,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return rows, info


def memory_check(rows: list[dict]) -> dict:
    """Every rank of every distinct measured plan: measured / predicted, and measured / the limit."""
    ratios, over_limit = [], []
    for r in rows:
        if r.get("same_as"):
            continue
        for m in r.get("memory", []):
            if m.get("peak_memory_bytes") and m.get("predicted_peak_memory_bytes"):
                ratios.append(m["peak_memory_bytes"] / m["predicted_peak_memory_bytes"])
                if m["peak_memory_bytes"] > r["limit_bytes"]:
                    over_limit.append(f"{r['id']} rank {m['rank']}")
    return {
        "ranks": len(ratios),
        "min_ratio": min(ratios, default=float("nan")),
        "max_ratio": max(ratios, default=float("nan")),
        "over_1_05": sum(x > 1.05 for x in ratios),
        "under_0_8": sum(x * 1.25 < 1 for x in ratios),
        "over_limit": over_limit,
    }


def time_check(rows: list[dict]) -> dict:
    """measured / predicted per distinct plan, against the run's median ratio."""
    ok = [r for r in rows if r.get("measured") and not r.get("same_as")]
    ratios = [r["measured"] / r["predicted"] for r in ok]
    med = statistics.median(ratios) if ratios else float("nan")
    _tau, agree, pairs = cmf.ranking(ok, 0.10)
    return {
        "plans": len(ok),
        "median_ratio": med,
        "within_10pct_of_median": sum(abs(x / med - 1) <= 0.10 for x in ratios),
        "within_10pct_absolute": sum(abs(x - 1) <= 0.10 for x in ratios),
        "mape": sum(abs(x - 1) for x in ratios) / len(ratios) if ratios else float("nan"),
        "pairs_agree_10pct": agree,
        "pairs_10pct": pairs,
    }


def default_pick(rows: list[dict]) -> list[dict]:
    """Per (model, limit): gpp's measured time over the best measured plan of any planner."""
    cells: dict = {}
    for r in rows:
        if r.get("measured"):
            cells.setdefault((r["model"], r["limit"]), []).append(r)
    out = []
    for (model, limit), rs in cells.items():
        best = min(r["measured"] for r in rs)
        mine = [r["measured"] for r in rs if r["planner"] == "gpp"]
        if mine:
            out.append({"model": model, "limit": limit, "ratio": min(mine) / best})
    return out


def predicted_pick(rows: list[dict]) -> list[dict]:
    """Per (model, limit, devices) where gpp and another planner have a plan: gpp's predicted
    iteration time over the least another planner's plan predicts (above 1: gpp missed a plan)."""
    cells: dict = {}
    for r in rows:
        if r.get("predicted"):
            cells.setdefault((r["model"], r["limit"], r["devices"]), {})[r["planner"]] = r["predicted"]
    out = []
    for (model, limit, devices), by in cells.items():
        others = [t for p, t in by.items() if p != "gpp"]
        if "gpp" in by and others:
            out.append({"model": model, "limit": limit, "devices": devices, "ratio": by["gpp"] / min(others)})
    return out


def levers(rows: list[dict]) -> list[dict]:
    """Per (model, limit, devices) where ``gpp`` and ``gpp@recompute=off`` both ran: their measured
    times, and whether ``gpp``'s plan recomputes (``None`` measured: no plan, or not trained)."""
    cells: dict = {}
    for r in rows:
        if r["planner"] in ("gpp", "gpp@recompute=off"):
            cells.setdefault((r["model"], r["limit"], r["devices"]), {})[r["planner"]] = r
    out = []
    for (model, limit, devices), pair in cells.items():
        if len(pair) == 2:
            auto, off = pair["gpp"], pair["gpp@recompute=off"]
            out.append(
                {
                    "model": model,
                    "limit": limit,
                    "devices": devices,
                    "auto": auto.get("measured"),
                    "off": off.get("measured"),
                    "recompute": auto.get("recompute_stages"),
                }
            )
    return out


def summaries(rows: list[dict]) -> dict:
    out = {}
    for set_name in ("calibration", "dev", "held-out", "extra"):
        mine = [r for r in rows if r["model"].startswith(set_name + ":")]
        if mine:
            picks = default_pick(mine)
            out[set_name] = {
                "memory": memory_check(mine),
                "time": time_check(mine),
                "default_pick": {
                    "cells": len(picks),
                    "within_1_10": sum(p["ratio"] <= 1.10 for p in picks),
                    "worst": max((p["ratio"] for p in picks), default=float("nan")),
                },
            }
    return out


def table(rows: list[dict], s: dict, info: dict) -> str:
    lines = [
        f"held-out fidelity, {info['date']}, planners {info['planners']}, median of {info['repeats']} runs, "
        f"precision {info.get('precision', 'float32')}",
        "",
        "| model | limit | devices | planner | stages | micro-batch | predicted ms | measured ms | ratio "
        "| peak meas / pred MB (worst rank) | over limit |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        head = f"| {r['model']} | {r['limit']} | {r['devices']} | {r['planner']}"
        if not r.get("measured"):
            lines.append(f"{head} | {r.get('error', '?')} |||||||")
            continue
        same = f" (= {r['same_as']})" if r.get("same_as") else ""
        over = any(m.get("peak_memory_bytes", 0) > r["limit_bytes"] for m in r.get("memory", []))
        lines.append(
            f"{head}{same} | {r['stages']} | {','.join(map(str, r['micro_batch']))} | {r['predicted'] * 1e3:.1f} | "
            f"{r['measured'] * 1e3:.1f} | {r['measured'] / r['predicted']:.3f} | {fidelity_cpu.memory_cell(r)} | "
            f"{'OVER' if over else ''} |"
        )
    for set_name, x in s.items():
        m, t, p = x["memory"], x["time"], x["default_pick"]
        lines += [
            "",
            f"**{set_name}**: memory on {m['ranks']} ranks, measured / predicted {m['min_ratio']:.3f} .. "
            f"{m['max_ratio']:.3f} (> 1.05: {m['over_1_05']}; predicted > 1.25x measured: {m['under_0_8']}; "
            f"over the plan's limit: {len(m['over_limit'])}); time on {t['plans']} plans: median measured / "
            f"predicted {t['median_ratio']:.3f}, within 10% of it {t['within_10pct_of_median']}/{t['plans']} "
            f"(within 10% of the prediction {t['within_10pct_absolute']}/{t['plans']}, mean absolute error "
            f"{t['mape']:.1%}); pairs > 10% apart in the measured order {t['pairs_agree_10pct']}/{t['pairs_10pct']}; "
            f"gpp's pick within 1.10x of the best measured {p['within_1_10']}/{p['cells']} (worst {p['worst']:.3f})",
        ]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows, info = run(args)
    if args.plan_only:
        picks = predicted_pick(rows)
        print("| model | limit | devices | gpp / best other (predicted) |\n| --- | --- | --- | --- |")
        for p in picks:
            print(f"| {p['model']} | {p['limit']} | {p['devices']} | {p['ratio']:.3f} |")
        worst = max((p["ratio"] for p in picks), default=float("nan"))
        print(f"\n{sum(p['ratio'] > 1 + 1e-9 for p in picks)} of {len(picks)} cells above 1; worst {worst:.3f}")
        if args.json:
            Path(args.json).write_text(json.dumps({"info": info, "picks": picks}, indent=1))
        return 0 if picks else 1
    s = summaries(rows)
    print(table(rows, s, info))
    pairs = levers(rows)
    if pairs:
        print("\nrecomputation: gpp (recompute auto) against gpp@recompute=off, measured ms")
        print("| model | limit | devices | auto | off | off / auto | stages recomputing |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for p in pairs:
            ms = [f"{x * 1e3:.1f}" if x else "no plan" for x in (p["auto"], p["off"])]
            gain = f"{p['off'] / p['auto']:.3f}" if p["auto"] and p["off"] else ""
            print(f"| {p['model']} | {p['limit']} | {p['devices']} | {ms[0]} | {ms[1]} | {gain} | {p['recompute']} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "info": info,
                    "summary": s,
                    "levers": pairs,
                    "rows": [{k: v for k, v in r.items() if k != "group"} for r in rows],
                },
                indent=1,
            )
        )
    return 0 if any(r.get("measured") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
