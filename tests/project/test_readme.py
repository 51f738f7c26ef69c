"""Every example in README runs: the Python blocks, and the quickstart's main job (minus `pip install`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_python_examples(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks("python")[i], f"README python block {i}", "exec"), {"__name__": "__readme__"})


def _runnable(block: str, out) -> str:
    """A README bash block as this interpreter runs it: files in ``out`` instead of ``out/``, the
    commands through ``sys.executable``, stopping at the first failure."""
    cmd = block.replace("\\\n", " ").replace("out/", f"{out}/").replace("mkdir -p out", "true")
    cmd = re.sub(r"(?m)^gpp ", f"{sys.executable} -m gpp_solver ", cmd)
    cmd = re.sub(r"(?m)^python |\$\(python ", lambda m: m.group(0).replace("python", sys.executable), cmd)
    cmd = re.sub(r"(?m)^torchrun ", f"{sys.executable} -m torch.distributed.run ", cmd)
    return "set -e\n" + cmd


def test_quickstart_main_job(tmp_path):
    cmd = blocks("bash")[0].strip()
    assert cmd.startswith("pip install -e . && ")
    job = cmd[len("pip install -e . && ") :].replace("gpp ", f"{sys.executable} -m gpp_solver ")
    r = subprocess.run(job, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    # everything goes into out/, nothing into the working directory itself
    assert (tmp_path / "out" / "plan.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert "stages" in r.stdout and "cluster: 8 devices in 2 nodes of 4" in r.stdout


def test_training_example(tmp_path):
    """README's profile -> plan -> torchrun block, run from the repository root."""
    pytest.importorskip("torch")
    cmd = _runnable(blocks("bash")[2], tmp_path)
    r = subprocess.run(cmd, shell=True, cwd=README.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verify: OK" in r.stdout + r.stderr
    # the plan trained is the plan just made, with one rank per device it uses
    assert f"--plan {tmp_path}/plan.json" in cmd and "--nproc-per-node $N" in cmd
    plan = json.loads((tmp_path / "plan.json").read_text())
    out = r.stdout + r.stderr
    assert len(plan["stages"]) >= 2, "the README's memory limit should force a pipeline"
    for st in plan["stages"]:
        assert f"stage {st['id']} ranks {st['devices']}" in out


def test_machine_table_is_the_code():
    from gpp_solver.formats.machines import MACHINES

    text = README.read_text()
    start = text.index("| NAME | device | per node |")
    lines = [line for line in text[start:].split("\n\n")[0].splitlines() if re.match(r"\| `[a-z0-9-]+` \|", line)]
    table = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0].strip("`")] = cells
    assert set(table) == set(MACHINES)
    for name, m in MACHINES.items():
        _, _, per, mem, intra, inter = table[name]
        assert int(per) == m.devices_per_node and mem == f"{m.memory_bytes / 2**30:g} GiB"
        assert intra.startswith(f"{m.intra_node_bandwidth / 1e9:g} GB/s") and inter.startswith(
            f"{m.inter_node_bandwidth / 1e9:g} GB/s"
        )


def test_planning_recipe(tmp_path):
    """README's profile -> probe -> plan -> train -> check recipe on CPU ranks: the last --json line
    has the prediction beside the measurement, time and memory, for every rank the plan uses."""
    pytest.importorskip("torch")
    (block,) = [b for b in blocks("bash") if "gpp_runtime.probe" in b]
    r = subprocess.run(
        _runnable(block, tmp_path), shell=True, cwd=README.parent, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    cluster = json.loads((tmp_path / "cluster.json").read_text())
    assert cluster["devices"] == 2 and cluster["allreduce_bandwidth"] > 0  # the probe's ring fit
    assert "op_overhead" in json.loads((tmp_path / "graph.json").read_text())  # the profile's time terms
    plan = json.loads((tmp_path / "plan.json").read_text())
    last = json.loads([line for line in r.stdout.splitlines() if line.startswith('{"gpp_runtime"')][-1])
    m = last["gpp_runtime"]
    assert m["predicted_iteration_seconds"] > 0 and m["seconds_per_step"] > 0 and m["timed_steps"] == 17
    ranks = sorted(d for s in plan["stages"] for d in s["devices"])
    assert [x["rank"] for x in m["ranks"]] == ranks
    assert all(x["peak_memory_bytes"] > 0 and x["predicted_peak_memory_bytes"] > 0 for x in m["ranks"])
