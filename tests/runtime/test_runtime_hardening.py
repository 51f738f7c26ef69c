"""The runtime validates plans as `gpp validate` does; checkpoints are checked and written safely."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_plans import SEQ, plan, stage, write

from gpp_runtime.engine import checkpoint
from gpp_runtime.profile import main as profile_main
from gpp_runtime.train import main as train_main
from gpp_solver.errors import InvalidInputError


def _run_direct(tmp_path, monkeypatch, capsys, doc, extra=(), world=2):
    """gpp_runtime.train's main() as 'rank 0' without torchrun: every check runs before any process group."""
    for k, v in {"RANK": "0", "WORLD_SIZE": str(world), "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    code = train_main(["--plan", write(tmp_path, doc), "--model", "examples.sequential:workload", *extra])
    return code, capsys.readouterr().err


def _chain() -> dict:
    return plan(8, [stage(0, SEQ[:4], [0], 2, 8, depth=1), stage(1, SEQ[4:], [1], 2, 8, depth=0)], [[0, 1]])


def test_extra_cyclic_stage_edge_is_refused(tmp_path, monkeypatch, capsys):
    doc = _chain()
    doc["edges"].append([1, 0])
    code, err = _run_direct(tmp_path, monkeypatch, capsys, doc)
    assert code == 2 and "plan edge [1, 0]" in err and "Traceback" not in err


def test_non_convex_stage_is_refused(tmp_path, monkeypatch, capsys):
    doc = plan(
        8,
        [
            stage(0, ["layers.0", "layers.1", "layers.5", "head"], [0], 2, 8, depth=0),
            stage(1, ["layers.2", "layers.3", "layers.4"], [1], 2, 8, depth=1),
        ],
        [[0, 1], [1, 0]],
    )
    code, err = _run_direct(tmp_path, monkeypatch, capsys, doc)
    assert code == 2 and ("convex" in err or "cycle" in err), err


def test_graph_and_cluster_validate_memory_as_gpp_validate(tmp_path, monkeypatch, capsys):
    graph = tmp_path / "g.json"
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
    capsys.readouterr()
    cluster = tmp_path / "c.json"
    cluster.write_text(
        json.dumps({"format": "gpp-cluster/1", "devices": 2, "memory_bytes": 100, "inter_node_bandwidth": 1e9})
    )
    doc = _chain()
    for st in doc["stages"]:
        st["in_flight_samples"] = 4 if st["id"] == 0 else 2
    code, err = _run_direct(tmp_path, monkeypatch, capsys, doc, ["--graph", str(graph), "--cluster", str(cluster)])
    assert code == 2 and "memory" in err, err
    code, err = _run_direct(tmp_path, monkeypatch, capsys, doc, ["--graph", str(graph)])
    assert code == 2 and "--graph and --cluster go together" in err


def test_checkpoint_structure_is_checked(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    torch.save(torch.zeros(3), d / "stage0-step1.pt")
    with pytest.raises(InvalidInputError, match="holds a Tensor"):
        checkpoint.load(str(d), 0, 1, "fp", torch.device("cpu"))
    torch.save({"step": 1, "fingerprint": "fp", "params": {}}, d / "stage0-step1.pt")
    with pytest.raises(InvalidInputError, match="lacks optimizer"):
        checkpoint.load(str(d), 0, 1, "fp", torch.device("cpu"))
    (d / "stage0-step1.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InvalidInputError, match="cannot load checkpoint"):
        checkpoint.load(str(d), 0, 1, "fp", torch.device("cpu"))


def test_checkpoint_save_removes_stale_temporaries_and_round_trips(tmp_path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "stage0-step3.pt.tmp12345").write_bytes(b"partial")
    (d / "stage1-step3.pt.tmp999").write_bytes(b"another stage's writer")
    checkpoint.save(str(d), 0, 4, "fp", {"w": torch.ones(2)}, {})
    assert not (d / "stage0-step3.pt.tmp12345").exists()
    assert (d / "stage1-step3.pt.tmp999").exists()
    state = checkpoint.load(str(d), 0, 4, "fp", torch.device("cpu"))
    assert torch.equal(state["params"]["w"], torch.ones(2)) and state["step"] == 4
