"""``gpp_runtime.calibration.insitu``: node times scaled to a one-stage plan as the runtime runs it."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist

from gpp_runtime.calibration.insitu import add_in_situ, calibrate, one_stage_plan, rest_fit
from gpp_runtime.profile import main
from gpp_solver import load_graph


def _doc() -> dict:
    def node(i, fw, bw, w):
        spread = {"fw": [[f * 0.9, f * 1.2] for f in fw], "bw": [[g * 0.9, g * 1.2] for g in bw]}
        return {
            "id": f"n{i}",
            "fw_time": list(fw),
            "bw_time": list(bw),
            "bw_weight_time": [g / 2 for g in bw],
            "weight_bytes": w,
            "extra": {"time_spread": spread},
        }

    return {
        "micro_batch_sizes": [1, 2],
        "nodes": [node(0, [1e-3, 2e-3], [2e-3, 4e-3], 100), node(1, [3e-3, 4e-3], [1e-3, 2e-3], 300)],
        "op_overhead": {"fw": 1e-4, "bw": 0.0},
        "extra": {"profile": {}},
    }


def test_calibrate_makes_the_one_stage_sums_the_measured_times():
    doc = _doc()
    measured = [
        {"size": 1, "fw": 2.2e-3, "bw": 3.3e-3, "step": 6.0e-3, "rest": 0.5e-3},
        {"size": 2, "fw": 9.2e-3, "bw": 6.0e-3, "step": 16.0e-3, "rest": 0.8e-3},
    ]
    rec = calibrate(doc, measured)
    nodes = doc["nodes"]
    # forward: (measured - 2 nodes x 0.1 ms) / (1 + 3 ms) at size 1, / (2 + 4 ms) at size 2
    assert rec["scale"]["fw"] == pytest.approx([2.0e-3 / 4e-3, 9.0e-3 / 6e-3])
    assert rec["scale"]["bw"] == pytest.approx([3.3e-3 / 3e-3, 6.0e-3 / 6e-3])
    for i, m in enumerate(measured):
        assert sum(nd["fw_time"][i] for nd in nodes) + 2 * 1e-4 == pytest.approx(m["fw"])
        assert sum(nd["bw_time"][i] for nd in nodes) == pytest.approx(m["bw"])
    assert nodes[0]["fw_time"] == pytest.approx([0.5e-3, 3e-3])  # each node keeps its share
    assert nodes[0]["extra"]["time_spread"]["fw"][0] == pytest.approx([0.45e-3, 0.6e-3])
    assert all(w <= b for nd in nodes for w, b in zip(nd["bw_weight_time"], nd["bw_time"]))
    # the step's rest, 0.5 ms at 1 sample and 0.8 at 2 (no optimizer timed): 0.2 ms a step + 0.3 ms a sample
    assert rec["rest_fit"] == pytest.approx({"fixed": 0.2e-3, "per_sample": 0.3e-3, "optimizer": 0.0})
    assert doc["optimizer_time_per_byte"] == 0.0
    assert doc["step_time_fixed"] == pytest.approx(0.2e-3)
    assert doc["step_time_per_sample"] == pytest.approx(0.3e-3)


def test_the_optimizer_step_timed_alone_survives_a_rest_all_in_the_slope():
    """Two sizes whose rest grows faster than the size (noise): fitted with the optimizer inside, the
    fixed part was 0 and so was optimizer_time_per_byte. Timed on its own (median over the sizes),
    the optimizer step stays (per weight byte); only the rest beyond it is fitted, its fixed part
    per step (none here: no step_time_fixed written, an earlier one dropped)."""
    doc = _doc()
    doc["step_time_fixed"] = 1.0
    measured = [
        {"size": 1, "fw": 2e-3, "bw": 3e-3, "step": 6.0e-3, "rest": 1.0e-3, "optimizer": 0.6e-3},
        {"size": 2, "fw": 4e-3, "bw": 6e-3, "step": 13.0e-3, "rest": 3.0e-3, "optimizer": 0.8e-3},
    ]
    assert rest_fit([1, 2], [1.0e-3, 3.0e-3])[0] == 0.0  # the old fit: no fixed part at all
    rec = calibrate(doc, measured)
    # the rest less the optimizer: 0.4 ms at 1, 2.2 ms at 2 -> 1.8 ms a sample, nothing fixed
    assert rec["rest_fit"] == pytest.approx({"fixed": 0.0, "per_sample": 1.8e-3, "optimizer": 0.7e-3})
    assert doc["optimizer_time_per_byte"] == pytest.approx(0.7e-3 / 400)
    assert doc["step_time_per_sample"] == pytest.approx(1.8e-3) and "step_time_fixed" not in doc


def test_the_steps_rest_is_fitted_robustly_fixed_plus_per_sample():
    """rest(b) = fixed + per_sample * b by the median of pairwise slopes: one slow step moves a few
    pairs, not the fit; a rest that falls with the size is all fixed; one size, all fixed."""
    sizes = [1, 2, 4, 8, 16]
    clean = [1e-3 + 2e-5 * b for b in sizes]
    assert rest_fit(sizes, clean) == pytest.approx((1e-3, 2e-5))
    spoiled = list(clean)
    spoiled[2] += 5e-3  # one slow measurement
    fixed, per_sample = rest_fit(sizes, spoiled)
    assert fixed == pytest.approx(1e-3, rel=0.05) and per_sample == pytest.approx(2e-5, rel=0.05)
    assert rest_fit(sizes, [2e-3 - 1e-5 * b for b in sizes]) == pytest.approx((2e-3 - 1e-5 * 4, 0.0))
    assert rest_fit([4], [3e-3]) == (3e-3, 0.0)
    doc = _doc()
    calibrate(doc, [{"size": 1, "fw": 2.2e-3, "bw": 3.3e-3, "step": 6e-3, "rest": 0.5e-3, "optimizer": 0.1e-3}])
    assert "step_time_per_sample" not in doc and doc["optimizer_time_per_byte"] == pytest.approx(0.1e-3 / 400)
    assert doc["step_time_fixed"] == pytest.approx(0.4e-3)


def test_the_gradient_sum_is_the_median_pair_over_the_weight_bytes():
    """Each step that sums into ``.grad`` less the step before it, over every size: the median,
    per weight byte (400 here); one slow pair moves nothing; a sum that costs nothing (or less) sets
    no term, and a model without the pairs (no optimizer: no weights) keeps none."""
    base = [
        {"size": 1, "fw": 2.2e-3, "bw": 3.3e-3, "step": 6.0e-3, "rest": 0.5e-3},
        {"size": 2, "fw": 9.2e-3, "bw": 6.0e-3, "step": 16.0e-3, "rest": 0.8e-3},
    ]
    doc = _doc()
    pairs = [[1e-4, 2e-4, 9e-3], [1.5e-4, 2.5e-4, 1.8e-4]]  # one pair slow (9 ms)
    rec = calibrate(doc, [dict(m, accumulation_pairs=p) for m, p in zip(base, pairs)])
    assert rec["accumulation"] == {"pairs": 6, "seconds": pytest.approx(1.9e-4)}
    assert doc["grad_accumulation_time_per_byte"] == pytest.approx(1.9e-4 / 400)
    none = _doc()
    none["grad_accumulation_time_per_byte"] = 1.0  # an earlier figure is replaced, not kept
    calibrate(none, [dict(m, accumulation_pairs=[-1e-4, 0.0, -2e-4]) for m in base])
    assert "grad_accumulation_time_per_byte" not in none
    plain = _doc()
    assert "accumulation" not in calibrate(plain, base) and "grad_accumulation_time_per_byte" not in plain


def test_the_sizes_take_turns(monkeypatch):
    """Each size's steps run in TURNS turns over the sizes (warm-up in the first turn only, one
    step after), and each size's pipeline is closed at the end."""
    from gpp_runtime.calibration import insitu as pi

    calls, closed, precisions = [], [], []
    device = torch.device("cpu")

    class Fake:
        def __init__(self, workload, doc, b, optimizer, precision):
            self.b = b
            precisions.append(precision)
            self.pipe = type("P", (), {"close": lambda _: closed.append(b), "device": device})()

        def steps(self, warmup, steps, min_seconds):
            calls.append((self.b, warmup, steps, min_seconds))

        def result(self):
            return {"size": self.b}

    monkeypatch.setattr(pi, "_SizeRun", Fake)
    assert [m["size"] for m in pi.measure(None, {}, [1, 4], 2, 7, "sgd")] == [1, 4]
    per = -(-7 // pi.TURNS)
    want = [(1, 2, per), (4, 2, per)] + [(b, 1, per) for _ in range(pi.TURNS - 1) for b in (1, 4)]
    assert [c[:3] for c in calls] == want and all(c[3] == pi.MIN_SECONDS / pi.TURNS for c in calls)
    assert sorted(closed) == [1, 4] and precisions == [None, None]
    # each size's one-stage plan trains in the profile's precision
    precisions.clear()
    pi.measure(None, {}, [1, 4], 2, 7, "sgd", "bf16-autocast")
    assert precisions == ["bf16-autocast", "bf16-autocast"]
    calls.clear()
    # a GPU (the device the pipelines sit on) keeps one block of steps per size
    calls.clear()
    device = torch.device("cuda", 0)
    pi.measure(None, {}, [1, 4], 2, 7, "sgd")
    assert [c[:3] for c in calls] == [(1, 2, 7), (4, 2, 7)] and all(c[3] == pi.MIN_SECONDS for c in calls)
    # a size whose pipeline cannot be built: the sizes built before it are closed, the error raised
    closed.clear()
    device = torch.device("cpu")

    class Breaks(Fake):
        def __init__(self, workload, doc, b, optimizer, precision):
            if b == 4:
                raise RuntimeError("no pipeline at 4")
            super().__init__(workload, doc, b, optimizer, precision)

    monkeypatch.setattr(pi, "_SizeRun", Breaks)
    with pytest.raises(RuntimeError, match="no pipeline at 4"):
        pi.measure(None, {}, [1, 4, 8], 2, 7, "sgd")
    assert closed == [1]


def test_calibrate_leaves_a_kind_it_cannot_scale():
    doc = _doc()
    # a measured forward below the per-node overhead alone: nothing to scale to
    rec = calibrate(doc, [{"size": 1, "fw": 1e-4, "bw": 3e-3, "step": 4e-3, "rest": 0.0}])
    assert rec["scale"]["fw"] == [1.0] and doc["nodes"][0]["fw_time"][0] == 1e-3


def test_the_profile_is_calibrated_in_situ(tmp_path):
    out, raw = tmp_path / "g.json", tmp_path / "raw.json"
    argv = ["--model", "examples.two_branch:workload", "--micro-batch-sizes", "1,4", "--warmup", "1"]
    assert main([*argv, "--repeats", "3", "--rounds", "1", "-o", str(out)]) == 0
    assert main([*argv, "--repeats", "3", "--rounds", "1", "--no-in-situ", "-o", str(raw)]) == 0
    g = json.loads(out.read_text())
    rec = g["extra"]["profile"]["in_situ"]
    assert [m["size"] for m in rec["measured"]] == [1, 4]
    n = len(g["nodes"])
    for i, m in enumerate(rec["measured"]):
        assert m["fw"] > 0 and m["bw"] > 0 and m["step"] >= m["fw"] + m["bw"] - 1e-9
        for kind in ("fw", "bw"):
            total = sum(nd[f"{kind}_time"][i] for nd in g["nodes"]) + n * g["op_overhead"][kind]
            if rec["scale"][kind][i] != 1.0:
                assert total == pytest.approx(m[kind], rel=1e-9)
    assert "in_situ" not in json.loads(raw.read_text())["extra"]["profile"]
    # every other timed step summed into .grad: one pair per plain step at each size
    assert rec["accumulation"]["pairs"] == sum(m["steps"] for m in rec["measured"])
    assert all(len(m["accumulation_pairs"]) == m["steps"] for m in rec["measured"])
    assert g.get("grad_accumulation_time_per_byte", 0.0) == pytest.approx(
        rec["accumulation"]["seconds"] / sum(nd["weight_bytes"] for nd in g["nodes"])
    )
    # the one-stage plan it ran prices as measured at a profiled size
    plan = one_stage_plan(g, 4)
    assert [len(s.nodes) for s in plan.stages] == [n] and plan.stages[0].micro_batch_size == 4
    assert load_graph(str(out)).op_overhead is not None


def test_an_initialised_process_group_skips_the_calibration(tmp_path):
    doc = _doc()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        add_in_situ(doc, object(), [1], 0, 1, "sgd")
    finally:
        dist.destroy_process_group()
    assert "skipped" in doc["extra"]["profile"]["in_situ"]
    assert doc["nodes"][0]["fw_time"] == [1e-3, 2e-3]


def test_a_model_the_runtime_refuses_to_train_keeps_its_profiled_times():
    """A loss over the whole batch (neither a mean nor a sum over samples) cannot be split into
    micro-batches: the runtime refuses it, so the calibration is skipped, saying why."""
    from types import SimpleNamespace

    import torch

    from gpp_runtime.calibration.terms import profile_with_terms

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    wl = SimpleNamespace(
        model=model,
        sample=lambda b, step: ((torch.randn(b, 4),), torch.randn(b, 1)),
        loss=lambda out, target: ((out - target) ** 2).std(),
    )
    doc = profile_with_terms(wl, [2, 4], warmup=0, repeats=1)
    skipped = doc["extra"]["profile"]["in_situ"]["skipped"]
    assert "did not train" in skipped and "loss_fn" in skipped
    assert "op_overhead" in doc  # the other time terms are there


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
def test_the_optimizer_clock_times_what_runs_between_its_start_and_stop(kind):
    """On a CPU the wall clock; on CUDA two events on the stream (no synchronisation before the
    optimizer step, as gpp_runtime.train runs it)."""
    import time

    import torch

    from gpp_runtime.calibration.insitu import _OptimizerClock

    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    clock = _OptimizerClock(torch.device(kind))
    if kind == "cuda":
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU cycles on the stream
    else:
        time.sleep(0.02)
    clock.stop()
    if kind == "cuda":
        torch.cuda.synchronize()
    assert 0.001 < clock.seconds() < 5.0
