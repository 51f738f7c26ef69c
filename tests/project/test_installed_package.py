"""The installed wheel, used from a directory outside the checkout: profile (``--concurrent 2``),
``gpp plan``, train under torchrun with ``--verify``, probe. Only the wheel's files are importable
(``PYTHONPATH`` is the install folder; the checkout's ``runtime/`` is not on the path), so every
subprocess the runtime starts must name ``gpp_runtime``, not ``runtime``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

WORKLOAD = '''
from types import SimpleNamespace
import torch
from torch import nn

def workload():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    def sample(batch_size, step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(batch_size, 8, generator=g),), torch.randn(batch_size, 3, generator=g)
    return SimpleNamespace(model=model, sample=sample, loss=lambda o, t: ((o - t) ** 2).sum())
'''


def _build(tmp: Path) -> Path:
    """``pip wheel`` of the checkout, installed with ``--target`` (no dependencies: the venv has them)."""
    wheels, site = tmp / "wheels", tmp / "site"
    for isolation in (["--no-build-isolation"], []):  # the venv's setuptools, else pip fetches one
        res = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(wheels), str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if res.returncode == 0:
            break
    assert res.returncode == 0, res.stderr[-2000:]
    (wheel,) = wheels.glob("gpp_solver-*.whl")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return site


@pytest.mark.slow  # about 26 s: builds and installs a wheel
def test_installed_wheel_outside_the_checkout(tmp_path):
    site = _build(tmp_path)
    work = tmp_path / "user"
    work.mkdir()
    (work / "mymodel.py").write_text(WORKLOAD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(site), OMP_NUM_THREADS="1")

    def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        res = subprocess.run(
            [sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert res.returncode == 0, f"{args}:\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
        return res

    where = run(
        "-c",
        "import gpp_runtime, gpp_solver, importlib.util as u; print(gpp_runtime.__file__); "
        "print(gpp_solver.__file__); print(u.find_spec('runtime'))",
    ).stdout.split()
    assert where[0].startswith(str(site)) and where[1].startswith(str(site)), where
    assert where[2] == "None", "the checkout's runtime/ must not be importable here"

    concurrent = min(2, len(os.sched_getaffinity(0)))
    run(
        "-m",
        "gpp_runtime.profile",
        "--model",
        "mymodel:workload",
        "--micro-batch-sizes",
        "2,4",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--concurrent",
        str(concurrent),
        "-o",
        "graph.json",
    )
    graph = json.loads((work / "graph.json").read_text())
    assert graph["extra"]["profile"]["concurrent"]["processes"] == concurrent

    run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "gpp_runtime.probe",
        "--cpu",
        "--memory",
        "1e9",
        "--sizes",
        "1024,65536",
        "--repeats",
        "2",
        "--warmup",
        "1",
        "-o",
        "cluster.json",
    )
    cluster = json.loads((work / "cluster.json").read_text())
    assert cluster["format"] == "gpp-cluster/1" and cluster["devices"] == 2

    gpp = site / "bin" / "gpp"
    plan_cmd = [str(gpp)] if gpp.exists() else [sys.executable, "-m", "gpp_solver"]
    res = subprocess.run(
        [
            *plan_cmd,
            "plan",
            "graph.json",
            "--cluster",
            "cluster.json",
            "--batch",
            "8",
            "--micro-batch-sizes",
            "2,4",
            "--quiet",
            "-o",
            "plan.json",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    plan = json.loads((work / "plan.json").read_text())
    world = len({d for s in plan["stages"] for d in s["devices"]})

    out = run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "gpp_runtime.train",
        "--threads",
        "1",
        "--plan",
        "plan.json",
        "--model",
        "mymodel.py:workload",
        "--steps",
        "2",
        "--verify",
    )
    assert "verify: OK" in out.stdout + out.stderr
