"""notebooks/solver_comparison.ipynb runs top to bottom (nbclient, kernel ``python3``, cwd notebooks/).

* ``test_notebook_with_stub_planners`` (default run): a cell put in front replaces the planner
  registry by two small stand-ins (a graph-pipeline planner that cuts the graph into depth bands
  split by branch, and a chain planner), so every section of the notebook draws something and the
  time does not depend on which real planners are installed; ``alpa`` points at a module that does
  not exist, so the "missing planners" path runs too.
* ``test_notebook_as_is``: the notebook exactly as committed, with the real planners (2 s per planner run).

Both check the notebook's text against its own figures: every device count has its tables, the
sentence under the stage graphs gives each plan's stages and depth as its table row does, and Piper
is skipped (``search-space-too-large`` at once) exactly on the graphs the workload list says.

The notebook in git has no outputs; executing it here never writes it back.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "solver_comparison.ipynb"

STUBS = r'''
import sys, time, types
import networkx as nx

_src = """
import time
import networkx as nx
from gpp_solver.plan.build import StageSpec, build_plan
from gpp_solver.types import SearchInfo
from gpp_solver.plan.validate import validate


def _micro_batch(B):
    return next(b for b in (4, 2, 1) if B % b == 0)


def stub_chain(graph, cluster, B, *, time_limit=None, progress=False, **options):
    t0 = time.perf_counter()
    order = list(graph.topo_order)
    k = min(cluster.devices, len(order))
    specs = [StageSpec(tuple(order[i * len(order) // k:(i + 1) * len(order) // k]), (i,), _micro_batch(B))
             for i in range(k)]
    plan = build_plan(graph, cluster, specs, B, planner="pipedream",
                      search=SearchInfo(time.perf_counter() - t0, "feasible"))
    validate(plan, graph, cluster)
    return plan


def stub_graph(graph, cluster, B, *, time_limit=None, progress=False, **options):
    t0 = time.perf_counter()
    g = graph.to_networkx()
    level = {}
    for v in nx.topological_sort(g):
        level[v] = max((level[u] + 1 for u in g.predecessors(v)), default=0)
    n_levels = max(level.values()) + 1
    for bands in range(min(n_levels, cluster.devices), 0, -1):
        parts = []
        for band in range(bands):
            members = [v for v in g if level[v] * bands // n_levels == band]
            parts += [tuple(c) for c in nx.weakly_connected_components(g.subgraph(members))]
        if len(parts) <= cluster.devices:
            break
    specs = [StageSpec(p, (i,), _micro_batch(B)) for i, p in enumerate(parts)]
    plan = build_plan(graph, cluster, specs, B, planner="graphpipe",
                      search=SearchInfo(time.perf_counter() - t0, "feasible"))
    validate(plan, graph, cluster)
    return plan
"""
_mod = types.ModuleType("gpp_notebook_stubs")
exec(_src, _mod.__dict__)
sys.modules["gpp_notebook_stubs"] = _mod

import gpp_solver.planners.registry as _planners
_planners.REGISTRY.clear()
_planners.REGISTRY.update({"graphpipe": "gpp_notebook_stubs:stub_graph",
                           "pipedream": "gpp_notebook_stubs:stub_chain",
                           "milp": "gpp_notebook_stubs:stub_graph",
                           "alpa": "gpp_solver._no_such_module:plan_alpa"})
'''


def _execute(nb, cwd: Path) -> None:
    client = nbclient.NotebookClient(
        nb, kernel_name="python3", timeout=300, allow_errors=False, resources={"metadata": {"path": str(cwd)}}
    )
    client.execute()


def _outputs(nb) -> tuple[str, int]:
    """All text/markdown output of the notebook joined, and the number of PNG images it made."""
    texts, images = [], 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            images += "image/png" in data
            texts.append(data.get("text/markdown", "") + data.get("text/plain", "") + out.get("text", ""))
    return "\n".join(texts), images


def _tables(text: str) -> dict[tuple[str, int], dict[str, dict[str, str]]]:
    """The sweep's tables: ``{(workload, devices): {planner: {column: cell}}}``."""
    out = {}
    for m in re.finditer(r"### (.+?), (\d+) devices, mini-batch \d+\n\n((?:\|.*\n?)+)", text):
        lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in m.group(3).strip().splitlines()]
        head = lines[0]
        out[(m.group(1), int(m.group(2)))] = {r[0]: dict(zip(head, r)) for r in lines[2:]}
    return out


def _check_text_against_figures(text: str) -> None:
    tables = _tables(text)
    workloads = sorted({w for w, _ in tables})
    assert workloads and all((w, d) in tables for w in workloads for d in (4, 8, 16)), sorted(tables)
    # the sentence under the stage graphs (MMT, 8 devices) against that case's table rows
    rows = tables[("MMT (4 branches x 2 layers)", 8)]
    shapes = re.findall(r"- `([\w-]+)`: (\d+) stages, depth (\d+); .*", text)
    assert len(shapes) == 2, shapes
    for planner, stages, depth in shapes:
        assert (rows[planner]["stages"], rows[planner]["depth"]) == (stages, depth), planner
        line = next(line for line in text.splitlines() if line.startswith(f"- `{planner}`: {stages} stages"))
        assert ("a chain" in line) == (stages == depth) and (
            f"{int(stages) - int(depth)} of its stages" in line or stages == depth
        )
    # Piper runs exactly where the workload list says
    for w in workloads:
        note = re.search(rf"- \*\*{re.escape(w)}\*\*: .*; (.*)", text).group(1)
        for d in (4, 8, 16):
            piper = tables[(w, d)].get("piper")
            if piper is None:
                continue
            skipped = piper["status"] == "search-space-too-large"
            assert skipped == ("Piper skipped" in note), (w, d, piper["status"], note)
            if skipped:
                assert float(piper["search s"]) < 1.0, "a skipped Piper must not spend the time limit"


def test_notebook_is_stored_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "the notebook has no code cells"
    for c in code:
        assert c.outputs == [] and c.execution_count is None, "strip the outputs before committing"


def test_notebook_with_stub_planners():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(STUBS))
    t0 = time.perf_counter()
    _execute(nb, NOTEBOOK.parent)
    elapsed = time.perf_counter() - t0
    text, images = _outputs(nb)
    # the missing planner is named, the stubs ran in the table, every figure section drew
    assert "Missing planners (not run):** `alpa`" in text
    assert "| graphpipe |" in text and "| pipedream |" in text
    assert images >= 3, f"expected the sweep, stage-graph and Gantt figures, got {images} images"
    assert "| MMT (2 branches x 1 layer) | 2 | graphpipe (feasible) |" in text  # the gap table
    assert "Notebook executed in" in text
    _check_text_against_figures(text)
    # the stub chain planner cuts one topological order, and two of its 8 stages carry no data to the next
    assert "- `pipedream`: 8 stages, depth 6; its stages follow one order" in text
    print(f"notebook with stub planners executed in {elapsed:.1f} s")


@pytest.mark.slow  # about 62 s; test_notebook_with_stub_planners runs every cell in the default run
def test_notebook_as_is(monkeypatch):
    """The committed notebook with the installed planners, top to bottom (2 s per planner run, so CI
    stays fast; run it by hand with the default 20 s for the full comparison)."""
    monkeypatch.setenv("GPP_NOTEBOOK_TIME_LIMIT", "2")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    t0 = time.perf_counter()
    _execute(nb, NOTEBOOK.parent)
    text, _ = _outputs(nb)
    assert "Installed planners:" in text and "Notebook executed in" in text
    _check_text_against_figures(text)
    assert "more than 2,000 downsets: Piper skipped" in text  # MMT and GNMT
    print(f"notebook executed in {time.perf_counter() - t0:.1f} s")


def test_notebook_extra_installs_a_jupyter_front_end():
    """`pip install -e ".[notebook]"` brings `jupyter notebook` and `jupyter nbconvert`."""
    import shutil
    import sys
    import tomllib

    extra = tomllib.loads((NOTEBOOK.parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[<>=\[ ]", r)[0] for r in extra["notebook"]}
    assert {"notebook", "nbconvert", "nbclient", "ipykernel"} <= names
    bindir = str(Path(sys.executable).parent)
    if shutil.which("jupyter", path=bindir) is None:
        pytest.skip("jupyter is not installed in this environment")
    # `jupyter SUB` runs the `jupyter-SUB` script beside it
    for sub in ("notebook", "nbconvert"):
        assert shutil.which(f"jupyter-{sub}", path=bindir), f"`jupyter {sub}` is not installed"
