"""Plan reading, action lowering and the dry-run deadlock check; bad input exits 2 before launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from runtime_plans import REPO, SEQ, plan, stage, write

from gpp_solver.errors import DeadlockError, InvalidPlanError
from runtime.lowering.actions import TransferSpec, dry_run, lower
from runtime.lowering.plan_io import parse_plan
from runtime.train import main as train_main


def _two_stage(b0=2, b1=2, big_b=8, dev1=(1,)):
    return plan(big_b, [stage(0, SEQ[:4], [0], b0, big_b, depth=1),
                        stage(1, SEQ[4:], list(dev1), b1, big_b, depth=0)], [[0, 1]])


def _deadlocking():
    doc = _two_stage(b0=2, b1=4)
    # stage 0 waits for B0's gradient before running F1, but stage 1's F0 needs F0 and F1
    doc["stages"][0]["schedule"]["order"] = [["F", 0], ["B", 0], ["F", 1], ["F", 2], ["B", 1],
                                             ["F", 3], ["B", 2], ["B", 3]]
    return doc


def test_lowering_pairs_every_send_with_a_receive():
    p = parse_plan(_two_stage(b0=2, b1=4, dev1=(1, 2)))
    acts = lower(p, [TransferSpec("layers.3", 0, 1, 3)])
    sends = [a.msg for r in acts for a in acts[r] if a.op == "send"]
    recvs = [a.msg for r in acts for a in acts[r] if a.op == "recv"]
    assert sorted(map(str, sends)) == sorted(map(str, recvs))
    # 8 samples cross the edge in 4 producer chunks of 2: 4 activations and 4 gradients
    assert len(sends) == 8
    dry_run(p, acts)


def test_dry_run_refuses_a_deadlock_and_marks_the_stuck_steps():
    p = parse_plan(_deadlocking())
    with pytest.raises(DeadlockError) as info:
        dry_run(p, lower(p, [TransferSpec("layers.3", 0, 1, 3)]))
    text = str(info.value)
    assert "stage 0 (rank 0): F0 [B0]* F1" in text
    assert "stage 1 (rank 1): [F0]* B0 F1 B1" in text


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(format="gpp-plan/0"), "format"),
    (lambda d: d["stages"][0].update(micro_batch_size=3), "B % b == 0"),
    (lambda d: d["stages"][1].update(devices=[1, 2], micro_batch_size=1), "b % d == 0"),
    (lambda d: d["stages"][0]["schedule"].update(order=[["B", 0], ["F", 0]]), "C4"),
    (lambda d: d["stages"][1].update(devices=[0]), "device 0"),
    (lambda d: d.update(edges=[[0, 5]]), "edge"),
])
def test_plan_reader_names_the_problem(mutate, words):
    doc = _two_stage()
    mutate(doc)
    with pytest.raises(InvalidPlanError, match=words):
        parse_plan(doc)


def _run_direct(tmp_path, monkeypatch, capsys, doc, model="examples.sequential:workload", world=2):
    """runtime.train's main() as 'rank 0' without torchrun: the checks run before any process group."""
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
    res = subprocess.run([sys.executable, "-m", "runtime.train", "--plan", write(tmp_path, _deadlocking()),
                          "--model", "examples.sequential:workload"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "deadlock" in res.stderr and "Traceback" not in res.stderr
