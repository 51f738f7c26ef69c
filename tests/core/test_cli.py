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
    plan = gs.build_plan(
        graph,
        cl,
        [StageSpec(("a",), (0,), 2), StageSpec(("b", "c"), (1,), 2), StageSpec(("d",), (2,), 2)],
        8,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
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


@pytest.mark.parametrize(
    "make_argv, needle",
    [
        (lambda g, c, p, t: ["validate", str(t / "missing.json")], "not found"),
        (lambda g, c, p, t: ["validate", str(g), "--plan", str(p)], "--plan needs --cluster"),
        (lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "0"], "positive integer"),
        (
            lambda g, c, p, t: ["plan", str(g), "--cluster", str(c), "--batch", "8", "--planner", "nope"],
            "unknown planner 'nope'; valid planners:",
        ),
        (lambda g, c, p, t: ["plan", str(g), "--cluster", "v100:0", "--batch", "8"], "N >= 1"),
        (
            lambda g, c, p, t: [
                "plan",
                str(g),
                "--cluster",
                str(c),
                "--batch",
                "8",
                "--planner",
                "alpa",
                "--no-shared-sinks",
            ],
            "--no-shared-sinks: only for --planner graphpipe",
        ),
        (
            lambda g, c, p, t: [
                "plan",
                str(g),
                "--cluster",
                str(c),
                "--batch",
                "8",
                "--planner",
                "pipedream",
                "--no-depth-tradeoff",
            ],
            "--no-depth-tradeoff: only for --planner graphpipe",
        ),
        (lambda g, c, p, t: ["model", "nope", "-o", str(t / "x.json")], "unknown model 'nope'"),
        (lambda g, c, p, t: ["import", "pipedream", str(t / "nothere.txt"), "-o", str(t / "x.json")], "nothere"),
        (lambda g, c, p, t: ["frobnicate"], "invalid choice"),
        (lambda g, c, p, t: [], ""),
    ],
)
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


def test_model_and_import(capsys, tmp_path, data_dir):
    out = tmp_path / "m.json"
    rc, o, _ = run(["model", "mmt", "--branches", "2", "--layers", "1", "-o", str(out)], capsys)
    assert rc == 0 and gs.load_graph(out).name
    rc, _, err = run(["model", "dlrm", "--layers", "2", "-o", str(out)], capsys)
    assert rc == 2 and "has no parameter --layers" in err
    rc, o, _ = run(
        ["import", "pipedream", str(data_dir / "pipedream/alexnet.graph.txt"), "--batch-size", "256", "-o", str(out)],
        capsys,
    )
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


# --- the first hour of a new user: defaults, time limit, progress, wording, formats ---


def _subparsers(parser):
    import argparse

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_help_states_every_default_and_describes_every_argument():
    from gpp_solver.cli import build_parser
    from gpp_solver.planners.gpp.planner import DEFAULT_TIME_LIMIT

    parser = build_parser()
    for name, sp in _subparsers(parser).items():
        for a in sp._actions:
            if a.dest == "help":
                continue
            label = f"gpp {name} {'/'.join(a.option_strings) or a.dest}"
            assert a.help, f"{label} has no help text"
            if a.option_strings and a.nargs != 0 and not a.required:
                assert "default" in a.help, f"{label} does not state its default: {a.help!r}"
    plan_help = _subparsers(parser)["plan"].format_help()
    assert f"default: {DEFAULT_TIME_LIMIT:g} s for gpp" in " ".join(plan_help.split())
    compare_help = " ".join(_subparsers(parser)["compare"].format_help().split())
    from gpp_solver.planners.registry import REGISTRY

    assert all(n in compare_help for n in REGISTRY) and "milp is exact" in compare_help


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"gpp {version('gpp_solver')}"


def test_time_limit_is_reported_with_the_hint(capsys, tmp_path):
    g = tmp_path / "m.json"
    assert run(["model", "mmt", "--branches", "2", "--layers", "1", "-o", str(g)], capsys)[0] == 0
    rc, out, err = run(
        [
            "plan",
            str(g),
            "--cluster",
            "v100:4",
            "--batch",
            "16",
            "--time-limit",
            "0.01",
            "--quiet",
            "-o",
            str(tmp_path / "p.json"),
        ],
        capsys,
    )
    assert rc == 0 and "status time-limit" in out
    assert "stopped at the time limit of 0.01 s" in err and "raise it with --time-limit" in err
    assert gs.load_plan(tmp_path / "p.json").search.status == "time-limit"


