"""Hand-written gpp-plan/1 documents and a torchrun launcher for the runtime tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SEQ = ["layers.0", "layers.1", "layers.2", "layers.3", "layers.4", "layers.5", "head"]
TWO_BRANCH = {
    0: ["branch0.fc1", "branch0.act", "branch0.fc2"],
    1: ["branch1.fc1", "branch1.act", "branch1.fc2"],
    "merge": ["cat", "head"],
}


def one_f_one_b(depth: int, num_micro_batches: int) -> list[list]:
    """1F1B order for a stage ``depth`` stages above the sink (0 = sink)."""
    warm = min(depth, num_micro_batches)
    order = [["F", j] for j in range(warm)]
    f, b = warm, 0
    while f < num_micro_batches:
        order += [["F", f], ["B", b]]
        f += 1
        b += 1
    order += [["B", j] for j in range(b, num_micro_batches)]
    return order


def stage(
    sid: int,
    nodes: list[str],
    devices: list[int],
    micro_batch_size: int,
    mini_batch_size: int,
    depth: int,
    order: list | None = None,
) -> dict:
    """One stage dict with a 1F1B order (or ``order``)."""
    num_micro_batches = mini_batch_size // micro_batch_size
    return {
        "id": sid,
        "nodes": nodes,
        "devices": devices,
        "micro_batch_size": micro_batch_size,
        "schedule": {"kind": "kFkB", "k": 1, "order": order or one_f_one_b(depth, num_micro_batches)},
    }


def plan(mini_batch_size: int, stages: list[dict], edges: list[list[int]]) -> dict:
    return {
        "format": "gpp-plan/1",
        "planner": "hand",
        "graph": "test",
        "mini_batch_size": mini_batch_size,
        "stages": stages,
        "edges": edges,
    }


def write(tmp_path: Path, doc: dict, name: str = "plan.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def write_cluster(tmp_path: Path, devices: int, optimizer_state_factor: float) -> dict:
    """A CPU cluster of ``devices`` with unbounded memory and the runtime's memory overheads,
    written to ``tmp_path / "cluster.json"``; returns the document."""
    doc = {
        "format": "gpp-cluster/1",
        "devices": devices,
        "memory_bytes": 1e12,
        "inter_node_bandwidth": 1e9,
        "latency": 1e-5,
        "optimizer_state_factor": optimizer_state_factor,
        "memory_overheads": True,
    }
    (tmp_path / "cluster.json").write_text(json.dumps(doc))
    return doc


def launch(
    nproc: int, target: list[str], timeout: float = 120, env: dict | None = None, pythonpath: list[Path] | None = None
):
    """Run ``python -m torch.distributed.run --standalone --nproc-per-node=NPROC TARGET...`` in the
    repository, one thread a rank, with ``pythonpath`` (default: the repository) as ``PYTHONPATH``
    (``[]``: none, as in a user's shell)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]
    paths = [REPO] if pythonpath is None else pythonpath
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    if paths:
        full_env["PYTHONPATH"] = os.pathsep.join(str(x) for x in paths)
    return subprocess.run(cmd, cwd=REPO, env=full_env | (env or {}), capture_output=True, text=True, timeout=timeout)


def torchrun(nproc: int, args: list[str], timeout: float = 120, env: dict | None = None):
    """Run ``python -m torch.distributed.run --standalone ... -m gpp_runtime.train ARGS``."""
    return launch(nproc, ["-m", "gpp_runtime.train", "--threads", "1", *args], timeout, env)


def assert_shape(
    doc: dict,
    *,
    stages: int | None = None,
    micro_batches: int | None = None,
    devices: list[int] | None = None,
    sizes: set[int] | None = None,
) -> None:
    """Assert the plan document's shape before a test trains on it: the number of stages, the
    micro-batches per stage (``B / b``, every stage), the devices of each stage in order, and that
    every stage's micro-batch size is one of ``sizes``."""
    got = [(len(s["devices"]), s["micro_batch_size"]) for s in doc["stages"]]
    where = f"plan stages (devices, b): {got}, B = {doc['mini_batch_size']}"
    if stages is not None:
        assert len(got) == stages, where
    if micro_batches is not None:
        assert all(doc["mini_batch_size"] // b == micro_batches for _, b in got), where
    if devices is not None:
        assert [d for d, _ in got] == devices, where
    if sizes is not None:
        assert {b for _, b in got} <= sizes, where


def dp_dropout_plan() -> dict:
    """``examples.two_tower:workload`` on 4 ranks in three stages, the dropout's on two replicas."""
    # the dropout (text.2) runs on two data-parallel replicas with micro-batch 4, the rest with 2;
    # stage 0 runs every forward first (1F1B there would wait, in gpp's model, for a B0 that
    # needs its F3: `gpp validate` refuses that order, and so does the runtime)
    gpipe = [["F", j] for j in range(4)] + [["B", j] for j in range(4)]
    doc = plan(
        8,
        [
            stage(0, ["text.0", "image.0", "image.1", "image.2"], [0], 2, 8, depth=2, order=gpipe),
            stage(1, ["text.1", "text.2", "text.3", "text.4"], [1, 2], 4, 8, depth=1),
            stage(2, ["cat", "head"], [3], 2, 8, depth=0),
        ],
        [[0, 1], [0, 2], [1, 2]],
    )
    assert_shape(doc, stages=3, devices=[1, 2, 1])
    assert [s["micro_batch_size"] for s in doc["stages"]] == [2, 4, 2]
    return doc
