"""gpp_runtime.cores: concurrent profiling (--concurrent), the merge of the workers' graphs, the filler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpp_runtime.cores import merge
from gpp_runtime.profile import main

REPO = Path(__file__).resolve().parents[2]
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")


def _doc(fw, bw, spread):
    return {
        "format": "gpp-graph/1",
        "micro_batch_sizes": [1, 2],
        "nodes": [{"id": "a", "fw_time": fw, "bw_time": bw, "extra": {"time_spread": {"fw": spread, "bw": spread}}}],
        "edges": [],
        "extra": {"profile": {"statistic": "median"}},
    }


def test_merge_takes_the_median_per_node_and_size_and_the_widest_spread():
    docs = [
        _doc([1.0, 2.0], [3.0, 4.0], [[0.9, 1.1], [1.9, 2.1]]),
        _doc([5.0, 2.5], [3.0, 9.0], [[4.0, 6.0], [2.4, 2.6]]),
        _doc([2.0, 2.2], [3.5, 1.0], [[1.5, 2.5], [1.0, 3.0]]),
    ]
    out = merge(docs, [0, 1, 2])
    node = out["nodes"][0]
    assert node["fw_time"] == [2.0, 2.2] and node["bw_time"] == [3.0, 4.0]
    assert node["extra"]["time_spread"]["fw"] == [[0.9, 6.0], [1.0, 3.0]]
    conc = out["extra"]["profile"]["concurrent"]
    assert conc["processes"] == 3 and conc["cores"] == [0, 1, 2]
    assert docs[0]["nodes"][0]["fw_time"] == [1.0, 2.0]  # the inputs are left alone
    assert "step_time_per_sample" not in out  # no worker fitted one
    fitted = [dict(d, step_time_per_sample=x) for d, x in zip(docs, (3e-6, 1e-6))] + [docs[2]]
    assert merge(fitted, [0, 1, 2])["step_time_per_sample"] == 1e-6  # the median, a worker without it 0
    assert "step_time_per_sample" not in merge([fitted[0], docs[1], docs[2]], [0, 1, 2])
    fixed = [dict(d, step_time_fixed=x) for d, x in zip(docs, (3e-4, 1e-4, 2e-4))]
    assert merge(fixed, [0, 1, 2])["step_time_fixed"] == 2e-4 and "step_time_fixed" not in out


@TWO_CORES
def test_profile_concurrent_two_pinned_workers(tmp_path):
    out = tmp_path / "graph.json"
    args = [
        "--model",
        "examples.two_branch:workload",
        "--micro-batch-sizes",
        "1,2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "-o",
        str(out),
    ]
    assert main(args + ["--concurrent", "2"]) == 0
    doc = json.loads(out.read_text())
    conc = doc["extra"]["profile"]["concurrent"]
    assert conc["processes"] == 2 and len(set(conc["cores"])) == 2
    single = tmp_path / "single.json"
    assert main(args[:-1] + [str(single)]) == 0
    one = json.loads(single.read_text())
    assert [n["id"] for n in doc["nodes"]] == [n["id"] for n in one["nodes"]]
    assert all(len(n["fw_time"]) == 2 and min(n["fw_time"] + n["bw_time"]) >= 0 for n in doc["nodes"])
    assert "concurrent" not in one["extra"]["profile"]
    workers = doc["extra"]["profile"]["in_situ"]["workers"]  # each worker calibrated (gpp_runtime.calibration.insitu)
    assert len(workers) == 2 and all(len(w["measured"]) == 2 for w in workers)
    assert not list(tmp_path.glob("*.tmp*"))


def test_profile_concurrent_refuses_bad_counts_and_reports_a_worker_error(tmp_path, capsys):
    out = str(tmp_path / "g.json")
    assert main(["--model", "examples.two_branch:workload", "--concurrent", "999", "-o", out]) == 2
    assert "--concurrent must be between 1 and" in capsys.readouterr().err
    if len(os.sched_getaffinity(0)) >= 2:
        assert main(["--model", "nope:workload", "--concurrent", "2", "-o", out]) == 2
        err = capsys.readouterr().err
        assert "profiler worker" in err and "nope" in err and "Traceback" not in err


def _filler(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpp_runtime.cores", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )


def test_filler_pins_itself_and_reports_ready():
    res = _filler("--model", "examples.sequential:workload", "--core", "0", "--seconds", "0.5")
    assert res.returncode == 0 and res.stdout.split() == ["ready"], res.stderr[-500:]
    bad = _filler("--model", "nope:x", "--core", "0")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--core", "4096"], "--core must be between 0 and"),
        (["--core", "-1"], "--core must be between 0 and"),
        (["--core", "0", "--seconds", "0"], "--seconds must be > 0"),
    ],
)
def test_filler_refuses_a_core_it_cannot_have(args, needle):
    res = _filler("--model", "examples.sequential:workload", *args)
    assert res.returncode == 2 and res.stderr.startswith("error: " + needle) and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_merge_keeps_the_weight_gradient_within_the_merged_backward():
    """Each worker's bw_weight_time <= its bw_time, but medians taken apart may cross: the merged
    weight-gradient time is the median, clamped to the merged backward."""
    docs = [
        _doc([1.0, 1.0], [3.0, 4.0], [[0.9, 1.1], [0.9, 1.1]]),
        _doc([1.0, 1.0], [2.0, 9.0], [[0.9, 1.1], [0.9, 1.1]]),
        _doc([1.0, 1.0], [2.5, 5.0], [[0.9, 1.1], [0.9, 1.1]]),
    ]
    for d, w in zip(docs, ([3.0, 1.0], [2.0, 2.0], [2.5, 3.0])):
        d["nodes"][0]["bw_weight_time"] = w
    node = merge(docs, [0, 1, 2])["nodes"][0]
    assert node["bw_time"] == [2.5, 5.0]
    assert node["bw_weight_time"] == [2.5, 2.0]


def test_busy_loop_runs_in_the_precision_given():
    """A filler beside bf16 ranks runs bf16 kernels: its forward under that precision's autocast."""
    import torch

    from gpp_runtime.capture.precision import precision
    from gpp_runtime.cores import busy_loop

    model = torch.nn.Linear(4, 4)
    seen = []
    model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    wl = SimpleNamespace(
        model=model,
        sample=lambda rows, step: ((torch.randn(rows, 4),), torch.randn(rows, 4)),
        loss=lambda out, target: ((out.float() - target) ** 2).mean(),
    )
    for prec, dtype in ((None, torch.float32), (precision("bf16-autocast"), torch.bfloat16)):
        seen.clear()
        assert busy_loop(wl, 2, stop=lambda: len(seen) >= 2, prec=prec) == 2
        assert seen == [dtype, dtype]
        assert model.weight.grad is not None and model.weight.dtype == torch.float32


def test_filler_takes_the_ranks_precision():
    from gpp_runtime.capture.precision import PRECISIONS
    from gpp_runtime.cores import PRECISION_CHOICES

    assert PRECISION_CHOICES == tuple(PRECISIONS)
    res = _filler(
        "--model", "examples.sequential:workload", "--core", "0", "--seconds", "0.5", "--precision", "bf16-model"
    )
    assert res.returncode == 0 and res.stdout.split() == ["ready"], res.stderr[-500:]
