"""Benchmark: does a plan's predicted iteration time hold when it trains?

    # emulated devices: operators sleep their profiled time (gpp_runtime.emulate), up to 8 ranks
    python benchmarks/cost_model_fidelity.py --mode emulated --devices 2,4,8
    # real compute on CPU ranks (one thread each, at most as many ranks as cores)
    python benchmarks/cost_model_fidelity.py --mode cpu --devices 1,2 --time-limit 10 --steps 8 --warmup-steps 3
    # the same on GPUs (one rank per GPU)
    python benchmarks/cost_model_fidelity.py --mode cpu --backend nccl --devices 1,2,4,8
    # the default-suite smoke test (tiny, seconds; checks that it runs, not the targets)
    python benchmarks/cost_model_fidelity.py --quick

For each model, device count and planner: plan (``gpp_solver.solve``), predict the iteration time
with the simulator (``gpp_solver.simulate``) on the *measured* cluster (``gpp_runtime.probe`` run first
on the largest device count, or ``--cluster``), train the plan for ``--steps`` steps under torchrun
(``gpp_runtime.train``; ``--warmup-steps`` excluded) and take its measured seconds per step. Identical
plans (same stages, devices, micro-batches and orders) are trained once per round: every plan is
made first, then trained ``--repeats`` times in rounds over all plans (default 3 in cpu mode), and
its measured time is the median run, so that a stretch of seconds in which the machine runs slower
(the host, another process) spoils one run of a plan rather than its figure. Prints one row per plan
and the summary: Pearson correlation of predicted vs measured, mean absolute error and mean
absolute percentage error, the share of plans within 10% of the prediction, and whether the
ranking of plans holds (Kendall tau and pairwise agreement over pairs of plans of one model and
mini-batch, all pairs and those whose predictions differ by more than 10%).

Models. ``emulated``: built-in workloads of ``gpp_solver.workloads`` (``mmt``, ``dlrm``, ``candle-uno``,
``transformer`` at small sizes; ``--graph FILE`` adds a profiled graph), every time scaled so that one device
would take ``--seq-seconds`` for a mini-batch (the ranks then take ~50-300 ms per iteration), bytes as
``gpp_runtime.emulate.realised_graph`` realises them, memory unbounded (activations are not emulated). Emulated:
compute and the data-parallel all-reduce sleep the modelled time (``A(S)`` on the probed cluster, passed in
``$GPP_EMULATE_CLUSTER``); point-to-point transfers and the schedule are real. ``cpu``: real models
(``benchmarks/fidelity_cpu.py``: torchvision resnet18, googlenet and mobilenet_v3_small at 32x32, HF BERT
tiny and a tiny random CLIP, a two-tower model, and the two examples' ``bench`` MLPs), each at its own
mini-batch, predicted from a few ms to a few
hundred ms per iteration; profiled with ``gpp_runtime.profile --concurrent`` (one pinned profiler per core),
trained with one thread per rank, each rank pinned to its own core and every other core kept busy
(``--fill-cores``; the module says why: this machine's cores slow each other down).

Per plan the JSON (``--json``) also has each stage's measured compute, wait and all-reduce per
step beside the simulator's busy time and ``A(S)``, so that a gap can be located (the table shows
the worst stage's busy error and all-reduce).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import fidelity_cpu  # noqa: E402
from gpp_runtime.emulate import ENV_CLUSTER, ENV_GRAPH, realised_graph  # noqa: E402
from gpp_solver import GppError, load_cluster, save_plan, simulate, solve  # noqa: E402
from gpp_solver.formats.cluster import cluster_from_dict  # noqa: E402
from gpp_solver.formats.graph import as_graph, graph_to_dict  # noqa: E402
from gpp_solver.workloads import build_model  # noqa: E402

PLANNERS = "graphpipe,pipedream,gpp,piper,alpa"
EMULATED_MODELS = {
    "mmt": dict(branches=2, layers=2, seq=128, hidden=512, heads=8, ffn=2048, vocab=8000, max_micro_batch=32),
    "dlrm": dict(
        dense_branches=2,
        sparse_branches=2,
        dense_layers=2,
        hidden=1024,
        dense_features=1024,
        table_rows=10000,
        embed_dim=32,
        bag_size=10,
        top_layers=2,
        max_micro_batch=64,
    ),
    "candle-uno": dict(branches=3, layers=2, hidden=1024, top_layers=2, input_features=1024, max_micro_batch=64),
    "transformer": dict(layers=6, seq=128, hidden=512, heads=8, ffn=2048, vocab=8000, max_micro_batch=32),
}
QUICK_MODELS = {
    "candle-uno": dict(branches=2, layers=1, hidden=256, top_layers=1, input_features=256, max_micro_batch=16)
}
NOTES = {
    "emulated": ["emulated: compute and all-reduce sleep the modelled time; p2p and the schedule are real"],
    "cpu": [
        "cpu: one thread per rank, each pinned to its own core; profile and training with every core busy "
        "(--fill-cores)"
    ],
}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("emulated", "cpu"), default="emulated")
    ap.add_argument(
        "--backend", choices=("gloo", "nccl"), default="gloo", help="gloo: CPU ranks; nccl: one GPU per rank"
    )
    ap.add_argument("--devices", default=None, help="device counts (default emulated 2,4,8; cpu 1,2)")
    ap.add_argument("--planners", default=None, help=f"comma-separated (default {PLANNERS})")
    ap.add_argument("--models", help="comma-separated (emulated: workload names, '' for none; cpu: MODULE:FN[@BATCH])")
    ap.add_argument("--graph", action="append", default=[], help="emulated: also this gpp-graph/1 file")
    ap.add_argument("--batch", type=int, default=None, help="mini-batch size (emulated 32; cpu: per model)")
    ap.add_argument(
        "--fill-cores",
        choices=fidelity_cpu.FILL,
        default="unused",
        help="cpu: keep every core busy in profile and training (benchmarks/fidelity_cpu.py)",
    )
    ap.add_argument("--steps", type=int, default=6, help="steps per run, warm-up included (at least; --min-seconds)")
    ap.add_argument("--warmup-steps", type=int, default=2)
    ap.add_argument(
        "--min-seconds",
        type=float,
        default=None,
        help="timed seconds per run at least: a plan predicted at T seconds per step runs "
        "max(--steps - --warmup-steps, ceil(S / T)) timed steps after max(--warmup-steps, ceil(S / 4T)) "
        "warm-up steps (default cpu 2, emulated 0: --steps as given)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of each distinct plan, in rounds over all plans; its measured time is the median run "
        "(default cpu 5, emulated 1; --quick 1)",
    )
    ap.add_argument(
        "--seq-seconds",
        type=float,
        default=0.6,
        help="emulated: one device's compute time for a mini-batch after scaling",
    )
    ap.add_argument("--max-output-bytes", type=float, default=16 * 1024, help="emulated: per sample")
    ap.add_argument("--max-weight-bytes", type=float, default=1 * 2**20, help="emulated: per node")
    ap.add_argument("--time-limit", type=float, default=20.0, help="per planner call (seconds)")
    ap.add_argument(
        "--schedule",
        choices=("1f1b", "zb", "auto"),
        default=None,
        help="gpp's and graphpipe's micro-batch orders (default: each planner's own, gpp auto, graphpipe 1f1b)",
    )
    ap.add_argument("--cluster", default=None, help="use this gpp-cluster/1 instead of probing")
    ap.add_argument("--json", default=None, help="write every row and the summary here")
    ap.add_argument("--workdir", default=None, help="keep graphs/plans/metrics here")
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (2 ranks, one small model)")
    args = ap.parse_args(argv)
    if args.quick:
        args.devices = args.devices or "2"
        args.planners = args.planners or "graphpipe,pipedream"
        args.steps, args.warmup_steps, args.batch, args.seq_seconds = 3, 1, 8, 0.1
    if args.repeats is None:
        args.repeats = 1 if args.quick or args.mode == "emulated" else 5
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.min_seconds is None:
        args.min_seconds = 0.0 if args.quick or args.mode == "emulated" else 2.0
    if args.min_seconds < 0:
        ap.error(f"--min-seconds must be >= 0, got {args.min_seconds}")
    args.planners = args.planners or PLANNERS
    args.batch = args.batch or (32 if args.mode == "emulated" else None)
    if args.mode == "cpu":
        try:
            fidelity_cpu.model_specs(args.models, args.batch, args.quick)
        except ValueError as exc:
            ap.error(str(exc))
    args.device_counts = [int(x) for x in (args.devices or ("2,4,8" if args.mode == "emulated" else "1,2")).split(",")]
    return args


# -- launching ------------------------------------------------------------------------------
def torchrun(nproc: int, module_args: list[str], env: dict | None = None, timeout: float = 900):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *module_args]
    full = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        **(env or {}),
    }
    res = subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[3:])} failed (exit {res.returncode}): " + (res.stderr.strip().splitlines() or ["?"])[-1]
        )
    return res


def probe(nproc: int, backend: str, work: Path, quick: bool) -> Path:
    out = work / "cluster.json"
    sizes = "4,16384,262144" if quick else "4,65536,1048576,4194304,26214400"  # up to a full bucket
    torchrun(
        nproc,
        [
            "-m",
            "gpp_runtime.probe",
            "-o",
            str(out),
            "--sizes",
            sizes,
            "--repeats",
            "3" if quick else "41",  # messages after work vary by several times (gpp_runtime.probe)
            "--details",
            str(work / "probe.json"),
        ]
        + (["--cpu"] if backend == "gloo" else []),
    )
    return out


def probe_ranks(args) -> int:
    """Ranks the probe runs on: the largest device count, at least 2 (a point-to-point pair to
    measure); with NCCL one per GPU (NCCL refuses two ranks on one GPU), so a host with one GPU
    probes one rank (its memory; nothing to send)."""
    n = max(args.device_counts + [2])
    if args.backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        if max(args.device_counts) > gpus:
            raise SystemExit(
                f"error: --backend nccl --devices {','.join(map(str, args.device_counts))} needs {max(args.device_counts)} GPUs, this host has {gpus}"
            )
        n = min(n, gpus)
    return n


def run_steps(args, predicted: float) -> tuple[int, int]:
    """(steps, warm-up steps) of one run of a plan predicted at ``predicted`` seconds per step:
    at least ``--min-seconds`` timed and a quarter of that warming up (a 3 ms plan's 7 timed steps
    measure 20 ms of a machine whose speed moves over seconds), within ``--steps``/``--warmup-steps``
    as the least and 2000 timed steps as the most."""
    timed, warmup = max(1, args.steps - args.warmup_steps), args.warmup_steps
    if args.min_seconds > 0 and predicted > 0:
        timed = max(timed, min(2000, math.ceil(args.min_seconds / predicted)))
        warmup = max(warmup, min(500, math.ceil(args.min_seconds / 4 / predicted)))
    return warmup + timed, warmup


def train(
    plan_path: Path,
    nproc: int,
    model: str,
    env: dict,
    args,
    metrics: Path,
    priced: list[str] = (),
    steps: tuple[int, int] | None = None,
) -> tuple[float, dict, list[dict], float]:
    """The measured iteration time (:func:`steady_period`), per-rank timings (:func:`rank_times`),
    per-rank peak memory beside the prediction (``gpp_runtime.train``'s ``ranks``; ``priced``:
    ``--graph G --cluster C`` of the plan, so the prediction is the cost model's for the optimizer
    used) and the mean period (:func:`mean_period`). ``steps``: (steps, warm-up steps), default ``--steps``/``--warmup-steps``."""
    n_steps, warmup = steps or (args.steps, args.warmup_steps)
    trace_path = metrics.with_suffix(".trace.json")
    torchrun(
        nproc,
        [
            "-m",
            "gpp_runtime.train",
            "--plan",
            str(plan_path),
            "--model",
            model,
            "--steps",
            str(n_steps),
            "--warmup-steps",
            str(warmup),
            "--lr",
            "1e-4",
            "--metrics",
            str(metrics),
            "--trace",
            str(trace_path),
            "--quiet",
            "--threads",
            "1",
            "--timeout",
            "300",
            *priced,
        ]
        + (["--cpu"] if args.backend == "gloo" else [])
        + fidelity_cpu.train_flags(args),
        env=env,
    )
    trace = json.loads(trace_path.read_text())
    ranks = json.loads(metrics.read_text()).get("ranks", [])
    return steady_period(trace, warmup), rank_times(trace, warmup), ranks, mean_period(trace, warmup)


def _step_ends(trace: dict) -> dict[int, list[float]]:
    """Per rank, the end (us) of each step: its ``optimizer`` event closes it."""
    ends: dict[int, list[float]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e["name"] == "optimizer":
            ends.setdefault(e["pid"], []).append(e["ts"] + e["dur"])
    return {r: sorted(v) for r, v in ends.items()}


def steady_period(trace: dict, warmup: int) -> float:
    """Seconds per iteration: the median over the timed steps of the time between the ends of
    consecutive steps.

    A step ends when the last rank's step does. Taking ends only (not ``min start .. max end`` over
    ranks, which also counts the offset between the ranks' step boundaries once) measures the
    steady-state period; the median, not the mean (:func:`mean_period`), so that a step another
    process delayed (this machine's cores are shared) does not move the figure.
    """
    per_step = [max(x) for x in zip(*_step_ends(trace).values())]
    if len(per_step) <= warmup or warmup < 1:
        raise RuntimeError(f"need more steps than --warmup-steps >= 1 (got {len(per_step)} steps)")
    return statistics.median(b - a for a, b in zip(per_step[warmup - 1 :], per_step[warmup:])) / 1e6


def mean_period(trace: dict, warmup: int) -> float:
    """Seconds per iteration as the mean: the span between the ends of the last warm-up step and
    the last step over the timed steps."""
    per_step = [max(x) for x in zip(*_step_ends(trace).values())]
    return (per_step[-1] - per_step[warmup - 1]) / (len(per_step) - warmup) / 1e6


def rank_times(trace: dict, warmup: int) -> dict[int, dict]:
    """Per rank, seconds per timed step of: F/B compute, waiting for messages, all-reduce."""
    ends = _step_ends(trace)
    out: dict[int, dict] = {}
    for r, e in ends.items():
        start, n = e[warmup - 1], len(e) - warmup
        acc = {"compute": 0.0, "wait": 0.0, "allreduce": 0.0}
        for ev in trace["traceEvents"]:
            if ev.get("ph") != "X" or ev["pid"] != r or ev["ts"] < start:
                continue
            if ev["name"].startswith("all-reduce"):
                acc["allreduce"] += ev["dur"]
            elif ev["cat"] == "wait":
                acc["wait"] += ev["dur"]
            elif ev["cat"] == "compute" and ev["name"] != "optimizer":
                acc["compute"] += ev["dur"]
        out[r] = {k: v / n / 1e6 for k, v in acc.items()}
    return out


# -- models ---------------------------------------------------------------------------------
def scaled(graph: dict, seq_seconds: float, batch: int) -> dict:
    """Times multiplied so that one device's forward+backward of a mini-batch takes ``seq_seconds``."""
    from gpp_solver.cost.model import interp_time

    sizes = graph["micro_batch_sizes"]
    total = sum(
        interp_time(n["fw_time"], sizes, batch) + interp_time(n["bw_time"], sizes, batch) for n in graph["nodes"]
    )
    k = seq_seconds / total
    for n in graph["nodes"]:
        n["fw_time"] = [t * k for t in n["fw_time"]]
        n["bw_time"] = [t * k for t in n["bw_time"]]
    return graph


def emulated_models(args, work: Path, cluster: Path) -> list[tuple[str, dict, str, dict, int]]:
    """(label, graph dict, MODULE:FN, env, mini-batch) per model, the graph being exactly what is emulated."""
    specs = QUICK_MODELS if args.quick else EMULATED_MODELS
    names = [n for n in args.models.split(",") if n] if args.models is not None else list(specs)
    graphs = [(n, graph_to_dict(build_model(n, **specs.get(n, {})))) for n in names]
    graphs += [(Path(p).stem, graph_to_dict(as_graph(p))) for p in args.graph]
    out = []
    for label, g in graphs:
        g = realised_graph(scaled(g, args.seq_seconds, args.batch), args.max_output_bytes, args.max_weight_bytes)
        path = work / f"graph-{label}.json"
        path.write_text(json.dumps(g))
        out.append(
            (label, g, "gpp_runtime.emulate:workload", {ENV_GRAPH: str(path), ENV_CLUSTER: str(cluster)}, args.batch)
        )
    return out


# -- statistics -----------------------------------------------------------------------------
def pearson(x: list[float], y: list[float]) -> float:
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def ranking(rows: list[dict], min_gap: float = 0.0) -> tuple[float, int, int]:
    """(Kendall tau-a, agreeing pairs, pairs) over pairs of one group whose predictions differ > min_gap."""
    agree = total = 0
    for i, a in enumerate(rows):
        for b in rows[i + 1 :]:
            if a["group"] != b["group"]:
                continue
            p, m = a["predicted"] - b["predicted"], a["measured"] - b["measured"]
            if p == 0 or abs(p) <= min_gap * min(a["predicted"], b["predicted"]):
                continue
            total += 1
            agree += (p > 0) == (m > 0)
    tau = (2 * agree - total) / total if total else float("nan")
    return tau, agree, total


def summary(rows: list[dict]) -> dict:
    """Fidelity figures over the measured rows (each distinct plan once)."""
    ok = [r for r in rows if r.get("measured") and not r.get("same_as")]
    pred, meas = [r["predicted"] for r in ok], [r["measured"] for r in ok]
    errs = [abs(m - p) for p, m in zip(pred, meas)]
    rel = [abs(m - p) / p for p, m in zip(pred, meas)]
    tau, agree, pairs = ranking(ok)
    tau10, agree10, pairs10 = ranking(ok, 0.10)
    return {
        "plans": len(ok),
        "pearson": pearson(pred, meas),
        "mae_seconds": sum(errs) / len(errs) if errs else float("nan"),
        "mape": sum(rel) / len(rel) if rel else float("nan"),
        "within_10pct": sum(e <= 0.10 for e in rel),
        "kendall_tau": tau,
        "pairs_agree": agree,
        "pairs": pairs,
        "kendall_tau_10pct": tau10,
        "pairs_agree_10pct": agree10,
        "pairs_10pct": pairs10,
    }


def summaries(rows: list[dict]) -> dict:
    """All plans, and the plans without a data-parallel stage (no gradient all-reduce); memory; and
    all plans again measured by each one's fastest run (``fastest_run``: what the machine gives a
    plan when nothing else slows it; the headline figure stays the median run)."""
    fastest = [dict(r, measured=min(r["measured_runs"])) for r in rows if r.get("measured_runs")]
    return {
        "all": summary(rows),
        "no_data_parallel": summary([r for r in rows if not r.get("data_parallel")]),
        "fastest_run": summary(fastest),
        "memory": fidelity_cpu.memory_summary(rows),
    }


# -- one plan -------------------------------------------------------------------------------
def stage_diagnostics(plan, sim, ranks: dict[int, dict]) -> list[dict]:
    """Per stage (first replica's rank): simulated vs measured compute+comm and all-reduce per step."""
    out = []
    for ps, st in zip(plan.stages, sim.stages):
        m = ranks.get(ps.devices[0], {})
        out.append(
            {
                "stage": st.stage,
                "rank": ps.devices[0],
                "sim_busy": st.busy - st.allreduce - st.optimizer,
                "measured_busy": m.get("compute"),
                "sim_allreduce": st.allreduce,
                "measured_allreduce": m.get("allreduce"),
                "measured_wait": m.get("wait"),
                "sim_idle": st.idle,
            }
        )
    return out


def planning_cluster(measured, devices: int, mode: str) -> dict:
    """The cluster the planners see for ``devices`` ranks: the probed one's figures (its ring
    all-reduce fit included), memory unbounded in emulated mode (activations are not emulated)."""
    cdoc = {
        "format": "gpp-cluster/1",
        "devices": devices,
        "memory_bytes": 1e15 if mode == "emulated" else measured.memory_bytes,
        "intra_node_bandwidth": measured.intra_node_bandwidth,
        "inter_node_bandwidth": measured.inter_node_bandwidth,
        "latency": measured.latency,
        "optimizer_state_factor": measured.optimizer_state_factor,
        "memory_overheads": measured.memory_overheads,
    }
    if measured.allreduce_bandwidth is not None:
        cdoc.update(allreduce_bandwidth=measured.allreduce_bandwidth, allreduce_latency=measured.allreduce_latency)
    if measured.devices_per_node:
        cdoc["devices_per_node"] = measured.devices_per_node
    if measured.runtime_memory_bytes:
        cdoc["runtime_memory_bytes"] = measured.runtime_memory_bytes
    return cdoc


def signature(plan) -> str:
    return json.dumps([[list(s.nodes), list(s.devices), s.micro_batch_size, s.schedule.order] for s in plan.stages])


def run(args) -> tuple[list[dict], dict]:
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="fidelity-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cpath = Path(args.cluster) if args.cluster else probe(probe_ranks(args), args.backend, work, args.quick)
    measured_cluster = load_cluster(cpath)
    models = emulated_models(args, work, cpath) if args.mode == "emulated" else fidelity_cpu.cpu_models(args, work)
    rows: list[dict] = []
    done: dict[str, dict] = {}
    jobs: list[dict] = []  # the distinct plans, trained after every plan is made
    copies: list[tuple[dict, dict]] = []  # (row, the row of the identical plan trained)
    for label, g, model_spec, env, batch in models:
        graph = as_graph(g)
        for n in args.device_counts:
            cdoc = planning_cluster(measured_cluster, n, args.mode)
            for planner in args.planners.split(","):
                row = {"model": label, "devices": n, "planner": planner, "group": (label, batch)}
                rows.append(row)
                try:
                    plan = solve(
                        graph,
                        cdoc,
                        mini_batch_size=batch,
                        planner=planner,
                        time_limit=args.time_limit,
                        **({"schedule": args.schedule} if args.schedule and planner in ("gpp", "graphpipe") else {}),
                    )
                except GppError as exc:
                    row["error"] = f"no plan: {str(exc).splitlines()[0][:120]}"
                    continue
                sim = simulate(plan, graph, cluster_from_dict(cdoc))
                row.update(
                    predicted=sim.iteration_time,
                    stages=len(plan.stages),
                    used=sum(len(s.devices) for s in plan.stages),
                    micro_batch=sorted({s.micro_batch_size for s in plan.stages}),
                )
                sig = signature(plan)
                if sig in done:
                    row["same_as"] = done[sig]["id"]
                    copies.append((row, done[sig]))
                    continue
                row["id"] = f"{label}-{n}-{planner}"
                ppath = work / f"plan-{row['id']}.json"
                save_plan(plan, ppath)
                priced = []
                if args.mode == "cpu":  # emulated ranks do not allocate the activations they model
                    gpath, cpath_n = work / f"graph-{label}.json", work / f"cluster-{n}.json"
                    if not gpath.exists():
                        gpath.write_text(json.dumps(graph_to_dict(graph)))
                    cpath_n.write_text(json.dumps(cdoc))
                    priced = ["--graph", str(gpath), "--cluster", str(cpath_n)]
                row["data_parallel"] = any(len(s.devices) > 1 for s in plan.stages)
                done[sig] = row
                jobs.append(dict(row=row, plan=plan, sim=sim, path=ppath, spec=model_spec, env=env, priced=priced))
    for repeat in range(args.repeats):  # every plan once per round: a slow stretch of the machine hits one run
        for job in jobs:
            if "error" not in job["row"]:
                _train_job(job, args, work, repeat)
    for job in jobs:
        _measured(job)
    for row, first in copies:
        row.update(
            {
                k: first[k]
                for k in ("measured", "measured_runs", "measured_mean_runs", "diagnostics", "memory", "error")
                if k in first
            }
        )
    info = {
        "mode": args.mode,
        "backend": args.backend,
        "cluster": str(cpath),
        "batch": args.batch or "per model",
        "fill_cores": args.fill_cores if args.mode == "cpu" else None,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "min_seconds": args.min_seconds,
        "statistic": "median step period of a run; median run",
        "repeats": args.repeats,
        "workdir": str(work),
        "seconds": time.time() - t0,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    return rows, info


def _train_job(job: dict, args, work: Path, repeat: int) -> None:
    """Train one distinct plan once more; its runs are kept in ``job["runs"]``."""
    row = job["row"]
    try:
        with fidelity_cpu.fillers(args, job["spec"], row["used"], max(row["micro_batch"])):
            period, ranks, memory, mean = train(
                job["path"],
                row["used"],
                job["spec"],
                job["env"],
                args,
                work / f"metrics-{row['id']}-run{repeat}.json",
                job["priced"],
                run_steps(args, row["predicted"]),
            )
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        row["error"] = f"training failed: {str(exc)[:200]}"
        print(f"[fidelity] {row['id']} run {repeat + 1}: {row['error']}", file=sys.stderr, flush=True)
        return
    job.setdefault("runs", []).append((period, ranks, memory, mean))
    print(
        f"[fidelity] {row['id']} run {repeat + 1}: {period * 1e3:.3f} ms (predicted {row['predicted'] * 1e3:.3f})",
        file=sys.stderr,
        flush=True,
    )


def _measured(job: dict) -> None:
    """The plan's measured iteration time: the median over its runs (``--repeats``), with the
    per-stage timings and memory of that run (the lower middle one for an even count)."""
    row, runs = job["row"], job.get("runs")
    if not runs or "error" in row:
        return
    runs = sorted(runs, key=lambda r: r[0])
    period, ranks, memory, _ = runs[(len(runs) - 1) // 2]
    row["measured"] = period
    row["measured_runs"] = [r[0] for r in job["runs"]]
    row["measured_mean_runs"] = [r[3] for r in job["runs"]]
    if job["priced"]:
        row["memory"] = memory
    row["diagnostics"] = stage_diagnostics(job["plan"], job["sim"], ranks)


def _worst(r: dict) -> tuple[str, str]:
    """Largest per-stage busy error and the all-reduce (predicted/measured ms) of the worst stage."""
    busy = [
        d["measured_busy"] / d["sim_busy"] - 1
        for d in r["diagnostics"]
        if d.get("measured_busy") is not None and d["sim_busy"] > 0
    ]
    ar = max(r["diagnostics"], key=lambda d: d.get("measured_allreduce") or 0.0)
    arx = f"{ar['sim_allreduce'] * 1e3:.1f} / {ar['measured_allreduce'] * 1e3:.1f}" if ar["measured_allreduce"] else "-"
    return (f"{max(busy, key=abs):+.1%}" if busy else "-"), arx


def _summary_lines(name: str, s: dict) -> list[str]:
    if not s["plans"]:
        return [f"{name}: no plan measured"]
    return [
        f"{name}: {s['plans']} plans; Pearson r = {s['pearson']:.3f}; mean absolute error "
        f"{s['mae_seconds'] * 1e3:.1f} ms ({s['mape']:.1%} of predicted); within 10%: "
        f"{s['within_10pct']}/{s['plans']}; ranking: Kendall tau {s['kendall_tau']:.3f} "
        f"({s['pairs_agree']}/{s['pairs']} pairs in the predicted order), pairs predicted >10% apart: "
        f"tau {s['kendall_tau_10pct']:.3f} ({s['pairs_agree_10pct']}/{s['pairs_10pct']})"
    ]


def table(rows: list[dict], s: dict, info: dict) -> str:
    lines = [
        f"cost-model fidelity, mode {info['mode']}, backend {info['backend']}, mini-batch {info['batch']}, "
        f"{info['steps']} steps ({info['warmup_steps']} warm-up), the median of {info.get('repeats', 1)} runs per "
        f"plan, {info['date']}" + (f", --fill-cores {info['fill_cores']}" if info.get("fill_cores") else ""),
        *NOTES.get(info["mode"], []),
        "",
        "| model | devices | planner | stages | used | micro-batch | predicted ms | measured ms | error "
        "| stage busy error | all-reduce pred / meas ms | peak memory meas / pred MB (ratio, worst rank) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r and not r.get("measured"):
            lines.append(f"| {r['model']} | {r['devices']} | {r['planner']} | {r['error']} |||||||||")
            continue
        err = (r["measured"] - r["predicted"]) / r["predicted"]
        same = f" (= {r['same_as']})" if r.get("same_as") else ""
        busy, ar = _worst(r)
        lines.append(
            f"| {r['model']} | {r['devices']} | {r['planner']}{same} | {r['stages']} | {r['used']} | "
            f"{','.join(map(str, r['micro_batch']))} | {r['predicted'] * 1e3:.1f} | "
            f"{r['measured'] * 1e3:.1f} | {err:+.1%} | {busy} | {ar} | {fidelity_cpu.memory_cell(r)} |"
        )
    lines += (
        [""]
        + _summary_lines("all plans", s["all"])
        + _summary_lines("plans without data-parallel stages", s["no_data_parallel"])
        + (_summary_lines("all plans, each by its fastest run", s["fastest_run"]) if "fastest_run" in s else [])
    )
    mem = s.get("memory", {})
    if mem.get("ranks"):
        lines.append(
            f"memory: {mem['ranks']} ranks; measured / predicted peak {mem['min_ratio']:.3f} .. "
            f"{mem['max_ratio']:.3f}; measured > 1.05 x predicted: {mem['over_1_05']}; "
            f"predicted > 1.25 x measured: {mem['under_0_8']}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    rows, info = run(args)
    s = summaries(rows)
    print(table(rows, s, info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"info": info, "summary": s, "rows": [{k: v for k, v in r.items() if k != "group"} for r in rows]},
                f,
                indent=1,
            )
    return 0 if s["all"]["plans"] else 1


if __name__ == "__main__":
    sys.exit(main())