def test_plan_summary_shows_the_cluster_and_progress(capsys, tmp_path):
    g = tmp_path / "m.json"
    run(["model", "mmt", "--branches", "2", "--layers", "1", "-o", str(g)], capsys)
    rc, out, err = run(
        ["plan", str(g), "--cluster", "h100:2x8", "--batch", "16", "-o", str(tmp_path / "p.json")], capsys
    )
    assert rc == 0
    assert (
        "cluster: 16 devices in 2 nodes of 8, 80 GiB each, 450 GB/s inside a node, 50 GB/s between nodes, latency 10 µs"
    ) in out
    for line in (
        "gpp: seed planner graphpipe running",
        "gpp: seed planner pipedream-2bw:",
        "gpp: local search",
        "gpp: CP-SAT tightening",
    ):
        assert line in err, err


def test_compare_names_each_planner_unless_quiet(files, capsys):
    g, c, _ = files
    argv = ["compare", str(g), "--cluster", str(c), "--batch", "8", "--planners", "graphpipe,pipedream"]
    rc, out, err = run(argv, capsys)
    assert rc == 0 and "| graphpipe |" in out and "cluster: 4 devices in 2 nodes of 2" in out
    assert "compare: running graphpipe (1 of 2)" in err and "compare: running pipedream (2 of 2)" in err
    rc, out, err = run(argv + ["--quiet"], capsys)
    assert rc == 0 and "| pipedream |" in out and err == ""


def test_one_stage_is_singular(capsys, tmp_path, diamond, cluster_dict):
    graph = gs.graph_from_dict(diamond)
    cl = gs.cluster_from_dict(cluster_dict)
    plan = gs.build_plan(
        graph,
        cl,
        [StageSpec(("a", "b", "c", "d"), (0,), 2)],
        8,
        planner="manual",
        search=gs.SearchInfo(0.0, "feasible"),
    )
    (tmp_path / "g.json").write_text(json.dumps(diamond))
    (tmp_path / "c.json").write_text(json.dumps(cluster_dict))
    gs.save_plan(plan, tmp_path / "p.json")
    rc, out, _ = run(
        [
            "validate",
            str(tmp_path / "g.json"),
            "--cluster",
            str(tmp_path / "c.json"),
            "--plan",
            str(tmp_path / "p.json"),
        ],
        capsys,
    )
    assert rc == 0 and "manual: 1 stage, depth 1, 1 of 4 devices (the others idle)," in out and "1 stages" not in out


def test_simulate_grid_has_legends(files, capsys):
    g, c, p = files
    rc, out, _ = run(["simulate", str(p), "--graph", str(g), "--cluster", str(c), "--grid"], capsys)
    assert rc == 0 and "legend: Fj / Bj = forward / backward" in out and "legend: F forward, B backward" in out


def test_show_format_from_extension(files, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    g, c, p = files
    magic = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}
    for ext, head in magic.items():
        out_path = tmp_path / f"plan.{ext}"
        rc, out, err = run(["show", str(p), "--graph", str(g), "--cluster", str(c), "-o", str(out_path)], capsys)
        assert rc == 0 and out_path.read_bytes().startswith(head), ext
        assert "the stage graph and the Gantt chart" in out and err == ""
    rc, _, err = run(["show", str(p), "--graph", str(g), "--cluster", str(c), "-o", str(tmp_path / "plan.jpg")], capsys)
    assert rc == 2 and "extension '.jpg'" in err and ".png, .pdf, .svg" in err
    assert not (tmp_path / "plan.jpg").exists()
    rc, out, err = run(["show", str(p), "--graph", str(g), "-o", str(tmp_path / "nocluster.png")], capsys)
    assert rc == 0 and "drawing the stage graph only" in err and "Gantt" not in out


def test_plan_on_a_profile_names_the_import_command(files, capsys, tmp_path):
    _, c, p = files
    pd = tmp_path / "graph.txt"
    pd.write_text(
        "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
        "activation_size=100.0, parameter_size=0.000\n"
    )
    rc, _, err = run(["plan", str(pd), "--cluster", str(c), "--batch", "8"], capsys)
    assert rc == 2 and f"gpp import pipedream {pd} --batch-size N" in err and len(err.strip().splitlines()) == 1
    piper = tmp_path / "piper.json"
    piper.write_text(json.dumps({"maxDevices": 4, "mbsInBatch": 8, "nodes": [{"id": 0, "TMPCs": {}}], "edges": []}))
    rc, _, err = run(["compare", str(piper), "--cluster", str(c), "--batch", "8"], capsys)
    assert rc == 2 and f"gpp import piper {piper}" in err
    rc, _, err = run(["simulate", str(p), "--graph", str(p), "--cluster", str(c)], capsys)
    assert rc == 2 and "this is a gpp-plan/1 document, not a gpp-graph/1 one" in err
    rc, _, err = run(["simulate", str(p), "--graph", str(tmp_path / "graph.txt"), "--cluster", str(p)], capsys)
    assert rc == 2 and "gpp import pipedream" in err


