"""``gpp_runtime.profile --precision``: the graph is measured in the precision the model will
train in and says which; ``gpp_runtime.train`` warns of a graph profiled in another precision
(``--strict`` refuses it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
from runtime_plans import REPO  # noqa: E402

from gpp_runtime import train  # noqa: E402
from gpp_solver.errors import InvalidInputError  # noqa: E402

MODEL = "examples.two_branch:workload"


def _profile(tmp_path, precision: str) -> dict:
    out = tmp_path / f"{precision}.json"
    cmd = [sys.executable, "-m", "gpp_runtime.profile", "--model", MODEL, "--micro-batch-sizes", "2,4"]
    cmd += ["--warmup", "0", "--repeats", "1", "--rounds", "1", "--no-time-terms", "--cpu"]
    cmd += ["--precision", precision, "-o", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profiles")
    return {p: _profile(tmp, p) for p in ("float32", "bf16-autocast", "bf16-model")}


def _nodes(doc: dict) -> dict:
    return {nd["id"]: nd for nd in doc["nodes"]}


def test_the_graph_records_its_precision(profiles):
    for name, doc in profiles.items():
        assert doc["extra"]["profile"]["precision"] == name


def test_bf16_autocast_halves_what_a_linear_layer_sends_but_not_its_weights(profiles):
    f32, bf16 = _nodes(profiles["float32"]), _nodes(profiles["bf16-autocast"])
    fc = "branch0.fc1"  # a Linear: under autocast it returns bfloat16
    assert bf16[fc]["output_bytes"] == f32[fc]["output_bytes"] / 2
    assert bf16[fc]["weight_bytes"] == f32[fc]["weight_bytes"]  # fp32 master weights


def test_autocast_weight_copies_are_counted_per_micro_batch_apart_from_activations(profiles):
    """Under autocast a Linear whose input needs grad saves its weight cast to bfloat16 (8 x 8 x 2
    bytes) once per forward, whatever its rows: ``weight_copy_bytes``, not per-sample activations
    (which hold its bf16 input alone). Neither float32 nor a bf16 model makes a copy."""
    bf16 = _nodes(profiles["bf16-autocast"])
    fc2 = bf16["branch0.fc2"]
    assert fc2["weight_copy_bytes"] == 8 * 8 * 2
    assert fc2["activation_bytes"] == 0  # its saved input is charged to the node that produced it
    assert "weight_copy_bytes" not in bf16["branch0.fc1"]  # fed the model's input: no input gradient
    for name in ("float32", "bf16-model"):
        assert not any("weight_copy_bytes" in nd for nd in profiles[name]["nodes"]), name


def test_a_bf16_model_halves_its_weights_and_outputs(profiles):
    f32, model = _nodes(profiles["float32"]), _nodes(profiles["bf16-model"])
    for nid, nd in f32.items():
        assert model[nid]["weight_bytes"] == nd["weight_bytes"] / 2, nid
        assert model[nid]["output_bytes"] == nd["output_bytes"] / 2, nid


def _args(graph: str, precision: str, strict: bool) -> SimpleNamespace:
    return SimpleNamespace(graph=graph, precision=precision, strict=strict)


def test_training_in_another_precision_than_profiled_warns_or_is_refused(profiles, tmp_path, caplog):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(profiles["bf16-autocast"]))
    train._check_profiled_precision(_args(str(path), "bf16-autocast", True), 0)  # the same: nothing
    with caplog.at_level("WARNING", logger="gpp_runtime.train"):
        train._check_profiled_precision(_args(str(path), "float32", False), 0)
        train._check_profiled_precision(_args(str(path), "float32", False), 1)  # rank 0 alone logs
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "was profiled in bf16-autocast but trains in float32" in warned[0]
    with pytest.raises(InvalidInputError, match="profile with --precision float32"):
        train._check_profiled_precision(_args(str(path), "float32", True), 0)


def test_strict_refuses_it_on_the_command_line_before_training(profiles, tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(profiles["float32"]))
    cmd = [sys.executable, "-m", "gpp_runtime.train", "--plan", "examples/plans/two_branch_3ranks.json"]
    cmd += ["--model", MODEL, "--graph", str(path), "--cluster", "examples/cpu3.json"]
    cmd += ["--precision", "bf16-autocast", "--strict"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    assert res.stderr.startswith("error: ") and "was profiled in float32 but trains in bf16-autocast" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


class _LearnedQueries(torch.nn.Module):
    """Learned query tokens repeated over the batch and fed to a matmul with a Linear's output."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Parameter(torch.randn(3, 8))
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        q = self.q.unsqueeze(0).repeat(x.shape[0], 1, 1)  # (B, 3, 8): grows with the rows
        return torch.bmm(q, self.fc(x).unsqueeze(2)).sum()


def test_a_parameter_repeated_over_the_batch_is_an_activation_not_a_weight_copy():
    """Autocast casts the repeated queries for the bmm: 4 x 3 x 8 bf16 elements saved, made from
    one parameter through one-input operators, but with more elements than the parameter, so they
    grow with the micro-batch and are priced per sample; the Linear's cast weight is a copy."""
    from gpp_runtime.capture.fx_graph import trace
    from gpp_runtime.capture.saved import saved_bytes

    x = torch.randn(4, 8, requires_grad=True)
    mg = trace(_LearnedQueries(), (x,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        kept = saved_bytes(mg, (x,))
    assert kept.weight_copies["fc"] == 8 * 8 * 2
    assert kept.weight_copies["bmm"] == 0
    assert kept.activations["bmm"] == 4 * 3 * 8 * 2
