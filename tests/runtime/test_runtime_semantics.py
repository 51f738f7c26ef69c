"""Dropout streams, loss reduction, --dtype/--rtol/--atol, the example training script."""

from __future__ import annotations

import os

import pytest
import torch
from runtime_plans import REPO, dp_dropout_plan, launch, plan, stage, torchrun, write

from gpp_runtime.capture.dropout import Context, chunk_dropout, set_context

TOWER = "examples.two_tower:workload"


def test_dropout_masks_per_chunk_reproducible_and_distinct():
    x = torch.ones(8, 50)
    set_context(Context(seed=0, step=3, lo=0))
    a = chunk_dropout(x[:4], 0.5, "text.2")
    set_context(Context(seed=0, step=3, lo=4))
    b = chunk_dropout(x[4:], 0.5, "text.2")  # the other replica's chunk
    set_context(Context(seed=0, step=3, lo=0, chunk_rows={"text.2": 4}))
    whole = chunk_dropout(x, 0.5, "text.2")  # the one-process reference, same chunks
    assert torch.equal(whole, torch.cat([a, b]))
    assert not torch.equal(a, b)  # replicas draw different masks
    set_context(Context(seed=0, step=4, lo=0))
    assert not torch.equal(chunk_dropout(x[:4], 0.5, "text.2"), a)  # and each step anew
    assert set(a.unique().tolist()) == {0.0, 2.0}


def test_dropout_with_dp_verifies_in_float64_with_adam(tmp_path):
    res = torchrun(
        4,
        [
            "--plan",
            write(tmp_path, dp_dropout_plan()),
            "--model",
            TOWER,
            "--steps",
            "3",
            "--optimizer",
            "adam",
            "--lr",
            "1e-3",
            "--dtype",
            "float64",
            "--verify",
            "--rtol",
            "1e-9",
            "--atol",
            "1e-12",
        ],
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "verify: OK" in out and "rtol 1e-09" in out, out[-3000:]


@pytest.mark.slow
def test_declared_mean_loss_verifies(tmp_path):
    res = torchrun(
        4,
        [
            "--plan",
            write(tmp_path, dp_dropout_plan()),
            "--model",
            "examples.two_tower:workload_mean",
            "--steps",
            "2",
            "--verify",
        ],
    )
    assert res.returncode == 0 and "verify: OK" in res.stdout + res.stderr, res.stderr[-3000:]


def test_undeclared_mean_loss_is_refused(tmp_path):
    doc = plan(
        8,
        [
            stage(
                0,
                ["text.0", "text.1", "text.2", "text.3", "text.4", "image.0", "image.1", "image.2"],
                [0],
                2,
                8,
                depth=1,
            ),
            stage(1, ["cat", "head"], [1], 2, 8, depth=0),
        ],
        [[0, 1]],
    )
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests' / 'runtime'}"}
    res = torchrun(
        2,
        [
            "--plan",
            write(tmp_path, doc),
            "--model",
            "pipe_worker:undeclared_mean_workload",
            "--steps",
            "2",
            "--timeout",
            "20",
        ],
        env=env,
    )
    assert res.returncode != 0
    assert "behaves as a mean" in res.stderr and "loss_reduction = 'mean'" in res.stderr, res.stderr[-3000:]
    assert "rank 1: error:" in res.stderr  # the failing rank (the sink) writes its own error


@pytest.mark.parametrize(
    "precision", ["float32", "bf16-autocast", pytest.param("fp16-autocast", marks=pytest.mark.slow)]
)
def test_example_training_script(tmp_path, precision):
    args = ["--epochs", "3", "--samples", "128", "--save", str(tmp_path), "--precision", precision]
    # no PYTHONPATH, as in a user's shell: the script finds the `examples` package itself
    res = launch(3, ["examples/train_two_tower.py", *args], timeout=180, pythonpath=[])
    assert res.returncode == 0, res.stderr[-3000:]
    losses = [
        float(line.split("mean loss ")[1].split()[0]) for line in res.stdout.splitlines() if line.startswith("epoch ")
    ]
    assert len(losses) == 3 and losses[-1] < losses[0]
    keys = {k for i in range(3) for k in torch.load(tmp_path / f"stage{i}.pt", weights_only=True)}
    assert keys == {n for n, _ in __import__("examples.two_tower", fromlist=["x"]).TwoTower().named_parameters()}
