"""Plan reading, action lowering and the dry-run deadlock check; bad input exits 2 before launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from runtime_plans import REPO, SEQ, plan, stage, write

from gpp_runtime.capture.fx_graph import trace
from gpp_runtime.engine.stage_setup import build, seeded_workload
from gpp_runtime.lowering.actions import MessageOp, TransferSpec, dry_run, lower
from gpp_runtime.lowering.plan_check import check_plan, check_world
from gpp_runtime.lowering.plan_io import read_plan
from gpp_runtime.profile import main as profile_main
from gpp_runtime.train import main as train_main
from gpp_solver.errors import DeadlockError, InvalidPlanError
from gpp_solver.formats.cluster import load_cluster
from gpp_solver.formats.graph import load_graph
from gpp_solver.formats.plan_json import plan_to_dict
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo, Status


def _two_stage(b0=2, b1=2, mini_batch_size=8, dev1=(1,)):
    return plan(
        mini_batch_size,
        [
            stage(0, SEQ[:4], [0], b0, mini_batch_size, depth=1),
            stage(1, SEQ[4:], list(dev1), b1, mini_batch_size, depth=0),
        ],
        [[0, 1]],
    )


def _deadlocking():
    doc = _two_stage(b0=2, b1=4)
    # stage 0 waits for B0's gradient before running F1, but stage 1's F0 needs F0 and F1
    doc["stages"][0]["schedule"]["order"] = [
        ["F", 0],
        ["B", 0],
        ["F", 1],
        ["F", 2],
        ["B", 1],
        ["F", 3],
        ["B", 2],
        ["B", 3],
    ]
    return doc


def test_lowering_pairs_every_send_with_a_receive():
    p = read_plan(_two_stage(b0=2, b1=4, dev1=(1, 2)))
    acts = lower(p, [TransferSpec("layers.3", 0, 1, 3)])
    ops = [a for r in acts for a in acts[r] if isinstance(a, MessageOp)]
    sends = [a.msg for a in ops if a.op == "send"]
    recvs = [a.msg for a in ops if a.op == "recv"]
    # every compute action of every rank is its stage's own order entry, a gpp_solver Action
    for s in p.stages:
        for rank in s.devices:
            assert tuple(a for a in acts[rank] if not isinstance(a, MessageOp)) == s.schedule.order
    assert sorted(map(str, sends)) == sorted(map(str, recvs))
    # 8 samples cross the edge in 4 producer chunks of 2: 4 activations and 4 gradients
    assert len(sends) == 8
    dry_run(p, acts)


def test_dry_run_refuses_a_deadlock_and_marks_the_stuck_steps():
    p = read_plan(_deadlocking())
    with pytest.raises(DeadlockError) as info:
        dry_run(p, lower(p, [TransferSpec("layers.3", 0, 1, 3)]))
    text = str(info.value)
    assert "stage 0 (rank 0): F0 [B0]* F1" in text
    assert "stage 1 (rank 1): [F0]* B0 F1 B1" in text


def _check(doc: dict, world: int | None = None) -> None:
    """The runtime's plan checks without a process group: read, world size, gpp's validator on the
    traced model's structure."""
    plan = read_plan(doc)
    check_world(plan, sum(len(s.devices) for s in plan.stages) if world is None else world)
    wl = seeded_workload("examples.sequential:workload")
    check_plan(plan, trace(wl.model, wl.sample(2, 0)[0]))


def test_a_valid_plan_passes_the_checks():
    _check(_two_stage())
    _check(_two_stage(b0=2, b1=4, dev1=(1, 2)))


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda d: d.update(format="gpp-plan/0"), "format"),
        (lambda d: d["stages"][0].update(micro_batch_size=3), "B % b == 0"),
        (lambda d: d["stages"][1].update(devices=[1, 2], micro_batch_size=1), "b % d == 0"),
        (lambda d: d["stages"][0]["schedule"].update(order=[["B", 0], ["F", 0]]), "C4"),
        (lambda d: d["stages"][1].update(devices=[0]), "device 0"),
        (lambda d: d["stages"][1].update(devices=[2]), "devices must be 0..1"),
        (lambda d: d.update(edges=[[0, 5]]), "edge"),
        (lambda d: d["stages"][1]["nodes"].remove("head"), "'head' is in no stage"),
        (lambda d: d["stages"][0].update(tensor_parallel=2), "tensor_parallel"),
        (lambda d: d["stages"][0].update(tmpc={d["stages"][0]["nodes"][0]: 0}), "runs in its TMPC 0"),
    ],
)
def test_plan_checks_name_the_problem(mutate, words):
    doc = _two_stage()
    mutate(doc)
    with pytest.raises(InvalidPlanError, match=words):
        _check(doc)


