"""benchmarks/cost_model_fidelity.py: the --quick run works end to end; its statistics are right.

The quick run plans a tiny emulated workload with two planners, trains both plans under torchrun
(2 gloo ranks, operators sleeping their times) and prints the table. It checks that the script
runs and reports finite figures, not the fidelity targets (those need a quiet machine).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "cost_model_fidelity.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_cost_model_fidelity", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # about 21 s: trains every plan of the quick run
def test_quick_run_prints_the_table_with_finite_figures(tmp_path):
    cluster = tmp_path / "cluster.json"  # given, so the run skips the probe (tested on its own)
    cluster.write_text(
        json.dumps(
            {
                "format": "gpp-cluster/1",
                "devices": 2,
                "memory_bytes": 1e10,
                "devices_per_node": 2,
                "intra_node_bandwidth": 2e9,
                "inter_node_bandwidth": 2e9,
                "latency": 1e-4,
                "optimizer_state_factor": 4.0,
            }
        )
    )
    out = tmp_path / "fidelity.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--quick",
            "--cluster",
            str(cluster),
            "--json",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "| model | devices | planner |" in res.stdout and "Pearson r =" in res.stdout
    doc = json.loads(out.read_text())
    rows = [r for r in doc["rows"] if r.get("measured")]
    assert len(rows) == 2 and {r["planner"] for r in rows} == {"graphpipe", "pipedream"}
    for r in rows:
        assert math.isfinite(r["predicted"]) and r["predicted"] > 0
        assert math.isfinite(r["measured"]) and r["measured"] > 0
        assert all(d["measured_busy"] > 0 for d in r["diagnostics"])
    s = doc["summary"]["all"]
    assert s["plans"] == 2 and math.isfinite(s["mape"]) and math.isfinite(s["mae_seconds"])


def test_statistics():
    b = _bench()
    assert b.pearson([1, 2, 3], [2, 4, 6.5]) == pytest.approx(0.9986, abs=1e-3)
    assert math.isnan(b.pearson([1.0], [1.0]))
    rows = [
        {"group": "g", "predicted": 1.0, "measured": 1.08},
        {"group": "g", "predicted": 2.0, "measured": 1.9},
        {"group": "g", "predicted": 1.05, "measured": 1.0},
        {"group": "h", "predicted": 9.0, "measured": 0.1},
    ]
    assert b.ranking(rows) == (pytest.approx(1 / 3), 2, 3)  # the 1.0/1.05 pair is swapped
    assert b.ranking(rows, 0.10) == (1.0, 2, 2)  # ... and predicted within 10%
    s = b.summary([dict(r, group="g") for r in rows[:3]])
    assert s["within_10pct"] == 3 and s["mape"] == pytest.approx((0.08 + 0.05 + 0.05 / 1.05) / 3)


def test_steady_period_uses_step_ends_of_the_last_rank():
    b = _bench()

    def opt(pid, end):
        return {"ph": "X", "name": "optimizer", "cat": "compute", "pid": pid, "ts": end - 10, "dur": 10}

    trace = {
        "traceEvents": [
            opt(0, 100),
            opt(0, 300),
            opt(0, 500),
            opt(1, 150),
            opt(1, 330),
            opt(1, 560),
            opt(0, 700),
            opt(1, 1160),  # a step another process delayed
            {"ph": "X", "name": "all-reduce", "cat": "comm", "pid": 1, "ts": 400, "dur": 40},
            {"ph": "X", "name": "wait", "cat": "wait", "pid": 1, "ts": 50, "dur": 40},
        ]
    }
    # the last rank's step ends 150, 330, 560, 1160: timed periods 180, 230, 600 us
    assert b.steady_period(trace, 1) == pytest.approx(230e-6)  # the median: the delayed step does not count
    assert b.mean_period(trace, 1) == pytest.approx((1160 - 150) / 3 / 1e6)
    t = b.rank_times(trace, 1)
    assert t[1]["allreduce"] == pytest.approx(40e-6 / 3) and t[1]["wait"] == 0.0  # the wait was in warm-up


def test_run_steps_time_at_least_min_seconds():
    b = _bench()
    args = b.parse_args(["--mode", "cpu", "--steps", "10", "--warmup-steps", "3"])
    assert args.min_seconds == 2.0
    assert b.run_steps(args, 0.003) == (167 + 667, 167)  # 2 s timed, 0.5 s warm-up
    assert b.run_steps(args, 0.5) == (3 + 7, 3)  # --steps already time more than 2 s
    assert b.run_steps(args, 1e-6) == (500 + 2000, 500)  # capped
    emu = b.parse_args(["--mode", "emulated", "--steps", "10", "--warmup-steps", "3"])
    assert emu.min_seconds == 0.0 and b.run_steps(emu, 0.003) == (10, 3)
    with pytest.raises(SystemExit):
        b.parse_args(["--mode", "cpu", "--min-seconds", "-1"])


def test_cpu_model_specs_and_bad_models_exit_2():
    b = _bench()
    specs = b.fidelity_cpu.model_specs("examples.sequential:bench@16,examples.two_branch:bench", None, False)
    assert specs == [("examples.sequential:bench", 16), ("examples.two_branch:bench", 128)]
    assert b.fidelity_cpu.model_specs("examples.sequential:bench@16", 4, False) == [("examples.sequential:bench", 4)]
    assert {batch for _, batch in b.fidelity_cpu.model_specs(None, None, False)} != {128}  # per-model batches
    # profiled up to the mini-batch itself (above the largest size the format extrapolates)
    assert b.fidelity_cpu.profile_sizes(512) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert b.fidelity_cpu.profile_sizes(96)[-2:] == [64, 96] and b.fidelity_cpu.profile_sizes(1) == [1]
    assert b.fidelity_cpu.train_flags(b.parse_args(["--mode", "cpu"])) == ["--pin-cores"]
    assert b.fidelity_cpu.train_flags(b.parse_args(["--mode", "cpu", "--fill-cores", "none"])) == []
    assert b.fidelity_cpu.train_flags(b.parse_args(["--mode", "emulated"])) == []  # emulated: unchanged
    for bad in ("nocolon", "examples.sequential:bench@x", "examples.sequential:bench@0"):
        with pytest.raises(SystemExit) as exc:
            b.parse_args(["--mode", "cpu", "--models", bad])
        assert exc.value.code == 2


def test_planning_cluster_carries_the_probed_allreduce_fit():
    from gpp_solver.formats.cluster import cluster_from_dict

    b = _bench()
    probed = cluster_from_dict(
        {
            "format": "gpp-cluster/1",
            "devices": 2,
            "memory_bytes": 8e9,
            "devices_per_node": 2,
            "inter_node_bandwidth": 1e9,
            "latency": 5e-5,
            "allreduce_bandwidth": 4e8,
            "allreduce_latency": 2e-4,
        }
    )
    c = cluster_from_dict(b.planning_cluster(probed, 1, "cpu"))
    assert (c.devices, c.memory_bytes, c.allreduce_bandwidth, c.allreduce_latency) == (1, 8e9, 4e8, 2e-4)
    assert cluster_from_dict(b.planning_cluster(probed, 2, "emulated")).memory_bytes == 1e15
    plain = cluster_from_dict(
        b.planning_cluster(probed.with_(allreduce_bandwidth=None, allreduce_latency=0.0), 2, "cpu")
    )
    assert plain.allreduce_bandwidth is None and plain.allreduce_latency == 0.0


def test_a_plan_measures_its_median_run_with_that_runs_timings():
    bench = _bench()
    plan_ranks = {0: {"compute": 0.0, "wait": 0.0, "allreduce": 0.0}}
    job = {
        "row": {"id": "p"},
        "priced": ["--graph", "g"],
        "runs": [
            (0.30, plan_ranks, ["slow"], 0.31),
            (0.10, plan_ranks, ["fast"], 0.11),
            (0.12, plan_ranks, ["middle"], 0.13),
        ],
        "plan": None,
        "sim": None,
    }
    bench.stage_diagnostics = lambda plan, sim, ranks: ["diag"]
    bench._measured(job)
    assert job["row"]["measured"] == 0.12 and job["row"]["memory"] == ["middle"]
    assert job["row"]["measured_runs"] == [0.30, 0.10, 0.12]
    assert job["row"]["measured_mean_runs"] == [0.31, 0.11, 0.13]  # each run's mean period beside its median


def test_repeats_default_to_five_on_cpu_and_are_refused_below_one(capsys):
    bench = _bench()
    assert bench.parse_args(["--mode", "cpu"]).repeats == 5
    assert bench.parse_args(["--mode", "emulated"]).repeats == 1
    assert bench.parse_args(["--quick"]).repeats == 1
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--mode", "cpu", "--repeats", "0"])
    assert exc.value.code == 2 and "--repeats" in capsys.readouterr().err


def test_summaries_also_measure_each_plan_by_its_fastest_run():
    b = _bench()
    rows = [
        {"group": "g", "predicted": 1.0, "measured": 1.3, "measured_runs": [1.3, 1.02, 1.4]},
        {"group": "g", "predicted": 2.0, "measured": 2.1, "measured_runs": [2.1, 2.5, 2.05]},
        {"group": "g", "predicted": 2.0, "measured": 2.1, "measured_runs": [2.1], "same_as": "x"},  # a copy
    ]
    s = b.summaries(rows)
    assert s["all"]["plans"] == 2 and s["all"]["within_10pct"] == 1  # the median runs: +30%, +5%
    assert s["fastest_run"]["plans"] == 2 and s["fastest_run"]["within_10pct"] == 2  # +2%, +2.5%
    assert rows[0]["measured"] == 1.3  # the rows keep their median run


def test_nccl_probes_one_rank_per_gpu_and_carries_the_runtime_memory(monkeypatch):
    """With NCCL the probe runs one rank per GPU (two ranks on one GPU are refused by NCCL), and a
    device count above the host's GPUs is refused; the probed runtime_memory_bytes (cuBLAS's
    workspaces) reaches the planning cluster."""
    import torch

    from gpp_solver.formats.cluster import cluster_from_dict

    b = _bench()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert b.probe_ranks(b.parse_args(["--mode", "cpu", "--backend", "nccl", "--devices", "1"])) == 1
    assert b.probe_ranks(b.parse_args(["--mode", "cpu", "--devices", "1"])) == 2  # gloo: a pair to measure
    with pytest.raises(SystemExit, match="needs 2 GPUs, this host has 1"):
        b.probe_ranks(b.parse_args(["--mode", "cpu", "--backend", "nccl", "--devices", "1,2"]))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert b.probe_ranks(b.parse_args(["--mode", "cpu", "--backend", "nccl", "--devices", "2,4"])) == 4
    probed = cluster_from_dict(
        {"devices": 1, "memory_bytes": 8e10, "inter_node_bandwidth": 1e12, "runtime_memory_bytes": 68157440.0}
    )
    assert cluster_from_dict(b.planning_cluster(probed, 1, "cpu")).runtime_memory_bytes == 68157440.0
