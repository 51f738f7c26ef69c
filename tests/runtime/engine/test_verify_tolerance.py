"""``--verify``'s default tolerance (by dtype and optimizer) passes a correct pipeline and fails a
wrong gradient.

The correct runs train ``examples.real_models:two_tower`` (its attention's key bias has a zero
true gradient, which Adam turns into rounding noise of a fraction of ``lr``) with Adam. The
wrong ones are a correct plan run with one fault patched in (``fault_train.py``): the last
micro-batch's loss multiplied by 0, the data-parallel all-reduce left out, a tied weight's
copies each updated with its own stage's gradient.
"""

from __future__ import annotations

import pytest
from runtime_plans import REPO, launch, one_f_one_b, plan, write

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
    # the shape the test names: 2 micro-batches of 4, 3 ranks; 2 stages, one of them data-parallel,
    # or 3 stages of one rank each (the graph pipeline)
    assert doc["mini_batch_size"] == 8 and all(s["micro_batch_size"] == 4 for s in doc["stages"])
    assert len({d for s in doc["stages"] for d in s["devices"]}) == 3
    assert (len(doc["stages"]) == 2 and any(len(s["devices"]) == 2 for s in doc["stages"])) or len(doc["stages"]) == 3
    args = ["--threads", "1", "--plan", write(tmp_path, doc), "--model", model, "--steps", "5"]
    res = launch(3, [str(WORKER), fault, *args, "--optimizer", "adam", "--verify", *extra], timeout=240)
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


# -- low precision: the reference trains in the same precision; SGD's default tolerance follows eps


def _graph_plan() -> dict:
    """A graph pipeline: the text tower (rank 0) and the image tower (rank 1) each feed the head (rank 2)."""
    image = ["image.0", "image.1", "image.2", "image.3", "flatten", "transpose"]
    head = ["fuse", "mean", "mean_1", "cat", "head"]
    stages = [_stage(0, ["embed", "text"], [0], depth=1), _stage(1, image, [1], depth=1), _stage(2, head, [2], depth=0)]
    return plan(8, stages, [[0, 2], [1, 2]])


def _low(tmp_path, fault: str, doc: dict, precision: str):
    # SGD, lr 0.1, 5 steps: a wrong gradient moves a parameter by 2e-3 or more, rounding by 3e-4 at most
    return _run(tmp_path, fault, doc, TOWER, "--precision", precision, "--optimizer", "sgd", "--lr", "0.1")


LOW_CASES = [
    pytest.param("bf16-autocast", "none", "data-parallel", marks=pytest.mark.slow),
    ("bf16-autocast", "none", "graph"),
    ("bf16-autocast", "drop-microbatch", "graph"),
    ("bf16-autocast", "no-allreduce", "data-parallel"),
    pytest.param("fp16-autocast", "none", "graph", marks=pytest.mark.slow),
    pytest.param("fp16-autocast", "drop-microbatch", "graph", marks=pytest.mark.slow),
    pytest.param("fp16-autocast", "no-allreduce", "data-parallel", marks=pytest.mark.slow),
    pytest.param("bf16-model", "none", "data-parallel", marks=pytest.mark.slow),
    pytest.param("bf16-model", "drop-microbatch", "graph", marks=pytest.mark.slow),
    pytest.param("bf16-model", "no-allreduce", "data-parallel", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("precision,fault,kind", LOW_CASES)
def test_low_precision_verify_passes_a_correct_run_and_fails_a_wrong_gradient(tmp_path, precision, fault, kind):
    doc = _tower_plan() if kind == "data-parallel" else _graph_plan()
    if kind == "graph":  # three stages on one rank each, two of them feeding the third
        assert [s["devices"] for s in doc["stages"]] == [[0], [1], [2]] and len(doc["edges"]) == 2
    res, out = _low(tmp_path, fault, doc, precision)
    if fault == "none":
        assert res.returncode == 0 and "verify: OK" in out, out[-3000:]
    else:
        assert res.returncode == 1 and "verify: FAILED" in out, out[-3000:]
    eps = {"bf16-autocast": 2**-7, "fp16-autocast": 2**-10, "bf16-model": 2**-7}[precision]
    assert f"atol {eps / 2 * 0.1 * 5:g}" in out, out[-3000:]  # eps / 2 * lr * steps


def test_adam_in_a_low_precision_needs_explicit_tolerances(tmp_path):
    res, out = _run(tmp_path, "none", _tower_plan(), TOWER, "--precision", "bf16-autocast")  # _run's Adam
    assert res.returncode != 0, out[-3000:]  # each rank exits 2 before training; torchrun reports 1
    line = "error: --verify has no default tolerance for --optimizer adam in --precision bf16-autocast"
    assert line in out, out[-3000:]
    assert "verify: OK" not in out and "[rank0]: Traceback" not in out