@pytest.mark.parametrize(
    "spec, devices, per_node, memory_gib, intra, inter",
    [
        ("v100:8", 8, 4, 16, 50e9, 12.5e9),
        ("a100-40g:8", 8, 8, 40, 300e9, 25e9),
        ("a100-80g:4x8", 32, 8, 80, 300e9, 25e9),
        ("h100:2x8", 16, 8, 80, 450e9, 50e9),
        ("h100:12", 12, 8, 80, 450e9, 50e9),
    ],
)
def test_machine_shorthands(capsys, tmp_path, spec, devices, per_node, memory_gib, intra, inter):
    out_path = tmp_path / "c.json"
    rc, out, _ = run(["cluster", spec, "-o", str(out_path)], capsys)
    assert rc == 0 and out.startswith(f"wrote {out_path}: {devices} devices")
    c = gs.load_cluster(out_path)
    assert (
        c.devices,
        c.devices_per_node,
        c.memory_bytes,
        c.intra_node_bandwidth,
        c.inter_node_bandwidth,
        c.latency,
    ) == (devices, per_node, memory_gib * 2**30, intra, inter, 1e-5)
    assert c == gs.v100_cluster(8) if spec == "v100:8" else True


def test_cluster_from_human_units(capsys, tmp_path):
    out_path = tmp_path / "c.json"
    rc, out, _ = run(
        [
            "cluster",
            "--devices",
            "16",
            "--per-node",
            "8",
            "--memory",
            "80GiB",
            "--intra",
            "900GB/s",
            "--inter",
            "200Gb/s",
            "--latency",
            "5us",
            "-o",
            str(out_path),
        ],
        capsys,
    )
    assert rc == 0
    d = json.loads(out_path.read_text())
    assert d == {
        "format": "gpp-cluster/1",
        "devices": 16,
        "memory_bytes": 80 * 2**30,
        "devices_per_node": 8,
        "intra_node_bandwidth": 900e9,
        "inter_node_bandwidth": 25e9,
        "latency": 5e-6,
        "optimizer_state_factor": 4.0,
    }
    assert "16 devices in 2 nodes of 8, 80 GiB each, 900 GB/s inside a node, 25 GB/s between nodes" in out
    rc, out, _ = run(["cluster", "h100:1x8", "--memory", "70GiB", "--latency", "0.002"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["memory_bytes"] == 70 * 2**30 and d["latency"] == 0.002 and d["intra_node_bandwidth"] == 450e9
    rc, out, _ = run(["cluster", "--devices", "4", "--memory", "16GB", "--inter", "10GB/s"], capsys)
    assert rc == 0 and "devices_per_node" not in json.loads(out)


def test_cluster_names_every_figure_it_fills_in(capsys):
    """Each figure not given is named on stderr with its value and the option that sets it; the JSON
    on stdout stays parseable; nothing is named when everything is given."""
    rc, out, err = run(["cluster", "--devices", "2", "--memory", "600kB", "--inter", "1GB/s"], capsys)
    assert rc == 0 and json.loads(out)["latency"] == 0 and len(err.strip().splitlines()) == 1
    for needle in ("latency 0 s per message (default; --latency)", "a flat network", "optimizer state factor 4"):
        assert needle in err, err
    rc, out, err = run(["cluster", "--devices", "4", "--per-node", "2", "--memory", "1GB", "--inter", "1GB/s"], capsys)
    assert rc == 0 and "1 GB/s inside a node (default: --inter's; --intra)" in err and "flat" not in err
    rc, out, err = run(["cluster", "v100:8"], capsys)
    assert rc == 0 and json.loads(out) == gs.cluster_to_dict(gs.v100_cluster(8))
    for needle in ("memory 16 GiB", "12.5 GB/s between nodes", "50 GB/s inside a node", "latency 10 µs"):
        assert needle in err and "(v100:8's" in err, err
    given = ["--devices", "2", "--memory", "1GB", "--inter", "1GB/s", "--latency", "0", "--per-node", "2"]
    rc, out, err = run(["cluster", *given, "--intra", "2GB/s", "--optimizer-state-factor", "3"], capsys)
    assert rc == 0 and err == "" and json.loads(out)["latency"] == 0  # an explicit 0 latency is accepted


def test_cluster_of_one_device_needs_no_bandwidth(capsys):
    rc, out, err = run(["cluster", "--devices", "1", "--memory", "600kB"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["devices"] == 1 and d["inter_node_bandwidth"] == 1e12
    assert "bandwidth 1 TB/s, never used: one device transfers nothing to another (--inter)" in err, err
    # more than one device: refused in one line that says why the bandwidth is needed
    rc, _, err = run(["cluster", "--devices", "2", "--memory", "600kB"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert "give --inter" in err and "prices each transfer between the 2 devices" in err, err


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--devices", "8", "--memory", "80GiBs", "--inter", "1GB/s"], "--memory: unknown unit 'GiBs' in '80GiBs'"),
        (["--devices", "8", "--memory", "80GiB", "--inter", "9 furlongs"], "--inter: unknown unit 'furlongs'"),
        (["--devices", "8", "--memory", "80GiB", "--inter", "fast"], "--inter: expected a number with a unit"),
        (["--devices", "8", "--memory", "80GiB", "--inter", "1GB/s", "--latency", "3 days"], "--latency: unknown unit"),
        (["--devices", "8", "--memory", "80GiB"], "give --inter"),
        (["--devices", "8", "--memory", "80GiB", "--inter", "1GB/s", "--intra", "9GB/s"], "--intra needs --per-node"),
        (["--devices", "2", "--memory", "1GB", "--inter", "1GB/s", "--latency", "-1us"], "--latency: expected"),
        (["--devices", "2", "--memory", "0", "--inter", "1GB/s"], "--memory: expected a positive finite quantity"),
        (["tpu:8"], "unknown machine 'tpu'; known: v100, a100-40g, a100-80g, h100"),
        (["h100:0x8"], "must be at least 1"),
    ],
)
def test_cluster_bad_input_exit_2(capsys, argv, needle):
    rc, _, err = run(["cluster", *argv], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_validate_describes_the_cluster(files, capsys):
    g, _, _ = files
    rc, out, _ = run(["validate", str(g), "--cluster", "a100-80g:4x8"], capsys)
    assert (
        rc == 0
        and (
            "cluster a100-80g:4x8 is valid: 32 devices in 4 nodes of 8, 80 GiB each, 300 GB/s inside a "
            "node, 25 GB/s between nodes"
        )
        in out
    )


def test_plan_with_unknown_machine_exit_2(files, capsys):
    g, _, _ = files
    rc, _, err = run(["plan", str(g), "--cluster", "b200:8", "--batch", "8"], capsys)
    assert rc == 2 and "unknown machine 'b200'" in err


def test_compare_exits_1_when_no_planner_finds_a_plan(files, capsys, tmp_path, cluster_dict):
    g, _, _ = files
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps({**cluster_dict, "memory_bytes": 1}))
    rc, out, err = run(
        ["compare", str(g), "--cluster", str(tiny), "--batch", "8", "--planners", "graphpipe,pipedream", "--quiet"],
        capsys,
    )
    assert rc == 1 and "| graphpipe | infeasible |" in out
    assert err.startswith("gpp: no planner found a plan (graphpipe: ") and "pipedream: " in err


@pytest.mark.parametrize("spec", ["h100:3x8x2", "v100:", "foo:bar"])
def test_malformed_machine_shorthand_is_named_as_such(files, capsys, spec):
    g, _, _ = files
    rc, _, err = run(["plan", str(g), "--cluster", spec, "--batch", "8"], capsys)
    assert rc == 2 and err.strip() == (
        f"gpp: cluster {spec!r}: expected NAME:N or NAME:NODESxPER_NODE with NAME one of v100, a100-40g, a100-80g, h100"
    )


def test_plan_ladder_holds_in_the_plan_or_is_refused(files, capsys, tmp_path):
    """``--ladder N``: gpp's memory ladder of N rungs, recorded in the plan; a bad N or another
    planner: exit 2 with one line."""
    g, c, _ = files
    base = ["plan", str(g), "--cluster", str(c), "--batch", "8", "--quiet"]
    for n in (0, 2):
        out = tmp_path / f"ladder{n}.json"
        rc, _, err = run([*base, "--ladder", str(n), "-o", str(out)], capsys)
        assert rc == 0, err
        ladder = json.loads(out.read_text())["search"]["ladder"]
        assert ladder["rungs"] == n and len(ladder["steps"]) <= n
    rc, _, err = run([*base, "--ladder", "-1"], capsys)
    assert rc == 2 and "ladder must be a non-negative integer" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run([*base, "--ladder", "1", "--planner", "graphpipe"], capsys)
    assert rc == 2 and "'ladder'" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    rc, _, err = run([*base, "--ladder", "two"], capsys)
    assert rc == 2 and "--ladder" in err
