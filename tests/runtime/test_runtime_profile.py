"""gpp_runtime.profile writes a gpp-graph/1 whose node ids are the model's fx nodes."""

from __future__ import annotations

import json
import math

import networkx as nx

from gpp_runtime.profile import main


def test_profile_two_branch_at_two_batch_sizes(tmp_path):
    out = tmp_path / "graph.json"
    assert (
        main(
            [
                "--model",
                "examples.two_branch:workload",
                "--micro-batch-sizes",
                "1,4",
                "--repeats",
                "2",
                "--warmup",
                "1",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    g = json.loads(out.read_text())
    assert g["format"] == "gpp-graph/1" and g["micro_batch_sizes"] == [1, 4]
    ids = [n["id"] for n in g["nodes"]]
    assert ids == [
        "branch0.fc1",
        "branch0.act",
        "branch0.fc2",
        "branch1.fc1",
        "branch1.act",
        "branch1.fc2",
        "cat",
        "head",
    ]
    for n in g["nodes"]:
        assert set(n) == {
            "id",
            "fw_time",
            "bw_time",
            "bw_weight_time",
            "weight_bytes",
            "activation_bytes",
            "output_bytes",
            "workspace_bytes",
            "extra",
        } | ({"grad_views"} if n["id"] == "cat" else set())  # torch.cat's backward hands out views
        assert n.get("grad_views", True) is True
        assert len(n["workspace_bytes"]) == 2 and all(w >= 0 for w in n["workspace_bytes"])  # one per size
        # the sink also keeps the loss's times, which its own include (gpp_runtime.calibration.terms)
        assert set(n["extra"]) == ({"time_spread", "loss_time"} if n["id"] == "head" else {"time_spread"})
        assert len(n["fw_time"]) == len(n["bw_time"]) == len(n["bw_weight_time"]) == 2
        # the weight gradient is a part of the backward; a node without parameters has none
        assert all(0 <= w <= b for w, b in zip(n["bw_weight_time"], n["bw_time"]))
        if n["weight_bytes"] == 0:
            assert n["bw_weight_time"] == [0.0, 0.0]
        for kind in ("fw", "bw"):  # the median lies within the spread of the timed runs
            for t, (lo, hi) in zip(n[f"{kind}_time"], n["extra"]["time_spread"][kind]):
                assert 0 <= lo <= t <= hi
        for v in n["fw_time"] + n["bw_time"] + [n["weight_bytes"], n["activation_bytes"], n["output_bytes"]]:
            assert math.isfinite(v) and v >= 0
    prof = g["extra"]["profile"]
    assert prof["threads"] == 1 and prof["device"] == "cpu"
    assert prof["warmup"] == 1 and prof["repeats"] == 2
    by = {n["id"]: n for n in g["nodes"]}
    assert by["branch0.fc1"]["weight_bytes"] == (8 * 8 + 8) * 4  # Linear(8, 8), float32
    assert by["cat"]["weight_bytes"] == 0
    assert all(w > 0 for w in by["branch0.fc1"]["bw_weight_time"])  # Linear: dW = x^T dy, timed
    assert by["cat"]["output_bytes"] == 16 * 4  # two width-8 rows per sample
    assert by["head"]["output_bytes"] == 4 * 4
    dg = nx.DiGraph([(e["src"], e["dst"]) for e in g["edges"]])
    assert set(dg.nodes) == set(ids)
    assert nx.is_directed_acyclic_graph(dg) and nx.is_weakly_connected(dg)
    assert set(dg.predecessors("cat")) == {"branch0.fc2", "branch1.fc2"}


def test_profile_threads_option(tmp_path):
    out = tmp_path / "graph.json"
    assert (
        main(
            [
                "--model",
                "examples.two_branch:workload",
                "--micro-batch-sizes",
                "2",
                "--threads",
                "2",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert json.loads(out.read_text())["extra"]["profile"]["threads"] == 2
    assert main(["--model", "examples.two_branch:workload", "--threads", "0", "-o", str(out)]) == 2


def test_profile_rejects_bad_batch_sizes(tmp_path):
    assert (
        main(["--model", "examples.two_branch:workload", "--micro-batch-sizes", "4,2", "-o", str(tmp_path / "g.json")])
        == 2
    )
    assert main(["--model", "nope:workload", "-o", str(tmp_path / "g.json")]) == 2


def test_the_old_batch_sizes_spelling_still_works_and_is_called_deprecated(tmp_path, caplog):
    out, old = tmp_path / "new.json", tmp_path / "old.json"
    common = ["--model", "examples.sequential:workload", "--repeats", "1", "--warmup", "0"]
    assert main([*common, "--micro-batch-sizes", "2,4", "-o", str(out)]) == 0
    assert "deprecated" not in caplog.text
    assert main([*common, "--batch-sizes", "2,4", "-o", str(old)]) == 0
    assert "--batch-sizes is deprecated" in caplog.text
    new_doc, old_doc = json.loads(out.read_text()), json.loads(old.read_text())
    assert new_doc["micro_batch_sizes"] == old_doc["micro_batch_sizes"] == [2, 4]
    assert [n["id"] for n in new_doc["nodes"]] == [n["id"] for n in old_doc["nodes"]]


def test_profile_device_is_the_ranks_and_cpu_forces_the_cpu(tmp_path, monkeypatch):
    """The profile runs where gpp_runtime.train puts the rank (the GPU when CUDA is available, unless
    --cpu); --concurrent (profilers on CPU cores) is refused on a GPU."""
    import torch

    from gpp_runtime.profile import profile_device

    out = tmp_path / "graph.json"
    args = ["--model", "examples.two_branch:workload", "--micro-batch-sizes", "2", "--repeats", "1"]
    assert main([*args, "--warmup", "0", "--no-in-situ", "--cpu", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["extra"]["profile"]["device"] == "cpu"
    assert profile_device(cpu=True) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profile_device(cpu=False) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert profile_device(cpu=False) == torch.device("cuda:3")
    assert main([*args, "--concurrent", "2", "-o", str(out)]) == 2
