"""``--verify``'s default tolerance (by dtype and optimizer) passes a correct pipeline and fails a
wrong gradient.

The correct runs train ``examples.real_models:two_tower`` (its attention's key bias has a zero
true gradient, which Adam turns into rounding noise of a fraction of ``lr``) with Adam. The
wrong ones are a correct plan run with one fault patched in (``fault_train.py``): the last
micro-batch's loss multiplied by 0, the data-parallel all-reduce left out, a tied weight's
copies each updated with its own stage's gradient.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from runtime_plans import REPO, one_f_one_b, plan, write

WORKER = REPO / "tests" / "runtime" / "fault_train.py"
TOWER = "examples.real_models:two_tower"
TIED = "tests.runtime.fault_train:tied_workload"


def _tower_plan() -> dict:
    """Both towers on 2 data-parallel ranks, fusion and head on a third; 2 micro-batches of 4."""
    towers = ["embed", "text", "image.0", "image.1", "image.2", "image.3", "flatten", "transpose"]
    head = ["fuse", "mean", "mean_1", "cat", "head"]
    return plan(8, [_stage(0, towers, [0, 1], depth=1), _stage(1, head, [2], depth=0)], [[0, 1]])


def _tied_plan() -> dict:
    """The embedding on rank 0, the head (tied to it) on 2 data-parallel ranks."""
    return plan(
        8,
        [
            _stage(0, ["wte", "block0", "act0"], [0], depth=1),
            _stage(1, ["block1", "add", "ln", "lm_head", "flatten"], [1, 2], depth=0),
        ],
        [[0, 1]],
    )


def _stage(sid: int, nodes: list[str], devices: list[int], depth: int) -> dict:
    return {
        "id": sid,
        "nodes": nodes,
        "devices": devices,
        "micro_batch_size": 4,
        "schedule": {"kind": "kFkB", "k": 1, "order": one_f_one_b(depth, 2)},
    }


def _run(tmp_path, fault: str, doc: dict, model: str, *extra: str):
    # the shape the test names: 2 stages, 2 micro-batches of 4, a data-parallel stage, 3 ranks
    assert len(doc["stages"]) == 2 and doc["mini_batch_size"] // 4 == 2
    assert any(len(s["devices"]) == 2 for s in doc["stages"])
    assert len({d for s in doc["stages"] for d in s["devices"]}) == 3
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=3",
        str(WORKER),
        fault,
        "--threads",
        "1",
        "--plan",
        write(tmp_path, doc),
        "--model",
        model,
        "--steps",
        "5",
        "--optimizer",
        "adam",
        "--verify",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    return res, res.stdout + res.stderr


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_correct_adam_run_passes_the_default_tolerance(tmp_path, dtype):
    res, out = _run(tmp_path, "none", _tower_plan(), TOWER, "--dtype", dtype)
    assert res.returncode == 0 and "verify: OK" in out, out[-3000:]
    # the tolerance is Adam's for this dtype, proportional to lr * steps (0.01 * 5)
    want = "atol 0.001" if dtype == "float32" else "atol 5e-10"
    assert want in out, out[-3000:]


@pytest.mark.parametrize(
    "fault,doc,model",
    [
        ("drop-microbatch", _tower_plan(), TOWER),
        ("no-allreduce", _tower_plan(), TOWER),
        ("no-tied-sync", _tied_plan(), TIED),
    ],
)
def test_wrong_gradient_fails_the_default_tolerance(tmp_path, fault, doc, model):
    res, out = _run(tmp_path, fault, doc, model)
    assert res.returncode == 1 and "verify: FAILED" in out, out[-3000:]
    if fault == "no-tied-sync":
        assert "wte.weight: max abs difference" in out, out[-3000:]
