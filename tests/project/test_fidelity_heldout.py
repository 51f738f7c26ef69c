"""The held-out model suite (``benchmarks/model_suite.py``) and its benchmark's arithmetic
(``benchmarks/fidelity_heldout.py``); the benchmark itself runs outside the default suite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

torch = pytest.importorskip("torch")

from benchmarks import fidelity_heldout as fh  # noqa: E402
from benchmarks import model_suite as ms  # noqa: E402


def test_the_sets_are_disjoint_and_drawn_deterministically():
    assert not set(ms.DEV_SEEDS) & set(ms.HELD_OUT_SEEDS)
    assert ms.draw(1003) == ms.draw(1003) and ms.describe(3) == ms.describe(3)
    families = {b.family for s in ms.DEV_SEEDS + ms.HELD_OUT_SEEDS for b in ms.draw(s).branches}
    assert families == set(ms.FAMILIES)
    heavy = {ms.draw(s).heavy for s in ms.HELD_OUT_SEEDS}
    assert heavy == {"activations", "weights"}


@pytest.mark.parametrize("seed", ms.DEV_SEEDS + ms.HELD_OUT_SEEDS)
def test_every_seed_trains_one_step(seed):
    w = ms.workload(seed)
    x, y = w.sample(2, 0)
    assert len(x) == len(w.spec.branches) and y.shape == (2,)
    loss = w.loss(w.model(*x), y)
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in w.model.parameters() if p.requires_grad)


def test_the_issues_conv_towers_train_one_step():
    w = ms.conv_towers()
    x, y = w.sample(2, 0)
    loss = w.loss(w.model(*x), y)
    loss.backward()
    assert torch.isfinite(loss) and w.batch == 64


def test_every_model_of_a_run_has_its_own_label():
    """Labels name each model's graph and plan files: two calibration models are ``bench``
    (``examples.sequential`` and ``examples.two_branch``), and once shared one label."""
    labels = [label for _, label, _, _ in fh._seeds(fh.parse_args(["--set", "all"]))]
    assert len(labels) == len(set(labels))
    assert {"calibration:sequential.bench", "calibration:two_branch.bench"} <= set(labels)


def test_seed_attributes_are_workloads():
    assert ms.seed_3().spec == ms.draw(3)
    with pytest.raises(AttributeError):
        ms.not_a_seed  # noqa: B018


def test_bad_arguments_exit_2():
    with pytest.raises(SystemExit) as e:
        fh.parse_args(["--seeds", "3,x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit):
        fh.parse_args(["--repeats", "0"])
    with pytest.raises(SystemExit):
        fh.parse_args(["--levels", "0"])
    args = fh.parse_args(["--set", "all"])
    assert [e[0] for e in args.seed_list].count("calibration") == 8
    assert [e[0] for e in args.seed_list].count("held-out") == len(ms.HELD_OUT_SEEDS)


def _row(model, limit, planner, predicted, measured, peaks, limit_bytes=1e6, same_as=None):
    r = {"model": model, "limit": limit, "limit_bytes": limit_bytes, "planner": planner, "id": f"{model}-{planner}"}
    r.update(predicted=predicted, measured=measured, group=(model, 8))
    r["memory"] = [
        {"rank": i, "peak_memory_bytes": m, "predicted_peak_memory_bytes": p} for i, (m, p) in enumerate(peaks)
    ]
    if same_as:
        r["same_as"] = same_as
    return r


def test_the_targets_arithmetic():
    rows = [
        _row("held-out:1", "roomy", "gpp", 1.0, 1.2, [(900, 1000)]),
        _row("held-out:1", "roomy", "alpa", 2.0, 2.3, [(1200, 1000)], limit_bytes=1100),  # over 1.05 and the limit
        _row("held-out:1", "0.5", "gpp", 3.0, 4.2, [(500, 700)]),  # predicted > 1.25 x measured
        _row("held-out:1", "0.5", "pipedream", 4.0, 3.6, [(100, 100)]),
        _row("dev:2", "roomy", "gpp", 1.0, 1.0, [(1, 1)]),
    ]
    s = fh.summaries(rows)
    assert set(s) == {"dev", "held-out"}
    m, t, p = s["held-out"]["memory"], s["held-out"]["time"], s["held-out"]["default_pick"]
    assert m["ranks"] == 4 and m["over_1_05"] == 1 and m["under_0_8"] == 1 and len(m["over_limit"]) == 1
    # ratios 1.2, 1.15, 1.4, 0.9: median 1.175; within 10% of it: 1.2 and 1.15
    assert t["median_ratio"] == pytest.approx(1.175) and t["within_10pct_of_median"] == 2
    # gpp's pick: 1.2 against the best 1.2 at roomy; 4.2 against 3.6 at 0.5
    assert p["cells"] == 2 and p["within_1_10"] == 1 and p["worst"] == pytest.approx(4.2 / 3.6)


def test_predicted_pick_compares_gpp_with_the_best_other_planner_per_cell():
    rows = [
        _row("dev:1", "roomy", "gpp", 1.0, None, []),
        _row("dev:1", "roomy", "alpa", 0.8, None, []),
        _row("dev:1", "roomy", "pipedream", 0.9, None, []),
        _row("dev:1", "0.5", "gpp", 2.0, None, []),
        _row("dev:1", "0.5", "alpa", None, None, []),  # no plan
        _row("dev:1", "0.5", "graphpipe", 2.5, None, []),
        _row("dev:1", "0.3", "alpa", 3.0, None, []),  # gpp has none: no cell
    ]
    for r in rows:
        r["devices"] = 2
    picks = {p["limit"]: p["ratio"] for p in fh.predicted_pick(rows)}
    assert picks == {"roomy": pytest.approx(1.25), "0.5": pytest.approx(0.8)}
    assert fh.parse_args(["--set", "dev", "--plan-only"]).plan_only


def test_the_tightest_memory_is_solved_and_a_step_below_is_not(chain, cluster_dict):
    import gpp_solver as gs

    graph, measured = gs.graph_from_dict(chain), gs.cluster_from_dict({**cluster_dict, "memory_bytes": 1e12})
    one = gs.solve(graph, fh._cluster(measured, 1, 1e12), mini_batch_size=8, planner="gpp", time_limit=5)
    m1 = one.predicted.peak_memory_bytes
    least = fh.tightest(graph, measured, 2, 8, m1, 5, steps=6)
    assert m1 / 100 < least <= m1
    assert not isinstance(fh._solve(graph, fh._cluster(measured, 2, least), 8, "gpp", 5), str)
    below = least / (100 ** (1 / 2**6))  # one bisection step's width
    assert isinstance(fh._solve(graph, fh._cluster(measured, 2, below * 0.999), 8, "gpp", 5), str)


def test_reprice_memory_sets_each_measured_rank_beside_the_current_rule(tmp_path, capsys):
    """``benchmarks/reprice_memory.py`` on a workdir as ``fidelity_heldout`` writes it: each rank's
    prediction re-computed by ``order_memory`` for the plan's stage, order and cluster, and the
    targets counted per set of models."""
    import json

    import gpp_solver as gs
    from benchmarks import reprice_memory as rm
    from gpp_solver.cost.memory import order_memory
    from gpp_solver.formats.graph import graph_to_dict
    from gpp_solver.workloads import build_model

    graph = build_model("dlrm")
    cdoc = {
        "format": "gpp-cluster/1",
        "devices": 2,
        "memory_bytes": 1e12,
        "inter_node_bandwidth": 1e10,
        "memory_overheads": True,
    }
    plan = gs.solve(graph, cdoc, mini_batch_size=64, planner="pipedream", time_limit=5)
    cluster = gs.cluster_from_dict(cdoc)
    (tmp_path / "graph-dev:9.json").write_text(json.dumps(graph_to_dict(graph)))
    (tmp_path / "cluster-dev:9-roomy-2.json").write_text(json.dumps(cdoc))
    gs.save_plan(plan, tmp_path / "plan-dev:9-roomy-2-pipedream.json")
    want = [order_memory(graph, cluster, s, s.schedule.order, plan.stages) for s in plan.stages]
    ranks = [
        {
            "rank": d,
            "stage": i,
            "peak_memory_bytes": want[i] * (1.1 if i == 0 else 1.0),
            "predicted_peak_memory_bytes": 1.0,
        }
        for i, s in enumerate(plan.stages)
        for d in s.devices
    ]
    (tmp_path / "metrics-dev:9-roomy-2-pipedream-run0.json").write_text(json.dumps({"ranks": ranks}))
    rows = rm.repriced(tmp_path)
    assert len(rows) == len(ranks) and {r["set"] for r in rows} == {"dev"}
    for r in rows:
        assert r["repriced"] == pytest.approx(want[r["stage"]])
    assert rm.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    over = sum(len(s.devices) for s in plan.stages[:1])
    assert f"dev: {len(ranks)} ranks, measured / repriced prediction 1.000-1.100; above 1.05: {over};" in out
    assert rm.main([str(tmp_path / "missing")]) == 2
    other = tmp_path / "other"  # cost_model_fidelity's layout (MODEL-DEVICES-PLANNER): not read
    other.mkdir()
    (other / "metrics-dlrm-pipedream-run0.json").write_text(json.dumps({"ranks": ranks}))
    assert rm.repriced(other) == [] and rm.main([str(other)]) == 2


def test_precision_reaches_the_profile_and_every_training_run():
    from gpp_runtime import PRECISIONS

    assert fh.PRECISION_CHOICES == tuple(PRECISIONS)
    args = fh.parse_args(["--seeds", "3", "--precision", "bf16-autocast"])
    assert args.profile_flags[-2:] == ["--precision", "bf16-autocast"]
    assert fh.parse_args(["--seeds", "3"]).precision == "float32"
    with pytest.raises(SystemExit):
        fh.parse_args(["--seeds", "3", "--precision", "fp8"])


def test_models_and_planner_options_are_read():
    args = fh.parse_args(["--models", "benchmarks.model_suite:conv_towers@64", "--planners", "gpp,gpp@recompute=off"])
    assert args.seed_list == [("extra", "extra:model_suite.conv_towers", "benchmarks.model_suite:conv_towers", 64)]
    with pytest.raises(SystemExit) as e:
        fh.parse_args(["--models", "benchmarks.model_suite:conv_towers"])  # no @BATCH
    assert e.value.code == 2


def test_a_planner_option_reaches_solve_and_the_levers_table(chain, cluster_dict):
    import gpp_solver as gs

    graph = gs.graph_from_dict(chain)
    cdoc = {**cluster_dict, "memory_bytes": 1e12}
    plan = fh._solve(graph, cdoc, 8, "gpp@recompute=on", 5)
    assert plan.stages and all(s.recompute for s in plan.stages)
    assert "recompute must be one of" in fh._solve(graph, cdoc, 8, "gpp@recompute=maybe", 5)
    rows = [
        {**_row("extra:m", "0.5", "gpp", 1.0, 2.0, []), "devices": 2, "recompute_stages": [0]},
        {**_row("extra:m", "0.5", "gpp@recompute=off", 1.0, 3.0, []), "devices": 2, "recompute_stages": []},
        {**_row("extra:m", "roomy", "gpp", 1.0, 1.0, []), "devices": 2},
    ]
    (pair,) = fh.levers(rows)
    assert (pair["auto"], pair["off"], pair["recompute"]) == (2.0, 3.0, [0])
