"""gpp_runtime.GraphPipeline in a user's own loop (Adam, an LR scheduler) under real torchrun (gloo).

Each test runs ``pipe_worker.py`` on every rank; rank 0 compares the gradients after the first
step and the parameters after three steps with the same loop on one process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from runtime_plans import REPO, assert_shape, plan, stage, write

WORKER = REPO / "tests" / "runtime" / "pipe_worker.py"


def run_worker(nproc: int, case: str, plan_path: str, p2p: str = "auto", timeout: float = 180):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(WORKER),
        case,
        plan_path,
        p2p,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "PIPE-OK" in out, out[-4000:]
    return json.loads(out.split("PIPE-OK ", 1)[1].splitlines()[0])


def _tower_plan() -> dict:
    # stage 1's first op is ReLU(inplace=True) and its input arrives as one received piece
    return plan(
        8,
        [
            stage(0, ["text.0", "image.0", "image.1", "image.2"], [0], 2, 8, depth=2),
            stage(1, ["text.1", "text.2"], [1], 2, 8, depth=1),
            stage(2, ["cat", "head"], [2, 3], 4, 8, depth=0),
        ],
        [[0, 1], [0, 2], [1, 2]],
    )


def test_two_tower_gradients_names_and_dp_sink(tmp_path):
    doc = _tower_plan()
    assert_shape(doc, stages=3, devices=[1, 1, 2])  # the sink on two data-parallel replicas
    info = run_worker(4, "two_tower", write(tmp_path, doc))
    names = {int(k): v for k, v in info["names"].items()}
    assert names[0] == [
        "image.0.bias",
        "image.0.weight",
        "image.2.bias",
        "image.2.weight",
        "text.0.bias",
        "text.0.weight",
    ]
    assert names[1] == ["text.2.bias", "text.2.weight"]
    assert names[2] == ["head.bias", "head.weight"]
    losses = {int(k): v for k, v in info["losses"].items()}
    assert losses[0] == [None] * 3 and losses[1] == [None] * 3
    # both replicas of the sink return the whole mini-batch's loss
    assert losses[2] == losses[3] and all(x > 0 for x in losses[2])
    # Adam: weights + grads + m + v = 4 bytes per weight byte, what the memory model assumes
    assert abs(info["state_factor"]["0"] - 4.0) < 1e-6


def test_tied_embedding_and_head_on_different_stages(tmp_path):
    doc = plan(
        8,
        [
            stage(0, ["wte", "block0", "act0"], [0], 4, 8, depth=1),
            stage(1, ["block1", "add", "ln", "lm_head"], [1, 2], 4, 8, depth=0),
        ],
        [[0, 1]],
    )
    assert_shape(doc, stages=2, micro_batches=2, devices=[1, 2])
    info = run_worker(3, "tied", write(tmp_path, doc))
    # the head's weight is the embedding's: one name, held (and kept equal) by both stages
    assert info["holders"]["wte.weight"] == [0, 1]
    assert "lm_head.weight" not in info["holders"]


def test_tuple_and_dict_values_stay_inside_graph_nodes(tmp_path):
    """MultiheadAttention's tuple and a dict value are grouped with the getitems that read them
    (``gpp_runtime.capture.fx_graph``), so a plan cuts only where tensors flow: stage 0 ends with the attention
    group (its two tensor parts cross), stage 1 ends with the dict's group (``lo`` and ``hi`` cross)."""
    doc = plan(
        8,
        [
            stage(0, ["inp", "attn"], [0], 2, 8, depth=2),
            stage(1, ["sum_1", "add", "fc", "getitem_3"], [1], 2, 8, depth=1),
            stage(2, ["mul", "relu_", "out", "mean"], [2], 2, 8, depth=0),
        ],
        [[0, 1], [1, 2]],
    )
    run_worker(3, "tuple_dict", write(tmp_path, doc))


def test_batched_posting_on_gloo(tmp_path):
    """The NCCL posting order (batch_isend_irecv groups, receives only when due), run on gloo,
    with the bucketed data-parallel all-reduce of the sink's two replicas."""
    run_worker(4, "two_tower", write(tmp_path, _tower_plan()), p2p="batched")
