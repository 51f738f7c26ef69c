"""Stages whose replicas shard the optimizer state (``"zero": 1``) under torchrun (gloo, CPU):
training equals one process (``--verify``), a checkpoint of the sharded state resumes exactly,
each replica holds its part of the state, and an optimizer over the whole stage is refused."""

from __future__ import annotations

import pytest
import torch
from runtime_plans import REPO, dp_dropout_plan, launch, torchrun, write

TOWER = "examples.two_tower:workload"
WORKER = str(REPO / "tests" / "runtime" / "zero_worker.py")


def _sharded(doc: dict, stages: set[int]) -> dict:
    for s in doc["stages"]:
        if s["id"] in stages:
            s["zero"] = 1
    return doc


def _run(tmp_path, doc: dict, args: list[str]):
    res = torchrun(4, ["--plan", write(tmp_path, doc), "--model", TOWER, *args])
    return res, res.stdout + res.stderr


@pytest.mark.parametrize(
    "optimizer",
    [
        ["--optimizer", "adam", "--lr", "1e-3"],
        pytest.param(["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"], marks=pytest.mark.slow),
    ],
)
def test_sharded_optimizer_state_equals_one_process(tmp_path, optimizer):
    """Stage 1 on two replicas shards Adam's (or momentum SGD's) state: float64, 3 steps, dropout on."""
    doc = _sharded(dp_dropout_plan(), {1})
    assert [len(s["devices"]) for s in doc["stages"]] == [1, 2, 1] and doc["stages"][1]["zero"] == 1
    res, out = _run(
        tmp_path,
        doc,
        ["--steps", "3", "--dtype", "float64", *optimizer, "--verify", "--rtol", "1e-9", "--atol", "1e-12"],
    )
    assert res.returncode == 0 and "verify: OK" in out, out[-3000:]


@pytest.mark.slow
def test_checkpoint_of_a_sharded_state_resumes_exactly(tmp_path):
    doc = _sharded(dp_dropout_plan(), {1})
    common = ["--steps", "4", "--optimizer", "adam", "--lr", "1e-3", "--dtype", "float64"]
    full = tmp_path / "full.pt"
    res, out = _run(tmp_path, doc, common + ["--save-params", str(full)])
    assert res.returncode == 0, out[-2000:]
    ck = tmp_path / "ck"
    crash = torchrun(
        4,
        ["--plan", write(tmp_path, doc), "--model", TOWER, *common, "--checkpoint", str(ck), "--checkpoint-every", "2"],
        env={"GPP_RUNTIME_TEST_KILL_RANK": "3", "GPP_RUNTIME_TEST_KILL_STEP": "3"},
    )
    assert crash.returncode != 0 and (ck / "stage1-step2.pt").exists()
    state = torch.load(ck / "stage1-step2.pt", weights_only=True)["optimizer"]["state"][0]
    assert state["exp_avg"].dim() == 1  # the stage's whole state, gathered from both replicas' parts
    resumed = tmp_path / "resumed.pt"
    res, out = _run(tmp_path, doc, common + ["--checkpoint", str(ck), "--resume", "--save-params", str(resumed)])
    assert res.returncode == 0 and "resumed from step 2" in out, out[-2000:]
    a, b = torch.load(full, weights_only=True), torch.load(resumed, weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_each_replica_holds_its_part_and_a_whole_stage_optimizer_is_refused(tmp_path):
    doc = _sharded(dp_dropout_plan(), {1})
    res = launch(4, [WORKER, write(tmp_path, doc)])
    out = res.stdout + res.stderr
    assert res.returncode == 0 and out.count("ZERO-OK") == 4, out[-3000:]


def test_zero_on_a_stage_with_one_replica_is_refused(tmp_path):
    doc = _sharded(dp_dropout_plan(), {0})
    res, out = _run(tmp_path, doc, ["--steps", "1"])
    assert res.returncode != 0 and "zero 1 shards the optimizer state" in out, out[-3000:]


@pytest.mark.slow  # a GPT-2 profile and three ranks
def test_a_sharded_stage_holding_a_tied_weight_is_refused(tmp_path):
    """GPT-2 with its head tied to the embedding, the embedding's stage on two replicas sharding:
    refused before training, in one line naming the stage (the tied copies must stay equal)."""
    from gpp_runtime.capture.fx_graph import load_workload
    from gpp_runtime.capture.profiler import profile
    from gpp_solver import cluster_from_dict, graph_from_dict, save_plan
    from gpp_solver.plan.build import StageSpec, build_plan
    from gpp_solver.types import SearchInfo

    doc = profile(load_workload("examples.real_models:gpt2_tiny_tied"), [2], warmup=0, repeats=1, name="gpt2")
    ids = [n["id"] for n in doc["nodes"]]
    first, rest = tuple(ids[: len(ids) // 2]), tuple(ids[len(ids) // 2 :])
    assert "embedding" in first and "linear" in rest  # the tied weight on both stages
    cluster = cluster_from_dict(
        {"format": "gpp-cluster/1", "devices": 3, "memory_bytes": 1e12, "inter_node_bandwidth": 1e9, "latency": 1e-5}
    )
    specs = [StageSpec(first, (0, 1), 2, zero=1), StageSpec(rest, (2,), 2)]
    plan = build_plan(graph_from_dict(doc), cluster, specs, 4, planner="hand", search=SearchInfo(0.0, "feasible"))
    assert [(len(s.devices), s.zero) for s in plan.stages] == [(2, 1), (1, 0)]
    save_plan(plan, tmp_path / "plan.json")
    res = torchrun(3, ["--plan", str(tmp_path / "plan.json"), "--model", "examples.real_models:gpt2_tiny_tied"], 300)
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "error: stage 0 holds a weight tied to another stage" in out, out[-3000:]
    assert "InvalidInputError" not in out  # one line, not the rank's traceback (torchrun's own follows)
