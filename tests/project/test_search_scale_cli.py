"""``benchmarks/search_scale.py`` refuses bad input with one line and exit 2 (grid and ``--cell``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "search_scale.py")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--workloads", "nosuch"], "unknown workload 'nosuch'"),
        (["--workloads", "pd-/nonexistent/x.graph.txt"], "no profile file"),
        (["--planners", "nosuch"], "unknown planner 'nosuch'"),
        (["--devices", "8,x"], "--devices must be comma-separated integers"),
        (["--cell", "pd-/nonexistent/x.graph.txt", "8", "graphpipe", "10"], "no profile file"),
        (["--cell", "transformer-12", "8", "nosuch", "10"], "unknown planner 'nosuch'"),
        (["--cell", "transformer-12", "eight", "graphpipe", "10"], "--cell takes WORKLOAD DEVICES PLANNER"),
        (["--cell", "transformer-12", "0", "graphpipe", "10"], "positive devices"),
    ],
)
def test_bad_input_exits_2(args, words):
    r = _run(*args)
    assert r.returncode == 2, r.stderr
    assert words in r.stderr
    assert "Traceback" not in r.stderr


def test_cell_runs_one_planner():
    r = _run("--cell", "transformer-12", "8", "graphpipe", "30")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["planner"] == "graphpipe" and out["devices"] == 8 and out["operators"] == 38
    assert out["status"] in ("optimal-within-search-space", "feasible") and out["iteration_time"] > 0
