"""A loss over the whole batch (CLIP's contrastive loss, a term over the batch's statistics,
in-batch negatives) is refused at the first step with one line saying why, never a traceback;
per-sample losses train and match one process; gpp_runtime.train stops at the first non-finite loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from batch_losses import ACCEPTED, REFUSED
from runtime_plans import REPO, assert_shape, one_f_one_b, plan, stage, torchrun, write

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


def _no_worker_traceback(err: str) -> bool:
    """No rank wrote a Python traceback (torchrun's own report of a failed child is its own)."""
    frames = [ln for ln in err.splitlines() if ln.strip().startswith('File "')]
    return not any("torch/distributed" not in ln and "<frozen runpy>" not in ln for ln in frames)


def _replicated_sink_plan(tmp_path) -> str:
    """fc1, act on rank 0 | fc2 on ranks 1 and 2, micro-batches of 2 (one row per replica)."""
    doc = plan(
        8,
        [stage(0, ["fc1", "act"], [0], 2, 8, depth=1), stage(1, ["fc2"], [1, 2], 2, 8, depth=0)],
        [[0, 1]],
    )
    assert_shape(doc, stages=2, micro_batches=4, devices=[1, 2])
    return write(tmp_path, doc)


def test_batch_level_and_per_sample_losses_through_graph_pipeline():
    """One launch, every case (``loss_worker.py``): three batch-level losses raise ``LossRefused`` on
    every rank at the first step, with micro-batches of 1, 2 and 8 rows and with two replicas of
    the sink; seven per-sample losses train, the sink's loss that of one process."""
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=3",
            str(REPO / "tests" / "runtime" / "loss_worker.py"),
        ],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'runtime'}"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0 and "LOSS-CASES " in res.stdout, res.stderr[-3000:]
    cases = json.loads(res.stdout.split("LOSS-CASES ", 1)[1].splitlines()[0])
    refused = {k: v for k, v in cases.items() if k.split("@")[0] in REFUSED}
    assert len(refused) == 3 * 5 and len(cases) - len(refused) == 2 * len(ACCEPTED) >= 8
    for key, ranks in refused.items():
        origin = ranks[0].get("origin")
        assert all(r.get("error") == "LossRefused" and r["origin"] == origin for r in ranks), (key, ranks)
        assert origin in ((2,) if "chain" in key else (1, 2)), (key, origin)  # a rank of the sink
        msg = ranks[origin]["msg"]
        assert msg.startswith("loss_fn ") and "a pipeline computes the loss per micro-batch" in msg, (key, msg)
    for key, ranks in cases.items():
        if key in refused:
            continue
        sinks = [2] if "chain" in key else [1, 2]
        for r, got in enumerate(ranks):
            assert "error" not in got, (key, got)
            if r in sinks:
                assert all(abs(v - got["want"]) <= 1e-5 * abs(got["want"]) for v in got["losses"]), (key, got)
            else:
                assert got["losses"] == [None, None], (key, got)


def test_train_refuses_a_centering_loss_once_and_every_rank_exits(tmp_path):
    """gpp_runtime.train with two replicas of the sink: one line naming loss_fn, every rank exits 2,
    no rank writes a traceback or a peer's failure."""
    res = torchrun(
        3,
        ["--plan", _replicated_sink_plan(tmp_path), "--model", "tests.runtime.batch_losses:centering", "--steps", "3"],
    )
    err = res.stderr
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert res.returncode != 0 and len(lines) == 1, err[-3000:]
    assert "loss_fn is neither a mean nor a sum" in lines[0] and "centering by the batch mean" in lines[0]
    assert "exitcode  : 2" in err and "exitcode  : 1" not in err, err[-3000:]
    assert _no_worker_traceback(err), err[-3000:]


def test_train_stops_at_the_first_non_finite_loss(tmp_path):
    """A loss that turns NaN at step 2 (sample 5, on the second replica of the sink): exit 1 with
    one line naming the step and the micro-batch; the other ranks stop without a word."""
    res = torchrun(
        3,
        [
            "--plan",
            _replicated_sink_plan(tmp_path),
            "--model",
            "tests.runtime.batch_losses:nan_at_step_2",
            "--steps",
            "6",
        ],
    )
    err = res.stderr
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert res.returncode == 1 and len(lines) == 1, err[-3000:]
    assert "rank 2: error: the loss is not finite (nan) at step 2, micro-batch 2 (samples 5:6" in lines[0], lines
    assert "exitcode  : 1" in err and _no_worker_traceback(err), err[-3000:]
