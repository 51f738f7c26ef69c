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
        (["--workloads", "graph-/nonexistent/g.json"], "no graph file"),
        (["--planners", "nosuch"], "unknown planner 'nosuch'"),
        (["--time-limit", "5,x"], "--time-limit must be comma-separated seconds"),
        (["--time-limit", "5,0"], "--time-limit must be positive"),
        (["--devices", "8,x"], "--devices must be comma-separated integers"),
        (["--cell", "pd-/nonexistent/x.graph.txt", "8", "graphpipe", "10"], "no profile file"),
        (["--cell", "transformer-12", "8", "nosuch", "10"], "unknown planner 'nosuch'"),
        (["--cell", f"graph-{SCRIPT}", "8", "graphpipe", "10"], "search_scale.py"),
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


def test_a_graph_file_is_a_workload(tmp_path):
    """``graph-PATH`` plans a ``gpp-graph/1`` file, labelled by its name, at every limit given."""
    from gpp_solver.formats.graph import save_graph
    from gpp_solver.workloads import build_model

    path = tmp_path / "tiny.json"
    save_graph(build_model("transformer", layers=12), path)
    r = _run("--workloads", f"graph-{path}", "--devices", "8", "--planners", "graphpipe", "--time-limit", "20,30")
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("tiny ")]
    assert [(row[1], row[2], row[4]) for row in rows] == [("38", "8", "20"), ("38", "8", "30")], r.stdout
