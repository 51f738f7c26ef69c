"""Every example in README runs: the Python blocks; the bash blocks, each section's by itself in the
default run, and all of them in order on a fresh copy of the checkout, as a user's shell runs them
(``-m slow``: ``test_readme_walk``)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"

#: the bash blocks the walk leaves out, by a string each holds, and why
SKIPPED = {"python -m pytest": "it runs the whole test suite, this walk among it"}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), flags=re.S)


def walked_blocks() -> list[str]:
    """README's bash blocks in order, less the ones :data:`SKIPPED` names."""
    return [b for b in blocks("bash") if not any(k in b for k in SKIPPED)]


def commands(block: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments dropped, ``&&`` chains split."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.extend(c.strip() for c in line.split(" && "))
    return out


_WRITES = re.compile(r"(?:^|\s)(?:-o|--output)\s+(out/\S+)")
_OUT_PATH = re.compile(r"(?<![\w/])out/[\w./-]*\w")
_REPO_PATH = re.compile(r"(?<![\w.])(?:examples|data|benchmarks)/[\w./-]*\w")


@pytest.mark.parametrize("i", range(len(blocks("python"))))
def test_python_examples(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks("python")[i], f"README python block {i}", "exec"), {"__name__": "__readme__"})


def test_bash_blocks_write_their_own_files():
    """What lets the walk run in order: every file under ``out/`` that a command writes, no other
    command writes (a later section does not overwrite an earlier one's, so the earlier commands
    still work when repeated), into a folder made before; every ``out/`` file a command reads, an
    earlier command wrote; every repository file a command names exists."""
    for key in SKIPPED:
        assert sum(key in b for b in blocks("bash")) == 1, key
    written: dict[str, str] = {}
    folders: set[str] = set()
    for cmd in (c for b in walked_blocks() for c in commands(b)):
        if cmd.startswith("mkdir "):
            folders.update(p for p in cmd.split()[1:] if p.startswith("out"))
            continue
        writes = _WRITES.findall(cmd)
        for path in _OUT_PATH.findall(cmd):
            if path not in writes:
                assert path in written, f"{cmd!r} reads {path}, which no earlier command writes"
        for path in writes:
            assert path not in written, f"{path} is written by both {written[path]!r} and {cmd!r}"
            assert str(Path(path).parent) in folders, f"{cmd!r} writes into a folder no earlier command makes"
            written[path] = cmd
        for path in _REPO_PATH.findall(cmd):
            assert (REPO / path).exists(), f"{cmd!r} names {path}, which is not in the repository"
    assert {"out/plan.json", "out/two_branch_plan.json", "out/recipe/plan.json"} <= set(written)


def _runnable(block: str, out) -> str:
    """A README bash block as this interpreter runs it: files in ``out`` instead of ``out/``, the
    commands through ``sys.executable``, stopping at the first failure."""
    cmd = block.replace("\\\n", " ").replace("out/", f"{out}/")
    cmd = re.sub(r"(?m)^mkdir -p out$", "true", cmd)
    cmd = re.sub(r"(?m)^gpp ", f"{sys.executable} -m gpp_solver ", cmd)
    cmd = re.sub(r"(?m)^python |\$\(python ", lambda m: m.group(0).replace("python", sys.executable), cmd)
    cmd = re.sub(r"(?m)^torchrun ", f"{sys.executable} -m torch.distributed.run ", cmd)
    return "set -e\n" + cmd


