"""A loss over the whole batch (CLIP's contrastive loss) is refused with one line saying why, never
a traceback; the same towers with a per-sample loss train and match one process."""

from __future__ import annotations

import pytest
from runtime_plans import one_f_one_b, plan, torchrun, write

TOWERS = ["image.0", "image.1", "image.2", "text.0", "text.1", "text.2"]


def _plan(tmp_path, head: list[str]) -> str:
    doc = plan(
        4,
        [
            {
                "id": 0,
                "nodes": TOWERS,
                "devices": [0],
                "micro_batch_size": 2,
                "schedule": {"kind": "kFkB", "k": 1, "order": one_f_one_b(1, 2)},
            },
            {
                "id": 1,
                "nodes": head,
                "devices": [1],
                "micro_batch_size": 2,
                "schedule": {"kind": "kFkB", "k": 1, "order": one_f_one_b(0, 2)},
            },
        ],
        [[0, 1]],
    )
    # the shape the test names: 2 stages on 2 ranks, 2 micro-batches of 2
    assert len(doc["stages"]) == 2 and doc["mini_batch_size"] // 2 == 2
    return write(tmp_path, doc)


@pytest.mark.parametrize("fn,head", [("logits", ["matmul"]), ("embeddings", ["cat"])])
def test_batch_level_loss_is_refused_in_one_line(tmp_path, fn, head):
    res = torchrun(2, ["--plan", _plan(tmp_path, head), "--model", f"tests.runtime.batch_losses:{fn}", "--steps", "1"])
    err = res.stderr
    assert res.returncode != 0
    lines = [ln for ln in err.splitlines() if "error:" in ln and "loss" in ln]
    assert lines, err[-3000:]
    assert "a pipeline computes the loss per micro-batch" in lines[0]
    assert "use a per-sample loss" in lines[0] and "CLIP" in lines[0]
    # the rank holding the loss exits 2 (bad input) with its message, not a Python traceback
    assert "executor.py" not in err and not any(
        ln.startswith(("IndexError", "RuntimeError")) for ln in err.splitlines()
    ), err[-3000:]
    assert "exitcode  : 2" in err, err[-3000:]


def test_per_sample_loss_on_the_same_towers_trains(tmp_path):
    res = torchrun(
        2,
        [
            "--plan",
            _plan(tmp_path, ["cat"]),
            "--model",
            "tests.runtime.batch_losses:per_sample",
            "--steps",
            "2",
            "--verify",
        ],
    )
    assert res.returncode == 0 and "verify: OK" in res.stdout + res.stderr, res.stderr[-3000:]
