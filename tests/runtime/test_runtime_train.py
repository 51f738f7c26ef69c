"""Training with hand-written plans under torchrun (gloo, CPU), each checked against one process."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_plans import SEQ, TWO_BRANCH, assert_shape, plan, stage, torchrun, write

SEQ_MODEL = "examples.sequential:workload"
TWO_MODEL = "examples.two_branch:workload"


def _ok(res) -> None:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "verify: OK" in res.stdout + res.stderr


def test_chain_1f1b_equals_one_process(tmp_path):
    doc = plan(8, [stage(0, SEQ[:4], [0], 2, 8, depth=1), stage(1, SEQ[4:], [1], 2, 8, depth=0)], [[0, 1]])
    assert_shape(doc, stages=2, micro_batches=4, devices=[1, 1])
    res = torchrun(
        2, ["--plan", write(tmp_path, doc), "--model", SEQ_MODEL, "--steps", "3", "--verify", "--momentum", "0.9"]
    )
    _ok(res)


def test_two_branch_graph_pipeline_runs_branches_concurrently(tmp_path):
    doc = plan(
        8,
        [
            stage(0, TWO_BRANCH[0], [0], 2, 8, depth=1),
            stage(1, TWO_BRANCH[1], [1], 2, 8, depth=1),
            stage(2, TWO_BRANCH["merge"], [2], 2, 8, depth=0),
        ],
        [[0, 2], [1, 2]],
    )
    assert_shape(doc, stages=3, micro_batches=4, devices=[1, 1, 1])
    for st in doc["stages"]:
        st["predicted"] = {"time_per_sample": 1e-4 * (st["id"] + 1)}
    trace, met = tmp_path / "trace.json", tmp_path / "metrics.json"
    res = torchrun(
        3,
        [
            "--plan",
            write(tmp_path, doc),
            "--model",
            TWO_MODEL,
            "--steps",
            "3",
            "--verify",
            "--trace",
            str(trace),
            "--metrics",
            str(met),
        ],
    )
    _ok(res)
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == {0, 1, 2}

    def step0_span(pid):  # compute of step 0: the first 8 compute events (4 F + 4 B)
        ev = sorted(
            (e for e in events if e["pid"] == pid and e["cat"] == "compute" and e["name"][0] in "FB"),
            key=lambda e: e["ts"],
        )[:8]
        return ev[0]["ts"], ev[-1]["ts"] + ev[-1]["dur"]

    # the two branch stages are busy with the same mini-batch in overlapping windows on
    # different ranks: neither branch finishes its step before the other starts
    (a0, a1), (b0, b1) = step0_span(0), step0_span(1)
    assert a0 < b1 and b0 < a1
    m = json.loads(met.read_text())
    assert m["samples_per_second"] > 0
    assert [s["stage"] for s in m["stages"]] == [0, 1, 2]
    assert all(0 <= s["bubble_fraction"] <= 1 for s in m["stages"])
    assert [s["predicted_time_per_sample"] for s in m["stages"]] == pytest.approx([1e-4, 2e-4, 3e-4])
    assert all(s["measured_time_per_sample"] > 0 for s in m["stages"])
    assert len(m["losses"]) == 3


def test_data_parallel_stage(tmp_path):
    doc = plan(8, [stage(0, SEQ[:4], [0], 4, 8, depth=1), stage(1, SEQ[4:], [1, 2], 4, 8, depth=0)], [[0, 1]])
    assert_shape(doc, stages=2, micro_batches=2, devices=[1, 2])
    _ok(torchrun(3, ["--plan", write(tmp_path, doc), "--model", SEQ_MODEL, "--steps", "3", "--verify"]))


@pytest.mark.parametrize("b0,b1", [(2, 4), (4, 2)])
def test_unequal_micro_batches_across_an_edge(tmp_path, b0, b1):
    doc = plan(8, [stage(0, SEQ[:3], [0], b0, 8, depth=1), stage(1, SEQ[3:], [1], b1, 8, depth=0)], [[0, 1]])
    assert_shape(doc, stages=2, devices=[1, 1])
    assert [s["micro_batch_size"] for s in doc["stages"]] == [b0, b1] and b0 != b1
    _ok(torchrun(2, ["--plan", write(tmp_path, doc), "--model", SEQ_MODEL, "--steps", "2", "--verify"]))


def test_three_branch_merge_with_unequal_and_dp(tmp_path):
    branches = [[f"branch{i}.fc1", f"branch{i}.act", f"branch{i}.fc2"] for i in range(3)]
    doc = plan(
        8,
        [
            stage(0, branches[0], [0], 2, 8, depth=1),
            stage(1, branches[1] + branches[2], [1], 4, 8, depth=1),
            stage(2, ["cat", "head"], [2, 3], 4, 8, depth=0),
        ],
        [[0, 2], [1, 2]],
    )
    assert_shape(doc, stages=3, devices=[1, 1, 2])
    assert [s["micro_batch_size"] for s in doc["stages"]] == [2, 4, 4]
    _ok(
        torchrun(
            4, ["--plan", write(tmp_path, doc), "--model", "examples.two_branch:workload3", "--steps", "2", "--verify"]
        )
    )


@pytest.mark.slow
def test_checkpoint_resume_equals_uninterrupted_run(tmp_path):
    doc = plan(4, [stage(0, SEQ[:4], [0], 2, 4, depth=1), stage(1, SEQ[4:], [1], 2, 4, depth=0)], [[0, 1]])
    path = write(tmp_path, doc)
    common = ["--plan", path, "--model", SEQ_MODEL, "--steps", "4", "--momentum", "0.9"]
    full = tmp_path / "full.pt"
    res = torchrun(2, common + ["--save-params", str(full)])
    assert res.returncode == 0, res.stderr[-2000:]
    ck = tmp_path / "ck"
    crash = torchrun(
        2,
        common + ["--checkpoint", str(ck), "--checkpoint-every", "2"],
        env={"GPP_RUNTIME_TEST_KILL_RANK": "1", "GPP_RUNTIME_TEST_KILL_STEP": "3"},
    )
    assert crash.returncode != 0
    assert (ck / "stage0-step2.pt").exists() and (ck / "stage1-step2.pt").exists()
    resumed = tmp_path / "resumed.pt"
    res = torchrun(2, common + ["--checkpoint", str(ck), "--resume", "--save-params", str(resumed)])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "resumed from step 2" in res.stdout + res.stderr
    a, b = torch.load(full, weights_only=True), torch.load(resumed, weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # a checkpoint of another plan is refused
    other = plan(4, [stage(0, SEQ[:3], [0], 2, 4, depth=1), stage(1, SEQ[3:], [1], 2, 4, depth=0)], [[0, 1]])
    res = torchrun(
        2,
        [
            "--plan",
            write(tmp_path, other, "other.json"),
            "--model",
            SEQ_MODEL,
            "--steps",
            "4",
            "--checkpoint",
            str(ck),
            "--resume",
        ],
    )
    assert res.returncode != 0
    assert "another plan or model" in res.stderr
