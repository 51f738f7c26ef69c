"""Stages that recompute their activations (``recompute``) under torchrun (gloo, CPU): each
backward runs its micro-batch's forward again, with the same dropout masks, and the training
equals one process (``--verify``)."""

from __future__ import annotations

from runtime_plans import assert_shape, plan, stage, torchrun, write

TOWER = "examples.two_tower:workload"


def _recomputing(doc: dict, stages: set[int]) -> dict:
    for s in doc["stages"]:
        if s["id"] in stages:
            s["recompute"] = True
    return doc


def _tower_plan() -> dict:
    # the dropout (text.2) on two data-parallel replicas with micro-batch 4, the rest with 2; the
    # first stage runs every forward first (tests/runtime/test_runtime_semantics.py's plan)
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
    return doc


def _verify(tmp_path, doc: dict, *extra: str) -> str:
    res = torchrun(
        4,
        [
            "--plan",
            write(tmp_path, doc),
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
            *extra,
        ],
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "verify: OK" in out, out[-3000:]
    return out


def test_recomputing_stages_with_dropout_and_replicas_equal_one_process(tmp_path):
    """Every stage recomputes, the dropout's among them on two replicas: float64, Adam, 3 steps."""
    doc = _recomputing(_tower_plan(), {0, 1, 2})
    assert [s.get("recompute", False) for s in doc["stages"]] == [True, True, True]
    _verify(tmp_path, doc)


def test_a_recomputing_stage_beside_others_equals_one_process(tmp_path):
    doc = _recomputing(_tower_plan(), {1})
    assert [s.get("recompute", False) for s in doc["stages"]] == [False, True, False]
    _verify(tmp_path, doc)


def test_recompute_with_w_actions_is_refused(tmp_path):
    doc = _recomputing(_tower_plan(), {2})
    doc["stages"][2]["schedule"]["order"] = [
        ["F", 0], ["B", 0], ["W", 0], ["F", 1], ["B", 1], ["W", 1], ["F", 2], ["B", 2], ["W", 2], ["F", 3], ["B", 3], ["W", 3]
    ]  # fmt: skip
    res = torchrun(4, ["--plan", write(tmp_path, doc), "--model", TOWER, "--steps", "1"])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "stage 2: recompute with a split backward (W actions) is not supported" in out, out[
        -3000:
    ]