def test_the_world_size_is_the_number_of_ranks_started():
    _check(_two_stage(), world=2)
    with pytest.raises(InvalidPlanError, match="2 devices but 3 ranks"):
        _check(_two_stage(), world=3)


def test_a_missing_in_flight_count_is_taken_from_the_order():
    doc = _two_stage()
    assert all("in_flight_samples" not in s for s in doc["stages"])
    plan = read_plan(doc)
    assert [s.in_flight_samples for s in plan.stages] == [4, 2]  # 1F1B: 2 and 1 micro-batches of 2
    doc["stages"][0]["in_flight_samples"] = 2
    with pytest.raises(InvalidPlanError, match="in_flight_samples is 2 but its order holds up to 4"):
        _check(doc)


def _run_direct(tmp_path, monkeypatch, capsys, doc, model="examples.sequential:workload", world=2):
    """gpp_runtime.train's main() as 'rank 0' without torchrun: the checks run before any process group."""
    for k, v in {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    path = write(tmp_path, doc) if isinstance(doc, dict) else doc
    code = train_main(["--plan", path, "--model", model])
    return code, capsys.readouterr().err


def test_cli_refuses_a_deadlocking_plan_with_the_grid(tmp_path, monkeypatch, capsys):
    code, err = _run_direct(tmp_path, monkeypatch, capsys, _deadlocking())
    assert code == 2
    assert "[B0]*" in err and "Traceback" not in err


def test_cli_refuses_unknown_node_ids_in_one_line(tmp_path, monkeypatch, capsys):
    doc = _two_stage()
    doc["stages"][1]["nodes"] = ["layers.4", "layers.5", "fc_out"]
    code, err = _run_direct(tmp_path, monkeypatch, capsys, doc)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert "'fc_out'" in err and "not a node of the model" in err


def test_cli_bad_json_and_unknown_module_exit_2(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, err = _run_direct(tmp_path, monkeypatch, capsys, str(bad))
    assert code == 2 and "is not JSON" in err
    code, err = _run_direct(tmp_path, monkeypatch, capsys, _two_stage(), model="no_such_module:workload")
    assert code == 2 and "no_such_module" in err
    code, err = _run_direct(tmp_path, monkeypatch, capsys, _two_stage(), world=3)
    assert code == 2 and "2 devices but 3 ranks" in err


def test_cli_can_run_as_a_subprocess_and_exit_2(tmp_path):
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpp_runtime.train",
            "--plan",
            write(tmp_path, _deadlocking()),
            "--model",
            "examples.sequential:workload",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "deadlock" in res.stderr and "Traceback" not in res.stderr


def test_without_a_cluster_the_factor_is_the_plans_record_else_the_default():
    wl = seeded_workload("examples.sequential:workload")
    doc = _two_stage()
    assert build(doc, wl.model, wl.sample(8, 0)[0], rank=0, world=2).optimizer_state_factor == 4.0
    doc["optimizer_state_factor"] = 2.0
    assert build(doc, wl.model, wl.sample(8, 0)[0], rank=1, world=2).optimizer_state_factor == 2.0


@pytest.mark.parametrize("recorded", [True, False])
def test_with_a_cluster_the_factor_is_the_plans_record_else_the_clusters(tmp_path, recorded):
    """A plan priced by gpp_solver on a cluster with factor 3 records it; one that does not record
    it takes --cluster's. Either way the runtime checks the optimizer against 3, not 4."""
    graph, cluster = tmp_path / "g.json", tmp_path / "c.json"
    assert (
        profile_main(
            [
                "--model",
                "examples.sequential:workload",
                "--micro-batch-sizes",
                "2",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "-o",
                str(graph),
            ]
        )
        == 0
    )
    cluster.write_text(
        json.dumps(
            {
                "format": "gpp-cluster/1",
                "devices": 2,
                "memory_bytes": 1e12,
                "inter_node_bandwidth": 1e9,
                "optimizer_state_factor": 3.0,
            }
        )
    )
    specs = [StageSpec(tuple(SEQ[:4]), (0,), 2), StageSpec(tuple(SEQ[4:]), (1,), 2)]
    priced = build_plan(
        load_graph(graph), load_cluster(cluster), specs, 8, planner="hand", search=SearchInfo(0.0, Status.FEASIBLE)
    )
    doc = plan_to_dict(priced)
    assert doc["optimizer_state_factor"] == 3.0
    if not recorded:
        del doc["optimizer_state_factor"]
    wl = seeded_workload("examples.sequential:workload")
    setup = build(doc, wl.model, wl.sample(8, 0)[0], rank=0, world=2, graph_path=str(graph), cluster_path=str(cluster))
    assert setup.optimizer_state_factor == 3.0
