"""Every example in README runs: the Python blocks, and the quickstart's main job (minus `pip install`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_python_examples(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks("python")[i], f"README python block {i}", "exec"), {"__name__": "__readme__"})


def test_quickstart_main_job(tmp_path):
    cmd = blocks("bash")[0].strip()
    assert cmd.startswith("pip install -e . && ")
    job = cmd[len("pip install -e . && "):].replace("gpp ", f"{sys.executable} -m gpp_solver ")
    r = subprocess.run(job, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.json").exists() and "stages" in r.stdout


def test_training_example(tmp_path):
    """README's profile -> plan -> torchrun block, run from the repository root."""
    pytest.importorskip("torch")
    root = README.parent
    cmd = blocks("bash")[2].replace("\\\n", " ").replace("out/", f"{tmp_path}/").replace("mkdir -p out", "true")
    cmd = re.sub(r"(?m)^gpp ", f"{sys.executable} -m gpp_solver ", cmd)
    cmd = re.sub(r"(?m)^python ", f"{sys.executable} ", cmd)
    cmd = re.sub(r"(?m)^torchrun ", f"{sys.executable} -m torch.distributed.run ", cmd)
    cmd = "set -e\n" + cmd
    r = subprocess.run(cmd, shell=True, cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verify: OK" in r.stdout + r.stderr
    assert (tmp_path / "plan.json").exists()
