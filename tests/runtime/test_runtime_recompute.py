"""Stages that recompute their activations (``recompute``) under torchrun (gloo, CPU): each
backward runs its micro-batch's forward again, with the same dropout masks, and the training
equals one process (``--verify``)."""

from __future__ import annotations

import pytest
from runtime_plans import dp_dropout_plan, torchrun, write

TOWER = "examples.two_tower:workload"


def _recomputing(doc: dict, stages: set[int]) -> dict:
    for s in doc["stages"]:
        if s["id"] in stages:
            s["recompute"] = True
    return doc


#: float64 and Adam, so that --verify's tolerances can be tight
VERIFY = "--steps 3 --optimizer adam --lr 1e-3 --dtype float64 --verify --rtol 1e-9 --atol 1e-12".split()


def _verify(tmp_path, doc: dict) -> None:
    res = torchrun(4, ["--plan", write(tmp_path, doc), "--model", TOWER, *VERIFY])
    out = res.stdout + res.stderr
    assert res.returncode == 0 and "verify: OK" in out, out[-3000:]


def test_recomputing_stages_with_dropout_and_replicas_equal_one_process(tmp_path):
    """Every stage recomputes, the dropout's among them on two replicas: float64, Adam, 3 steps."""
    doc = _recomputing(dp_dropout_plan(), {0, 1, 2})
    assert [s.get("recompute", False) for s in doc["stages"]] == [True, True, True]
    _verify(tmp_path, doc)


@pytest.mark.slow  # the test above runs every stage recomputing by default
def test_a_recomputing_stage_beside_others_equals_one_process(tmp_path):
    doc = _recomputing(dp_dropout_plan(), {1})
    assert [s.get("recompute", False) for s in doc["stages"]] == [False, True, False]
    _verify(tmp_path, doc)


def test_recompute_with_w_actions_is_refused(tmp_path):
    doc = _recomputing(dp_dropout_plan(), {2})
    doc["stages"][2]["schedule"]["order"] = [
        ["F", 0], ["B", 0], ["W", 0], ["F", 1], ["B", 1], ["W", 1], ["F", 2], ["B", 2], ["W", 2], ["F", 3], ["B", 3], ["W", 3]
    ]  # fmt: skip
    res = torchrun(4, ["--plan", write(tmp_path, doc), "--model", TOWER, "--steps", "1"])
    out = res.stdout + res.stderr
    assert res.returncode != 0 and "stage 2: recompute with a split backward (W actions) is not supported" in out, out[
        -3000:
    ]
