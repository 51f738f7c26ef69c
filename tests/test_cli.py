"""The `gpp` command: exit codes and one-line messages for bad input; the happy paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gpp_solver as gs
from gpp_solver.cli import main
from gpp_solver.plan.build import StageSpec


def run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def files(tmp_path, diamond, cluster_dict):
    g = tmp_path / "g.json"
    c = tmp_path / "c.json"
    g.write_text(json.dumps(diamond))
    c.write_text(json.dumps(cluster_dict))
    graph = gs.graph_from_dict(diamond)
    cl = gs.cluster_from_dict(cluster_dict)
    plan = gs.build_plan(graph, cl, [StageSpec(("a",), (0,), 2), StageSpec(("b", "c"), (1,), 2),
                                     StageSpec(("d",), (2,), 2)], 8, planner="manual",
                         search=gs.SearchInfo(0.0, "feasible"))
    p = tmp_path / "p.json"
    gs.save_plan(plan, p)
    return g, c, p


def test_validate_ok(files, capsys):
    g, c, p = files
    rc, out, _ = run(["validate", str(g)], capsys)
    assert rc == 0 and "is valid" in out
    rc, out, _ = run(["validate", str(g), "--cluster", str(c), "--plan", str(p)], capsys)
    assert rc == 0 and "3 stages" in out


def test_simulate_grid_and_trace(files, capsys, tmp_path):
    g, c, p = files
    t = tmp_path / "t.json"
    rc, out, err = run(["simulate", str(p), "--graph", str(g), "--cluster", str(c), "--trace", str(t)], capsys)
    if rc != 0 and "trace" in err:
        pytest.skip("trace module not installed")
    assert rc == 0 and "iteration" in out
    assert json.loads(t.read_text())["traceEvents"]


@pytest.mark.parametrize("make_argv, needle", [
    (lambda g, c, p, t: ["validate", str(t / "missing.json")], "not found"),
    (lambda g, c, p, t: ["validate", str(g), "--plan", str(p)], "--plan needs --cluster"),
    (lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "0"], "positive integer"),
    (lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "nope"],
     "unknown planner 'nope'; valid planners:"),
    (lambda g, c, p, t: ["plan", str(g), "--cluster", "v100:0", "--batch", "8"], "N >= 1"),
    (lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "alpa",
                         "--no-shared-sinks"], "--no-shared-sinks: only for --planner graphpipe"),
    (lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "pipedream",
                         "--no-depth-tradeoff"], "--no-depth-tradeoff: only for --planner graphpipe"),
    (lambda g, c, p, t: ["model", "nope", "-o", str(t / "x.json")], "unknown model 'nope'"),
    (lambda g, c, p, t: ["import", "pipedream", str(t / "nothere.txt"), "-o", str(t / "x.json")], "nothere"),
    (lambda g, c, p, t: ["frobnicate"], "invalid choice"),
    (lambda g, c, p, t: [], ""),
])
def test_bad_input_exit_2(files, capsys, tmp_path, make_argv, needle):
    g, c, p = files
    rc, out, err = run(make_argv(g, c, p, tmp_path), capsys)
    assert rc == 2
    assert needle in err
    assert "Traceback" not in err
    if needle:
        assert len(err.strip().splitlines()) == 1


def test_bad_files_exit_2(files, capsys, tmp_path, cluster_dict):
    g, c, p = files
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    rc, _, err = run(["validate", str(bad)], capsys)
    assert rc == 2 and "not JSON" in err
    c0 = tmp_path / "c0.json"
    c0.write_text(json.dumps({**cluster_dict, "devices": 0}))
    rc, _, err = run(["validate", str(g), "--cluster", str(c0)], capsys)
    assert rc == 2 and "devices must be at least 1" in err
    plan = json.loads(p.read_text())
    plan["stages"][0]["devices"] = [1]
    bp = tmp_path / "bp.json"
    bp.write_text(json.dumps(plan))
    rc, _, err = run(["validate", str(g), "--cluster", str(c), "--plan", str(bp)], capsys)
    assert rc == 2 and "device 1 is in stage 0 and in stage 1" in err


def test_model_and_import(capsys, tmp_path, shared_dir):
    out = tmp_path / "m.json"
    rc, o, _ = run(["model", "mmt", "--branches", "2", "--layers", "1", "-o", str(out)], capsys)
    assert rc == 0 and gs.load_graph(out).name
    rc, _, err = run(["model", "dlrm", "--layers", "2", "-o", str(out)], capsys)
    assert rc == 2 and "has no parameter --layers" in err
    rc, o, _ = run(["import", "pipedream", str(shared_dir / "data/pipedream/alexnet.graph.txt"), "-o", str(out)],
                   capsys)
    assert rc == 0 and len(gs.load_graph(out).nodes) > 5


def test_python_dash_m_and_help():
    r = subprocess.run([sys.executable, "-m", "gpp_solver", "plan", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "--planner" in r.stdout and "--batch" in r.stdout


def test_solve_options_value(diamond, cluster_dict):
    g = gs.graph_from_dict(diamond)
    c = gs.cluster_from_dict(cluster_dict)
    a = gs.solve(g, c, options=gs.SolveOptions(mini_batch_size=8, planner="graphpipe"))
    b = gs.solve(g, c, mini_batch_size=8, planner="graphpipe")
    assert a.mini_batch_size == 8 and a.planner == "graphpipe"
    assert a.stages == b.stages
    with pytest.raises(gs.InvalidInputError, match="mini_batch_size must be a positive integer"):
        gs.solve(g, c, mini_batch_size=0)