def test_quickstart_main_job(tmp_path):
    cmd = blocks("bash")[0].strip()
    pip = re.match(r"pip install [^&]+ && ", cmd)
    assert pip, cmd
    job = cmd[pip.end() :].replace("gpp ", f"{sys.executable} -m gpp_solver ")
    r = subprocess.run(job, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    # everything goes into out/, nothing into the working directory itself
    assert (tmp_path / "out" / "plan.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert "stages" in r.stdout and "cluster: 8 devices in 2 nodes of 4" in r.stdout


def _block_with(*needles: str) -> str:
    (block,) = [b for b in blocks("bash") if all(n in b for n in needles)]
    return block


@pytest.mark.slow  # about 16 s; the README walk (slow) runs it too
def test_training_example(tmp_path):
    """README's profile -> plan -> torchrun block, run from the repository root."""
    pytest.importorskip("torch")
    cmd = _runnable(_block_with("examples.two_branch:workload", "--verify"), tmp_path)
    r = subprocess.run(cmd, shell=True, cwd=README.parent, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "verify: OK" in r.stdout + r.stderr
    # the plan trained is the plan just made, with one rank per device it uses
    assert f"--plan {tmp_path}/two_branch_plan.json" in cmd and "--nproc-per-node $N" in cmd
    plan = json.loads((tmp_path / "two_branch_plan.json").read_text())
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


def _recipe_checks(out: str, folder: Path) -> None:
    """The recipe's plan trains on both probed ranks, and the last --json line has the prediction
    beside the measurement, time and memory, for every rank."""
    cluster = json.loads((folder / "cluster.json").read_text())
    assert cluster["devices"] == 2 and cluster["allreduce_bandwidth"] > 0  # the probe's ring fit
    assert "op_overhead" in json.loads((folder / "graph.json").read_text())  # the profile's time terms
    plan = json.loads((folder / "plan.json").read_text())
    ranks = sorted(d for s in plan["stages"] for d in s["devices"])
    assert ranks == [0, 1], f"the recipe's plan should use both ranks, not {ranks}"
    last = json.loads([line for line in out.splitlines() if line.startswith('{"gpp_runtime"')][-1])
    m = last["gpp_runtime"]
    assert m["predicted_iteration_seconds"] > 0 and m["seconds_per_step"] > 0 and m["timed_steps"] == 17
    assert [x["rank"] for x in m["ranks"]] == ranks
    assert all(x["peak_memory_bytes"] > 0 and x["predicted_peak_memory_bytes"] > 0 for x in m["ranks"])


@pytest.mark.slow  # about 25 s; the README walk (slow) runs it too
def test_planning_recipe(tmp_path):
    """README's profile -> probe -> plan -> train -> check recipe on CPU ranks."""
    pytest.importorskip("torch")
    r = subprocess.run(
        _runnable(_block_with("gpp_runtime.probe"), tmp_path),
        shell=True,
        cwd=README.parent,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _recipe_checks(r.stdout, tmp_path / "recipe")


def _fresh_copy(dest: Path) -> None:
    """The checkout's tracked files, as a clone has them (with this working tree's edits)."""
    ls = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in filter(None, ls.stdout.split("\0")):
        if (REPO / name).is_file():  # a file deleted in the working tree is not in the copy
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def _throwaway_env(venv: Path) -> dict[str, str]:
    """A virtual environment in which README's ``pip install -e ...`` installs the copy, leaving this
    one's install alone: it sees this environment's packages (torch, numpy, pip, setuptools) behind
    its own, and ``torchrun`` runs its Python. The environment a user's shell has: its ``bin`` on
    ``PATH``, no ``PYTHONPATH``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    # processed after the copy's editable install's .pth (names sort so), so the copy's gpp_solver wins
    (Path(site) / "zz_test_environment.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(f"#!{py}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n")
    torchrun.chmod(0o755)
    ours_bin = str(Path(sys.executable).parent)
    path = [str(venv / "bin")] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p != ours_bin]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return env | {"PATH": os.pathsep.join(path), "VIRTUAL_ENV": str(venv)}


def _as_in_the_walk(block: str) -> str:
    """``pip install X`` as ``pip install --no-deps --no-build-isolation X``: the copy itself is
    installed, its dependencies are this environment's (nothing is downloaded)."""
    return "set -e\n" + re.sub(
        r"(?m)(^|&& )pip install ", r"\1python -m pip install -q --no-deps --no-build-isolation ", block
    )


@pytest.mark.slow
def test_readme_walk(tmp_path):
    """README followed on a fresh copy of the checkout: every bash block in order (less
    :data:`SKIPPED`), as written, in a throwaway environment without ``PYTHONPATH``."""
    pytest.importorskip("torch")
    if subprocess.run(["git", "rev-parse"], cwd=REPO, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    clone = tmp_path / "clone"
    _fresh_copy(clone)
    env = _throwaway_env(tmp_path / "venv")
    outputs = []
    for i, block in enumerate(walked_blocks()):
        r = subprocess.run(
            ["bash", "-c", _as_in_the_walk(block)], cwd=clone, env=env, capture_output=True, text=True, timeout=600
        )
        outputs.append(r.stdout + r.stderr)
        assert r.returncode == 0, f"README bash block {i} failed:\n{block}\n{outputs[-1][-3000:]}"
    # the commands ran the copy's code, not this checkout's
    where = subprocess.run(
        ["python", "-c", "import gpp_solver, gpp_runtime; print(gpp_solver.__file__); print(gpp_runtime.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert all(Path(p).is_relative_to(clone) for p in where), where
    training = next(o for b, o in zip(walked_blocks(), outputs) if "--verify" in b)
    assert "verify: OK" in training
    recipe = next(o for b, o in zip(walked_blocks(), outputs) if "gpp_runtime.probe" in b)
    _recipe_checks(recipe, clone / "out" / "recipe")
    # the quickstart's files are still its own: its later commands run again at the end
    show = _block_with("gpp show out/plan.json")
    r = subprocess.run(["bash", "-c", "set -e\n" + show], cwd=clone, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
