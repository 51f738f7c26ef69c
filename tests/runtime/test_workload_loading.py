"""``--model``: a dotted module or a file path, workload modules that import torchvision, timm or
transformers, and the messages for what cannot load."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from runtime_plans import REPO

from gpp_runtime.capture.fx_graph import load_workload
from gpp_solver.errors import InvalidInputError


def test_file_path_loads_like_the_dotted_name():
    by_file = load_workload(f"{REPO / 'examples' / 'sequential.py'}:workload")
    by_name = load_workload("examples.sequential:workload")
    assert [n for n, _ in by_file.model.named_parameters()] == [n for n, _ in by_name.model.named_parameters()]


@pytest.mark.parametrize(
    "spec,words",
    [
        (
            "examples/sequential:workload",
            ["cannot import module 'examples/sequential'", "'examples.sequential'", "path/to/file.py:FUNCTION"],
        ),
        ("examples/nothing_here.py:workload", ["no such file", "nothing_here.py"]),
        ("examples/sequential.py", ["MODULE:FUNCTION", "path/to/file.py:FUNCTION"]),
    ],
)
def test_a_path_that_does_not_load_gets_a_hint(spec, words):
    with pytest.raises(InvalidInputError) as err:
        load_workload(spec)
    for w in words:
        assert w in str(err.value), str(err.value)


MODULE = '''
from types import SimpleNamespace
import torch
{imports}

def workload():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    def sample(batch_size, step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(batch_size, 4, generator=g),), torch.randn(batch_size, 2, generator=g)
    return SimpleNamespace(model=model, sample=sample, loss=lambda o, t: ((o - t) ** 2).sum())
'''


@pytest.mark.parametrize("package", ["timm", "torchvision", "transformers"])
def test_profile_loads_a_module_that_imports_a_vision_or_text_library(tmp_path, package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install -e .[models] timm)")
    (tmp_path / "uses_lib.py").write_text(MODULE.format(imports=f"import {package}"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpp_runtime.profile",
            "--model",
            "uses_lib.py:workload",
            "--micro-batch-sizes",
            "1,2",
            "--warmup",
            "0",
            "--repeats",
            "1",
            "-o",
            "g.json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "g.json").exists()


def test_one_rank_for_a_two_device_plan_is_refused_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpp_runtime.train",
            "--plan",
            "examples/plans/sequential_2ranks.json",
            "--model",
            "examples.sequential:workload",
            "--steps",
            "1",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "error: the plan uses 2 devices but 1 rank was started (torchrun --nproc-per-node 2)"
    ), res.stderr
