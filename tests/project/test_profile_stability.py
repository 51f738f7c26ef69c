"""benchmarks/profile_stability.py: the --quick run profiles one model twice, compares the profiles
and their plans, and reports finite figures (the stability itself needs a quiet machine)."""

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
SCRIPT = REPO / "benchmarks" / "profile_stability.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_profile_stability", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _graph(times: list[float]) -> dict:
    return {
        "micro_batch_sizes": [1, 2],
        "op_overhead": {"fw": 1e-4, "bw": 2e-4},
        "optimizer_time_per_byte": 1e-9,
        "nodes": [
            {
                "fw_time": [t, 2 * t],
                "bw_time": [2 * t, 4 * t],
                "weight_bytes": 1000,
                "extra": {"time_spread": {"fw": [[t, t], [2 * t, 3 * t]], "bw": [[2 * t, 2 * t], [4 * t, 5 * t]]}},
            }
            for t in times
        ],
    }


def test_figures_of_two_profiles():
    b = _bench()
    g1, g2 = _graph([1e-3, 2e-3]), _graph([1e-3, 3e-3])
    # one device at 2 samples: forward + backward (6 t per node), 2 nodes x 3e-4 overhead, 2e-6 optimizer
    assert math.isclose(b.one_device_time(g1, 2), 6 * 3e-3 + 6e-4 + 2e-6)
    # the second node moved by 50% against the median (2.5e-3) of its two runs: 3e-3 / 2.5e-3 - 1
    assert math.isclose(b.node_deviation([g1, g2], 2), 0.2)
    # within a run at the largest size: spreads 1+1 (node 1) and 2+2 ms (node 2) over 6 + 12 ms
    assert math.isclose(b.within_run_spread(g1), (1e-3 + 1e-3 + 2e-3 + 2e-3) / (6e-3 + 12e-3))


def test_cost_of_planning_from_another_profile():
    """Two profiles of a 4-node chain that disagree on where the time is, and the 2-stage plan each
    would pick: each plan priced under the other profile costs what the simulator says it does, the
    worse of the two is the cell's figure, one profile alone costs nothing, a missing plan None."""
    from tiny_graphs import chain_dict

    import gpp_solver as gs
    from gpp_solver.plan.build import StageSpec

    b = _bench()
    cdoc = {"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 1e9, "inter_node_bandwidth": 1e9, "latency": 0.0}
    cluster = gs.cluster_from_dict(cdoc)
    g_front, g_back = chain_dict(4, [3.0, 1.0, 1.0, 1.0]), chain_dict(4, [1.0, 1.0, 1.0, 3.0])

    def plan(cut: int):
        specs = [StageSpec(("n0", "n1", "n2", "n3")[:cut], (0,), 2), StageSpec(("n0", "n1", "n2", "n3")[cut:], (1,), 2)]
        return gs.build_plan(
            gs.graph_from_dict(g_front), cluster, specs, 4, planner="manual", search=gs.SearchInfo(0.0, "feasible")
        )

    p_front, p_back = plan(1), plan(3)  # each balances its own profile: 3 | 1+1+1 and 1+1+1 | 3

    def t(p, g):
        return gs.simulate(p, gs.graph_from_dict(g), cluster).iteration_time

    expected = max(t(p_back, g_front) / t(p_front, g_front), t(p_front, g_back) / t(p_back, g_back)) - 1
    assert expected > 0.1  # the other profile's plan is clearly worse under each
    assert math.isclose(b.cross_regret([g_front, g_back], [p_front, p_back], cdoc), expected)
    assert b.cross_regret([g_front, g_front], [p_front, plan(1)], cdoc) == 0.0  # the same plan
    assert b.cross_regret([g_front, g_back], [p_front, "no plan: time limit"], cdoc) is None


@pytest.mark.slow  # about 18 s: profiles and plans twice
def test_quick_run(tmp_path):
    cluster = tmp_path / "cluster.json"  # given, so the run skips the probe (tested on its own)
    cluster.write_text(
        json.dumps(
            {
                "format": "gpp-cluster/1",
                "devices": 2,
                "memory_bytes": 1e10,
                "intra_node_bandwidth": 2e9,
                "inter_node_bandwidth": 2e9,
                "latency": 1e-4,
            }
        )
    )
    out = tmp_path / "stability.json"
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--cluster", str(cluster), "--json", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "| model | one-device predicted ms" in res.stdout and "same plan from every profile" in res.stdout
    (row,) = json.loads(out.read_text())
    assert row["runs"] == 2 and len(row["one_device_seconds"]) == 2
    assert all(math.isfinite(t) and t > 0 for t in row["one_device_seconds"])
    assert set(row["same_plan"]) == {"graphpipe@2"}


def test_one_run_is_refused():
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "at least 2" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("devices", ["x", "2,y", "0"])
def test_bad_device_counts_are_refused_by_name(devices):
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--devices", devices], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "--devices" in res.stderr and "Traceback" not in res.stderr
