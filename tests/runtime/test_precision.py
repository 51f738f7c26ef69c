"""Mixed precision in the runtime: values cross stages in the dtype their producer returns under
the pipeline's autocast, fp16's loss scale is one for the whole pipeline (an overflow on any rank,
data-parallel replicas included, skips the step on every rank and moves every rank's scale the
same way), and a tensor of another dtype than traced is refused before it is sent."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
from runtime_plans import REPO, launch, plan, stage, write  # noqa: E402

WORKER = REPO / "tests" / "runtime" / "precision_worker.py"
TEXT = ["text.0", "text.1", "text.2"]
IMAGE = ["image.0", "image.1", "image.2"]
HEAD = ["cat", "head"]


def _stage(sid: int, nodes: list[str], devices: list[int], depth: int) -> dict:
    return stage(sid, nodes, devices, 4, 8, depth)  # 2 micro-batches of 4, 1F1B


def graph_plan() -> dict:
    """A graph pipeline: each tower its own stage (ranks 0 and 1), both feeding the head (rank 2)."""
    return plan(8, [_stage(0, TEXT, [0], 1), _stage(1, IMAGE, [1], 1), _stage(2, HEAD, [2], 0)], [[0, 2], [1, 2]])


def data_parallel_plan() -> dict:
    """Both towers on 2 data-parallel ranks (0, 1), the head on rank 2."""
    return plan(8, [_stage(0, TEXT + IMAGE, [0, 1], 1), _stage(1, HEAD, [2], 0)], [[0, 1]])


def _run(tmp_path, case: str, doc: dict, timeout: float = 180):
    # the shape the test names: 2 micro-batches of 4 on every stage, 3 ranks
    assert all(s["micro_batch_size"] == 4 for s in doc["stages"]) and doc["mini_batch_size"] == 8
    assert sorted(d for s in doc["stages"] for d in s["devices"]) == [0, 1, 2]
    res = launch(3, [str(WORKER), case, write(tmp_path, doc)], timeout, pythonpath=[REPO, REPO / "tests" / "runtime"])
    out = res.stdout + res.stderr
    return res, out


def _reports(res, out) -> list[dict]:
    assert res.returncode == 0, out[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("PREC-OK "))
    return sorted(json.loads(line.removeprefix("PREC-OK ")), key=lambda r: r["rank"])


def test_bf16_autocast_sends_the_bfloat16_its_producers_return(tmp_path):
    doc = graph_plan()
    assert len(doc["stages"]) == 3 and [s["devices"] for s in doc["stages"]] == [[0], [1], [2]]
    reports = _reports(*_run(tmp_path, "bf16", doc))
    dtypes = reports[0]["dtypes"]
    # the towers' last Linear returns bfloat16 under autocast: what crosses to the head is bf16
    assert dtypes == {"text.2": ["bfloat16"], "image.2": ["bfloat16"]}, dtypes
    assert all(r["param_dtypes"] == ["float32"] for r in reports)  # fp32 master weights
    losses = reports[2]["losses"]
    assert len(losses) == 3 and all(x is not None and torch.isfinite(torch.tensor(x)) for x in losses)
    assert all(r["stepped"] == [True, True, True] for r in reports)


@pytest.mark.parametrize(
    "doc,poisoned", [(graph_plan(), 1), (data_parallel_plan(), 1)], ids=["graph-pipeline", "data-parallel-replica"]
)
def test_an_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path, doc, poisoned):
    # the poisoned rank holds a tower: one stage of 3 (graph), or one replica of 2 (data parallel)
    stage_of = {d: s["id"] for s in doc["stages"] for d in s["devices"]}
    assert stage_of[poisoned] != stage_of[2]
    res, out = _run(tmp_path, f"overflow-{poisoned}", doc)
    # a plan written by hand states no memory: no prediction to compare with (none negative)
    assert "the cost model predicted" not in out, out[-2000:]
    reports = _reports(res, out)
    for r in reports:
        assert r["stepped"] == [True, False, True], r
        assert r["changed_at_1"] is False, r  # no rank stepped at step 1
    scales = [r["scale"] for r in reports]
    assert all(s == scales[0] for s in scales), scales  # every rank holds the same scale
    assert scales[0][1] == scales[0][0] / 2  # halved after the overflow
    assert reports[2]["losses"][1] is not None and torch.isfinite(torch.tensor(reports[2]["losses"][1]))


def test_a_stage_cast_after_the_pipeline_was_built_is_refused_before_its_send(tmp_path):
    doc = graph_plan()
    assert len(doc["stages"]) == 3
    res, out = _run(tmp_path, "cast-after-build", doc)
    assert res.returncode != 0
    line = next(x for x in out.splitlines() if "PREC-REFUSED" in x)
    assert "the activation 'text.2'" in line and "sent from stage 0 (rank 0) to stage 2 (rank 2)" in line, line
    assert "is float64 of shape (4, 8)" in line and "traced float32 of shape (4, 8)" in line, line
